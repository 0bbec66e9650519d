"""The ``match`` package's parts on their own: the vocabulary's folding, the evidence read from a
config, the fused layouts' rows against their definitions, the layouts a tensor can take, and
a refusal's text. The whole pipeline is tested by forward pass elsewhere; these pin each rule."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import paramreg_jax as prj
from paramreg_jax._src.match import candidates as cand_lib
from paramreg_jax._src.match import coherence
from paramreg_jax._src.match import config_facts
from paramreg_jax._src.match import decide
from paramreg_jax._src.match import evidence
from paramreg_jax._src.match import layouts as layouts_lib
from paramreg_jax._src.match import numbering
from paramreg_jax._src.match import order
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
    ("layer.0.ffn_output.bias", {"layers", "mlp", "down", "b"}, "b"),  # ALBERT's MLP output
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
  facts = config_facts.facts_from_config(config)
  assert facts.qkv_layout == layout and facts.post_norms == post


def test_per_head_rows_are_the_view_heads_3_head_dim():
  """GPT-NeoX/Bloom/Persimmon: ``fused.view(heads, 3, head_dim)``: q is [:, 0], k [:, 1]..."""
  h, d = 4, 2
  facts = config_facts.Facts(heads=h, kv_heads=h, head_dim=d)
  rows = config_facts.part_rows("per_head", ("q", "k", "v"), [h * d] * 3, facts)
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
  evidence.norm_roles(folded, config_facts.facts_from_config({"model_type": "olmo2"}))
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
  layouts = dict(layouts_lib.readings(src, dst, linear=True))
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
  assert coherence.template("layer2.1.bn1.weight") == "layer#.#.bn1.weight"
  assert coherence.template("layers.0.ffn.layer1.0.weight") == "layers.#.ffn.layer1.0.weight"


def test_a_module_numbered_in_its_own_name_keeps_its_place():
  """torchvision's ``conv1``/``bn2``: the module's concept and its place ``#j``, which pairs
  it in order with flax's ``Conv_0``/``Conv_1``; a word the vocabulary knows whole is not
  split (``fc1``), and one letter and a number is not a module and a place (``w1``)."""
  assert concepts("layer1.0.conv2.weight").tokens == {"layers", "conv", "#2", "w"}
  assert concepts("layer1.0.bn1.running_var").tokens == {"layers", "norm", "#1", "var", "w"}
  assert "#1" not in concepts("h.0.mlp.fc1.weight").tokens
  assert "#1" not in concepts("layers.0.feed_forward.w1.weight").tokens
  assert concepts("layer2.0.downsample.1.weight").tokens >= {"proj"}  # the shortcut


@pytest.mark.parametrize(
  "name, indices",
  [
    ("DecoderLayer_3/Attention_0/Dense_0/kernel", (3,)),  # a block class flax auto-names
    ("Transformer/encoderblock_2/MlpBlock_0/Dense_1/kernel", (2,)),  # big_vision
    ("ConvNeXtStage_1/ConvNeXtBlock_0/Conv_0/kernel", (1, 0)),
    ("feature_extractor/conv_layers_1/conv/kernel", (1,)),
    ("MlpBlock_0/Dense_0/kernel", ()),  # a part of a layer, named as a module
    ("MoeBlock_0/wi_0", ()),
    ("stem/0/kernel", ()),  # a sequential outside the layers
    ("classifier.1.weight", ()),
    ("layers/1/mlp/layers/0/weight", (1,)),  # equinox's MLP: its list holds its modules
    ("model.layers.3.block_sparse_moe.experts.7.w1.weight", (3, 7)),
    ("layers/0/1/0/kernel", (0,)),
    ("layer2.1.downsample.0.weight", (2, 1)),  # torchvision: stage 2's block 1
    ("layers.0.ffn.layer1.weight", (0,)),  # a module named layer1 inside a layer
    ("encoder.conv2.weight", ()),
    # a block class named for a part of a layer: inside a layer, that part (MaxText's
    # DeepSeek); outside, a layer (CLIP's ResidualAttentionBlock)
    ("decoder/layers_1/DeepSeekMoeBlock_0/MoeBlock_0/wi_0", (1,)),
    ("visual/ResidualAttentionBlock_3/mlp/c_fc/kernel", (3,)),
    # a sequential under a head's, a stem's, an embedding's or a projection's word, even one
    # the vocabulary knows only in parts: its modules (vit-pytorch's mlp_head, LDM's time_embed)
    ("mlp_head/1/kernel", ()),
    ("lm_head/0/kernel", ()),
    ("conv_stem/0/kernel", ()),
    ("time_embed.2.weight", ()),
    ("transformer_blocks/0/attn1/to_q/kernel", (0,)),
    ("encoder_layers/1/fc1/kernel", (1,)),
  ],
)
def test_which_numbers_are_layers(name, indices):
  assert concepts(name).indices == indices


def test_layer_scales_weight_norms_and_torch_attention_fold_to_roles():
  assert {"layerscale", "attn"} <= concepts("encoder.layer.0.layer_scale1.lambda1").tokens
  assert {"layerscale", "mlp"} <= concepts("blocks/0/ls2").tokens
  g = concepts("encoder.pos_conv_embed.conv.parametrizations.weight.original0").tokens
  assert "weightnorm" in g
  assert coherence.checkpoint_module("conv.parametrizations.weight.original1") == "conv"
  assert coherence.checkpoint_module("conv.weight_g") == "conv"
  assert concepts("head.attention.in_proj_weight").tokens >= {"qkv", "w"}
  assert config_facts.layout_by_name("vision_model.head.attention.in_proj_bias") == "contiguous"
  assert coherence.template("DecoderLayer_3/mlp/layers/1/w") == "DecoderLayer_#/mlp/layers/1/w"


def _sds(*shape):
  return jax.ShapeDtypeStruct(shape, np.float32)


def test_a_weight_only_its_own_shape_fits_is_taken_only_when_nothing_else_could_be():
  rng = np.random.default_rng(0)
  ck = {
    "stem.weight": rng.standard_normal((8, 3, 4, 4)).astype(np.float32),
    "classifier.weight": rng.standard_normal((5, 8)).astype(np.float32),
    "norm.weight": rng.standard_normal((8,)).astype(np.float32),
  }
  target = {"Conv_0": {"kernel": _sds(4, 4, 3, 8)}, "Dense_0": {"kernel": _sds(8, 5)}}
  rows = {t: (r, why) for t, r, why in prj.match(target, prj.MemorySource(ck)).rows()}
  assert rows["Conv_0/kernel"] == (
    "transpose(source('stem.weight'), (2, 3, 1, 0))",
    "unique shape, both conv kernels",
  )
  assert rows["Dense_0/kernel"][1] == "unique shape, both linear weights"
  # a vector is never taken so, nor a weight a second leaf could be
  with pytest.raises(prj.MatchError):
    prj.match({"Gain_0": {"scale": _sds(8)}}, prj.MemorySource(ck))
  two = {**target, "Dense_1": {"kernel": _sds(5, 8)}}  # classifier.weight as stored, too
  with pytest.raises(prj.MatchError) as e:
    prj.match(two, prj.MemorySource(ck))
  assert "Dense_0/kernel" in str(e.value)
  # an embedding table is not a linear kernel (a tied head is decided by its own evidence)
  emb = {"embeddings.word_embeddings.weight": np.zeros((99, 8), np.float32)}
  with pytest.raises(prj.MatchError):
    prj.match({"Dense_0": {"kernel": _sds(8, 99)}}, prj.MemorySource(emb))


def test_two_towers_are_not_a_model_prefix():
  """A leading component most keys share is noise (``gpt_neox.``), but not where two leading
  components hold layers: stripping ``vision_model.`` alone made the vision tower's names
  read closer to every target name than the text tower's."""
  neox = [f"gpt_neox.layers.{i}.mlp.dense_h_to_4h.weight" for i in range(3)] + ["embed_out.weight"]
  assert evidence.model_prefix(neox) == {"gpt_neox"}
  clip = [
    f"{t}_model.encoder.layers.{i}.mlp.fc1.weight" for t in ("text", "vision") for i in (0, 1)
  ]
  clip += ["vision_model.post_layernorm.weight", "logit_scale"]
  assert evidence.model_prefix(clip) == frozenset()
  # a head's numbered sequential is no tower
  resnet = [f"resnet.encoder.stages.{i}.layers.0.conv.weight" for i in range(3)]
  assert evidence.model_prefix([*resnet, "classifier.1.weight"]) == {"resnet"}


