"""A restore from a cold page cache and a warm one, against the medium's floors in the same run.

Run: python benchmarks/restore_cold.py [--mib 1024] [--repeat 3]

A safetensors file of float32 [4096, 4096] tensors (1 GiB by default) is restored into a target
whose rows are split over 8 devices (every byte read once), in a fresh process each time:

- cold: the page cache dropped before each run (``/proc/sys/vm/drop_caches``; needs root: the
  cold half is skipped with a message otherwise), against two floors measured cold in the same
  run: 8 threads ``preadv``-ing contiguous eighths into fresh memory, and one sequential reader;
- warm: the file in the page cache, against one copy of it into fresh memory
  (``np.fromfile``).

Medians of ``--repeat`` runs; each figure is a ratio to its floor (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

SIDE = 4096

CHILD = r"""
import json, sys, time
import paramreg_jax as prj
prj.use_cpu_devices(8)
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
path, count, side = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = NamedSharding(jax.make_mesh((8,), ("x",)), P("x", None))
target = {f"w{i}": jax.ShapeDtypeStruct((side, side), np.float32, sharding=rows)
          for i in range(count)}
src = prj.SafetensorsSource(path)
start = time.perf_counter()
jax.block_until_ready(prj.restore(target, src))
print(json.dumps(time.perf_counter() - start))
"""


def drop_caches() -> bool:
  try:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
      f.write("3\n")
    return True
  except OSError:
    return False


def threads_floor(path: str, threads: int = 8) -> float:
  size = os.path.getsize(path)
  out = np.empty(size, np.uint8)
  view = memoryview(out)
  step = -(-size // threads)
  fd = os.open(path, os.O_RDONLY)

  def part(i: int) -> None:
    pos, end = i * step, min(size, (i + 1) * step)
    while pos < end:
      pos += os.preadv(fd, [view[pos : min(end, pos + (8 << 20))]], pos)

  start = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    list(pool.map(part, range(threads)))
  took = time.perf_counter() - start
  os.close(fd)
  return took


def sequential_floor(path: str) -> float:
  out = np.empty(os.path.getsize(path), np.uint8)
  start = time.perf_counter()
  with open(path, "rb", buffering=0) as f:
    f.readinto(memoryview(out))
  return time.perf_counter() - start


def copy_floor(path: str) -> float:
  start = time.perf_counter()
  np.fromfile(path, np.uint8)
  return time.perf_counter() - start


def restore(path: str, count: int) -> float:
  done = subprocess.run(
    [sys.executable, "-c", CHILD, path, str(count), str(SIDE)], capture_output=True, text=True
  )
  if done.returncode:
    raise SystemExit(done.stderr[-3000:])
  return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--mib", type=int, default=1024)
  ap.add_argument("--repeat", type=int, default=3)
  args = ap.parse_args()
  from safetensors.numpy import save_file

  count = max(1, args.mib // (SIDE * SIDE * 4 >> 20))
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "model.safetensors")
    rng = np.random.default_rng(0)
    save_file({f"w{i}": rng.standard_normal((SIDE, SIDE), np.float32) for i in range(count)}, path)
    gib = os.path.getsize(path) / 2**30
    runs: dict[str, list[float]] = {}
    cold = drop_caches()
    if not cold:
      print("cold: skipped (dropping the page cache needs root: /proc/sys/vm/drop_caches)")
    for _ in range(args.repeat):
      if cold:
        for name, run in [
          ("cold floor: 8 threads", lambda: threads_floor(path)),
          ("cold floor: one reader", lambda: sequential_floor(path)),
          ("cold restore", lambda: restore(path, count)),
        ]:
          drop_caches()
          runs.setdefault(name, []).append(run())
      sequential_floor(path)  # warm
      runs.setdefault("warm floor: one copy", []).append(copy_floor(path))
      runs.setdefault("warm restore", []).append(restore(path, count))
    med = {k: sorted(v)[len(v) // 2] for k, v in runs.items()}
    print(f"{gib:.2f} GiB, {count} tensors, medians of {args.repeat} (GiB/s, ratio to floor)")
    for name, took in med.items():
      print(f"  {name:24s} {took:6.3f} s  {gib / took:5.2f} GiB/s")
    if cold:
      best = min(med["cold floor: 8 threads"], med["cold floor: one reader"])
      print(f"cold restore / best cold floor: {med['cold restore'] / best:.2f}x (goal <= 1.15)")
    warm = med["warm restore"] / med["warm floor: one copy"]
    print(f"warm restore / one copy: {warm:.2f}x (goal <= 1.2)")


if __name__ == "__main__":
  main()
