"""Shared test set-up: 8 virtual CPU devices, before jax loads.

Strict dtype promotion is a fixture (``strict_promotion``), not global: optax's own
bias-correction code mixes int counts with floats and fails under it.
"""

import os

os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import pytest


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
collect_ignore_glob = ["tests/*_worker.py"]
