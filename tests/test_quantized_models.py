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
  flat = "".join(code.split())  # the lines break where they are wide; the calls are the same
  assert "R.dequantize(" in flat and kind.upper() in flat and "prj.Indices(0," in flat  # q/k


def test_the_match_of_a_gguf_reads_its_config_and_names_the_format():
  arch, sizes, _ = _llama()
  shapes = hf.with_head(hf.canonical_shapes(arch, sizes), arch, sizes)
  target = hf.target(hf.STYLES["nnx"], shapes, arch, sizes)
  src = prj.GGUFSource(DATA / "llama-q4_k.gguf")
  m = prj.match(target, src)
  text = str(m)
  assert "from the GGUF metadata: model_type = llama" in text  # there is no config.json
  assert "dequantize(" in text and "'Q4_K'" in text
  assert src.config["num_key_value_heads"] == 2 and src.config["tie_word_embeddings"] is False


def test_an_unknown_architectures_q_and_k_are_refused_not_guessed(tmp_path):
  arch, sizes, _ = _llama()
  shapes = hf.with_head(hf.canonical_shapes(arch, sizes), arch, sizes)
  target = hf.target(hf.STYLES["nnx"], shapes, arch, sizes)
  src = prj.GGUFSource(DATA / "llama-q8_0.gguf")
  config = {**src.config, "gguf_architecture": "someformer"}
  with pytest.raises(prj.MatchError, match=r"attn_q\.weight: which conventions llama\.cpp"):
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
  view = quantized.ValuesView(src, quantized.stored_forms(src))
  ref = np.load(DATA / "llama-q8_0.npz")
  assert view.metadata("blk.0.attn_q.weight").shape == (256, 256)
  np.testing.assert_array_equal(view.lease("blk.0.attn_q.weight").read(), ref["q_proj_0"])


def test_tensors_merely_named_blocks_and_scales_are_not_taken_for_mxfp4():
  from paramreg_jax._src.match import quantized

  plain = prj.MemorySource(
    {"conv_blocks": np.ones((4, 3), np.float32), "conv_scales": np.ones(4, np.float32)}
  )
  assert quantized.stored_forms(plain) == quantized.Forms()
  packed = prj.SafetensorsSource(DATA / "gpt_oss_moe.safetensors")
  forms = quantized.stored_forms(packed)
  assert list(forms.forms) == ["model.layers.0.mlp.experts.down_proj"] and len(forms.hidden) == 2


def _case(config_name):
  config = json.loads((DATA / config_name).read_text())
  arch = hf.ARCHS[config["model_type"]]
  sizes = hf.Sizes.of(config, arch)
  return arch, sizes, hf.with_head(hf.canonical_shapes(arch, sizes), arch, sizes)


def _restore_and_run(style_name, gguf_name, arch, sizes, shapes, ids):
  style = hf.STYLES[style_name]
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("a", "b"))
  target = _sharded(hf.target(style, shapes, arch, sizes), mesh)
  src = prj.GGUFSource(DATA / gguf_name)
  restored = prj.restore(target, src, recipes=prj.match(target, src))  # no hint
  weights = hf.to_canonical(style, shapes, arch, sizes, restored)
  return np.asarray(hf.forward(arch, sizes, weights, ids)), weights


