"""Quantized checkpoints into JAX models, checked by value against their reference framework:
a Llama GGUF (Q8_0, Q4_K) through ``match`` with no hint into a stacked, (4, 2)-sharded JAX
Llama whose logits equal transformers' from the same file; an FP8 block-scaled matrix and
gpt-oss MXFP4 experts equal their reference dequantization (``tests/make_gguf_fixtures.py``
made the files and references)."""

import json
import pathlib

import hf_models as hf
import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import paramreg_jax as prj
from paramreg_jax import errors
from paramreg_jax import recipes as R

DATA = pathlib.Path(__file__).parent / "data" / "quantized"


def _sharded(target, mesh):
  """Each leaf sharded over the (4, 2) mesh on the axes that divide evenly."""

  def place(leaf):
    spec = [None] * len(leaf.shape)
    for axis_name, size in (("a", 4), ("b", 2)):
      for i in range(len(leaf.shape) - 1, -1, -1):
        if spec[i] is None and leaf.shape[i] % size == 0 and leaf.shape[i] >= size:
          spec[i] = axis_name
          break
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, P(*spec)))

  return jax.tree.map(place, target)


def _llama():
  config = json.loads((DATA / "config.json").read_text())
  arch = hf.ARCHS["llama"]
  return arch, hf.Sizes.of(config, arch), config


@pytest.mark.parametrize("kind", ["q8_0", "q4_k"])
@pytest.mark.parametrize("style_name", ["nnx", "flax"])
def test_a_llama_gguf_restores_through_match_into_jax_as_transformers_loads_it(kind, style_name):
  arch, sizes, _ = _llama()
  style = hf.STYLES[style_name]
  shapes = hf.with_head(hf.canonical_shapes(arch, sizes), arch, sizes)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("a", "b"))
  target = _sharded(hf.target(style, shapes, arch, sizes), mesh)
  src = prj.GGUFSource(DATA / f"llama-{kind}.gguf")
  m = prj.match(target, src)  # no hint
  restored = prj.restore(target, src, recipes=m)
  assert all(
    leaf.sharding == t.sharding
    for leaf, t in zip(jax.tree.leaves(restored), jax.tree.leaves(target))
  )
  weights = hf.to_canonical(style, shapes, arch, sizes, restored)
  ref = np.load(DATA / f"llama-{kind}.npz")
  got = np.asarray(hf.forward(arch, sizes, weights, ref["input_ids"]))
  np.testing.assert_allclose(got, ref["output"], atol=2e-4, rtol=2e-4)
  for role in ("q", "k"):  # the rows llama.cpp permuted, back where transformers reads them
    restored_w = weights["layers"][0][role]["w"]
    np.testing.assert_array_equal(restored_w, ref[f"{role}_proj_0"].T)
  code = m.to_python()
  assert "R.dequantize(" in code and kind.upper() in code and "prj.Indices(0" in code  # q/k


def test_the_match_of_a_gguf_reads_its_config_and_names_the_format():
  arch, sizes, _ = _llama()
  shapes = hf.with_head(hf.canonical_shapes(arch, sizes), arch, sizes)
  target = hf.target(hf.STYLES["nnx"], shapes, arch, sizes)
  src = prj.GGUFSource(DATA / "llama-q4_k.gguf")
  m = prj.match(target, src)
  text = str(m)
  assert "model_type = llama" in text and "dequantize(" in text and "'Q4_K'" in text
  assert src.config["num_key_value_heads"] == 2 and src.config["tie_word_embeddings"] is False


def test_an_unknown_architectures_q_and_k_are_refused_not_guessed(tmp_path):
  arch, sizes, _ = _llama()
  shapes = hf.with_head(hf.canonical_shapes(arch, sizes), arch, sizes)
  target = hf.target(hf.STYLES["nnx"], shapes, arch, sizes)
  src = prj.GGUFSource(DATA / "llama-q8_0.gguf")
  config = {**src.config, "gguf_architecture": "someformer"}
  with pytest.raises(prj.MatchError, match=r"attn_q\.weight: whether llama\.cpp permuted"):
    prj.match(target, src, config=config)


def test_fp8_block_scales_restore_as_deepseeks_weight_dequant():
  src = prj.SafetensorsSource(DATA / "fp8.safetensors")
  key = "model.layers.0.mlp.up_proj.weight"
  recipe = R.transpose(
    R.scale_blocks(R.source(key), R.source(key + "_scale_inv"), block=(128, 128)), (1, 0)
  )
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("a", "b"))
  sharding = NamedSharding(mesh, P("a", "b"))
  target = {"up": {"kernel": jax.ShapeDtypeStruct((260, 300), np.float32, sharding=sharding)}}
  out = prj.restore(target, src, recipes={"up/kernel": recipe})
  want = np.load(DATA / "fp8_reference.npy").T
  np.testing.assert_array_equal(
    np.asarray(out["up"]["kernel"]).view(np.uint32), want.view(np.uint32)
  )


