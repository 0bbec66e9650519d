"""Restore throughput over HTTP on loopback, against reading the same file locally.

Run: python benchmarks/remote.py [--mib 512] [--repeat 3] [--server own|suite]

A safetensors file of float32 [1024, 2048] kernels stored [out, in] is served over loopback
HTTP and restored with a transpose on every kernel into a (4, 2)-sharded target, each restore
in a fresh process: once from the local path, once from the URL. Beside them, the raw
throughput of the same server: a plain loop of ranged GETs (16 threads, 8 MiB each) that only
fetches the file, so the overhead the restore adds over the wire is visible.

The server is this file's own by default (``--server own``: a separate process, the standard
library's threaded server with a listen backlog of 128, ``Range`` answered with ``sendfile``,
nothing else), not the suite's (``--server suite``: ``tests/http_server.py``, which also counts
bytes per client). Each case runs ``--repeat`` times, interleaved; reported: the median time
and throughput, the ratios of the medians (the acceptance of issue #46 is the restore against
the slower of the local restore and the raw GETs), and where the time goes: the CPU seconds of
the restoring process and of the server, and the floor they make on this machine's cores
(both share them on loopback).
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


SERVER = r"""
import http.server, os, re, sys

class Handler(http.server.BaseHTTPRequestHandler):
  protocol_version = "HTTP/1.1"

  def log_message(self, *args):
    pass

  def do_GET(self):
    path = os.path.join(ROOT, self.path.lstrip("/"))
    if not os.path.isfile(path):
      self.send_error(404)
      return
    size = os.path.getsize(path)
    m = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
    start, end = (int(m.group(1)), min(int(m.group(2)), size - 1)) if m else (0, size - 1)
    self.send_response(206 if m else 200)
    self.send_header("Content-Length", str(end - start + 1))
    if m:
      self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
    self.send_header("ETag", f'"{size}"')
    self.end_headers()
    with open(path, "rb") as f:
      done = 0
      while done < end - start + 1:
        done += self.connection.sendfile(f, offset=start + done, count=end - start + 1 - done)

  do_HEAD = do_GET

class Server(http.server.ThreadingHTTPServer):
  request_queue_size = 128
  daemon_threads = True

ROOT = sys.argv[1]
server = Server(("127.0.0.1", 0), Handler)
print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
server.serve_forever()
"""


def cpu_seconds(pid: int | None = None) -> float:
  """User + system CPU seconds of this process (its finished children too), or of ``pid``."""
  if pid is None:
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime
  with open(f"/proc/{pid}/stat") as f:
    fields = f.read().rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
  c0, t0 = cpu_seconds(), time.perf_counter()
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
  seconds = time.perf_counter() - t0
  return {"seconds": seconds, "cpu": cpu_seconds() - c0, "bytes": src.stats.bytes_read}


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

  c0, t0 = cpu_seconds(), time.perf_counter()
  with ThreadPoolExecutor(threads) as pool:
    got = sum(pool.map(get, range(0, size, chunk)))
  assert got == size, (got, size)
  return {"seconds": time.perf_counter() - t0, "cpu": cpu_seconds() - c0, "bytes": got}


def median(runs: list[dict]) -> dict:
  return sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]


def measure(where: str, server: int | None = None) -> dict:
  """One case in a fresh process; with ``server`` (its pid), the server's CPU seconds too."""
  before = cpu_seconds(server) if server else 0.0
  proc = subprocess.run([sys.executable, __file__, "--case", where], capture_output=True, text=True)
  if proc.returncode:
    raise SystemExit(f"{where} failed:\n{proc.stderr[-3000:]}")
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  out["server_cpu"] = cpu_seconds(server) - before if server else 0.0
  return out


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--mib", type=int, default=512)
  parser.add_argument("--repeat", type=int, default=3)
  parser.add_argument("--server", choices=("own", "suite"), default="own")
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
    if args.server == "own":
      command = [sys.executable, "-c", SERVER, work]
    else:
      command = [sys.executable, os.path.join(HERE, "..", "tests", "http_server.py"), work]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
      assert server.stdout is not None
      url = server.stdout.readline().strip()
      runs: dict[str, list[dict]] = {"local": [], "remote": [], "raw": []}
      for _ in range(args.repeat):
        runs["local"].append(measure(path))
        runs["remote"].append(measure(f"{url}/ckpt/model.safetensors", server.pid))
        runs["raw"].append(measure(f"raw:{url}/ckpt/model.safetensors", server.pid))
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
  slower = max(local["seconds"], raw["seconds"])
  print(f"ratio HTTP / max(local, raw GETs): {remote['seconds'] / slower:.2f} (#46: <= 1.3)")
  cores = len(os.sched_getaffinity(0))
  for name, run in (("local", local), ("HTTP", remote), ("raw GETs", raw)):
    both = run["cpu"] + run["server_cpu"]
    print(
      f"CPU seconds, {name}: restoring process {run['cpu']:.2f} + server "
      f"{run['server_cpu']:.2f} = {both:.2f}; over {cores} cores at least {both / cores:.2f} s"
    )
  print(f"bytes read / file size: {remote['bytes'] / size:.3f}")


if __name__ == "__main__":
  main()