@pytest.mark.parametrize("kind", ["F32", "F16", "BF16"])
@pytest.mark.parametrize("style_name", ["nnx", "flax"])
def test_an_unquantized_llama_gguf_has_its_q_and_k_rows_put_back(kind, style_name):
  """llama.cpp permutes q and k whatever the storage type: an F32, F16 or BF16 file restores
  as transformers' GGUF loader reads it (the permutation was once undone only for blocks)."""
  arch, sizes, shapes = _case("llama-plain-config.json")
  ref = np.load(DATA / "llama-plain.npz")
  got, _ = _restore_and_run(
    style_name, f"llama-{kind.lower()}.gguf", arch, sizes, shapes, ref["input_ids"]
  )
  np.testing.assert_allclose(got, ref[kind], atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("kind", ["F32", "Q8_0"])
@pytest.mark.parametrize("style_name", ["nnx", "flax"])
def test_a_phi3_gguf_splits_its_fused_qkv_and_gate_up_for_a_model_with_separate_ones(
  kind, style_name
):
  arch, sizes, shapes = _case("phi3-config.json")
  ref = np.load(DATA / "phi3.npz")
  got, _ = _restore_and_run(
    style_name, f"phi3-{kind.lower()}.gguf", arch, sizes, shapes, ref["input_ids"]
  )
  np.testing.assert_allclose(got, ref[kind], atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("kind", ["F32", "Q8_0"])
def test_a_phi3_gguf_restores_into_a_model_that_keeps_qkv_and_gate_up_fused(kind):
  """The other direction: a target with Phi-3's own fused ``qkv`` and ``gate_up`` kernels
  takes ``attn_qkv`` and ``ffn_up`` whole (transposed, no split), and runs as transformers."""
  arch, sizes, shapes = _case("phi3-config.json")
  ref = np.load(DATA / "phi3.npz")
  style = hf.STYLES["nnx"]
  target = hf.target(style, shapes, arch, sizes)
  attn, mlp = target["layers"]["attn"], target["layers"]["mlp"]
  (layers, hidden, heads, hd), kv = attn["q"]["kernel"].shape, attn["k"]["kernel"].shape[2]
  ffn = mlp["up"]["kernel"].shape[-1]
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, np.float32)  # noqa: E731
  fused = dict(target, layers=dict(target["layers"]))
  fused["layers"]["attn"] = {
    "qkv": {"kernel": f32(layers, hidden, (heads + 2 * kv) * hd)},
    "o": attn["o"],
  }
  fused["layers"]["mlp"] = {
    "gate_up": {"kernel": f32(layers, hidden, 2 * ffn)},
    "down": mlp["down"],
  }
  src = prj.GGUFSource(DATA / f"phi3-{kind.lower()}.gguf")
  out = prj.restore(fused, src, recipes=prj.match(fused, src))  # no hint
  qkv = np.asarray(out["layers"]["attn"]["qkv"]["kernel"])
  q, k, v = np.split(qkv, [heads * hd, (heads + kv) * hd], axis=-1)
  gate, up = np.split(np.asarray(out["layers"]["mlp"]["gate_up"]["kernel"]), 2, axis=-1)
  restored = dict(out, layers=dict(out["layers"]))
  restored["layers"]["attn"] = {
    "q": {"kernel": q.reshape(layers, hidden, heads, hd)},
    "k": {"kernel": k.reshape(layers, hidden, kv, hd)},
    "v": {"kernel": v.reshape(layers, hidden, kv, hd)},
    "o": out["layers"]["attn"]["o"],
  }
  restored["layers"]["mlp"] = {
    "gate": {"kernel": gate},
    "up": {"kernel": up},
    "down": out["layers"]["mlp"]["down"],
  }
  weights = hf.to_canonical(style, shapes, arch, sizes, restored)
  got = np.asarray(hf.forward(arch, sizes, weights, ref["input_ids"]))
  np.testing.assert_allclose(got, ref[kind], atol=2e-4, rtol=2e-4)


_GEMMA2_NORMS = {  # transformers' name -> a target's name, in three styles of naming
  "gguf": ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"),
  "user": ("attn_norm", "post_attn_norm", "mlp_norm", "post_mlp_norm"),
  "hf": (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
  ),
}
_HF_NORMS = _GEMMA2_NORMS["hf"]


def _gemma2_target(naming):
  """The tiny Gemma 2 as a stacked target, its four norms named in ``naming``'s words."""
  layers, hidden, ffn, heads, kv, head_dim, vocab = 2, 64, 128, 4, 2, 16, 64
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, np.float32)  # noqa: E731
  norms = {name: {"scale": f32(layers, hidden)} for name in _GEMMA2_NORMS[naming]}
  target = {
    "embed": {"embedding": f32(vocab, hidden)},
    "final_norm": {"scale": f32(hidden)},
    "layers": {
      **norms,
      "attn": {
        "q": {"kernel": f32(layers, hidden, heads * head_dim)},
        "k": {"kernel": f32(layers, hidden, kv * head_dim)},
        "v": {"kernel": f32(layers, hidden, kv * head_dim)},
        "o": {"kernel": f32(layers, heads * head_dim, hidden)},
      },
      "mlp": {
        "gate": {"kernel": f32(layers, hidden, ffn)},
        "up": {"kernel": f32(layers, hidden, ffn)},
        "down": {"kernel": f32(layers, ffn, hidden)},
      },
    },
  }
  return target


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
@pytest.mark.parametrize("naming", sorted(_GEMMA2_NORMS))
def test_gemma2_norms_lose_the_one_llama_cpp_added_and_keep_their_places(kind, naming):
  """Gemma 2's GGUF stores every norm weight + 1 and names its four norms in its own words:
  each restores to what transformers' GGUF loader reads, into targets named as the GGUF, as a
  user would, or as transformers does."""
  src = prj.GGUFSource(DATA / f"gemma2-{kind}.gguf")
  ref = np.load(DATA / f"gemma2-{kind}.npz")
  layers = 2
  target = _gemma2_target(naming)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("a", "b"))
  target = _sharded(target, mesh)
  out = prj.restore(target, src, recipes=prj.match(target, src))  # no hint
  assert (
    out["layers"]["mlp"]["up"]["kernel"].sharding
    == target["layers"]["mlp"]["up"]["kernel"].sharding
  )
  np.testing.assert_array_equal(np.asarray(out["final_norm"]["scale"]), ref["model.norm.weight"])
  np.testing.assert_array_equal(
    np.asarray(out["embed"]["embedding"]), ref["model.embed_tokens.weight"]
  )
  for i in range(layers):
    p = f"model.layers.{i}."
    for name, hf_name in zip(_GEMMA2_NORMS[naming], _HF_NORMS):
      got = np.asarray(out["layers"][name]["scale"][i])
      np.testing.assert_array_equal(got, ref[p + hf_name + ".weight"], err_msg=name)
    for part in "qkvo":
      got = np.asarray(out["layers"]["attn"][part]["kernel"][i])
      np.testing.assert_array_equal(got, ref[p + f"self_attn.{part}_proj.weight"].T)
    for part in ("gate", "up", "down"):
      got = np.asarray(out["layers"]["mlp"][part]["kernel"][i])
      np.testing.assert_array_equal(got, ref[p + f"mlp.{part}_proj.weight"].T)


