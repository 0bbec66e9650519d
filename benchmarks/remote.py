"""Restore throughput over HTTP on loopback, against reading the same file locally.

Run: python benchmarks/remote.py [--mib 512] [--repeat 3]

A safetensors file of float32 [1024, 2048] kernels stored [out, in] is served by
``tests/http_server.py`` (a separate process, honouring Range), and restored with a transpose
on every kernel into a (4, 2)-sharded target, each restore in a fresh process: once from the
local path, once from the URL. Beside them, the raw throughput of the same server: a plain loop
of ranged GETs (16 threads, 8 MiB each) that only fetches the file, so the overhead the restore
adds over the wire is visible. The server sends file bytes with ``sendfile`` (the kernel
copies them), so it is not what limits the loopback. Each case runs ``--repeat`` times,
interleaved; reported: the median time and throughput, the ratios of the medians, and the
bytes the server sent against the file's size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

ROWS, COLS = 1024, 2048
HERE = os.path.dirname(os.path.abspath(__file__))


def run_case(where: str) -> dict:
  import paramreg_jax as prj

  prj.use_cpu_devices(8)
  import jax
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from paramreg_jax import recipes as R

  grid = NamedSharding(jax.make_mesh((4, 2), ("x", "y")), P("x", "y"))
  jax.device_put(np.zeros((8, 8), np.float32), grid).block_until_ready()
  t0 = time.perf_counter()
  src = prj.SafetensorsSource(where)
  target = {
    "layers": {
      k.split(".")[1]: {"kernel": jax.ShapeDtypeStruct((COLS, ROWS), np.float32, sharding=grid)}
      for k in src.keys()
    }
  }
  recipes = {
    f"layers/{k.split('.')[1]}/kernel": R.transpose(R.source(k), (1, 0)) for k in src.keys()
  }
  out = prj.restore(target, src, recipes=recipes)
  jax.block_until_ready(out)
  return {"seconds": time.perf_counter() - t0, "bytes": src.stats.bytes_read}


def raw_gets(url: str, chunk: int = 8 << 20, threads: int = 16) -> dict:
  """The file at ``url`` fetched by plain ranged GETs in ``threads`` threads, into nothing."""
  from concurrent.futures import ThreadPoolExecutor

  head = urllib.request.Request(url, method="HEAD")
  size = int(urllib.request.urlopen(head).headers["Content-Length"])

  def get(start: int) -> int:
    end = min(size, start + chunk) - 1
    request = urllib.request.Request(url, headers={"Range": f"bytes={start}-{end}"})
    with urllib.request.urlopen(request) as r:
      return len(r.read())

  t0 = time.perf_counter()
  with ThreadPoolExecutor(threads) as pool:
    got = sum(pool.map(get, range(0, size, chunk)))
  assert got == size, (got, size)
  return {"seconds": time.perf_counter() - t0, "bytes": got}


def median(runs: list[dict]) -> dict:
  return sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]


def measure(where: str) -> dict:
  proc = subprocess.run([sys.executable, __file__, "--case", where], capture_output=True, text=True)
  if proc.returncode:
    raise SystemExit(f"{where} failed:\n{proc.stderr[-3000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--mib", type=int, default=512)
  parser.add_argument("--repeat", type=int, default=3)
  parser.add_argument("--case", default=None)
  args = parser.parse_args()
  if args.case:
    raw = args.case.startswith("raw:")
    print(json.dumps(raw_gets(args.case[4:]) if raw else run_case(args.case)))
    return
  with tempfile.TemporaryDirectory() as work:
    count = args.mib * 2**20 // (ROWS * COLS * 4)
    os.makedirs(os.path.join(work, "ckpt"))
    path = os.path.join(work, "ckpt", "model.safetensors")
    code = (
      "import numpy as np\nfrom safetensors.numpy import save_file\n"
      "rng = np.random.default_rng(0)\n"
      f"save_file({{f'layers.{{i:04d}}.weight': rng.standard_normal(({ROWS}, {COLS}), "
      f"dtype=np.float32) for i in range({count})}}, {path!r})\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    server = subprocess.Popen(
      [sys.executable, os.path.join(HERE, "..", "tests", "http_server.py"), work],
      stdout=subprocess.PIPE,
      text=True,
    )
    try:
      assert server.stdout is not None
      url = server.stdout.readline().strip()
      runs: dict[str, list[dict]] = {"local": [], "remote": [], "raw": []}
      for _ in range(args.repeat):
        runs["local"].append(measure(path))
        before = json.load(urllib.request.urlopen(f"{url}/_stats"))["sent"].get("-", 0)
        runs["remote"].append(measure(f"{url}/ckpt/model.safetensors"))
        sent = json.load(urllib.request.urlopen(f"{url}/_stats"))["sent"]["-"] - before
        runs["raw"].append(measure(f"raw:{url}/ckpt/model.safetensors"))
      local, remote, raw = (median(runs[k]) for k in ("local", "remote", "raw"))
    finally:
      server.terminate()
      server.wait()
    size = os.path.getsize(path)
  gb = 1e9
  print(
    f"{count} kernels [{ROWS}, {COLS}] float32 ({size / 2**20:.0f} MiB), (4, 2) mesh, transposed; "
    f"median of {args.repeat}"
  )
  print(f"local file: {local['seconds']:.2f} s ({size / gb / local['seconds']:.2f} GB/s)")
  print(f"HTTP on loopback: {remote['seconds']:.2f} s ({size / gb / remote['seconds']:.2f} GB/s)")
  print(
    f"raw ranged GETs, same server: {raw['seconds']:.2f} s ({size / gb / raw['seconds']:.2f} GB/s)"
  )
  print(f"ratio HTTP / local: {remote['seconds'] / local['seconds']:.2f}")
  print(f"ratio HTTP restore / raw GETs: {remote['seconds'] / raw['seconds']:.2f} (what we add)")
  print(f"bytes the server sent / file size: {sent / size:.3f}")


if __name__ == "__main__":
  main()