def test_an_untied_auto_named_head_takes_lm_head_only_when_the_config_says_untied():
  rng = np.random.default_rng(2)
  ck = {
    "model.embed_tokens.weight": rng.standard_normal((99, 32)).astype(np.float32),
    "lm_head.weight": rng.standard_normal((99, 32)).astype(np.float32),
  }
  target = {"Embed_0": {"embedding": _sds(99, 32)}, "Dense_0": {"kernel": _sds(32, 99)}}
  config = {"model_type": "llama", "tie_word_embeddings": False}
  m = prj.match(target, prj.MemorySource(ck), config=config)
  got = prj.restore(target, prj.MemorySource(ck), recipes=m)
  np.testing.assert_array_equal(got["Dense_0"]["kernel"], ck["lm_head.weight"].T)
  np.testing.assert_array_equal(got["Embed_0"]["embedding"], ck["model.embed_tokens.weight"])
  with pytest.raises(prj.MatchError) as e:  # nothing says the head is not the embedding
    prj.match(target, prj.MemorySource(ck))
  assert "Dense_0/kernel" in str(e.value)


def test_a_sibling_named_alike_places_a_norm_beside_its_conv_and_numbers_pair_nothing():
  def cand(k):
    return cand_lib.Candidate(0.5, (k,), "name", None)

  block = "net/block"
  decided = {
    f"{block}/conv_0/w": ("stem.unit_0.conv.weight",),
    f"{block}/shortcut_conv/w": ("stem.short.conv.weight",),
    "net/head/w": ("fc.weight",),
  }
  # each norm's only candidates are the norm beside conv_0's convolution in its unit
  open_ = {
    f"{block}/{norm}/scale": [cand("stem.unit_0.norm.weight"), cand("stem.unit_0.norm.bias")]
    for norm in ("batchnorm_1", "batchnorm_0", "shortcut_batchnorm")
  }
  # no enclosing module narrows anything: the block's decided leaves point two ways
  got = coherence.settle_by_subtree(open_, decided, lambda c: c[:1])
  # shortcut_batchnorm pairs with shortcut_conv (its unit is stem.short: no candidate there);
  # batchnorm_1 shares only "batchnorm", which two siblings have: neither is paired
  assert set(got) == set()
  open_ = {"net/initial_bn/scale": [cand("stem.unit_0.norm.weight")]}
  decided = {"net/initial_conv/w": ("stem.unit_0.conv.weight",), "net/head/w": ("fc.weight",)}
  got = coherence.settle_by_subtree(open_, decided, lambda c: c[:1])
  assert {n: (c.keys, by) for n, (c, by) in got.items()} == {
    "net/initial_bn/scale": (("stem.unit_0.norm.weight",), "net/initial_conv/w")
  }
  # two of one kind are not partners: batchnorm_1 is not placed beside batchnorm_0
  open_ = {"net/block/batchnorm_1/scale": [cand("stem.unit_0.conv.weight")]}
  decided = {
    "net/block/batchnorm_0/scale": ("stem.unit_0.norm.weight",),
    "net/block/conv_1/w": ("stem.unit_1.conv.weight",),
  }
  assert coherence.settle_by_subtree(open_, decided, lambda c: c[:1]) == {}
  open_ = {"net/initial_bn/scale": [cand("stem.unit_0.norm.weight")]}
  decided = {"net/initial_conv/w": ("stem.unit_0.conv.weight",), "net/head/w": ("fc.weight",)}
  # a third module sharing the word: "initial" names no one pair
  decided["net/initial_pool/w"] = ("pool.weight",)
  assert coherence.settle_by_subtree(open_, decided, lambda c: c[:1]) == {}