def _gemma2_logits(params, config, names, ids):
  """Gemma 2's forward as transformers' ``Gemma2ForCausalLM`` computes it (eager attention):
  the embedding scaled by sqrt(hidden), RMS norms of ``x * (1 + w)``, a norm after each
  sublayer too, attention logits scaled by ``query_pre_attn_scalar`` and soft-capped,
  GeGLU (tanh gelu), the tied head's logits soft-capped."""
  import jax.numpy as jnp

  c = config
  heads, kv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
  theta = c.get("rope_theta") or (c.get("rope_parameters") or {}).get("rope_theta", 10000.0)

  def norm(x, w):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + c["rms_norm_eps"]) * (1 + w)

  def softcap(x, cap):
    return jnp.tanh(x / cap) * cap if cap else x

  emb = params["embed"]["embedding"]
  x = emb[ids] * jnp.asarray(c["hidden_size"] ** 0.5, jnp.float32)
  b, t = ids.shape
  inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
  angles = np.arange(t)[:, None] * inv[None]
  cos, sin = np.cos(np.concatenate([angles] * 2, -1)), np.sin(np.concatenate([angles] * 2, -1))

  def rope(u):
    rot = jnp.concatenate([-u[..., hd // 2 :], u[..., : hd // 2]], -1)
    return u * cos[None, :, None] + rot * sin[None, :, None]

  layers, attn, mlp = params["layers"], params["layers"]["attn"], params["layers"]["mlp"]
  pre, post, pre_ffw, post_ffw = (layers[n]["scale"] for n in names)
  causal = np.tril(np.ones((t, t), bool))
  for i in range(c["num_hidden_layers"]):
    h = norm(x, pre[i])
    q = rope((h @ attn["q"]["kernel"][i]).reshape(b, t, heads, hd))
    k = rope((h @ attn["k"]["kernel"][i]).reshape(b, t, kv, hd))
    v = (h @ attn["v"]["kernel"][i]).reshape(b, t, kv, hd)
    k, v = (jnp.repeat(u, heads // kv, axis=2) for u in (k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * c["query_pre_attn_scalar"] ** -0.5
    scores = jnp.where(causal, softcap(scores, c.get("attn_logit_softcapping")), -jnp.inf)
    o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), v).reshape(b, t, heads * hd)
    x = x + norm(o @ attn["o"]["kernel"][i], post[i])
    h = norm(x, pre_ffw[i])
    gate = jax.nn.gelu(h @ mlp["gate"]["kernel"][i], approximate=True)
    x = x + norm((gate * (h @ mlp["up"]["kernel"][i])) @ mlp["down"]["kernel"][i], post_ffw[i])
  x = norm(x, params["final_norm"]["scale"])
  return np.asarray(softcap(x @ emb.T, c.get("final_logit_softcapping")))


@pytest.mark.parametrize("kind", ["F32", "Q8_0"])
@pytest.mark.parametrize("naming", sorted(_GEMMA2_NORMS))
def test_a_gemma2_gguf_runs_as_transformers_runs_it(kind, naming):
  """The forward pass, by value: restored with no hint into each naming of the four norms,
  the logits equal transformers' own Gemma 2 loaded from the same GGUF file."""
  ref = np.load(DATA / "gemma2-logits.npz")
  config = json.loads((DATA / "gemma2-config.json").read_text())
  src = prj.GGUFSource(DATA / f"gemma2-{kind.lower()}.gguf")
  target = _gemma2_target(naming)
  out = prj.restore(target, src, recipes=prj.match(target, src))
  got = _gemma2_logits(out, config, _GEMMA2_NORMS[naming], ref["input_ids"])
  np.testing.assert_allclose(got, ref[kind], atol=2e-4, rtol=2e-4)


def test_a_phi3_gguf_exports_back_to_its_own_tensors_bit_for_bit(tmp_path):
  """The way back: gate and up joined into ``ffn_up`` again, q/k/v into ``attn_qkv``."""
  arch, sizes, shapes = _case("phi3-config.json")
  target = hf.target(hf.STYLES["nnx"], shapes, arch, sizes)
  src = prj.GGUFSource(DATA / "phi3-f32.gguf")
  m = prj.match(target, src)
  prj.export(prj.restore(target, src, recipes=m), m, tmp_path / "out")
  back = prj.SafetensorsSource(tmp_path / "out")
  assert sorted(back.keys()) == sorted(src.keys())
  for k in src.keys():
    np.testing.assert_array_equal(back.lease(k).read(), src.lease(k).read(), err_msg=k)


@pytest.mark.parametrize("sharded", [False, True])
def test_gpt_oss_square_experts_with_biases_match_with_no_hint(sharded):
  """Real gpt-oss experts are square (hidden = expert width) and carry ``*_bias`` siblings:
  ``gate_up_proj`` and ``gate_up_proj_bias`` are one module's weight and bias, and a square
  ``down_proj`` is oriented like any other (it was "unmatched")."""
  src = prj.SafetensorsSource(DATA / "gpt_oss_square.safetensors")
  ref = np.load(DATA / "gpt_oss_square_reference.npz")
  e, h, f = 2, 64, 64
  target = {
    "layers_0": {
      "mlp": {
        "experts": {
          "gate_up": {"kernel": (e, h, 2 * f), "bias": (e, 2 * f)},
          "down": {"kernel": (e, f, h), "bias": (e, h)},
        }
      }
    }
  }
  target = jax.tree.map(
    lambda s: jax.ShapeDtypeStruct(s, np.float32), target, is_leaf=lambda x: isinstance(x, tuple)
  )
  if sharded:
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("a", "b"))
    target = _sharded(target, mesh)
  out = prj.restore(target, src, recipes=prj.match(target, src, config={"model_type": "gpt_oss"}))
  experts = out["layers_0"]["mlp"]["experts"]
  for name, theirs in (("gate_up", "gate_up_proj"), ("down", "down_proj")):
    got = np.asarray(experts[name]["kernel"])
    np.testing.assert_array_equal(got.view(np.uint32), ref[theirs].view(np.uint32), err_msg=name)
    np.testing.assert_array_equal(np.asarray(experts[name]["bias"]), ref[theirs + "_bias"])


def _flax_named(ref):
  """``{target name: (transformers' name, transposed?)}`` and the target: transformers' own
  module names, held as flax holds them (a linear ``kernel`` ``[in, out]``, a norm ``scale``,
  an ``embedding``; a conv kernel and the SSM's ``A_log`` and ``D`` as they are)."""
  names, target = {}, {}
  for key in ref.files:
    module, _, leaf = key.rpartition(".")
    shape = ref[key].shape
    linear = leaf == "weight" and len(shape) == 2 and "embed" not in module
    if leaf == "weight":
      leaf = "kernel" if linear else "embedding" if "embed" in module else "scale"
      if len(shape) == 3:
        leaf = "kernel"
    name = f"{module.replace('.', '/')}/{leaf}" if module else leaf
    names[name] = (key, linear)
    node = target
    *head, last = name.split("/")
    for part in head:
      node = node.setdefault(part, {})
    node[last] = jax.ShapeDtypeStruct(shape[::-1] if linear else shape, np.float32)
  return names, target


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
@pytest.mark.parametrize("model", ["mamba", "nemotron"])
def test_mamba_and_nemotron_ggufs_restore_as_transformers_reads_them(model, kind):
  """Mamba's ``ssm_a`` is ``A = -exp(A_log)`` and its conv kernel lost its middle axis;
  Nemotron's norms carry llama.cpp's +1: with no hint, every parameter equals what
  transformers' GGUF loader reads from the same file (``log(-A)``, the axis back, the 1 off)."""
  ref = np.load(DATA / f"{model}-{kind}.npz")
  src = prj.GGUFSource(DATA / f"{model}-{kind}.gguf")
  names, target = _flax_named(ref)
  out = prj.restore(target, src, recipes=prj.match(target, src))
  got = {prj.path_to_name(p): v for p, v in jax.tree_util.tree_flatten_with_path(out)[0]}
  for name, (key, linear) in names.items():
    want = ref[key].T if linear else ref[key]
    np.testing.assert_allclose(np.asarray(got[name]), want, rtol=1e-6, atol=1e-6, err_msg=key)
