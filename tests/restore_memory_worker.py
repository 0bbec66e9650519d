"""Restores ~256 MB of transposed kernels from safetensors and prints the peak RSS growth.

Run by tests/test_restore_memory.py in a fresh process (so the peak is this restore's own):
    python restore_memory_worker.py PATH MAX_INFLIGHT_BYTES
"""

import json
import os
import sys

import paramreg_jax as prj

prj.use_cpu_devices(8)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from paramreg_jax import recipes as R  # noqa: E402


def rss() -> int:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
  """This process image's peak RSS (``VmHWM``). ``ru_maxrss`` would not do: Linux carries it
  over ``fork`` + ``exec``, so a child of a large parent reports the parent's peak."""
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def main() -> None:
  path, budget = sys.argv[1], int(sys.argv[2])
  src = prj.SafetensorsSource(path)
  grid = NamedSharding(jax.make_mesh((4, 2), ("x", "y")), P("x", "y"))
  jax.device_put(np.zeros((8, 8), np.float32), grid).block_until_ready()  # warm the runtime up
  target = {}
  for key in src.keys():
    rows, cols = src.metadata(key).shape
    target[key] = jax.ShapeDtypeStruct((cols, rows), np.float32, sharding=grid)
  before = rss()
  out = prj.restore(
    target,
    src,
    recipes={k: R.transpose(R.source(k), (1, 0)) for k in target},
    max_inflight_bytes=budget,
  )
  jax.block_until_ready(out)
  peak = peak_rss()
  restored = sum(x.nbytes for x in out.values())
  probe = out[src.keys()[-1]]
  print(
    json.dumps(
      {
        "growth": peak - before,
        "restored": restored,
        "bytes_read": src.stats.bytes_read,
        "corner": float(np.asarray(probe.addressable_shards[0].data)[0, 0]),
      }
    )
  )


if __name__ == "__main__":
  main()
