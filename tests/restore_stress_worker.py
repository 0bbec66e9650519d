"""Restores a column-sharded target through transposing and concatenating recipes, many times.

Run by tests/test_reliability.py in a process of its own (not collected by pytest).
argv: restores layers
"""

import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"

from paramreg_jax._src.devices import use_cpu_devices

use_cpu_devices(8)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import paramreg_jax as prj  # noqa: E402
from paramreg_jax import MemorySource  # noqa: E402
from paramreg_jax import recipes as R  # noqa: E402

restores, layers = int(sys.argv[1]), int(sys.argv[2])
mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
cols = NamedSharding(mesh, P(None, ("data", "model")))
rng = np.random.default_rng(0)
tensors = {
  f"l{i}.{p}.weight": rng.standard_normal((8, 16)).astype(np.float32)
  for i in range(layers)
  for p in "qkv"
}
source = MemorySource(tensors)
target, recipes = {}, {}
for i in range(layers):
  target[f"l{i}"] = {
    "qkv": jax.ShapeDtypeStruct((16, 24), np.float32, sharding=cols),
    "q": jax.ShapeDtypeStruct((16, 8), np.float32, sharding=cols),
  }
  # the fused recipe's device transform is an all-to-all: a collective program per layer
  recipes[f"l{i}/qkv"] = R.concatenate(
    [R.transpose(R.source(f"l{i}.{p}.weight"), (1, 0)) for p in "qkv"], 1
  )
  recipes[f"l{i}/q"] = R.transpose(R.source(f"l{i}.q.weight"), (1, 0))
for _ in range(restores):
  out = prj.restore(target, source, recipes=recipes)
last = layers - 1
want = np.concatenate([tensors[f"l{last}.{p}.weight"].T for p in "qkv"], 1)
assert np.array_equal(np.asarray(out[f"l{last}"]["qkv"]), want)
assert out[f"l{last}"]["qkv"].sharding == cols
print(f"ok: {restores} restores of {layers} fused layers")
