"""Hints and the evidence that spans parameters (``match/hints.py``, ``match/coherence.py``).

What a hint settles (the leaf it names, whatever it is called), what it never does (hand a
tensor to another leaf by elimination), and the suites' two end-to-end promises: a correct hint
for every leaf always restores, and pasting a refusal's own suggestions never restores a wrong
leaf. Every restore is checked by value (the forward pass against PyTorch's output).
"""

from __future__ import annotations

import ast
import re
import shutil

import hf_models as hf
import jax
import numpy as np
import pytest
from abstract import sds
from test_match_refusals import literal_entries
from test_match_refusals import uncommented

import paramreg_jax as prj
from paramreg_jax import MemorySource
from paramreg_jax import SafetensorsSource
from paramreg_jax import recipes as R

rng = np.random.default_rng(0)
CASES = sorted(hf.ARCHS)


def rand(*shape):
  return rng.standard_normal(shape).astype(np.float32)


def setup(name, style_name, *, config=True, tmp_path=None):
  arch, sizes, cfg, ref = hf.case(name)
  style = hf.STYLES[style_name]
  shapes = hf.canonical_shapes(arch, sizes)
  if arch.head and not cfg.get("tie_word_embeddings", True):
    shapes = hf.with_head(shapes, arch, sizes)
  target = hf.target(style, shapes, arch, sizes)
  path = hf.DATA / name / "model.safetensors"
  if not config:
    shutil.copy(path, tmp_path / "model.safetensors")
    path = tmp_path / "model.safetensors"
  return arch, sizes, ref, style, shapes, target, SafetensorsSource(path)


def forward_matches(arch, sizes, ref, style, shapes, restored):
  weights = hf.to_canonical(style, shapes, arch, sizes, restored)
  got = np.asarray(hf.forward(arch, sizes, weights, ref["input_ids"]))
  np.testing.assert_allclose(got, ref["output"], atol=1e-5, rtol=1e-5)


