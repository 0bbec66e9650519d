"""One process of the two-process object-store test (tests/test_object_stores.py); not
collected by pytest.

argv: process_id port url storage_options.json out.json. Each process restores a row-sharded
target (8 devices, 4 per process) from the store and must fetch only its own rows.
"""

import json
import os
import sys

process_id, port, url, options, out_path = sys.argv[1:6]
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

from paramreg_jax._src.devices import use_cpu_devices  # noqa: E402

use_cpu_devices(4)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
  coordinator_address=f"127.0.0.1:{port}",
  num_processes=2,
  process_id=int(process_id),
  initialization_timeout=60,
)

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import paramreg_jax as prj  # noqa: E402

src = prj.SafetensorsSource(url, storage_options=json.loads(options))
mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(8), ("x",))
rows = NamedSharding(mesh, P("x", None))
target = {
  key.replace(".", "_"): jax.ShapeDtypeStruct(src.metadata(key).shape, np.float32, sharding=rows)
  for key in src.keys()
}
params = prj.restore(target, src, rename=[(r"(.*)\.(.*)\.(.*)", r"\1_\2_\3")])
# the values the test wrote (checkpoint(): seed 0, layers.0 ... layers.N-1 in order)
rng = np.random.default_rng(0)
shape = src.metadata("layers.0.weight").shape
written = {f"layers_{i}_weight": rng.standard_normal(shape, dtype=np.float32) for i in range(8)}
checked = 0
for name, array in params.items():
  for shard in array.addressable_shards:
    np.testing.assert_array_equal(np.asarray(shard.data), written[name][shard.index])
    checked += 1
with open(out_path, "w") as f:
  json.dump({"checked": checked, "bytes_read": src.stats.bytes_read}, f)
jax.distributed.shutdown()
