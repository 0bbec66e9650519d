"""Host memory during restore stays within the restored arrays plus the budget."""

import json
import pathlib
import subprocess
import sys

import numpy as np
from safetensors.numpy import save_file

HERE = pathlib.Path(__file__).parent
MIB = 1 << 20


def test_restore_stays_within_restored_bytes_plus_the_budget(tmp_path):
  rng = np.random.default_rng(0)
  tensors = {
    f"layer_{i:02d}.weight": rng.standard_normal((1024, 2048), np.float32) for i in range(30)
  }
  path = tmp_path / "model.safetensors"
  save_file(tensors, str(path))
  last = tensors[f"layer_{len(tensors) - 1:02d}.weight"]
  del tensors
  r = subprocess.run(
    [sys.executable, str(HERE / "restore_memory_worker.py"), str(path), str(32 * MIB)],
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert r.returncode == 0, r.stderr[-4000:]
  out = json.loads(r.stdout.strip().splitlines()[-1])
  assert out["restored"] == 30 * 1024 * 2048 * 4  # ~252 MB
  assert out["bytes_read"] == out["restored"]  # every row block read once
  assert out["corner"] == float(last[0, 0])  # shard (0, 0) of the transpose
  assert out["growth"] < out["restored"] + 64 * MIB, (
    f"peak RSS grew {out['growth'] / MIB:.0f} MiB for {out['restored'] / MIB:.0f} MiB restored"
  )
