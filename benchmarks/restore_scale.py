"""How restore time and peak memory grow with checkpoint size: 1, 2, 4 GiB and 10,000 tensors.

Run: python benchmarks/restore_scale.py [--sizes 1 2 4] [--small 10000]
(``--sizes`` with no value runs only the small-tensor case.)

Each size is a safetensors file of float32 [1024, 2048] kernels stored [out, in], restored with
a transpose on every kernel into a (4, 2)-sharded target at default settings, in a fresh
process (8 virtual CPU devices). The small-tensor run restores 10,000 [64, 64] tensors directly.
Reported for paramreg and for the baseline (``safetensors.numpy.load_file`` + ``np.transpose``
+ ``jax.device_put``): time, peak RSS growth, and the least-squares slope of both against size;
for the small tensors also one batched ``device_put`` of the arrays loaded beforehand, the floor
of any restore that creates them through ``device_put``
(the memory slope should be ~1 GB per GB: the restored arrays themselves, plus a constant
window budget).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from restore import peak_rss_bytes  # benchmarks/ is the script's directory
from restore import rss_bytes

ROWS, COLS = 1024, 2048


def _result(t0: float, before: int, out: dict) -> dict:
  """Time since ``t0`` and peak RSS growth since ``before`` of a finished restore ``out``."""
  import jax

  jax.block_until_ready(out)
  return {
    "seconds": time.perf_counter() - t0,
    "growth": peak_rss_bytes() - before,
    "restored": sum(x.nbytes for x in out.values()),
    "tensors": len(out),
  }


def run_case(
  path: str, transpose: bool, baseline: bool | str = False, single: bool = False
) -> dict:
  import paramreg_jax as prj

  prj.use_cpu_devices(8)
  import jax
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from paramreg_jax import recipes as R

  grid = NamedSharding(jax.make_mesh((4, 2), ("x", "y")), P("x", "y"))
  jax.device_put(np.zeros((8, 8), np.float32), grid).block_until_ready()
  if single:
    grid = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  if baseline == "floor":  # one batched device_put of arrays loaded beforehand (not timed)
    from safetensors.numpy import load_file

    loaded = load_file(path)
    before = rss_bytes()
    t0 = time.perf_counter()
    out = dict(zip(loaded, jax.device_put(list(loaded.values()), [grid] * len(loaded))))
    return _result(t0, before, out)
  if baseline:  # safetensors' own loader, numpy's transpose, jax's sharding
    from safetensors.numpy import load_file

    before = rss_bytes()
    t0 = time.perf_counter()
    loaded = load_file(path)
    out = {
      k: jax.device_put(np.ascontiguousarray(v.T) if transpose else v, grid)
      for k, v in loaded.items()
    }
    del loaded
    return _result(t0, before, out)
  src = prj.SafetensorsSource(path)
  target, recipes = {}, {}
  for key in src.keys():
    meta = src.metadata(key)
    shape = meta.shape[::-1] if transpose else meta.shape
    target[key] = jax.ShapeDtypeStruct(shape, meta.dtype, sharding=grid)
    if transpose:
      recipes[key] = R.transpose(R.source(key), (1, 0))
  before = rss_bytes()
  t0 = time.perf_counter()
  return _result(t0, before, prj.restore(target, src, recipes=recipes))


def write(path: str, count: int, shape: tuple[int, int]) -> None:
  code = f"""
