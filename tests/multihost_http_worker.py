"""One process of the two-process URL tests (tests/test_remote.py over HTTP,
tests/test_object_stores.py for s3://, gs:// and hf://); not collected by pytest.

argv: process_id port url out.json [storage_options.json]. Each process restores a row-sharded
target (8 devices, 4 per process) from a safetensors checkpoint at the URL (seed 0, layers.0 ...
layers.N-1), and must fetch only its own rows. Without storage options the URL is the loopback
HTTP server of tests/http_server.py, which counts the bytes each X-Client header was sent.
Options ``{"orbax": {"env": {...}, "values": "file.npz"}}`` read an orbax checkpoint in a
bucket instead (tests/test_orbax_buckets.py): the environment reaches the store, the .npz holds
the saved values.
"""

import json
import os
import sys
import urllib.request

process_id, port, url, out_path = sys.argv[1:5]
options = json.loads(sys.argv[5]) if len(sys.argv) > 5 else None
orbax = options.pop("orbax", None) if options else None
os.environ.update(orbax["env"] if orbax else {})

import multihost_start  # noqa: E402

jax = multihost_start.start(process_id, port)

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import paramreg_jax as prj  # noqa: E402

client = f"process-{process_id}"
if options is None:  # tests/http_server.py: what it sent this client while the source opened
  src = prj.SafetensorsSource(url, storage_options={"headers": {"X-Client": client}})
  server = url.split("/ckpt")[0]
  header_bytes = json.load(urllib.request.urlopen(f"{server}/_stats"))["sent"].get(client, 0)
elif orbax:
  src, header_bytes = prj.OrbaxSource(url), 0
else:
  src = prj.SafetensorsSource(url, storage_options=options)
  header_bytes = 0
mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(8), ("x",))
rows = NamedSharding(mesh, P("x", None))
target = {
  key.replace(".", "_"): jax.ShapeDtypeStruct(src.metadata(key).shape, np.float32, sharding=rows)
  for key in src.keys()
}
params = prj.restore(target, src, rename=None if orbax else [(r"(.*)\.(.*)\.(.*)", r"\1_\2_\3")])
if orbax:
  written = dict(np.load(orbax["values"]))
else:  # the values the test wrote (seed 0, layers.0 ... layers.N-1 in order)
  rng = np.random.default_rng(0)
  count = len(src.keys())
  shape = src.metadata("layers.0.weight").shape
  written = {
    f"layers_{i}_weight": rng.standard_normal(shape, dtype=np.float32) for i in range(count)
  }
checked = 0
for name, arr in params.items():
  for shard in arr.addressable_shards:
    np.testing.assert_array_equal(np.asarray(shard.data), written[name][shard.index])
    checked += 1
with open(out_path, "w") as f:
  json.dump({"header_bytes": header_bytes, "checked": checked}, f)
jax.distributed.shutdown()
