"""A JAX model that keeps a GGUF quantized: ``match`` proposes, with no hint, the recipes that
read each weight's integer values, scales and minimums from the file's blocks (through the
transposes, stacking and q/k row order it proposes for a float model); the restored parts are
what the blocks encode, bit for bit, a jitted matmul over them gives transformers' logits,
and they take under a third of the float model's memory."""

import json
import pathlib

import hf_models as hf
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import paramreg_jax as prj
from paramreg_jax import errors
from paramreg_jax import recipes as R

DATA = pathlib.Path(__file__).parent / "data" / "quantized"
GROUP = 32  # Q4_K: one scale and one minimum per 32 values


def dequantize_kernel(w):
  """The float kernel of a quantized one, ``{"qvalue": [..., in, out], "scale", "min":
  [..., in // group, out]}`` (the function docs/howto/gguf.md shows)."""
  q = w["qvalue"].astype(jnp.float32)
  group = q.shape[-2] // w["scale"].shape[-2]
  q = q.reshape((*q.shape[:-2], -1, group, q.shape[-1]))
  x = w["scale"][..., :, None, :] * q
  if "min" in w:
    x = x - w["min"][..., :, None, :]
  return x.reshape(w["qvalue"].shape)


@jax.jit
def qdot(x, w):
  return x @ dequantize_kernel(w)


def _llama():
  config = json.loads((DATA / "config.json").read_text())
  arch = hf.ARCHS["llama"]
  sizes = hf.Sizes.of(config, arch)
  return arch, sizes, hf.with_head(hf.canonical_shapes(arch, sizes), arch, sizes)


def _in_out(path, shape):
  """A kernel of the nnx style with its head axes merged: ``[..., in, out]``."""
  role = path[-2].key
  lead = 1 if len(shape) > 2 and path[0].key == "layers" else 0
  if role == "o":  # [L, heads, head_dim, hidden]
    return (*shape[:lead], shape[lead] * shape[lead + 1], shape[-1])
  if role in ("q", "k", "v"):  # [L, hidden, heads, head_dim]
    return (*shape[:lead], shape[lead], shape[-2] * shape[-1])
  return shape


def _place(shape, dtype, mesh):
  spec = [None] * len(shape)
  for axis_name, size in (("a", 4), ("b", 2)):
    for i in range(len(shape) - 1, -1, -1):
      if spec[i] is None and shape[i] % size == 0 and shape[i] >= size:
        spec[i] = axis_name
        break
  return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P(*spec)))