import numpy as np
from safetensors.numpy import save_file
rng = np.random.default_rng(0)
save_file({{f"t{{i:05d}}": rng.standard_normal({shape!r}, dtype=np.float32) for i in range({count})}}, {path!r})
"""
  subprocess.run([sys.executable, "-c", code], check=True)
  # on disk before anything is timed: otherwise the kernel writes the fresh file back while the
  # first measured case reads it (that case ran up to 2x slower than in the same run later)
  with open(path, "rb") as f:
    os.fsync(f.fileno())


def measure(path: str, transpose: bool, baseline: bool | str = False, single: bool = False) -> dict:
  proc = subprocess.run(
    [
      sys.executable,
      __file__,
      "--case",
      path,
      *(["--transpose"] if transpose else []),
      *(["--baseline"] if baseline is True else ["--floor"] if baseline == "floor" else []),
      *(["--single"] if single else []),
    ],
    capture_output=True,
    text=True,
  )
  if proc.returncode:
    raise SystemExit(f"{path} failed:\n{proc.stderr[-3000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def slope(xs: list[float], ys: list[float]) -> tuple[float, float]:
  n = len(xs)
  mx, my = sum(xs) / n, sum(ys) / n
  b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
  return b, my - b * mx


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--case", default=None)
  ap.add_argument("--transpose", action="store_true")
  ap.add_argument("--baseline", action="store_true")
  ap.add_argument("--floor", action="store_true")
  ap.add_argument("--single", action="store_true")
  ap.add_argument("--sizes", type=float, nargs="*", default=[1, 2, 4])
  ap.add_argument("--small", type=int, default=10_000)
  args = ap.parse_args()
  if args.case:
    baseline = "floor" if args.floor else args.baseline
    print(json.dumps(run_case(args.case, args.transpose, baseline, args.single)))
    return
  gb = 1e9
  rows, bases = [], []
  with tempfile.TemporaryDirectory() as tmp:
    for size in args.sizes:
      path = os.path.join(tmp, f"{size}.safetensors")
      write(path, int(size * 2**30) // (ROWS * COLS * 4), (ROWS, COLS))
      r, b = measure(path, transpose=True), measure(path, transpose=True, baseline=True)
      os.remove(path)
      rows.append(r)
      bases.append(b)
      print(
        f"{r['restored'] / 2**30:g} GiB ({r['tensors']} kernels, transposed): "
        f"{r['seconds']:.2f} s ({r['restored'] / r['seconds'] / gb:.2f} GB/s; baseline "
        f"{b['seconds']:.2f} s), peak RSS growth {r['growth'] / gb:.2f} GB "
        f"({r['growth'] / r['restored']:.3f} x restored; baseline {b['growth'] / gb:.2f} GB)",
        flush=True,
      )
    if len(rows) > 1:
      sizes = [r["restored"] / gb for r in rows]
      for name, runs in (("paramreg", rows), ("baseline", bases)):
        t_slope, t_icpt = slope(sizes, [r["seconds"] for r in runs])
        m_slope, m_icpt = slope(sizes, [r["growth"] / gb for r in runs])
        print(
          f"{name}: time = {t_slope:.3f} s/GB x size + {t_icpt:.3f} s; peak RSS growth = "
          f"{m_slope:.3f} GB/GB x size + {m_icpt * 1e3:.0f} MB"
        )
    if args.small:
      path = os.path.join(tmp, "small.safetensors")
      write(path, args.small, (64, 64))
      for single, where in ((False, "over a (4, 2) mesh"), (True, "on one device")):
        r = measure(path, transpose=False, single=single)
        b = measure(path, transpose=False, baseline=True, single=single)
        f = measure(path, transpose=False, baseline="floor", single=single)
        print(
          f"{r['tensors']} tensors of [64, 64] ({r['restored'] / 1e6:.0f} MB) {where}: "
          f"{r['seconds']:.2f} s ({r['seconds'] / r['tensors'] * 1e6:.0f} us per tensor; "
          f"baseline {b['seconds']:.2f} s, ratio {r['seconds'] / b['seconds']:.2f}), peak RSS "
          f"growth {r['growth'] / 1e6:.0f} MB (baseline {b['growth'] / 1e6:.0f} MB); one batched "
          f"device_put of the loaded arrays alone: {f['seconds']:.2f} s = "
          f"{f['seconds'] / b['seconds']:.2f} of the baseline"
        )


if __name__ == "__main__":
  main()