def test_a_list_below_a_block_counts_from_0_and_a_name_from_1():
  """transformers' ``layer.{j}`` below a block is a place ``@j`` counted from 0; torch's
  ``conv1`` is ``#1``, counted from 1. They must never be equal tokens: then ``conv1`` would
  take ``layer.1``, the block's second convolution. Only the order within one kind counts."""
  assert numbering.position("@0") == 0 and numbering.position("#1") == 1
  assert numbering.position("@x") is None and numbering.position("conv") is None
  targets = [
    (f"ResNetBlock_{n}/{m}/kernel", (3, 3, 4, 4)) for n in range(2) for m in ("conv1", "conv2")
  ]
  folded = {
    f"stages.{s}.layers.0.layer.{j}.convolution.weight": concepts(
      f"stages.{s}.layers.0.layer.{j}.convolution.weight"
    )
    for s in range(2)
    for j in range(2)
  }
  shapes = {k: (4, 4, 3, 3) for k in folded}
  read, pairs = numbering.across_stages(folded, shapes, targets)
  assert pairs == (("0", "(0, 0)"), ("1", "(1, 0)"))
  second = read["stages.1.layers.0.layer.1.convolution.weight"]
  assert second.indices == (1,) and "@1" in second.tokens and "#1" not in second.tokens
  # the target's own number from its name is a sibling number: conv1 before conv2
  assert order._sibling("ResNetBlock_0/conv2/kernel") == (("ResNetBlock_0", "conv", "kernel"), 2)
  assert order._sibling("ResNetBlock_0/fc/kernel") == (("ResNetBlock_0", "fc", "kernel"), 0)


