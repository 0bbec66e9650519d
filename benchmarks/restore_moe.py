"""A mixture-of-experts checkpoint stored per expert, restored into stacked parameters.

Run: python benchmarks/restore_moe.py [--layers 8] [--experts 64] [--dim 256]

The safetensors file holds ``model.layers.{l}.block_sparse_moe.experts.{e}.w{1,2,3}.weight``
([ff, d] or [d, ff], PyTorch's [out, in]); the target holds three [layers, experts, in, out]
parameters sharded over a (4, 2) mesh (experts over the first axis, the output dimension over the
second), mapped by ``match``. Each case runs in a fresh process (8 virtual CPU devices):

- paramreg: ``prj.restore(target, src, recipes=prj.match(target, src))``;
- the naive loop: ``load_file``, then per parameter ``np.stack`` of the transposed experts over
  layers and experts, and ``jax.device_put``.

Reported: time and peak RSS growth of both, and their ratios (goal: faster, at <= 0.6x the
naive loop's memory growth).
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


def run_case(path: str, layers: int, experts: int, d: int, naive: bool) -> dict:
  import paramreg_jax as prj

  prj.use_cpu_devices(8)
  import jax
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  ff = 2 * d
  grid = NamedSharding(jax.make_mesh((4, 2), ("x", "y")), P(None, "x", None, "y"))
  jax.device_put(
    np.zeros((8, 8), np.float32), NamedSharding(grid.mesh, P("x", "y"))
  ).block_until_ready()
  shapes = {"w1": (d, ff), "w2": (ff, d), "w3": (d, ff)}
  target = {
    "layers": {
      "moe": {
        "experts": {
          w: {"kernel": jax.ShapeDtypeStruct((layers, experts, *s), np.float32, sharding=grid)}
          for w, s in shapes.items()
        }
      }
    }
  }
  with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
  before = peak_rss_bytes()
  t0 = time.perf_counter()
  if naive:
    from safetensors.numpy import load_file

    loaded = load_file(path)
    out = {}
    for w in shapes:
      stacked = np.stack(
        [
          np.stack(
            [
              loaded[f"model.layers.{i}.block_sparse_moe.experts.{e}.{w}.weight"].T
              for e in range(experts)
            ]
          )
          for i in range(layers)
        ]
      )
      out[w] = jax.device_put(stacked, grid)
      del stacked
    del loaded
  else:
    src = prj.SafetensorsSource(path)
    out = prj.restore(target, src, recipes=prj.match(target, src))
  jax.block_until_ready(out)
  return {
    "seconds": time.perf_counter() - t0,
    "growth": peak_rss_bytes() - before,
    "bytes": sum(x.nbytes for x in jax.tree.leaves(out)),
  }


def measure(*args: object) -> dict:
  proc = subprocess.run(
    [sys.executable, __file__, "--case", *map(str, args)], capture_output=True, text=True
  )
  if proc.returncode:
    raise SystemExit(f"failed:\n{proc.stderr[-3000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--experts", type=int, default=64)
  ap.add_argument("--dim", type=int, default=256)
  ap.add_argument("--case", nargs=5, default=None)
  args = ap.parse_args()
  if args.case:
    path, layers, experts, d, naive = args.case
    print(json.dumps(run_case(path, int(layers), int(experts), int(d), naive == "1")))
    return
  L, E, d = args.layers, args.experts, args.dim
  with tempfile.TemporaryDirectory() as work:
    path = os.path.join(work, "model.safetensors")
    code = (
      "import numpy as np\nfrom safetensors.numpy import save_file\n"
      "rng = np.random.default_rng(0)\n"
      f"shapes = {{'w1': ({2 * d}, {d}), 'w2': ({d}, {2 * d}), 'w3': ({2 * d}, {d})}}\n"
      "save_file({f'model.layers.{i}.block_sparse_moe.experts.{e}.{w}.weight': "
      "rng.standard_normal(s, dtype=np.float32) "
      f"for i in range({L}) for e in range({E}) for w, s in shapes.items()}}, {path!r})\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    ours = measure(path, L, E, d, 0)
    naive = measure(path, L, E, d, 1)
  mb = 1e6
  print(
    f"{L} layers x {E} experts x 3 matrices ({3 * L * E} tensors, {ours['bytes'] / 2**20:.0f} MiB) "
    "into 3 stacked parameters on a (4, 2) mesh"
  )
  print(
    f"paramreg (match + restore): {ours['seconds']:.2f} s, peak RSS growth {ours['growth'] / mb:.0f} MB"
  )
  print(
    f"naive load_file + stack + device_put: {naive['seconds']:.2f} s, peak RSS growth {naive['growth'] / mb:.0f} MB"
  )
  print(
    f"ratios: time {ours['seconds'] / naive['seconds']:.2f}, "
    f"memory growth {ours['growth'] / naive['growth']:.2f} (goal: < 1 and <= 0.6)"
  )


if __name__ == "__main__":
  main()
