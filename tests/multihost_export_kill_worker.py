"""One process of the export-with-a-dead-peer test (tests/test_multihost.py); not collected.

argv: process_id port out_dir result.json mode. ``mode`` is ``kill`` (process 1 is killed in
the middle of the export's exchanges) or ``fail`` (process 0 fails writing its tensors).
Process 0 writes what its ``export`` raised to result.json.
"""

import json
import os
import signal
import sys

process_id, port, out_dir, result, mode = sys.argv[1:6]
sys.path.insert(0, os.path.dirname(__file__))

import multihost_start  # noqa: E402

jax = multihost_start.start(process_id, port)

import multihost_export_model as model  # noqa: E402

import paramreg_jax as prj  # noqa: E402
from paramreg_jax._src.export import multihost  # noqa: E402

src, target, recipes = model.setup()
params = model.trained(prj.restore(target, src, recipes=recipes))
me = jax.process_index()
if mode == "kill" and me == 1:
  exchange, calls = multihost._exchange, []

  def dying(mine):
    calls.append(1)
    if len(calls) == 2:  # after the files exist and a tensor was exchanged
      os.kill(os.getpid(), signal.SIGKILL)
    return exchange(mine)

  multihost._exchange = dying
if mode == "fail" and me == 0:

  def failing(*args, **kwargs):
    raise OSError(28, "No space left on device")

  multihost.write_tensor = failing
try:
  prj.export(
    params, recipes, out_dir, source=src, max_shard_bytes=model.SHARD_BYTES, overwrite=True
  )
  outcome = {"raised": None}
except Exception as e:
  outcome = {"raised": type(e).__name__, "message": str(e)}
with open(result, "w") as f:
  json.dump(outcome, f)
sys.stdout.flush()
os._exit(0)  # a dead peer: jax.distributed.shutdown would wait for it
