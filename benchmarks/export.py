"""Export memory and time, and what ``convert`` saves on every later start.

Run: python benchmarks/export.py [--gib 1]

A safetensors checkpoint of float32 [1024, 2048] kernels stored [out, in] (1 GiB by default) is
restored with a transpose on every kernel into a (4, 2)-sharded target; then, each in a fresh
process (8 virtual CPU devices):

- ``export``: ``prj.export`` of the restored tree back to the checkpoint's layout, at default
  settings; peak RSS growth during the export against the bound "block budget + the largest
  single tensor", and time;
- ``naive``: the baseline a user writes: every parameter gathered to numpy, transposed back,
  and ``safetensors.numpy.save_file`` of the whole dict;
- ``recipes`` / ``converted``: a start that restores through the recipes, against a start that
  restores the ``prj.convert``-ed orbax checkpoint with ``ocp.StandardCheckpointer`` (and with
  ``prj.restore`` from an ``OrbaxSource``).

Ratios are against baselines measured in the same run.
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

ROWS, COLS = 1024, 2048


def _setup(path: str):
  import paramreg_jax as prj

  prj.use_cpu_devices(8)
  import jax
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from paramreg_jax import recipes as R

  grid = NamedSharding(jax.make_mesh((4, 2), ("x", "y")), P("x", "y"))
  src = prj.SafetensorsSource(path)
  target = {
    "layers": {
      k.split(".")[1]: {"kernel": jax.ShapeDtypeStruct((COLS, ROWS), np.float32, sharding=grid)}
      for k in src.keys()
    }
  }
  recipes = {
    f"layers/{k.split('.')[1]}/kernel": R.transpose(R.source(k), (1, 0)) for k in src.keys()
  }
  return prj, src, target, recipes


def run_case(case: str, path: str, work: str) -> dict:
  prj, src, target, recipes = _setup(path)
  import jax
  import numpy as np

  if case == "converted_prj":
    t0 = time.perf_counter()
    out = prj.restore(target, prj.OrbaxSource(os.path.join(work, "converted")))
    jax.block_until_ready(out)
    return {"seconds": time.perf_counter() - t0}
  if case == "converted":
    import orbax.checkpoint as ocp

    t0 = time.perf_counter()
    out = ocp.StandardCheckpointer().restore(os.path.join(work, "converted"), target)
    jax.block_until_ready(out)
    return {"seconds": time.perf_counter() - t0}
  t0 = time.perf_counter()
  params = prj.restore(target, src, recipes=recipes)
  jax.block_until_ready(params)
  if case == "recipes":
    return {"seconds": time.perf_counter() - t0}
  largest = max(x.nbytes for x in jax.tree.leaves(params))
  with open("/proc/self/clear_refs", "w") as f:  # the high-water mark starts again from here
    f.write("5")
  before = peak_rss_bytes()
  out_dir = os.path.join(work, f"out-{case}")
  t0 = time.perf_counter()
  if case == "export":
    prj.export(params, recipes, out_dir, source=src)
  else:  # naive: gather everything, transpose back, save the dict
    from safetensors.numpy import save_file

    os.makedirs(out_dir)
    tensors = {
      k: np.ascontiguousarray(np.asarray(params["layers"][k.split(".")[1]]["kernel"]).T)
      for k in src.keys()
    }
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
  seconds = time.perf_counter() - t0
  return {
    "seconds": seconds,
    "growth": peak_rss_bytes() - before,
    "largest": largest,
    "bytes": sum(x.nbytes for x in jax.tree.leaves(params)),
  }


def measure(case: str, path: str, work: str) -> dict:
  proc = subprocess.run(
    [sys.executable, __file__, "--case", case, path, work], capture_output=True, text=True
  )
  if proc.returncode:
    raise SystemExit(f"{case} failed:\n{proc.stderr[-3000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--gib", type=float, default=1.0)
  parser.add_argument("--case", nargs=3, default=None)
  args = parser.parse_args()
  if args.case:
    print(json.dumps(run_case(*args.case)))
    return
  with tempfile.TemporaryDirectory() as work:
    count = int(args.gib * 2**30 // (ROWS * COLS * 4))
    path = os.path.join(work, "model.safetensors")
    code = (
      "import numpy as np\nfrom safetensors.numpy import save_file\n"
      "rng = np.random.default_rng(0)\n"
      f"save_file({{f'layers.{{i:04d}}.weight': rng.standard_normal(({ROWS}, {COLS}), "
      f"dtype=np.float32) for i in range({count})}}, {path!r})\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    convert = (
      "import sys; sys.path.insert(0, " + repr(os.path.dirname(__file__)) + ")\n"
      "from export import _setup\n"
      f"prj, src, target, recipes = _setup({path!r})\n"
      f"prj.convert(src, {os.path.join(work, 'converted')!r}, target, recipes=recipes)\n"
    )
    subprocess.run([sys.executable, "-c", convert], check=True)
    export = measure("export", path, work)
    naive = measure("naive", path, work)
    recipes = measure("recipes", path, work)
    converted = measure("converted", path, work)
    converted_prj = measure("converted_prj", path, work)
  budget = 16 * 2**20
  mb = 1e6
  print(
    f"{count} kernels [{ROWS}, {COLS}] float32 ({export['bytes'] / 2**30:.2f} GiB), (4, 2) mesh"
  )
  print(
    f"export: {export['seconds']:.2f} s, peak RSS growth {export['growth'] / mb:.0f} MB "
    f"(bound: budget {budget / mb:.0f} MB + largest tensor {export['largest'] / mb:.0f} MB = "
    f"{(budget + export['largest']) / mb:.0f} MB)"
  )
  print(
    f"naive gather + transpose + save_file: {naive['seconds']:.2f} s, peak RSS growth "
    f"{naive['growth'] / mb:.0f} MB"
  )
  print(
    f"ratios: time {export['seconds'] / naive['seconds']:.2f}, memory growth "
    f"{export['growth'] / max(naive['growth'], 1):.3f}"
  )
  print(
    f"start through recipes {recipes['seconds']:.2f} s, from the converted orbax checkpoint "
    f"{converted['seconds']:.2f} s: ratio {converted['seconds'] / recipes['seconds']:.2f}; "
    f"the converted checkpoint through prj.restore(target, OrbaxSource(path)) "
    f"{converted_prj['seconds']:.2f} s: ratio {converted_prj['seconds'] / recipes['seconds']:.2f}"
  )


if __name__ == "__main__":
  main()
