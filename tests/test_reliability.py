"""XLA:CPU collective deadlocks: the library's device work and the demo never abort.

Both run in the configuration that deadlocks plain JAX (8 virtual devices on a thread pool of
8, ``PJRT_NPROC=8``) while another process keeps a core busy; XLA's collective termination
timeout is shortened so a deadlock fails in seconds instead of 40.
"""

import contextlib
import os
import pathlib
import subprocess
import sys

import pytest

import paramreg_jax as prj

HERE = pathlib.Path(__file__).parent


@contextlib.contextmanager
def cpu_hog():
  hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
  try:
    yield
  finally:
    hog.kill()
    hog.wait()


def deadlock_prone_env():
  env = dict(os.environ)
  env["PJRT_NPROC"] = "8"  # the pool XLA picks by itself for 8 devices on <= 8 cores
  env["XLA_FLAGS"] = (
    "--xla_force_host_platform_device_count=8 "
    "--xla_cpu_collective_call_warn_stuck_timeout_seconds=5 "
    "--xla_cpu_collective_call_terminate_timeout_seconds=15"
  )
  return env


def run(args, env):
  r = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
  return r.stdout


def test_materialize_never_queues_collectives_that_deadlock():
  with cpu_hog():
    for _ in range(3):
      out = run([str(HERE / "restore_stress_worker.py"), "20", "32"], deadlock_prone_env())
      assert "ok: 20 restores of 32 fused layers" in out


def test_demo_survives_a_busy_machine_on_the_smallest_pool(tmp_path):
  with cpu_hog():
    out = run(["-m", "paramreg_jax", "demo", "--workdir", str(tmp_path)], deadlock_prone_env())
  assert "== done" in out


def test_use_cpu_devices_checks_its_argument_and_the_running_client(devices):
  prj.use_cpu_devices(len(devices))  # the running client's count: accepted, nothing changes
  with pytest.raises(RuntimeError, match=r"already created its CPU client with 8 device\(s\)"):
    prj.use_cpu_devices(4)
  for bad in (0, -1, 2.0, True):
    with pytest.raises(ValueError, match="count must be a positive int"):
      prj.use_cpu_devices(bad)


def test_use_cpu_devices_sets_the_pool_before_jax_starts():
  code = (
    "import os; os.environ.pop('PJRT_NPROC', None); os.environ.pop('NPROC', None);"
    "os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=3 --xla_cpu_enable_fast_math=false';"
    "import paramreg_jax as prj; prj.use_cpu_devices(6); import jax;"
    "print(len(jax.devices()), os.environ['PJRT_NPROC'], os.environ['XLA_FLAGS'])"
  )
  env = {k: v for k, v in os.environ.items() if k not in ("PJRT_NPROC", "NPROC")}
  out = run(["-c", code], env).split()
  assert out[0] == "6"
  assert int(out[1]) >= 12
  assert out[2:] == ["--xla_cpu_enable_fast_math=false", "--xla_force_host_platform_device_count=6"]
