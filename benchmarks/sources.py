"""Source read throughput as ratios against the reference readers, in one run.

Run: python benchmarks/sources.py [--gb 1.0] [--tensors 64]
Targets (issue 4):
  * SafetensorsSource full read / safetensors.numpy.load_file:  >= 0.9x the speed
  * OrbaxSource full read / StandardCheckpointer.restore to numpy: >= 0.9x the speed
  * region read of 1/8 of every tensor: bytes read <= 1/8 of the file + per-tensor overhead
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np


def best_of(fn, repeat=3):
  times = []
  for _ in range(repeat):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return min(times), statistics.median(times)


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--gb", type=float, default=1.0)
  ap.add_argument("--tensors", type=int, default=64)
  args = ap.parse_args()
  import jax  # noqa: F401  (orbax needs it initialised)
  import orbax.checkpoint as ocp
  from safetensors.numpy import load_file
  from safetensors.numpy import save_file

  from paramreg_jax import OrbaxSource
  from paramreg_jax import SafetensorsSource

  per = int(args.gb * 2**30) // args.tensors // 4
  cols = 1024
  rows = max(8, per // cols // 8 * 8)
  rng = np.random.default_rng(0)
  tensors = {
    f"layer_{i:03d}": rng.standard_normal((rows, cols), dtype=np.float32)
    for i in range(args.tensors)
  }
  total = sum(t.nbytes for t in tensors.values())
  with tempfile.TemporaryDirectory() as tmp:
    st = os.path.join(tmp, "model.safetensors")
    save_file(tensors, st)
    ob = os.path.join(tmp, "ckpt")
    ckpt = ocp.StandardCheckpointer()
    # 8 chunks per tensor (what a save from 8 row-sharded devices produces), so that region
    # reads can be physically bounded; orbax's restore reads the same chunks.
    save_args = {k: ocp.SaveArgs(chunk_byte_size=v.nbytes // 8) for k, v in tensors.items()}
    ocp.Checkpointer(ocp.StandardCheckpointHandler()).save(
      ob, args=ocp.args.StandardSave(tensors, save_args=save_args)
    )
    ckpt.wait_until_finished()
    del tensors
    print(f"{args.tensors} float32 tensors of ({rows}, {cols}), {total / 2**30:.2f} GiB")

    base, _ = best_of(lambda: load_file(st))
    src = SafetensorsSource(st)
    ours, _ = best_of(lambda: {k: src.lease(k).read() for k in src.keys()})
    print(
      f"safetensors full read: load_file {total / base / 2**30:.2f} GiB/s, SafetensorsSource "
      f"{total / ours / 2**30:.2f} GiB/s, speed ratio {base / ours:.2f} (target >= 0.9)"
    )

    abstract = {k: np.empty((rows, cols), np.float32) for k in OrbaxSource(ob).keys()}
    restore_args = {k: ocp.RestoreArgs(restore_type=np.ndarray) for k in abstract}
    pt = ocp.PyTreeCheckpointer()
    base, _ = best_of(
      lambda: pt.restore(ob, args=ocp.args.PyTreeRestore(item=abstract, restore_args=restore_args))
    )
    osrc = OrbaxSource(ob)
    full = [(k, tuple((0, d) for d in osrc.metadata(k).shape)) for k in osrc.keys()]
    ours, _ = best_of(lambda: osrc.read_many(full))
    print(
      f"orbax full read: PyTreeCheckpointer.restore(np) {total / base / 2**30:.2f} GiB/s, OrbaxSource "
      f"{total / ours / 2**30:.2f} GiB/s, speed ratio {base / ours:.2f} (target >= 0.9)"
    )

    for name, s in (("safetensors", SafetensorsSource(st)), ("orbax", OrbaxSource(ob))):
      for k in s.keys():
        s.lease(k).read((slice(0, rows // 8),))
      frac = s.stats.bytes_read / total
      print(
        f"{name} region read of 1/8 of every tensor: {s.stats.bytes_read / 2**20:.1f} MiB = "
        f"{frac:.4f} of the checkpoint (target <= 0.125 + overhead)"
      )


if __name__ == "__main__":
  main()
