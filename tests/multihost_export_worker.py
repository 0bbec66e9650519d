"""One process of the two-process export test (tests/test_multihost.py); not collected.

argv: process_id port out_dir result.json
"""

import json
import os
import sys

process_id, port, out_dir, result = sys.argv[1:5]
sys.path.insert(0, os.path.dirname(__file__))

import multihost_start  # noqa: E402

jax = multihost_start.start(process_id, port)

import multihost_export_model as model  # noqa: E402

import paramreg_jax as prj  # noqa: E402

assert jax.process_count() == 2 and jax.device_count() == 8
src, target, recipes = model.setup()
params = model.trained(prj.restore(target, src, recipes=recipes))
assert not params["w"].is_fully_addressable


def rss(field):
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))


# the first export compiles its few XLA programs (slices, gathers, barriers: a fixed cost of
# LLVM, not of the model); the second, into another directory, measures the data path
prj.export(
  params,
  recipes,
  out_dir,
  source=src,
  max_shard_bytes=model.SHARD_BYTES,
  max_inflight_bytes=model.BUDGET,
)
with open("/proc/self/clear_refs", "w") as f:
  f.write("5")  # resets the peak (VmHWM) to the current RSS
before = rss("VmRSS:")
plan = prj.export(
  params,
  recipes,
  out_dir + "-again",
  source=src,
  max_shard_bytes=model.SHARD_BYTES,
  max_inflight_bytes=model.BUDGET,
)
growth = rss("VmHWM:") - before
with open(result, "w") as f:
  json.dump({"growth": growth, "model": plan.nbytes, "tensors": len(plan.tensors)}, f)
jax.distributed.shutdown()