def flat(tree):
  return {prj.path_to_name(p): v for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def nested(names_values):
  out = {}
  for name, value in names_values.items():
    node = out
    *head, last = name.split("/")
    for part in head:
      node = node.setdefault(part, {})
    node[last] = value
  return out


# --- a hint settles what it names, and only that ------------------------------------------------


def test_a_short_hint_takes_its_own_kind_and_the_bias_follows_its_module():
  """``"input_layernorm"`` names a weight and a bias: the hinted ``scale`` takes the weight, and
  the bias (named like nothing) comes from the same module, never from another norm."""
  arch, sizes, ref, style, shapes, target, src = setup("persimmon", "nnx")
  layers = target["layers"]
  layers["pre_a"] = layers.pop("attn_norm")
  layers["pre_b"] = layers.pop("mlp_norm")
  m = prj.match(
    target,
    src,
    hints={
      "layers/pre_a/scale": "input_layernorm",
      "layers/pre_b/scale": "post_attention_layernorm",
    },
  )
  text = str(m)
  assert "layers/pre_a/bias" in text and "module of layers/pre_a/scale" in text
  restored = prj.restore(target, src, recipes=m)
  restored["layers"]["attn_norm"] = restored["layers"].pop("pre_a")
  restored["layers"]["mlp_norm"] = restored["layers"].pop("pre_b")
  forward_matches(arch, sizes, ref, style, shapes, restored)


def test_a_hinted_tensor_is_never_given_to_another_leaf_by_elimination(tmp_path):
  """OLMo 2 without its config: the target's ``post_attention_norm`` is the checkpoint's own
  words (``_norm`` for ``_layernorm``), so it maps with no hint. A wrong hint for it takes the
  other post-norm's tensor: that other leaf is refused (listing the true tensor), never handed
  what is left over."""
  arch, sizes, ref, style, shapes, target, src = setup(
    "olmo2", "flax", config=False, tmp_path=tmp_path
  )
  m = prj.match(target, src)
  forward_matches(arch, sizes, ref, style, shapes, prj.restore(target, src, recipes=m))
  wrong = {"layers_{i}/post_attention_norm/scale": "model.layers.{i}.post_feedforward_layernorm"}
  with pytest.raises(prj.MatchError) as info:
    prj.match(target, src, hints=wrong)
  text = str(info.value)
  assert "layers_{i}/post_mlp_norm/scale, in 2 layers (0, 1), each alike:" in text
  assert "is what the hint for layers_{i}/post_attention_norm/scale names" in text
  assert "nothing else is chosen for it by elimination" in text
  true = '"layers_{i}/post_mlp_norm/scale": "model.layers.{i}.post_attention_layernorm.weight"'
  assert f"  # {true}," in text  # still a choice


def test_the_right_hint_for_one_post_norm_leaves_the_other_to_its_own_evidence(tmp_path):
  arch, sizes, ref, style, shapes, target, src = setup(
    "olmo2", "flax", config=False, tmp_path=tmp_path
  )
  right = {"layers_{i}/post_attention_norm/scale": "model.layers.{i}.post_attention_layernorm"}
  m = prj.match(target, src, hints=right)
  assert m.hint_effects == ()  # post_mlp_norm was decided by its name before and after
  forward_matches(arch, sizes, ref, style, shapes, prj.restore(target, src, recipes=m))


def test_the_config_settles_olmo2s_post_norms_and_the_report_shows_it():
  arch, sizes, ref, style, shapes, target, src = setup("olmo2", "flax")
  m = prj.match(target, src)
  assert ("post_attention_layernorm", "the attention's post-norm") in m.facts
  forward_matches(arch, sizes, ref, style, shapes, prj.restore(target, src, recipes=m))


def test_what_a_hint_changes_elsewhere_is_reported():
  ck = {
    "proj.weight": rand(6, 4),
    "proj.bias": rand(6),
    "other.weight": rand(6, 4),
    "other.bias": rand(6),
  }
  target = {"mystery": {"kernel": sds(4, 6), "bias": sds(6)}}
  src = MemorySource(ck, config={"model_type": "llama"})
  with pytest.raises(prj.MatchError, match="mystery/bias"):
    prj.match(target, src)
  m = prj.match(target, src, hints={"mystery/kernel": "other.weight"})
  got = prj.restore(target, src, recipes=m)
  np.testing.assert_array_equal(got["mystery"]["bias"], ck["other.bias"])
  np.testing.assert_array_equal(got["mystery"]["kernel"], ck["other.weight"].T)
  (effect,) = m.hint_effects
  assert effect[0] == "mystery/bias" and effect[2] == "source('other.bias')"
  assert "changed by the hints (parameters they do not name):" in str(m)


# --- hints always work ----------------------------------------------------------------------------


def test_a_hint_that_names_a_tensor_works_whatever_the_leaf_is_called():
  ck = {
    "encoder.layer.0.output.LayerNorm.bias": rand(8),
    "encoder.layer.0.output.LayerNorm.weight": rand(8),
  }
  target = {"blocks": [{"mlp_norm": {"zz": sds(8), "scale": sds(8)}}]}
  src = MemorySource(ck)
  hints = {"blocks/0/mlp_norm/zz": "encoder.layer.0.output.LayerNorm.bias"}
  got = prj.restore(target, src, recipes=prj.match(target, src, hints=hints))
  np.testing.assert_array_equal(
    got["blocks"][0]["mlp_norm"]["zz"], ck[hints["blocks/0/mlp_norm/zz"]]
  )
  np.testing.assert_array_equal(
    got["blocks"][0]["mlp_norm"]["scale"], ck["encoder.layer.0.output.LayerNorm.weight"]
  )


def test_layer_template_hints_stack_under_a_linen_scan_target():
  ck = {f"model.layers.{i}.self_attn.q_proj.weight": rand(8, 4) for i in range(3)}
  target = {"ScanBlock_0": {"attn": {"q": {"kernel": sds(3, 4, 8)}}}}
  src = MemorySource(ck, config={"model_type": "llama"})
  hints = {"ScanBlock_0/attn/q/kernel": "model.layers.{i}.self_attn.q_proj"}
  got = prj.restore(target, src, recipes=prj.match(target, src, hints=hints))
  for i in range(3):
    want = ck[f"model.layers.{i}.self_attn.q_proj.weight"].T
    np.testing.assert_array_equal(got["ScanBlock_0"]["attn"]["q"]["kernel"][i], want)


def test_a_target_that_keeps_out_in_restores_with_every_linear_weight_hinted():
  ck = {"layers.0.q_proj.weight": rand(4, 4), "layers.0.k_proj.weight": rand(2, 4)}
  target = {"layers": [{"wq": {"weight": sds(4, 4)}, "wk": {"weight": sds(2, 4)}}]}
  src = MemorySource(ck, config={"model_type": "llama"})
  hints = {
    "layers/0/wq/weight": R.source("layers.0.q_proj.weight"),
    "layers/0/wk/weight": R.source("layers.0.k_proj.weight"),
  }
  got = prj.restore(target, src, recipes=prj.match(target, src, hints=hints))
  np.testing.assert_array_equal(got["layers"][0]["wq"]["weight"], ck["layers.0.q_proj.weight"])
  np.testing.assert_array_equal(got["layers"][0]["wk"]["weight"], ck["layers.0.k_proj.weight"])
  # by name, the hinted pairs' own shapes show the orientation: still as stored
  named = {"layers/0/wq/weight": "layers.0.q_proj.weight", "layers/0/wk/weight": "layers.0.k_proj"}
  got = prj.restore(target, src, recipes=prj.match(target, src, hints=named))
  np.testing.assert_array_equal(got["layers"][0]["wq"]["weight"], ck["layers.0.q_proj.weight"])


def test_an_ssm_state_parameter_is_not_a_linear_weight():
  ck = {
    "backbone.layers.0.mixer.A_log": rand(16, 4),
    "backbone.layers.0.mixer.in_proj.weight": rand(32, 8),
  }
  target = {"layers": [{"mixer": {"A_log": sds(16, 4), "in_proj": {"kernel": sds(8, 32)}}}]}
  src = MemorySource(ck, config={"model_type": "mamba"})
  hints = {"layers/0/mixer/A_log": R.source("backbone.layers.0.mixer.A_log")}
  got = prj.restore(target, src, recipes=prj.match(target, src, hints=hints))
  np.testing.assert_array_equal(
    got["layers"][0]["mixer"]["A_log"], ck["backbone.layers.0.mixer.A_log"]
  )
  # with no hint: A_log as stored (no orientation asked), in_proj transposed as a kernel
  got = prj.restore(target, src, recipes=prj.match(target, src))
  mixer = got["layers"][0]["mixer"]
  np.testing.assert_array_equal(mixer["A_log"], ck["backbone.layers.0.mixer.A_log"])
  np.testing.assert_array_equal(
    mixer["in_proj"]["kernel"], ck["backbone.layers.0.mixer.in_proj.weight"].T
  )


def test_one_template_hint_serves_every_per_layer_module():
  arch, sizes, ref, style, shapes, target, src = setup("llama", "flax")
  for i in range(sizes.layers):  # both norms renamed: nothing tells them apart
    target[f"layers_{i}"]["pre_a"] = target[f"layers_{i}"].pop("attention_norm")
    target[f"layers_{i}"]["pre_c"] = target[f"layers_{i}"].pop("mlp_norm")
  with pytest.raises(prj.MatchError, match=r"layers_\{i\}/pre_a/scale \(32,\), in 2 layers"):
    prj.match(target, src)
  hints = {
    "layers_{i}/pre_a/scale": "model.layers.{i}.input_layernorm",
    "layers_{i}/pre_c/scale": "post_attention_layernorm",
  }
  m = prj.match(target, src, hints=hints)
  restored = prj.restore(target, src, recipes=m)
  for i in range(sizes.layers):
    restored[f"layers_{i}"]["attention_norm"] = restored[f"layers_{i}"].pop("pre_a")
    restored[f"layers_{i}"]["mlp_norm"] = restored[f"layers_{i}"].pop("pre_c")
  forward_matches(arch, sizes, ref, style, shapes, restored)
  with pytest.raises(prj.MatchError, match=r"'layers_\{i\}/pre_b/scale' \(no target name fits"):
    prj.match(target, src, hints={"layers_{i}/pre_b/scale": "input_layernorm"})


# --- the suites' promises -------------------------------------------------------------------------


def _hint_for(p, proposals):
  """The correct hint for one proposal: the checkpoint name when it is one tensor (or one name
  template over the layers), else the recipe."""
  if p.alias_of is not None:
    return proposals[p.alias_of].recipe
  # a name cannot say which part of a fused tensor, or which expert of a stacked one
  plain = not any(w in p.reason for w in ("part of fused", "joined", ", expert "))
  numbers = {len(re.findall(r"(?<=\.)\d+(?=\.)", k)) for k in p.keys}
  if plain and len(p.keys) == 1:
    return p.keys[0]
  if plain and numbers == {1}:
    return re.sub(r"(?<=\.)\d+(?=\.)", "{i}", p.keys[0])
  return p.recipe


@pytest.mark.parametrize("style", sorted(hf.STYLES))
@pytest.mark.parametrize("name", CASES)
def test_a_correct_hint_for_every_leaf_restores_whatever_the_leaves_are_called(name, style):
  arch, sizes, ref, style_, shapes, target, src = setup(name, style)
  proposals = {p.target: p for p in prj.match(target, src).proposals}
  names = list(flat(target))
  opaque = {f"p{j}": leaf for j, leaf in enumerate(flat(target).values())}
  hints = {f"p{j}": _hint_for(proposals[n], proposals) for j, n in enumerate(names)}
  restored = prj.restore(opaque, src, recipes=prj.match(opaque, src, hints=hints))
  back = nested({n: restored[f"p{j}"] for j, n in enumerate(names)})
  forward_matches(arch, sizes, ref, style_, shapes, back)


_SUGGESTED = re.compile(r"hints=(\{'[^{}]*'\})")


def _suggested(error):
  """The paste-ready hints a refusal suggests (not a template with a placeholder)."""
  out = {}
  for problem in error.problems:
    for found in _SUGGESTED.findall(str(problem)):
      if "<" not in found:
        out.update(ast.literal_eval(found))
  return out


@pytest.mark.parametrize("name", CASES)
def test_pasting_a_refusals_suggestions_never_restores_a_wrong_leaf(name, tmp_path):
  """Without config.json (fused layouts, norm roles, tied heads unknown), and with the norms
  renamed: paste what each refusal suggests and try again, until it restores (and then the
  forward pass is right) or nothing more is suggested."""
  for variant in ("no config", "renamed norms"):
    folder = tmp_path / variant.replace(" ", "_")
    folder.mkdir()
    arch, sizes, ref, style, shapes, target, src = setup(
      name, "flax", config=variant != "no config", tmp_path=folder
    )
    renamed = {}
    if variant == "renamed norms":
      for key in list(target):
        for old, new in (("attention_norm", "pre_a"), ("mlp_norm", "pre_b")):
          if key.startswith("layers_") and old in target[key]:
            target[key][new] = target[key].pop(old)
            renamed[new] = old
    hints: dict = {}
    for _ in range(6):
      try:
        m = prj.match(target, src, hints=hints)
      except prj.MatchError as e:
        more = {k: v for k, v in _suggested(e).items() if k not in hints}
        if not more:
          break
        hints.update(more)
        continue
      restored = prj.restore(target, src, recipes=m)
      for key in restored:
        for new, old in renamed.items():
          if isinstance(restored[key], dict) and new in restored[key]:
            restored[key][old] = restored[key].pop(new)
      forward_matches(arch, sizes, ref, style, shapes, restored)
      break


# --- the same promises on the encoder-decoder suites (T5, Whisper, BART) ---------------------------


def _encoder_decoder(name, stacked):
  import json

  import test_match_bart
  import test_match_t5
  import test_match_whisper

  module = {"t5": test_match_t5, "t5_gated": test_match_t5, "whisper": test_match_whisper}.get(
    name, test_match_bart
  )
  c = json.loads((hf.DATA / name / "config.json").read_text())
  ref = dict(np.load(hf.DATA / name / "reference.npz"))

  def check(restored):
    first = ref["input_features"] if name == "whisper" else ref["input_ids"]
    weights = module.canonical(c, restored, stacked)
    got = np.asarray(module.forward(c, weights, first, ref["decoder_input_ids"]))
    np.testing.assert_allclose(got, ref["output"], atol=1e-5, rtol=1e-5)

  return module.target(c, stacked), check


ENCODER_DECODERS = ["bart", "t5", "t5_gated", "whisper"]


@pytest.mark.parametrize("stacked", [False, True], ids=["flax", "nnx"])
@pytest.mark.parametrize("name", ENCODER_DECODERS)
def test_encoder_decoders_restore_with_a_correct_hint_for_every_leaf(name, stacked):
  target, check = _encoder_decoder(name, stacked)
  src = SafetensorsSource(hf.DATA / name / "model.safetensors")
  proposals = {p.target: p for p in prj.match(target, src).proposals}
  names = list(flat(target))
  opaque = {f"p{j}": leaf for j, leaf in enumerate(flat(target).values())}
  hints = {f"p{j}": _hint_for(proposals[n], proposals) for j, n in enumerate(names)}
  restored = prj.restore(opaque, src, recipes=prj.match(opaque, src, hints=hints))
  check(nested({n: restored[f"p{j}"] for j, n in enumerate(names)}))


@pytest.mark.parametrize("stacked", [False, True], ids=["flax", "nnx"])
@pytest.mark.parametrize("name", ENCODER_DECODERS)
def test_encoder_decoders_pasting_suggestions_never_restores_a_wrong_leaf(name, stacked, tmp_path):
  target, check = _encoder_decoder(name, stacked)
  shutil.copy(hf.DATA / name / "model.safetensors", tmp_path / "model.safetensors")
  src = SafetensorsSource(tmp_path / "model.safetensors")  # no config.json beside it
  hints: dict = {}
  for _ in range(6):
    try:
      m = prj.match(target, src, hints=hints)
    except prj.MatchError as e:
      more = {k: v for k, v in _suggested(e).items() if k not in hints}
      if not more:
        return
      hints.update(more)
      continue
    check(prj.restore(target, src, recipes=m))
    return


def test_a_name_hint_into_a_bfloat16_target_gets_its_cast():
  """A name hint's tensor is cast to the parameter's dtype like any other (the cast was left
  out, and match failed with "the proposed mapping does not plan")."""
  import ml_dtypes

  bf16 = ml_dtypes.bfloat16
  src = prj.MemorySource(
    {
      "model.embed_tokens.weight": np.arange(256, dtype=np.float32).reshape(32, 8),
      "model.layers.0.mlp.up_proj.weight": np.ones((16, 8), np.float32),
    }
  )
  target = {
    "embed": {"embedding": jax.ShapeDtypeStruct((32, 8), bf16)},
    "layers_0": {"mlp": {"up": {"kernel": jax.ShapeDtypeStruct((8, 16), bf16)}}},
  }
  m = prj.match(target, src, hints={"embed/embedding": "model.embed_tokens.weight"})
  out = prj.restore(target, src, recipes=m)
  assert out["embed"]["embedding"].dtype == bf16 and "cast to bfloat16" in str(m)
  np.testing.assert_array_equal(
    np.asarray(out["embed"]["embedding"]).astype(np.float32),
    np.arange(256, dtype=np.float32).reshape(32, 8).astype(bf16).astype(np.float32),
  )


def test_hints_written_checkpoint_to_target_say_swapped_and_the_paste_works():
  """Hints written the way ``rename`` is (checkpoint -> target) are refused with the dict the
  right way round; pasting it restores the named tensor."""

  src = prj.MemorySource(
    {"a.weight": np.full((4,), 1.0, np.float32), "b.weight": np.full((4,), 2.0, np.float32)}
  )
  leaf = jax.ShapeDtypeStruct((4,), np.float32)
  target = {"x": {"scale": leaf}, "y": {"scale": leaf}}
  with pytest.raises(prj.errors.MatchError, match=r"swapped\?") as e:
    prj.match(target, src, hints={"a.weight": "x/scale", "b.weight": "y/scale"})
  pasted = ast.literal_eval(str(e.value).rsplit("hints=", 1)[1])
  assert pasted == {"x/scale": "a.weight", "y/scale": "b.weight"}
  out = prj.restore(target, src, recipes=prj.match(target, src, hints=pasted))
  np.testing.assert_array_equal(out["x"]["scale"], 1.0)
  np.testing.assert_array_equal(out["y"]["scale"], 2.0)


@pytest.mark.parametrize(
  "call, kwargs, message",
  [
    (
      "match",
      {"rename": {}},
      "match() got unexpected keyword arguments: rename=: rename= is "
      "restore's (checkpoint key -> target name rules); match takes hints={target name: "
      "checkpoint name}",
    ),
    (
      "restore",
      {"hints": {}},
      "restore() got unexpected keyword arguments: hints=: hints= is "
      "match's: m = prj.match(target, source, hints={...}); then prj.restore(target, source, "
      "recipes=m)",
    ),
    (
      "restore",
      {"recipe": {}},
      "restore() got unexpected keyword arguments: recipe=: not an "
      "argument of restore; did you mean 'recipes'?",
    ),
  ],
)
def test_an_argument_of_the_other_call_says_where_it_belongs(call, kwargs, message):
  src = prj.MemorySource({"a": np.zeros((4,), np.float32)})
  target = {"a": jax.ShapeDtypeStruct((4,), np.float32)}
  with pytest.raises(TypeError) as e:
    getattr(prj, call)(target, src, **kwargs)
  assert str(e.value) == message
  assert src.stats.reads == 0


def test_a_name_hint_whose_tensor_cannot_fit_says_both_shapes():
  src = MemorySource({"a.weight": rand(3, 5), "b.weight": rand(4, 6)})
  target = {"x": {"kernel": sds(6, 4)}, "y": {"kernel": sds(7, 7)}}
  with pytest.raises(prj.MatchError) as info:
    prj.match(target, src, hints={"y/kernel": "a.weight", "x/kernel": "b"})
  assert info.value.problems == (
    "y/kernel (7, 7): its hint names 'a.weight' (3, 5), which no transpose, reshape, stack or "
    "split turns into (7, 7); is it the hint of another leaf? Name a tensor that fits, or give "
    "the recipe that builds the leaf",
  )


def test_a_kernel_named_for_the_embeddings_is_a_linear_and_a_hint_derives_its_transpose():
  """ALBERT projects its embeddings up to the hidden width (``embedding_hidden_mapping_in``,
  torch ``[out, in]``); a flax target calls that Dense ``embed_proj``. A ``kernel`` is a
  Dense's (an Embed's is ``embedding``), so the hint is read as a linear and transposed
  (it was taken for a table, whose layout a hint does not transpose, and refused)."""
  w, b = rand(32, 16), rand(32)
  src = MemorySource(
    {"encoder.embedding_hidden_mapping_in.weight": w, "encoder.embedding_hidden_mapping_in.bias": b}
  )
  target = {"embed_proj": {"kernel": sds(16, 32), "bias": sds(32)}}
  hints = {"embed_proj/kernel": "encoder.embedding_hidden_mapping_in.weight"}
  got = prj.restore(target, src, recipes=prj.match(target, src, hints=hints))
  np.testing.assert_array_equal(got["embed_proj"]["kernel"], w.T)
  np.testing.assert_array_equal(got["embed_proj"]["bias"], b)


def test_hints_work_under_list_indices_and_derive_the_layout():
  """A Python list of blocks (``blocks/0/...``): one ``{i}`` hint, and each tensor stored
  ``[out, in]`` arrives transposed into the ``[in, out]`` leaf."""
  ck = {f"enc.{i}.proj.weight": rand(6, 4) for i in range(2)}
  src = MemorySource(ck)
  target = {"blocks": [{"w0": {"kernel": sds(4, 6)}} for _ in range(2)]}
  m = prj.match(target, src, hints={"blocks/{i}/w0/kernel": "enc.{i}.proj.weight"})
  got = prj.restore(target, src, recipes=m)
  for i in range(2):
    np.testing.assert_array_equal(got["blocks"][i]["w0"]["kernel"], ck[f"enc.{i}.proj.weight"].T)


# --- a fused tensor's layout, said once (match/hints.py: layouts) --------------------------------


QKV = ("query", "key", "value")


def _fused_qkv(layers=2):
  """A GPT-NeoX-like layer without a config: q, k, v as rows of one ``query_key_value`` per
  layer, 2 heads of 8, laid out per head (``[heads, 3, head_dim]``), every value distinct,
  beside an MLP input (its shape says the checkpoint keeps ``[out, in]``); the target's q, k,
  v and MLP input as flax kernels and biases."""
  ck, target = {}, {}
  for i in range(layers):
    at = f"gpt_neox.layers.{i}.attention."
    ck[at + "query_key_value.weight"] = rand(48, 16)
    ck[at + "query_key_value.bias"] = rand(48)
    ck[f"gpt_neox.layers.{i}.mlp.dense_h_to_4h.weight"] = rand(64, 16)
    target[f"layers_{i}"] = {n: {"kernel": sds(16, 16), "bias": sds(16)} for n in QKV}
    target[f"layers_{i}"]["mlp"] = {"up": {"kernel": sds(16, 64)}}
  return ck, target


def _per_head(w, part):  # the rows of q (0), k (1) or v (2) in [heads, 3, head_dim] order
  return np.concatenate([w[h * 24 + part * 8 : h * 24 + part * 8 + 8] for h in range(2)])


def test_one_layout_hint_answers_every_layers_kernels_and_biases():
  ck, target = _fused_qkv()
  with pytest.raises(prj.MatchError) as info:
    prj.match(target, MemorySource(ck))
  key = "gpt_neox.layers.{i}.attention.query_key_value"
  assert list(info.value.problems[0].choices) == [key]
  assert f'# "{key}": "per_head:8",' in info.value.hints_code
  m = prj.match(target, MemorySource(ck), hints={key: "per_head:8"})
  assert "as the layout hint says" in dict((t, w) for t, _, w in m.rows())["layers_1/key/bias"]
  effects = {t: (before, after) for t, before, after in m.hint_effects}
  assert effects["layers_1/key/bias"][0] == "refused"  # what the hint changed is reported
  got = prj.restore(target, MemorySource(ck), recipes=m)
  for i in range(2):
    w = ck[f"gpt_neox.layers.{i}.attention.query_key_value.weight"]
    b = ck[f"gpt_neox.layers.{i}.attention.query_key_value.bias"]
    for part, n in enumerate(QKV):
      np.testing.assert_array_equal(got[f"layers_{i}"][n]["kernel"], _per_head(w, part).T)
      np.testing.assert_array_equal(got[f"layers_{i}"][n]["bias"], _per_head(b, part))
  # the same hint without the head size: contiguous thirds are another layout, not this one
  thirds = prj.match(target, MemorySource(ck), hints={key: "contiguous"})
  got = prj.restore(target, MemorySource(ck), recipes=thirds)
  w = ck["gpt_neox.layers.0.attention.query_key_value.weight"]
  np.testing.assert_array_equal(got["layers_0"]["key"]["kernel"], w[16:32].T)


@pytest.mark.parametrize(
  "hints, message",
  [
    (
      {"layers_0/query/kernel": "per_head"},
      "hint for 'layers_0/query/kernel': 'per_head' is the layout of a fused checkpoint tensor, "
      "not a parameter's hint: key it by that tensor or its module, e.g. "
      "hints={'gpt_neox.layers.{i}.attention.query_key_value': 'per_head'}",
    ),
    (
      {"gpt_neox.layers.{i}.attention.qkv": "contiguous"},
      "layout hint 'gpt_neox.layers.{i}.attention.qkv': no checkpoint tensor or module is "
      "'gpt_neox.layers.{i}.attention.qkv'",
    ),
    (
      {"gpt_neox.layers.{i}.mlp.dense_h_to_4h": "contiguous"},
      "layout hint 'gpt_neox.layers.{i}.mlp.dense_h_to_4h': "
      "'gpt_neox.layers.0.mlp.dense_h_to_4h.weight' is no fused qkv or gate_up tensor",
    ),
  ],
)
def test_a_wrong_layout_hint_says_which_and_the_fix(hints, message):
  ck, target = _fused_qkv()
  with pytest.raises(prj.MatchError) as info:
    prj.match(target, MemorySource(ck), hints=hints)
  assert message in str(info.value)
  assert info.value.partial is None  # refused before anything was decided


def test_a_gate_up_layout_is_contiguous_interleaved_or_refused():
  """``[gate | up]``, or gate and up alternating (GPT-OSS's ``gate_up[..., ::2]``, ``[..., 1::2]``)."""
  ck = {"h.0.mlp.gate_up_proj.weight": rand(12, 4), "h.0.mlp.down_proj.weight": rand(4, 6)}
  target = {
    "h_0": {
      "mlp": {
        n: {"kernel": sds(*s)} for n, s in (("gate", (4, 6)), ("up", (4, 6)), ("down", (6, 4)))
      }
    }
  }
  with pytest.raises(prj.MatchError, match="a fused gate_up is laid out"):
    prj.match(target, MemorySource(ck), hints={"h.0.mlp.gate_up_proj": "per_head"})
  m = prj.match(target, MemorySource(ck), hints={"h.{i}.mlp.gate_up_proj": "contiguous"})
  got = prj.restore(target, MemorySource(ck), recipes=m)["h_0"]["mlp"]
  np.testing.assert_array_equal(got["up"]["kernel"], ck["h.0.mlp.gate_up_proj.weight"][6:].T)
  m = prj.match(target, MemorySource(ck), hints={"h.{i}.mlp.gate_up_proj": "interleaved"})
  got = prj.restore(target, MemorySource(ck), recipes=m)["h_0"]["mlp"]
  np.testing.assert_array_equal(got["gate"]["kernel"], ck["h.0.mlp.gate_up_proj.weight"][::2].T)
  np.testing.assert_array_equal(got["up"]["kernel"], ck["h.0.mlp.gate_up_proj.weight"][1::2].T)


@pytest.mark.parametrize("config", [None, {"model_type": "newer_llama"}])
def test_an_unknown_layout_asks_for_config_json_only_where_there_is_none(config):
  """A fused gate_up the config does not place: the fix offered is a config.json only where
  there is none (beside one that does not say, pointing at it sends the user in a circle)."""
  ck = {"h.0.mlp.gate_up_proj.weight": rand(12, 4), "h.0.mlp.down_proj.weight": rand(4, 6)}
  mlp = {n: {"kernel": sds(*s)} for n, s in (("gate", (4, 6)), ("up", (4, 6)), ("down", (6, 4)))}
  with pytest.raises(prj.MatchError) as info:
    prj.match({"h_0": {"mlp": mlp}}, MemorySource(ck), config=config)
  (problem,) = info.value.problems
  said = "(no config.json)" if config is None else "(config.json model_type 'newer_llama')"
  fix = "say the layout the model uses: one hint for the fused 'h.0.mlp.gate_up_proj'"
  if config is None:
    fix = "Restore from a source that has the model's config.json " + (
      "(SafetensorsSource reads it beside the weights; match(..., config=...) for others), or "
      + fix
    )
  else:
    fix = fix[0].upper() + fix[1:]
  assert f"is not known for this checkpoint {said}: nothing is split by guess. {fix}" in problem


def test_a_layout_that_does_not_tile_the_parts_is_asked_again():
  ck, target = _fused_qkv(1)
  key = "gpt_neox.layers.0.attention.query_key_value"
  with pytest.raises(prj.MatchError) as info:
    prj.match(target, MemorySource(ck), hints={key: "per_head:3"})  # 16 is no multiple of 3
  assert "not known for this checkpoint" in str(info.value)
  assert '"per_head:8"' in info.value.hints_code


def test_a_per_head_layout_hint_over_grouped_heads_is_refused_not_read_out_of_range():
  """4 q heads over 2 kv heads: ``per_head`` (one k and v per q head) cannot tile the fused
  rows; the hint is refused with why, and the layouts that do tile are offered."""
  ck = {"l.0.attn.qkv.weight": rand(64, 32), "l.0.mlp.up.weight": rand(48, 32)}
  target = {"l_0": {"attn": {n: {"kernel": sds(32, w)} for n, w in zip("qkv", (32, 16, 16))}}}
  target["l_0"]["mlp"] = {"up": {"kernel": sds(32, 48)}}
  with pytest.raises(prj.MatchError) as info:
    prj.match(target, MemorySource(ck), hints={"l.{i}.attn.qkv": "per_head:8"})
  assert "the layout 'per_head' does not tile its 64 rows" in str(info.value)
  assert '"l.0.attn.qkv": "grouped:8",' in info.value.hints_code
  m = prj.match(target, MemorySource(ck), hints={"l.{i}.attn.qkv": "grouped:8"})
  got = prj.restore(target, MemorySource(ck), recipes=m)["l_0"]["attn"]
  w = ck["l.0.attn.qkv.weight"]  # per kv group: [q q k v] of 8 rows each, twice
  np.testing.assert_array_equal(got["k"]["kernel"], np.concatenate([w[16:24], w[48:56]]).T)


def _gpt_oss_biases():
  """GPT-OSS's experts keep gate and up alternating in one fused tensor (its code reads
  ``gate_up[..., ::2]`` and ``gate_up[..., 1::2]``), ``[E, 2I]`` for the bias."""
  r = np.random.default_rng(3)
  ck = {
    "model.layers.0.mlp.experts.gate_up_proj_bias": r.standard_normal((4, 12)).astype(np.float32),
    "model.layers.0.mlp.experts.down_proj_bias": r.standard_normal((4, 8)).astype(np.float32),
  }
  experts = {
    n: {"bias": sds(4, w)} for n, w in (("gate_proj", 6), ("up_proj", 6), ("down_proj", 8))
  }
  return ck, {"layers_0": {"mlp": {"experts": experts}}}


def test_gpt_oss_experts_alternate_gate_and_up():
  """The config's model type says the layout: gate the even rows, up the odd ones. Without
  it both layouts are lines (only ``[gate | up]`` was, and its line failed to plan: the
  per-expert bias was read as a weight, split along its experts)."""
  ck, target = _gpt_oss_biases()
  fused = ck["model.layers.0.mlp.experts.gate_up_proj_bias"]
  m = prj.match(target, MemorySource(ck), config={"model_type": "gpt_oss", "hidden_size": 8})
  got = prj.restore(target, MemorySource(ck), recipes=m)["layers_0"]["mlp"]["experts"]
  np.testing.assert_array_equal(got["gate_proj"]["bias"], fused[:, ::2])
  np.testing.assert_array_equal(got["up_proj"]["bias"], fused[:, 1::2])
  with pytest.raises(prj.MatchError) as e:
    prj.match(target, MemorySource(ck))
  (lines,) = literal_entries(e.value).values()
  assert [uncommented(x) for x in lines] == [
    {"model.layers.0.mlp.experts.gate_up_proj": "contiguous"},
    {"model.layers.0.mlp.experts.gate_up_proj": "interleaved"},
  ]
  m = prj.match(target, MemorySource(ck), hints=uncommented(lines[1]))
  got = prj.restore(target, MemorySource(ck), recipes=m)["layers_0"]["mlp"]["experts"]
  np.testing.assert_array_equal(got["up_proj"]["bias"], fused[:, 1::2])
