"""Restore time, peak host memory and bytes read, as ratios against baselines in one run.

Run: python benchmarks/restore.py [--quick]

Prints every figure of the README's restore table (issue 11), each case in a fresh subprocess
with 8 virtual CPU devices so its peak RSS is its own:

  1. safetensors, 32 [1024, 2048] float32 kernels stored [out, in], restored through a transpose
     recipe into a (4, 2)-sharded [in, out] target, against ``safetensors.numpy.load_file`` +
     ``np.transpose`` + ``jax.device_put``: peak RSS growth ratio (goal <= 0.5) and time ratio
     (goal <= 0.6);
  2. the same arrays in an orbax checkpoint saved with the target's sharding, restored into it:
     time / ``StandardCheckpointer.restore`` (goal <= 0.5);
  3. bytes read / bytes the shards need, column-sharded target over row-chunked orbax storage
     (goal <= 1.1);
  4. the same for an orbax checkpoint saved unsharded (one chunk per array) restored into a
     row-sharded 8-device target (goal <= 1.1);
  5. peak RSS of a 1 GiB safetensors restore with a transpose on every kernel, default settings
     (goal <= 1.5 GB), beside the baseline's.

Times are the best of ``--repeat`` runs; memory is the first run's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROWS, COLS = 1024, 2048  # stored [out, in]


def rss_bytes() -> int:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
  """This process image's peak RSS (``VmHWM``). ``ru_maxrss`` would not do: Linux carries it
  over ``fork`` + ``exec``, so a child of a large parent reports the parent's peak."""
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def run_case(case: str, workdir: str, tensors: int) -> dict:
  """One measurement, in this (fresh) process."""
  import paramreg_jax as prj

  prj.use_cpu_devices(8)
  import jax
  import numpy as np
  import orbax.checkpoint as ocp
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P
  from safetensors.numpy import load_file

  from paramreg_jax import recipes as R
  from paramreg_jax._src.restore.jax_backend.budget import default_max_inflight_bytes

  names = [f"layer_{i:03d}" for i in range(tensors)]
  mesh42 = jax.make_mesh((4, 2), ("x", "y"))
  mesh8 = jax.make_mesh((8,), ("x",))
  grid = NamedSharding(mesh42, P("x", "y"))
  st_path = os.path.join(workdir, f"model_{tensors}.safetensors")
  kernel = {n: jax.ShapeDtypeStruct((COLS, ROWS), np.float32, sharding=grid) for n in names}
  stored = {n: jax.ShapeDtypeStruct((ROWS, COLS), np.float32, sharding=grid) for n in names}
  cols8 = NamedSharding(mesh8, P(None, "x"))
  rows8 = NamedSharding(mesh8, P("x", None))
  jax.device_put(np.zeros(8, np.float32), NamedSharding(mesh8, P("x"))).block_until_ready()
  source = None
  before = rss_bytes()
  t0 = time.perf_counter()
  if case == "st_base":
    loaded = load_file(st_path)
    out = {n: jax.device_put(np.ascontiguousarray(loaded[n].T), grid) for n in names}
    del loaded
  elif case == "st_ours":
    source = prj.SafetensorsSource(st_path)
    out = prj.restore(kernel, source, recipes={n: R.transpose(R.source(n), (1, 0)) for n in names})
  elif case == "orbax_base":
    out = ocp.StandardCheckpointer().restore(os.path.join(workdir, "orbax_grid"), stored)
  elif case == "orbax_ours":
    out = prj.restore(stored, prj.OrbaxSource(os.path.join(workdir, "orbax_grid")))
  elif case in ("orbax_cols", "orbax_unsharded"):
    path, sharding = ("orbax_rows", cols8) if case == "orbax_cols" else ("orbax_single", rows8)
    source = prj.OrbaxSource(os.path.join(workdir, path))
    target = {n: jax.ShapeDtypeStruct((ROWS, COLS), np.float32, sharding=sharding) for n in names}
    out = prj.restore(target, source)
  else:
    raise SystemExit(f"unknown case {case}")
  jax.block_until_ready(out)
  seconds = time.perf_counter() - t0
  first = next(iter(out.values()))
  return {
    "seconds": seconds,
    "rss_before": before,
    "peak": peak_rss_bytes(),
    "growth": peak_rss_bytes() - before,
    "bytes_read": source.stats.bytes_read if source is not None else None,
    "needed": sum(x.nbytes for x in out.values()),
    "budget": default_max_inflight_bytes(),
    "checksum": float(np.asarray(first.addressable_shards[0].data).sum()),
  }


