"""The model of the two-process export test, built alike on one host and on two processes."""

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import paramreg_jax as prj
from paramreg_jax import recipes as R

LAYERS = 32
SHARD_BYTES = 6 * 2**20  # several files: every process writes into more than one
BUDGET = 4 * 2**20  # bytes in flight (the peak is the largest tensor plus this)


def setup():
  """A Hugging Face-style source (per-layer [out, in] weights, an embedding), the stacked,
  transposed target spread over all 8 devices, and the recipes."""
  rng = np.random.default_rng(0)
  tensors = {
    f"layers.{i}.w": rng.standard_normal((256, 1024)).astype(np.float32) for i in range(LAYERS)
  }
  tensors["embed"] = rng.standard_normal((4096, 1024)).astype(np.float32)
  mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(8), ("x",))
  target = {
    "w": jax.ShapeDtypeStruct(
      (LAYERS, 1024, 256), np.float32, sharding=NamedSharding(mesh, P(None, None, "x"))
    ),
    "embed": jax.ShapeDtypeStruct(
      (4096, 1024), np.float32, sharding=NamedSharding(mesh, P("x", None))
    ),
  }
  recipes = {
    "w": R.stack([R.transpose(R.source(f"layers.{i}.w"), (1, 0)) for i in range(LAYERS)], axis=0),
    "embed": R.source("embed"),
  }
  return prj.MemorySource(tensors), target, recipes


def trained(params):
  """One 'training step': new values, same shardings."""
  return jax.jit(lambda p: jax.tree.map(lambda x: x * 0.5 + 1.0, p))(params)
