"""Shared test set-up: 8 virtual CPU devices (with a deadlock-free thread pool), before jax loads.

Strict dtype promotion is a fixture (``strict_promotion``), not global: optax's own
bias-correction code mixes int counts with floats and fails under it.
"""

import os
import pathlib
import shutil
import tempfile

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


_STARTED = []  # (work folder, process) begun at collection, ended with the session


def pytest_collection_finish(session):
  """The docs build (``tests/test_docs.py``) starts now as its own process when its test is
  selected: the suite runs its tests in one process, and the build uses the other core
  meanwhile; the test waits for it. Stopped at the end if a run ends before its test."""
  for item in session.items:
    if item.name == "test_the_docs_build_with_warnings_as_errors":
      work = pathlib.Path(tempfile.mkdtemp(prefix="paramreg-docs-"))
      started = (work, item.module.start_build(work))
      _STARTED.append(started)
      session.config.stash[item.module.EARLY_BUILD] = started
      return


def pytest_sessionfinish(session):
  for work, process in _STARTED:
    if process.poll() is None:
      process.kill()
      process.wait()
    shutil.rmtree(work, ignore_errors=True)
