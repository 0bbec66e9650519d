"""One process of the two-process test (tests/test_multihost.py); not collected by pytest.

argv: process_id port checkpoint_dir reference.npz out.json
"""

import json
import sys

process_id, port, ckpt_dir, reference, out_path = sys.argv[1:6]

import multihost_start  # noqa: E402

jax = multihost_start.start(process_id, port)

import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import paramreg_jax as prj  # noqa: E402
from paramreg_jax import recipes as R  # noqa: E402

assert jax.process_count() == 2 and jax.device_count() == 8 and jax.local_device_count() == 4
mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(8), ("x",))
rows = NamedSharding(mesh, P("x", None))
src = prj.OrbaxSource(ckpt_dir)
split = R.fused_split("fused", 0, {"a": 64, "b": 64})
target = {
  "a": jax.ShapeDtypeStruct((64, 16), np.float32, sharding=rows),
  "b": jax.ShapeDtypeStruct((64, 16), np.float32, sharding=rows),
  "w": jax.ShapeDtypeStruct((128, 16), np.float32, sharding=rows),
}
params = prj.restore(target, src, recipes=dict(split))
ref = np.load(reference)
checked = 0
for name, arr in params.items():
  for shard in arr.addressable_shards:
    np.testing.assert_array_equal(np.asarray(shard.data), ref[f"param_{name}"][shard.index])
    checked += 1

tx = prj.keyed(optax.adam(1e-2))


@jax.jit
def step(params, state):
  grads = jax.tree.map(lambda p: jax.numpy.sin(p), params)
  updates, state = tx.update(grads, state, params)
  return optax.apply_updates(params, updates), state


state = tx.init(params)
new_params, state = step(params, state)
for name, arr in new_params.items():
  for shard in arr.addressable_shards:
    np.testing.assert_array_equal(np.asarray(shard.data), ref[f"step_{name}"][shard.index])
    checked += 1
stats = src.stats
with open(out_path, "w") as f:
  json.dump({"bytes_read": stats.bytes_read, "reads": stats.reads, "checked": checked}, f)
jax.distributed.shutdown()
