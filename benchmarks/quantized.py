"""A 4-bit GGUF (Q4_K) restored into a (4, 2)-sharded float32 target, against the naive path
(``gguf.quants.dequantize`` of each whole tensor on the host, then ``jax.device_put``): time
ratio (goal <= 0.5) and peak host RSS growth beyond the restored arrays (goal <= the quantized
bytes + the budget). Each case runs in a fresh subprocess with 8 virtual CPU devices, so its
peak RSS is its own.

Run: python benchmarks/quantized.py [--tensors 16] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROWS, COLS = 2048, 4096  # stored [out, in], Q4_K: 2048 x 16 blocks of 144 bytes


def peak_rss_bytes() -> int:
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def rss_bytes() -> int:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def write(path: str, tensors: int) -> None:
  import gguf
  import numpy as np

  rng = np.random.default_rng(0)
  w = gguf.GGUFWriter(path, "llama")
  for i in range(tensors):
    blocks = rng.integers(0, 256, (ROWS * COLS // 256, 144), dtype=np.uint8)
    blocks[:, 0:2] = np.full((len(blocks), 1), 1e-3, np.float16).view(np.uint8)
    blocks[:, 2:4] = np.full((len(blocks), 1), 2e-3, np.float16).view(np.uint8)
    w.add_tensor(
      f"blk.{i}.ffn_up.weight", blocks.reshape(ROWS, -1), raw_dtype=gguf.GGMLQuantizationType.Q4_K
    )
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def run_case(case: str, path: str, tensors: int) -> dict:
  import paramreg_jax as prj

  prj.use_cpu_devices(8)
  import gguf
  import jax
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from paramreg_jax import recipes as R

  mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2), ("a", "b"))
  sharding = NamedSharding(mesh, P("a", "b"))
  keys = [f"blk.{i}.ffn_up.weight" for i in range(tensors)]
  jax.device_put(np.zeros((8, 8), np.float32), sharding).block_until_ready()  # warm up
  base = rss_bytes()
  start = time.perf_counter()
  if case == "naive":
    reader = gguf.GGUFReader(path)
    by_name = {t.name: t for t in reader.tensors}
    out = []
    for k in keys:
      t = by_name[k]
      values = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
      out.append(jax.device_put(values, sharding))
    jax.block_until_ready(out)
  else:
    src = prj.GGUFSource(path)
    target = {k: jax.ShapeDtypeStruct((ROWS, COLS), np.float32, sharding=sharding) for k in keys}
    recipes = {k: R.dequantize(R.source(k), "Q4_K") for k in keys}
    out = jax.block_until_ready(prj.restore(target, src, recipes=recipes))
  seconds = time.perf_counter() - start
  return {"seconds": seconds, "growth": peak_rss_bytes() - base}


def measure(case: str, path: str, tensors: int) -> dict:
  code = [sys.executable, __file__, "--case", case, "--path", path, "--tensors", str(tensors)]
  done = subprocess.run(code, capture_output=True, text=True, check=True)
  return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--tensors", type=int, default=16)
  parser.add_argument("--repeat", type=int, default=3)
  parser.add_argument("--case", default=None)
  parser.add_argument("--path", default=None)
  args = parser.parse_args()
  if args.case:
    print(json.dumps(run_case(args.case, args.path, args.tensors)))
    return
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "q4k.gguf")
    write(path, args.tensors)
    quantized = os.path.getsize(path)
    restored = args.tensors * ROWS * COLS * 4
    runs = {"naive": [], "paramreg": []}
    for _ in range(args.repeat):  # interleaved, so load on the machine hits both alike
      for case in runs:
        runs[case].append(measure(case, path, args.tensors))
  t = {c: statistics.median(r["seconds"] for r in rs) for c, rs in runs.items()}
  g = {c: statistics.median(r["growth"] for r in rs) for c, rs in runs.items()}
  budget = 16 << 20
  mb = 1e6
  print(
    f"{args.tensors} Q4_K [{ROWS}, {COLS}] tensors: {quantized / mb:.0f} MB quantized, "
    f"{restored / mb:.0f} MB as float32, on a (4, 2) mesh of CPU devices"
  )
  print(
    f"  time, paramreg / naive (gguf dequantize + device_put)   {t['paramreg'] / t['naive']:.2f} "
    f"({t['paramreg']:.2f} s vs {t['naive']:.2f} s)  (goal <= 0.5)"
  )
  beyond = g["paramreg"] - restored
  print(
    f"  peak RSS growth beyond the restored arrays               {beyond / mb:.0f} MB "
    f"(naive: {(g['naive'] - restored) / mb:.0f} MB)  (goal <= {(quantized + budget) / mb:.0f} MB: "
    "the quantized bytes + the budget)"
  )


if __name__ == "__main__":
  main()