def _quantized_target(mesh, values_dtype=ml_dtypes.uint4, group=GROUP, mins=True):
  """The nnx-style Llama with every matrix kept as Q4_K parts; norms and the embedding float."""
  arch, sizes, shapes = _llama()
  floats = hf.target(hf.STYLES["nnx"], shapes, arch, sizes)

  def leaf(path, x):
    if path[-1].key != "kernel":
      return _place(x.shape, np.float32, mesh)
    shape = _in_out(path, x.shape)
    groups = (*shape[:-2], shape[-2] // group, shape[-1])
    out = {"qvalue": _place(shape, values_dtype, mesh), "scale": _place(groups, np.float32, mesh)}
    if mins:
      out["min"] = _place(groups, np.float32, mesh)
    return out

  return floats, jax.tree_util.tree_map_with_path(leaf, floats)


def _float_kernels(restored, floats):
  """The restored tree with each quantized kernel dequantized (jitted) to its float shape."""

  def back(path, f):
    node = restored
    for k in path:
      node = node[k.key]
    if isinstance(node, dict):
      return dequantize_kernel(node).reshape(f.shape)
    return node

  return jax.tree_util.tree_map_with_path(back, floats)


def test_a_q4_k_gguf_restores_kept_quantized_and_runs_as_transformers_does():
  arch, sizes, shapes = _llama()
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("a", "b"))
  floats, target = _quantized_target(mesh)
  src = prj.GGUFSource(DATA / "llama-q4_k.gguf")
  m = prj.match(target, src)  # no hint
  assert {"layers/attn/q/kernel/qvalue", "layers/attn/q/kernel/min", "lm_head/kernel/scale"} <= set(
    m
  )
  assert "kept Q4_K minimums" in dict((t, w) for t, _, w in m.rows())["layers/attn/q/kernel/min"]
  restored = prj.restore(target, src, recipes=m)
  for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(target)):
    assert got.sharding == want.sharding and got.dtype == want.dtype

  # the parts are what the blocks encode: scale * q - min, in numpy, is the float restore's
  float_restored = prj.restore(floats, src, recipes=prj.match(floats, src))
  q = restored["layers"]["attn"]["q"]["kernel"]
  values = np.asarray(q["qvalue"]).astype(np.float32).reshape(2, 8, GROUP, 256)
  x = np.asarray(q["scale"])[:, :, None] * values - np.asarray(q["min"])[:, :, None]
  want = np.asarray(float_restored["layers"]["attn"]["q"]["kernel"]).reshape(2, 256, 256)
  np.testing.assert_array_equal(x.reshape(2, 256, 256), want)

  # a jitted matmul over the parts is the matmul with the dequantized weight
  w = restored["layers"]["mlp"]["down"]["kernel"]
  h = np.random.default_rng(0).normal(size=(3, 512)).astype(np.float32)
  dense = np.asarray(float_restored["layers"]["mlp"]["down"]["kernel"])
  np.testing.assert_allclose(
    qdot(h, jax.tree.map(lambda a: a[1], w)), h @ dense[1], rtol=1e-5, atol=1e-5
  )

  # the model runs on the dequantized kernels and gives transformers' logits from the file
  weights = hf.to_canonical(hf.STYLES["nnx"], shapes, arch, sizes, _float_kernels(restored, floats))
  ref = np.load(DATA / "llama-q4_k.npz")
  got = np.asarray(hf.forward(arch, sizes, weights, ref["input_ids"]))
  np.testing.assert_allclose(got, ref["output"], atol=2e-4, rtol=2e-4)

  # at its quantized size: values 1 byte (uint4 on this backend), a scale and a min per 32
  kernels = [k for k in jax.tree.leaves(floats) if k.ndim >= 2][:-1]  # the embedding stays float
  quantized = [
    a
    for k, a in jax.tree_util.tree_leaves_with_path(restored)
    if len(k) > 2 and k[-2].key == "kernel"
  ]
  ratio = sum(a.nbytes for a in quantized) / sum(np.prod(k.shape) * 4 for k in kernels)
  assert ratio <= 0.32, ratio


@pytest.mark.parametrize(
  "change, message",
  [
    ({"group": 16}, r"Q4_K has one scale per 32 values, the target one per 16"),
    ({"mins": False}, r"Q4_K subtracts a minimum per group .* no float leaf named '\*min\*'"),
    ({"values_dtype": np.int8}, r"would be uint4\[2, 256, 256\].*holds int8"),
  ],
)
def test_a_quantized_target_the_file_cannot_fill_is_refused_naming_its_leaves(change, message):
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("a", "b"))
  _, target = _quantized_target(mesh, **change)
  src = prj.GGUFSource(DATA / "llama-q4_k.gguf")
  with pytest.raises(errors.MatchError, match=message) as e:
    prj.match(target, src)
  assert "layers/attn/q/kernel/qvalue" in str(e.value)
  assert src.stats.reads == 0


def test_an_unquantized_file_into_a_quantized_target_is_refused():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("a", "b"))
  _, target = _quantized_target(mesh)
  gguf_src = prj.GGUFSource(DATA / "llama-q4_k.gguf")
  plain = {  # the same weights, stored as float32
    k: R.evaluate(
      R.dequantize(R.source(k), f) if (f := gguf_src.quantization(k)) else R.source(k), gguf_src
    )
    for k in gguf_src.keys()
  }
  with pytest.raises(errors.MatchError, match=r"kernel/qvalue.*stores this weight unquantized"):
    prj.match(target, prj.MemorySource(plain), config=gguf_src.config)


def test_heads_split_out_of_a_quantized_kernel_are_refused_not_regrouped():
  """Values read through a reshape are refused (a reshape could move values across groups)."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("a", "b"))
  target = {
    "layers": {
      "attn": {
        "q": {
          "kernel": {
            "qvalue": _place((2, 256, 4, 64), ml_dtypes.uint4, mesh),
            "scale": _place((2, 8, 4, 64), np.float32, mesh),
            "min": _place((2, 8, 4, 64), np.float32, mesh),
          }
        }
      }
    }
  }
  src = prj.GGUFSource(DATA / "llama-q4_k.gguf")
  with pytest.raises(errors.MatchError, match=r"q/kernel/qvalue.*read through reshape"):
    prj.match(target, src)
