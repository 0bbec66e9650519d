"""The command line: the demo runs end to end; errors are one line."""

import subprocess
import sys


def test_demo_runs(tmp_path):
  out = subprocess.run(
    [sys.executable, "-m", "paramreg_jax", "demo", "--workdir", str(tmp_path)],
    capture_output=True,
    text=True,
    timeout=300,
    check=True,
  ).stdout
  assert "on 8 cpu devices" in out
  assert "OrderingContractError" in out
  assert "SurgeryReport: 4 kept, 2 added, 0 dropped, 0 re-initialised" in out
  assert "== done" in out


def test_unknown_command_is_a_usage_error():
  r = subprocess.run(
    [sys.executable, "-m", "paramreg_jax", "nope"], capture_output=True, text=True, timeout=120
  )
  assert r.returncode == 2 and "invalid choice" in r.stderr
