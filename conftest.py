"""Shared test set-up: 8 virtual CPU devices (with a deadlock-free thread pool), before jax loads.

Strict dtype promotion is a fixture (``strict_promotion``), not global: optax's own
bias-correction code mixes int counts with floats and fails under it.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from paramreg_jax._src.devices import use_cpu_devices

use_cpu_devices(
  8
)  # before jax creates its client: XLA_FLAGS and PJRT_NPROC, inherited by notebooks

import jax  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def devices():
  devs = jax.devices()
  assert len(devs) == 8, f"expected 8 virtual CPU devices, got {len(devs)}"
  return devs


@pytest.fixture
def strict_promotion():
  with jax.numpy_dtype_promotion("strict"):
    yield


# Scripts that tests run as separate processes (they initialise jax.distributed at import).
collect_ignore_glob = ["tests/*_worker.py", "tests/*_shim.py"]
# Generate tests/data/{hf,quantized,unseen} with torch + transformers (not test dependencies).
collect_ignore_glob += ["tests/make_*_fixtures.py"]