def make_data(workdir: str, tensors: list[int]) -> None:
  """Writes the checkpoints in a subprocess (so the measuring processes start clean)."""
  code = f"""
import os, numpy as np, paramreg_jax as prj
prj.use_cpu_devices(8)
import jax, orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec as P
from safetensors.numpy import save_file
mesh42, mesh8 = jax.make_mesh((4, 2), ("x", "y")), jax.make_mesh((8,), ("x",))
for n in {tensors!r}:
  rng = np.random.default_rng(n)
  t = {{f"layer_{{i:03d}}": rng.standard_normal(({ROWS}, {COLS}), dtype=np.float32) for i in range(n)}}
  save_file(t, os.path.join({workdir!r}, f"model_{{n}}.safetensors"))
  if n != {tensors[0]}:
    continue
  ckpt = ocp.StandardCheckpointer()
  for name, sharding in (
    ("orbax_grid", NamedSharding(mesh42, P("x", "y"))),
    ("orbax_rows", NamedSharding(mesh8, P("x", None))),
    ("orbax_single", jax.sharding.SingleDeviceSharding(jax.devices()[0])),
  ):
    ckpt.save(os.path.join({workdir!r}, name), {{k: jax.device_put(v, sharding) for k, v in t.items()}})
    ckpt.wait_until_finished()
"""
  subprocess.run([sys.executable, "-c", code], check=True)


def measure(case: str, workdir: str, tensors: int, repeat: int) -> dict:
  best: dict | None = None
  for _ in range(repeat):
    proc = subprocess.run(
      [sys.executable, __file__, "--case", case, "--workdir", workdir, "--tensors", str(tensors)],
      capture_output=True,
      text=True,
    )
    if proc.returncode:
      raise SystemExit(f"case {case} failed:\n{proc.stderr[-3000:]}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    if best is None:
      best = r
    else:
      best["seconds"] = min(best["seconds"], r["seconds"])
  assert best is not None
  return best


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--case", default=None)
  ap.add_argument("--workdir", default=None)
  ap.add_argument("--tensors", type=int, default=32)
  ap.add_argument("--repeat", type=int, default=3)
  ap.add_argument("--quick", action="store_true", help="skip the 1 GiB case")
  args = ap.parse_args()
  if args.case:
    print(json.dumps(run_case(args.case, args.workdir, args.tensors)))
    return
  mb = 1e6
  small, large = 32, 128  # 268 MB and 1 GiB of float32 [1024, 2048]
  with tempfile.TemporaryDirectory() as tmp:
    make_data(tmp, [small] if args.quick else [small, large])
    r = {c: measure(c, tmp, small, args.repeat) for c in ("st_base", "st_ours")}
    r |= {c: measure(c, tmp, small, args.repeat) for c in ("orbax_base", "orbax_ours")}
    r |= {c: measure(c, tmp, small, 1) for c in ("orbax_cols", "orbax_unsharded")}
    sb, so, ob, oo = r["st_base"], r["st_ours"], r["orbax_base"], r["orbax_ours"]
    assert (
      abs(sb["checksum"] - so["checksum"]) < 1e-2 and abs(ob["checksum"] - oo["checksum"]) < 1e-2
    )
    weights = so["needed"]
    print(
      f"{small} float32 [{ROWS}, {COLS}] tensors ({weights / mb:.0f} MB), 8 CPU devices, "
      f"default budget max_inflight_bytes = {so['budget'] / 2**20:.0f} MiB"
    )
    rows = [
      (
        "peak RSS growth, paramreg / baseline (safetensors + transpose)",
        f"{so['growth'] / sb['growth']:.2f} ({so['growth'] / mb:.0f} MB vs {sb['growth'] / mb:.0f} MB; "
        f"floor {weights / sb['growth']:.2f}: the restored arrays)",
        "<= 0.5",
      ),
      (
        "time, paramreg / baseline (safetensors + transpose)",
        f"{so['seconds'] / sb['seconds']:.2f} ({so['seconds']:.3f} s vs {sb['seconds']:.3f} s)",
        "<= 0.6",
      ),
      (
        "orbax restore time, paramreg / StandardCheckpointer.restore",
        f"{oo['seconds'] / ob['seconds']:.2f} ({oo['seconds']:.3f} s vs {ob['seconds']:.3f} s)",
        "<= 0.5",
      ),
    ]
    for case, what in (
      ("orbax_cols", "bytes read / needed, column-sharded target over row-chunked orbax"),
      ("orbax_unsharded", "bytes read / needed, unsharded orbax into row-sharded 8 devices"),
    ):
      c = r[case]
      rows.append(
        (what, f"{c['bytes_read'] / c['needed']:.2f} ({c['bytes_read'] / mb:.0f} MB)", "<= 1.1")
      )
    if not args.quick:
      lb, lo = measure("st_base", tmp, large, 1), measure("st_ours", tmp, large, 1)
      rows.append(
        (
          f"peak RSS, {lo['needed'] / 2**30:.0f} GiB safetensors + transpose, default settings",
          f"{lo['peak'] / 1e9:.2f} GB (baseline {lb['peak'] / 1e9:.2f} GB; growth "
          f"{lo['growth'] / 1e9:.2f} GB for {lo['needed'] / 1e9:.2f} GB of weights)",
          "<= 1.5 GB",
        )
      )
    width = max(len(w) for w, _, _ in rows)
    for what, value, goal in rows:
      print(f"  {what:<{width}}  {value}  (goal {goal})")


if __name__ == "__main__":
  main()
