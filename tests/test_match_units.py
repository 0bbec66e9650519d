"""The ``match`` package's parts on their own: the vocabulary's folding, the evidence read from a
config, the fused layouts' rows against their definitions, the layouts a tensor can take, and
a refusal's text. The whole pipeline is tested by forward pass elsewhere; these pin each rule."""

from __future__ import annotations

import numpy as np
import pytest

from paramreg_jax._src.match import candidates as cand_lib
from paramreg_jax._src.match import coherence
from paramreg_jax._src.match import decide
from paramreg_jax._src.match import evidence
from paramreg_jax._src.match.vocabulary import concepts


@pytest.mark.parametrize(
  "name, tokens, kind",
  [
    ("model.layers.3.self_attn.q_proj.weight", {"layers", "attn", "q", "w"}, "w"),
    ("layers_3/attention/query/kernel", {"layers", "attn", "q", "w"}, "w"),
    ("layer_0/ln1/offset", {"layers", "attn", "norm", "b"}, "b"),
    ("decoder/layers_0/cross_attn_norm/scale", {"decoder", "layers", "xattn", "norm", "w"}, "w"),
    (
      "model.decoder.layers.0.encoder_attn_layer_norm.weight",
      {"decoder", "layers", "xattn", "norm", "w"},
      "w",
    ),
    (
      "transformer.blocks.0.norm_2.weight",
      {"layers", "mlp", "norm", "w"},
      "w",
    ),
    (
      "model.layers.0.self_attn.q_layernorm.norms.2.weight",
      {"layers", "attn", "q", "norm", "heads", "w"},
      "w",
    ),
    ("model.encoder.layernorm_embedding.weight", {"encoder", "embed", "norm", "w"}, "w"),
  ],
)
def test_names_fold_to_concepts(name, tokens, kind):
  c = concepts(name)
  assert set(c.tokens) == tokens and c.kind == kind


def test_a_bare_name_is_marked_and_only_projections_are_linear():
  a_log, wq = concepts("backbone.layers.0.mixer.A_log"), concepts("layers/0/attention/wq")
  assert a_log.bare and wq.bare and not concepts("mlp.up_proj.weight").bare
  assert not evidence.is_linear(a_log, (16, 4)) and evidence.is_linear(wq, (4, 4))
  assert evidence.linear_target(concepts("mlp/x"), (4, 6))  # a target's name is the user's


@pytest.mark.parametrize(
  "config, layout, post",
  [
    ({"model_type": "bloom", "n_head": 4, "hidden_size": 32}, "per_head", False),
    ({"model_type": "persimmon", "num_attention_heads": 4, "hidden_size": 32}, "per_head", False),
    ({"model_type": "mpt", "n_heads": 4, "d_model": 32}, "contiguous", False),
    ({"model_type": "codegen", "n_head": 4, "n_embd": 32}, "blocked_qvk4", False),
    (
      {"model_type": "falcon", "new_decoder_architecture": True, "num_attention_heads": 4},
      "grouped",
      False,
    ),
    ({"model_type": "olmo2", "num_attention_heads": 4, "hidden_size": 32}, None, True),
    ({"model_type": "llama", "num_attention_heads": 4, "hidden_size": 32}, None, False),
  ],
)
def test_the_config_says_the_fused_layout_and_the_norm_roles(config, layout, post):
  facts = evidence.facts_from_config(config)
  assert facts.qkv_layout == layout and facts.post_norms == post


def test_per_head_rows_are_the_view_heads_3_head_dim():
  """GPT-NeoX/Bloom/Persimmon: ``fused.view(heads, 3, head_dim)``: q is [:, 0], k [:, 1]..."""
  h, d = 4, 2
  facts = evidence.Facts(heads=h, kv_heads=h, head_dim=d)
  rows = evidence.part_rows("per_head", ("q", "k", "v"), [h * d] * 3, facts)
  fused = np.arange(3 * h * d).reshape(h, 3, d)
  for n, part in enumerate("qkv"):
    assert rows[part] == fused[:, n, :].reshape(-1).tolist()


def test_the_router_beside_fused_experts_and_olmo2s_post_norm_take_their_roles():
  keys = [
    "model.layers.0.mlp.gate.weight",
    "model.layers.0.mlp.experts.gate_up_proj",
    "model.layers.0.post_attention_layernorm.weight",
  ]
  folded = {k: concepts(k) for k in keys}
  evidence.norm_roles(folded, evidence.facts_from_config({"model_type": "olmo2"}))
  assert {"moe", "router"} <= folded[keys[0]].tokens and "gate" not in folded[keys[0]].tokens
  assert {"attn", "post", "norm"} <= folded[keys[2]].tokens


@pytest.mark.parametrize(
  "src, dst, how",
  [
    ((8, 4), (4, 8), "t"),
    ((16, 3, 5, 5), (5, 5, 3, 16), "conv"),
    ((4, 8, 2), (4, 2, 8), "t"),  # experts [E, out, in] -> [E, in, out]
    ((8, 4), (4, 2, 4), "t+heads"),
  ],
)
def test_a_tensor_takes_the_layouts_its_shape_allows(src, dst, how):
  layouts = dict(cand_lib._layouts(src, dst, linear=True))
  assert how in layouts


def test_a_refusal_lists_every_candidate_and_offers_no_pick():
  c = [
    cand_lib.Candidate(
      0.8, (f"k{i}",), "name", lambda i=i: __import__("paramreg_jax").recipes.source(f"k{i}")
    )
    for i in range(3)
  ]
  text = decide.ambiguous("x/bias", c)
  assert all(f"'k{i}' [name] (0.80): R.source('k{i}')" in text for i in range(3))
  assert "hints={'x/bias': '<checkpoint name>'}" in text and "choose" not in text


def test_modules_and_layer_templates():
  assert coherence.target_module("blocks/0/mlp_out/bias") == "blocks/0/mlp_out"
  assert coherence.target_module("layers/0/attention/wq") is None
  assert (
    coherence.checkpoint_module("encoder.layer.0.output.dense.bias")
    == "encoder.layer.0.output.dense"
  )
  assert coherence.template("layers_3/conv1/kernel") == "layers_#/conv1/kernel"