def test_a_stage_numbered_backbone_is_read_beside_one_number_layers():
  """DETR: the target's two-number backbone blocks are read against the checkpoint's
  stage-numbered tensors alone, while its one-number encoder layers stay as they are."""
  targets = [(f"backbone/Stage_{s}/Block_0/conv1/kernel", (3, 3, 4, 4)) for s in range(2)]
  targets += [(f"encoder/layers/{i}/fc1/kernel", (8, 8)) for i in range(2)]
  names = [f"backbone.stages.{s}.layers.0.layer.0.convolution.weight" for s in range(2)]
  names += [f"encoder.layers.{i}.fc1.weight" for i in range(2)]
  folded = {k: concepts(k) for k in names}
  shapes = {k: (4, 4, 3, 3) if "backbone" in k else (8, 8) for k in names}
  read, pairs = numbering.across_stages(folded, shapes, targets)
  assert pairs == (("(0, 0)", "(0, 0)"), ("(1, 0)", "(1, 0)"))
  assert read[names[1]].indices == (1, 0) and "@0" in read[names[1]].tokens
  assert read[names[2]] == folded[names[2]]  # the encoder's layers: untouched
  # the backbone's blocks alone do not fit the target's (a third stage): nothing is read
  del targets[1]
  assert numbering.across_stages(folded, shapes, targets) == (folded, ())


def test_three_numbered_norms_beside_a_cross_attention_are_its_three_sublayers():
  """A decoder layer's ``norm1``, ``norm2``, ``norm3`` beside a cross-attention are the
  self-attention's, the cross-attention's and the MLP's (``norm2`` is the MLP's only in a
  block of two); without a cross-attention, three norms say no sublayer."""
  cross = {"self_attn", "cross_attn", "mlp", "norm1", "norm2", "norm3"}
  roles = {
    n: evidence.three_norm_tokens(concepts(f"{n}/scale").tokens, n, cross)
    & {"attn", "xattn", "mlp"}
    for n in ("norm1", "norm2", "norm3")
  }
  assert roles == {"norm1": {"attn"}, "norm2": {"xattn"}, "norm3": {"mlp"}}
  plain = {"attn", "conv", "mlp", "norm1", "norm2", "norm3"}
  for n in ("norm1", "norm2", "norm3"):
    got = evidence.three_norm_tokens(concepts(f"{n}/scale").tokens, n, plain)
    assert not got & {"attn", "xattn", "mlp"}
  two = {"attn", "mlp", "norm1", "norm2"}  # a block of two: left to the rules that know it
  assert evidence.three_norm_tokens(frozenset({"norm", "mlp"}), "norm2", two) == {"norm", "mlp"}
  # the checkpoint's side: norm1..3 beside a cross-attention, found at any depth below
  src = {
    f"blocks.0.{m}.weight": concepts(f"blocks.0.{m}.weight") for m in ("norm1", "norm2", "norm3")
  }
  src["blocks.0.encoder_attn.q.weight"] = concepts("blocks.0.encoder_attn.q.weight")
  before = dict(src)
  evidence.three_norms(src)
  assert "mlp" in before["blocks.0.norm2.weight"].tokens  # alone, the vocabulary's reading
  roles = {
    m: src[f"blocks.0.{m}.weight"].tokens & {"attn", "xattn", "mlp"}
    for m in cross - {"self_attn", "cross_attn", "mlp"}
  }
  assert roles == {"norm1": {"attn"}, "norm2": {"xattn"}, "norm3": {"mlp"}}


def test_a_modules_list_of_linears_is_not_layers():
  """DETR's ``bbox_predictor.layers.{j}``: under a named module, a list of items that hold a
  weight and a bias is that module's, numbered ``@j``; a bare parameter right in a layer
  (BEiT's ``layer.3.lambda_1``) and a model's own ``layers.{i}`` stay layers."""
  c = concepts("bbox_predictor.layers.2.weight")
  assert c.indices == () and "@2" in c.tokens
  assert concepts("model.decoder.layers.1.fc1.weight").indices == (1,)
  assert concepts("model.layers.1.fc1.weight").indices == (1,)  # an item holding modules
  assert concepts("beit.encoder.layer.3.lambda_1").indices == (3,)


def test_a_word_the_vocabulary_knows_whole_is_kept_whole_inside_an_unknown_one():
  """``replicated_layer_norm`` (mesh-transformer-jax's final norm) is a norm, not a layer's
  part: the longest known run of its parts (``layer_norm``) is read whole."""
  assert concepts("model/replicated_layer_norm/scale").tokens == {"replicated", "norm", "w"}
  assert concepts("out/pre_self_attn_layer_norm/scale").tokens >= {"attn", "norm"}
  assert "layers" not in concepts("out/pre_self_attn_layer_norm/scale").tokens
  assert concepts("out/attn_out/kernel").tokens >= {"attn", "o"}  # known runs only: each part