def test_gpt_oss_mxfp4_experts_restore_as_transformers_dequantizes_them():
  src = prj.SafetensorsSource(DATA / "gpt_oss_moe.safetensors")
  p = "model.layers.0.mlp.experts.down_proj"
  recipe = R.transpose(R.mxfp4(R.source(p + "_blocks"), R.source(p + "_scales")), (0, 2, 1))
  target = {"down": jax.ShapeDtypeStruct((2, 64, 96), np.float32)}
  out = prj.restore(target, src, recipes={"down": recipe})
  want = np.load(DATA / "gpt_oss_reference.npz")["down_proj"]
  np.testing.assert_array_equal(np.asarray(out["down"]).view(np.uint32), want.view(np.uint32))


def test_a_wrong_format_for_a_gguf_tensor_binds_nothing():
  src = prj.GGUFSource(DATA / "llama-q8_0.gguf")
  key = "blk.0.ffn_down.weight"
  target = {"w": jax.ShapeDtypeStruct(src.logical_shape(key), np.float32)}
  with pytest.raises(prj.RestorePlanError, match=r"n:w: dequantize\(source\('blk\.0\.ffn_down"):
    prj.restore(target, src, recipes={"w": R.dequantize(R.source(key), "Q4_K")})
  assert src.stats.reads == 0
  assert issubclass(errors.QuantizedLayoutError, errors.RecipeError)


def test_match_reads_an_fp8_checkpoint_through_its_block_scales():
  """The weight and its ``weight_scale_inv`` are one tensor to match; the block size comes
  from the config (``quantization_config.weight_block_size``)."""
  src = prj.SafetensorsSource(DATA / "fp8.safetensors")
  target = {"layers_0": {"mlp": {"up": {"kernel": jax.ShapeDtypeStruct((260, 300), np.float32)}}}}
  config = {"model_type": "deepseek_v3", "quantization_config": {"weight_block_size": [128, 128]}}
  m = prj.match(target, src, config=config)
  assert "scale_blocks(" in str(m) and "block=(128, 128)" in m.to_python()
  out = prj.restore(target, src, recipes=m)
  want = np.load(DATA / "fp8_reference.npy").T
  np.testing.assert_array_equal(np.asarray(out["layers_0"]["mlp"]["up"]["kernel"]), want)
  with pytest.raises(prj.MatchError, match=r"weight: .*weight_block_size"):  # no block size given
    prj.match(target, src)


def test_match_reads_gpt_oss_mxfp4_experts():
  src = prj.SafetensorsSource(DATA / "gpt_oss_moe.safetensors")
  target = {
    "layers_0": {
      "mlp": {"experts": {"down": {"kernel": jax.ShapeDtypeStruct((2, 64, 96), np.float32)}}}
    }
  }
  m = prj.match(target, src, config={"model_type": "gpt_oss"})
  assert "mxfp4(" in str(m)
  out = prj.restore(target, src, recipes=m)
  want = np.load(DATA / "gpt_oss_reference.npz")["down_proj"]
  got = np.asarray(out["layers_0"]["mlp"]["experts"]["down"]["kernel"])
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_the_values_view_reads_what_transformers_reads():
  from paramreg_jax._src.match import quantized

  src = prj.GGUFSource(DATA / "llama-q8_0.gguf")
  view = quantized.ValuesView(src, *quantized.stored_forms(src))
  ref = np.load(DATA / "llama-q8_0.npz")
  assert view.metadata("blk.0.attn_q.weight").shape == (256, 256)
  np.testing.assert_array_equal(view.lease("blk.0.attn_q.weight").read(), ref["q_proj_0"])


def test_tensors_merely_named_blocks_and_scales_are_not_taken_for_mxfp4():
  from paramreg_jax._src.match import quantized

  plain = prj.MemorySource(
    {"conv_blocks": np.ones((4, 3), np.float32), "conv_scales": np.ones(4, np.float32)}
  )
  assert quantized.stored_forms(plain) == ({}, set())
  packed = prj.SafetensorsSource(DATA / "gpt_oss_moe.safetensors")
  forms, hidden = quantized.stored_forms(packed)
  assert list(forms) == ["model.layers.0.mlp.experts.down_proj"] and len(hidden) == 2
