"""``match`` on architectures the forward-pass suites do not have, each written the way JAX code
is written in the wild: flax auto-names (``DecoderLayer_0``, ``Dense_1``, ``RMSNorm_0``),
big_vision's ViT and SigLIP trees (``encoderblock_0``, ``MlpBlock_0``, ``MAPHead_0``), timm's
numbered sequentials (``stem/0``, ``downsample/1``), haiku's ``~`` module paths with ``linear``
and ``linear_1``, equinox (``[out, in]`` weights, layers in lists, ``mlp/layers/0``), NNX
stacked layers with heads split (out-first, as haliax writes them too), flax's
``nn.WeightNorm`` over a torch weight-normed conv, a linen ResNet with ``batch_stats``;
MaxText's DeepSeek-V3 (latent attention, a router with its score-correction bias, shared and
stacked routed experts), Qwen2-MoE in NNX, ModernBERT with its fused ``Wqkv``/``Wi`` kept or
split, Gemma 2 as Google's gemma library keeps it, Phi in haiku, Mamba as a flax port
keeps it, a Conformer in lingvo's and praxis's words and in NeMo's, RecurrentGemma as
google-deepmind/recurrentgemma keeps it, Qwen2-VL's two towers, DETR (a stage-numbered ResNet
backbone beside one-number encoder and decoder layers) and a ResNet in torch's ``conv1``/``bn1``.

The checkpoints are tiny random Hugging Face models (``make_unseen_fixtures.py``). Each case
also writes out, by hand, what every leaf must hold (the transposes, head splits, conv layouts
and qkv rows a user would write): every restored leaf is compared with it by value. What maps
with no hint must equal it everywhere; what is refused must ask at most three questions, each
with the true tensor among its lines, and choosing those lines must restore it exactly.
"""

from __future__ import annotations

import functools
import itertools
import json
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from safetensors.numpy import load_file
from test_match_projects import gemma_layer
from test_match_refusals import expand_template
from test_match_refusals import literal_entries
from test_match_refusals import uncommented

import paramreg_jax as prj
from paramreg_jax import recipes as R
from paramreg_jax._src.match import hints as hints_lib
from paramreg_jax._src.match.hints import is_layout
from paramreg_jax._src.match.hints import named_keys

DATA = pathlib.Path(__file__).parent / "data" / "unseen"


def ld(name):
  (path,) = [p for p in (DATA / name).glob("*.safetensors")]  # diffusers names its file its way
  return load_file(str(path))


def T(x):
  return np.ascontiguousarray(x.T)


def conv2(x):
  return np.ascontiguousarray(x.transpose(2, 3, 1, 0))  # OIHW -> HWIO


def conv1(x):
  return np.ascontiguousarray(x.transpose(2, 1, 0))  # OIK -> KIO


def heads_in(w, h):  # torch [H*Dh, D] -> [D, H, Dh]
  return np.ascontiguousarray(w.T.reshape(w.shape[1], h, -1))


def heads_out(w, h):  # torch o [D, H*Dh] -> [H, Dh, D]
  return np.ascontiguousarray(w.T.reshape(h, -1, w.shape[0]))


def convnext_timm():
  c = ld("convnext")
  p = "convnext.encoder.stages"
  e = {
    "stem": [
      {
        "kernel": conv2(c["convnext.embeddings.patch_embeddings.weight"]),
        "bias": c["convnext.embeddings.patch_embeddings.bias"],
      },
      {
        "scale": c["convnext.embeddings.layernorm.weight"],
        "bias": c["convnext.embeddings.layernorm.bias"],
      },
    ],
    "stages": [],
  }
  for s in range(3):
    st = {}
    if s:
      st["downsample"] = [
        {
          "scale": c[f"{p}.{s}.downsampling_layer.0.weight"],
          "bias": c[f"{p}.{s}.downsampling_layer.0.bias"],
        },
        {
          "kernel": conv2(c[f"{p}.{s}.downsampling_layer.1.weight"]),
          "bias": c[f"{p}.{s}.downsampling_layer.1.bias"],
        },
      ]
    blocks = []
    for b in range(2):
      q = f"{p}.{s}.layers.{b}"
      blocks.append(
        {
          "conv_dw": {"kernel": conv2(c[f"{q}.dwconv.weight"]), "bias": c[f"{q}.dwconv.bias"]},
          "norm": {"scale": c[f"{q}.layernorm.weight"], "bias": c[f"{q}.layernorm.bias"]},
          "mlp": {
            "fc1": {"kernel": T(c[f"{q}.pwconv1.weight"]), "bias": c[f"{q}.pwconv1.bias"]},
            "fc2": {"kernel": T(c[f"{q}.pwconv2.weight"]), "bias": c[f"{q}.pwconv2.bias"]},
          },
          "gamma": c[f"{q}.layer_scale_parameter"],
        }
      )
    st["blocks"] = blocks
    e["stages"].append(st)
  e["head"] = {
    "norm": {"scale": c["convnext.layernorm.weight"], "bias": c["convnext.layernorm.bias"]},
    "fc": {"kernel": T(c["classifier.weight"]), "bias": c["classifier.bias"]},
  }
  return "convnext", e


def convnext_flax():
  c = ld("convnext")
  p = "convnext.encoder.stages"
  e = {
    "Conv_0": {
      "kernel": conv2(c["convnext.embeddings.patch_embeddings.weight"]),
      "bias": c["convnext.embeddings.patch_embeddings.bias"],
    },
    "LayerNorm_0": {
      "scale": c["convnext.embeddings.layernorm.weight"],
      "bias": c["convnext.embeddings.layernorm.bias"],
    },
  }
  for s in range(3):
    st = {}
    if s:
      st["LayerNorm_0"] = {
        "scale": c[f"{p}.{s}.downsampling_layer.0.weight"],
        "bias": c[f"{p}.{s}.downsampling_layer.0.bias"],
      }
      st["Conv_0"] = {
        "kernel": conv2(c[f"{p}.{s}.downsampling_layer.1.weight"]),
        "bias": c[f"{p}.{s}.downsampling_layer.1.bias"],
      }
    for b in range(2):
      q = f"{p}.{s}.layers.{b}"
      st[f"ConvNeXtBlock_{b}"] = {
        "Conv_0": {"kernel": conv2(c[f"{q}.dwconv.weight"]), "bias": c[f"{q}.dwconv.bias"]},
        "LayerNorm_0": {"scale": c[f"{q}.layernorm.weight"], "bias": c[f"{q}.layernorm.bias"]},
        "Dense_0": {"kernel": T(c[f"{q}.pwconv1.weight"]), "bias": c[f"{q}.pwconv1.bias"]},
        "Dense_1": {"kernel": T(c[f"{q}.pwconv2.weight"]), "bias": c[f"{q}.pwconv2.bias"]},
        "layer_scale": c[f"{q}.layer_scale_parameter"],
      }
    e[f"ConvNeXtStage_{s}"] = st
  e["LayerNorm_1"] = {"scale": c["convnext.layernorm.weight"], "bias": c["convnext.layernorm.bias"]}
  e["Dense_0"] = {"kernel": T(c["classifier.weight"]), "bias": c["classifier.bias"]}
  return "convnext", {"params": e}


def qwen3_vmap():
  c = ld("qwen3")
  L = 2

  def st(f):
    return np.stack([f(f"model.layers.{i}.") for i in range(L)])

  e = {
    "embed": {"embedding": c["model.embed_tokens.weight"]},
    "layers": {
      "attn_norm": {"scale": st(lambda q: c[q + "input_layernorm.weight"])},
      "mlp_norm": {"scale": st(lambda q: c[q + "post_attention_layernorm.weight"])},
      "attn": {
        "q_proj": {"kernel": st(lambda q: heads_in(c[q + "self_attn.q_proj.weight"], 4))},
        "k_proj": {"kernel": st(lambda q: heads_in(c[q + "self_attn.k_proj.weight"], 2))},
        "v_proj": {"kernel": st(lambda q: heads_in(c[q + "self_attn.v_proj.weight"], 2))},
        "o_proj": {"kernel": st(lambda q: heads_out(c[q + "self_attn.o_proj.weight"], 4))},
        "q_norm": {"scale": st(lambda q: c[q + "self_attn.q_norm.weight"])},
        "k_norm": {"scale": st(lambda q: c[q + "self_attn.k_norm.weight"])},
      },
      "mlp": {
        "gate_proj": {"kernel": st(lambda q: T(c[q + "mlp.gate_proj.weight"]))},
        "up_proj": {"kernel": st(lambda q: T(c[q + "mlp.up_proj.weight"]))},
        "down_proj": {"kernel": st(lambda q: T(c[q + "mlp.down_proj.weight"]))},
      },
    },
    "final_norm": {"scale": c["model.norm.weight"]},
    "lm_head": {"kernel": T(c["lm_head.weight"])},
  }
  return "qwen3", e


def qwen3_flax_auto():
  c = ld("qwen3")
  e = {"Embed_0": {"embedding": c["model.embed_tokens.weight"]}}
  for i in range(2):
    q = f"model.layers.{i}."
    e[f"DecoderLayer_{i}"] = {
      "RMSNorm_0": {"scale": c[q + "input_layernorm.weight"]},
      "Attention_0": {
        "Dense_0": {"kernel": T(c[q + "self_attn.q_proj.weight"])},
        "Dense_1": {"kernel": T(c[q + "self_attn.k_proj.weight"])},
        "Dense_2": {"kernel": T(c[q + "self_attn.v_proj.weight"])},
        "Dense_3": {"kernel": T(c[q + "self_attn.o_proj.weight"])},
        "RMSNorm_0": {"scale": c[q + "self_attn.q_norm.weight"]},
        "RMSNorm_1": {"scale": c[q + "self_attn.k_norm.weight"]},
      },
      "RMSNorm_1": {"scale": c[q + "post_attention_layernorm.weight"]},
      "Mlp_0": {
        "Dense_0": {"kernel": T(c[q + "mlp.gate_proj.weight"])},
        "Dense_1": {"kernel": T(c[q + "mlp.up_proj.weight"])},
        "Dense_2": {"kernel": T(c[q + "mlp.down_proj.weight"])},
      },
    }
  e["RMSNorm_0"] = {"scale": c["model.norm.weight"]}
  e["Dense_0"] = {"kernel": T(c["lm_head.weight"])}
  return "qwen3", {"params": e}


def dinov2_bigvision():
  c = ld("dinov2")
  H = 4
  e = {
    "embedding": _conv(c, "embeddings.patch_embeddings.projection"),
    "cls": c["embeddings.cls_token"],
    "mask_token": c["embeddings.mask_token"],
    "Transformer": {
      "posembed_input": {"pos_embedding": c["embeddings.position_embeddings"]},
      "encoder_norm": {"scale": c["layernorm.weight"], "bias": c["layernorm.bias"]},
    },
  }
  for i in range(2):
    q = f"encoder.layer.{i}."
    a = q + "attention.attention."
    e["Transformer"][f"encoderblock_{i}"] = {
      "LayerNorm_0": {"scale": c[q + "norm1.weight"], "bias": c[q + "norm1.bias"]},
      "MultiHeadDotProductAttention_0": {
        **{
          n: {
            "kernel": heads_in(c[a + f"{n}.weight"], H),
            "bias": c[a + f"{n}.bias"].reshape(H, -1),
          }
          for n in ("query", "key", "value")
        },
        "out": {
          "kernel": heads_out(c[q + "attention.output.dense.weight"], H),
          "bias": c[q + "attention.output.dense.bias"],
        },
      },
      "LayerScale_0": {"gamma": c[q + "layer_scale1.lambda1"]},
      "LayerNorm_1": {"scale": c[q + "norm2.weight"], "bias": c[q + "norm2.bias"]},
      "MlpBlock_0": {
        "Dense_0": {"kernel": T(c[q + "mlp.fc1.weight"]), "bias": c[q + "mlp.fc1.bias"]},
        "Dense_1": {"kernel": T(c[q + "mlp.fc2.weight"]), "bias": c[q + "mlp.fc2.bias"]},
      },
      "LayerScale_1": {"gamma": c[q + "layer_scale2.lambda1"]},
    }
  return "dinov2", {"params": e}


def _clip_layer(c, q, H):
  a = q + "self_attn."
  return {
    "norm1": {"scale": c[q + "layer_norm1.weight"], "bias": c[q + "layer_norm1.bias"]},
    "attn": {
      **{
        n: {
          "kernel": heads_in(c[a + f"{n}_proj.weight"], H),
          "bias": c[a + f"{n}_proj.bias"].reshape(H, -1),
        }
        for n in ("q", "k", "v")
      },
      "out": {"kernel": heads_out(c[a + "out_proj.weight"], H), "bias": c[a + "out_proj.bias"]},
    },
    "norm2": {"scale": c[q + "layer_norm2.weight"], "bias": c[q + "layer_norm2.bias"]},
    "mlp": {
      "fc1": {"kernel": T(c[q + "mlp.fc1.weight"]), "bias": c[q + "mlp.fc1.bias"]},
      "fc2": {"kernel": T(c[q + "mlp.fc2.weight"]), "bias": c[q + "mlp.fc2.bias"]},
    },
  }


def clip_nnx():
  c = ld("clip")
  t = {
    "token_embed": {"embedding": c["text_model.embeddings.token_embedding.weight"]},
    "pos_embed": {"embedding": c["text_model.embeddings.position_embedding.weight"]},
    "layers": [_clip_layer(c, f"text_model.encoder.layers.{i}.", 4) for i in range(2)],
    "final_norm": {
      "scale": c["text_model.final_layer_norm.weight"],
      "bias": c["text_model.final_layer_norm.bias"],
    },
  }
  v = {
    "patch_embed": {"kernel": conv2(c["vision_model.embeddings.patch_embedding.weight"])},
    "cls_token": c["vision_model.embeddings.class_embedding"],
    "pos_embed": {"embedding": c["vision_model.embeddings.position_embedding.weight"]},
    "pre_norm": {
      "scale": c["vision_model.pre_layrnorm.weight"],
      "bias": c["vision_model.pre_layrnorm.bias"],
    },
    "layers": [_clip_layer(c, f"vision_model.encoder.layers.{i}.", 4) for i in range(2)],
    "post_norm": {
      "scale": c["vision_model.post_layernorm.weight"],
      "bias": c["vision_model.post_layernorm.bias"],
    },
  }
  return "clip", {
    "text": t,
    "vision": v,
    "text_proj": {"kernel": T(c["text_projection.weight"])},
    "vision_proj": {"kernel": T(c["visual_projection.weight"])},
    "logit_scale": c["logit_scale"],
  }


def _clip_compact_block(c, q):
  projections = ("q_proj", "k_proj", "v_proj", "out_proj")
  return {
    "LayerNorm_0": _norm(c, q + "layer_norm1"),
    "MultiHeadAttention_0": {
      f"Dense_{j}": _linear(c, q + f"self_attn.{n}") for j, n in enumerate(projections)
    },
    "LayerNorm_1": _norm(c, q + "layer_norm2"),
    "MlpBlock_0": {"Dense_0": _linear(c, q + "mlp.fc1"), "Dense_1": _linear(c, q + "mlp.fc2")},
  }


def clip_compact_same_class():
  """CLIP's two towers as two instances of one linen class (``Encoder_0``, ``Encoder_1``),
  everything below them numbered by flax; the vision tower's ``LayerNorm_0`` and
  ``LayerNorm_1`` outside its blocks are its pre- and post-norm, in call order."""
  c = ld("clip")
  norm = functools.partial(_norm, c)
  blocks = lambda t: {  # noqa: E731
    f"ResidualAttentionBlock_{i}": _clip_compact_block(c, f"{t}.encoder.layers.{i}.")
    for i in range(2)
  }
  text = {
    "Embed_0": {"embedding": c["text_model.embeddings.token_embedding.weight"]},
    "positional_embedding": c["text_model.embeddings.position_embedding.weight"],
    "LayerNorm_0": norm("text_model.final_layer_norm"),
    **blocks("text_model"),
  }
  vision = {
    "Conv_0": {"kernel": conv2(c["vision_model.embeddings.patch_embedding.weight"])},
    "class_embedding": c["vision_model.embeddings.class_embedding"],
    "positional_embedding": c["vision_model.embeddings.position_embedding.weight"],
    "LayerNorm_0": norm("vision_model.pre_layrnorm"),
    "LayerNorm_1": norm("vision_model.post_layernorm"),
    **blocks("vision_model"),
  }
  return "clip", {
    "params": {
      "Encoder_0": text,
      "Encoder_1": vision,
      "text_projection": {"kernel": T(c["text_projection.weight"])},
      "visual_projection": {"kernel": T(c["visual_projection.weight"])},
      "logit_scale": c["logit_scale"],
    }
  }


def _batch_norm(c, q):
  """A torch ``BatchNorm`` at ``q`` as flax keeps it: its ``params`` and its ``batch_stats``."""
  return (
    {"scale": c[q + ".weight"], "bias": c[q + ".bias"]},
    {"mean": c[q + ".running_mean"], "var": c[q + ".running_var"]},
  )


def resnet_flax():
  c = ld("resnet")
  r = "resnet.encoder.stages"

  def bn(q):
    return _batch_norm(c, q)

  P, B = {}, {}
  P["conv_init"] = {"kernel": conv2(c["resnet.embedder.embedder.convolution.weight"])}
  P["bn_init"], B["bn_init"] = bn("resnet.embedder.embedder.normalization")
  # flax's example numbers the blocks across the stages: ResNetBlock_2 is stages.1.layers.0
  for n, (s, b) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
    q = f"{r}.{s}.layers.{b}"
    bp, bb = {}, {}
    for j in range(2):
      bp[f"Conv_{j}"] = {"kernel": conv2(c[f"{q}.layer.{j}.convolution.weight"])}
      bp[f"BatchNorm_{j}"], bb[f"BatchNorm_{j}"] = bn(f"{q}.layer.{j}.normalization")
    if (s, b) == (1, 0):
      bp["conv_proj"] = {"kernel": conv2(c[f"{q}.shortcut.convolution.weight"])}
      bp["norm_proj"], bb["norm_proj"] = bn(f"{q}.shortcut.normalization")
    P[f"ResNetBlock_{n}"], B[f"ResNetBlock_{n}"] = bp, bb
  P["Dense_0"] = {"kernel": T(c["classifier.1.weight"]), "bias": c["classifier.1.bias"]}
  return "resnet", {"params": P, "batch_stats": B}


def wav2vec2_flax():
  c = ld("wav2vec2")
  fe = {
    f"conv_layers_{j}": {
      "conv": {"kernel": conv1(c[f"feature_extractor.conv_layers.{j}.conv.weight"])}
    }
    for j in range(2)
  }
  fe["conv_layers_0"]["norm"] = {
    "scale": c["feature_extractor.conv_layers.0.layer_norm.weight"],
    "bias": c["feature_extractor.conv_layers.0.layer_norm.bias"],
  }
  g = "encoder.pos_conv_embed.conv."
  e = {
    "feature_extractor": fe,
    "feature_projection": {
      "norm": {
        "scale": c["feature_projection.layer_norm.weight"],
        "bias": c["feature_projection.layer_norm.bias"],
      },
      "proj": {
        "kernel": T(c["feature_projection.projection.weight"]),
        "bias": c["feature_projection.projection.bias"],
      },
    },
    "masked_spec_embed": c["masked_spec_embed"],
    "encoder": {
      "pos_conv": {
        "Conv_0": {
          "kernel": conv1(c[g + "parametrizations.weight.original1"]),
          "bias": c[g + "bias"],
        },
        "WeightNorm_0": {
          "Conv_0/kernel/scale": c[g + "parametrizations.weight.original0"].reshape(-1)
        },
      },
      "norm": {"scale": c["encoder.layer_norm.weight"], "bias": c["encoder.layer_norm.bias"]},
    },
  }
  for i in range(2):
    q = f"encoder.layers.{i}."
    a = q + "attention."
    e["encoder"][f"layers_{i}"] = {
      "attention": {
        n: {"kernel": T(c[a + f"{n}_proj.weight"]), "bias": c[a + f"{n}_proj.bias"]}
        for n in ("q", "k", "v", "out")
      },
      "attention_norm": {"scale": c[q + "layer_norm.weight"], "bias": c[q + "layer_norm.bias"]},
      "ffn": {
        "wi": {
          "kernel": T(c[q + "feed_forward.intermediate_dense.weight"]),
          "bias": c[q + "feed_forward.intermediate_dense.bias"],
        },
        "wo": {
          "kernel": T(c[q + "feed_forward.output_dense.weight"]),
          "bias": c[q + "feed_forward.output_dense.bias"],
        },
      },
      "ffn_norm": {
        "scale": c[q + "final_layer_norm.weight"],
        "bias": c[q + "final_layer_norm.bias"],
      },
    }
  return "wav2vec2", {"params": e}


def electra_haiku():
  c = ld("electra")

  def ln(q):
    return {"scale": c[q + ".weight"], "offset": c[q + ".bias"]}

  def lin(q):
    return {"w": T(c[q + ".weight"]), "b": c[q + ".bias"]}

  e = {
    "electra/~/embed": {"embeddings": c["embeddings.word_embeddings.weight"]},
    "electra/~/pos_embed": {"embeddings": c["embeddings.position_embeddings.weight"]},
    "electra/~/type_embed": {"embeddings": c["embeddings.token_type_embeddings.weight"]},
    "electra/~/layer_norm": ln("embeddings.LayerNorm"),
    "electra/~/linear": lin("embeddings_project"),
  }
  for i in range(2):
    q = f"encoder.layer.{i}."
    b = f"electra/~/layer_{i}/~/"
    e[b + "mha/~/query"] = lin(q + "attention.self.query")
    e[b + "mha/~/key"] = lin(q + "attention.self.key")
    e[b + "mha/~/value"] = lin(q + "attention.self.value")
    e[b + "mha/~/linear"] = lin(q + "attention.output.dense")
    e[b + "layer_norm"] = ln(q + "attention.output.LayerNorm")
    e[b + "linear"] = lin(q + "intermediate.dense")
    e[b + "linear_1"] = lin(q + "output.dense")
    e[b + "layer_norm_1"] = ln(q + "output.LayerNorm")
  return "electra", e


def bigcode_flax():
  c = ld("gpt_bigcode")
  e = {
    "wte": {"embedding": c["transformer.wte.weight"]},
    "wpe": {"embedding": c["transformer.wpe.weight"]},
  }
  for i in range(2):
    q = f"transformer.h.{i}."
    w, b = c[q + "attn.c_attn.weight"], c[q + "attn.c_attn.bias"]
    e[f"Block_{i}"] = {
      "LayerNorm_0": {"scale": c[q + "ln_1.weight"], "bias": c[q + "ln_1.bias"]},
      "Attention_0": {
        "Dense_0": {"kernel": T(w[:32]), "bias": b[:32]},
        "Dense_1": {"kernel": T(w[32:40]), "bias": b[32:40]},
        "Dense_2": {"kernel": T(w[40:]), "bias": b[40:]},
        "Dense_3": {"kernel": T(c[q + "attn.c_proj.weight"]), "bias": c[q + "attn.c_proj.bias"]},
      },
      "LayerNorm_1": {"scale": c[q + "ln_2.weight"], "bias": c[q + "ln_2.bias"]},
      "Mlp_0": {
        "Dense_0": {"kernel": T(c[q + "mlp.c_fc.weight"]), "bias": c[q + "mlp.c_fc.bias"]},
        "Dense_1": {"kernel": T(c[q + "mlp.c_proj.weight"]), "bias": c[q + "mlp.c_proj.bias"]},
      },
    }
  e["LayerNorm_0"] = {"scale": c["transformer.ln_f.weight"], "bias": c["transformer.ln_f.bias"]}
  return "gpt_bigcode", {"params": e}


def swin_nnx():
  c = ld("swin")
  e = {
    "patch_embed": {
      "proj": {
        "kernel": conv2(c["embeddings.patch_embeddings.projection.weight"]),
        "bias": c["embeddings.patch_embeddings.projection.bias"],
      },
      "norm": {"scale": c["embeddings.norm.weight"], "bias": c["embeddings.norm.bias"]},
    },
    "layers": [],
  }
  for s in range(2):
    blocks = []
    for b in range(2):
      q = f"encoder.layers.{s}.blocks.{b}."
      a = q + "attention.self."
      blocks.append(
        {
          "norm1": {
            "scale": c[q + "layernorm_before.weight"],
            "bias": c[q + "layernorm_before.bias"],
          },
          "attn": {
            "q": {"kernel": T(c[a + "query.weight"]), "bias": c[a + "query.bias"]},
            "k": {"kernel": T(c[a + "key.weight"]), "bias": c[a + "key.bias"]},
            "v": {"kernel": T(c[a + "value.weight"]), "bias": c[a + "value.bias"]},
            "relative_position_bias_table": c[a + "relative_position_bias_table"],
            "proj": {
              "kernel": T(c[q + "attention.output.dense.weight"]),
              "bias": c[q + "attention.output.dense.bias"],
            },
          },
          "norm2": {
            "scale": c[q + "layernorm_after.weight"],
            "bias": c[q + "layernorm_after.bias"],
          },
          "mlp": {
            "fc1": {
              "kernel": T(c[q + "intermediate.dense.weight"]),
              "bias": c[q + "intermediate.dense.bias"],
            },
            "fc2": {"kernel": T(c[q + "output.dense.weight"]), "bias": c[q + "output.dense.bias"]},
          },
        }
      )
    st = {"blocks": blocks}
    if s == 0:
      st["downsample"] = {
        "norm": {
          "scale": c["encoder.layers.0.downsample.norm.weight"],
          "bias": c["encoder.layers.0.downsample.norm.bias"],
        },
        "reduction": {"kernel": T(c["encoder.layers.0.downsample.reduction.weight"])},
      }
    e["layers"].append(st)
  e["norm"] = {"scale": c["layernorm.weight"], "bias": c["layernorm.bias"]}
  return "swin", e


def _bv_block(
  c,
  q,
  H,
  attn="self_attn.",
  names=("q_proj", "k_proj", "v_proj", "out_proj"),
  n1="layer_norm1",
  n2="layer_norm2",
):
  a = q + attn
  return {
    "LayerNorm_0": {"scale": c[q + n1 + ".weight"], "bias": c[q + n1 + ".bias"]},
    "MultiHeadDotProductAttention_0": {
      **{
        m: {"kernel": heads_in(c[a + f"{n}.weight"], H), "bias": c[a + f"{n}.bias"].reshape(H, -1)}
        for m, n in zip(("query", "key", "value"), names)
      },
      "out": {
        "kernel": heads_out(c[a + names[3] + ".weight"], H),
        "bias": c[a + names[3] + ".bias"],
      },
    },
    "LayerNorm_1": {"scale": c[q + n2 + ".weight"], "bias": c[q + n2 + ".bias"]},
    "MlpBlock_0": {
      "Dense_0": {"kernel": T(c[q + "mlp.fc1.weight"]), "bias": c[q + "mlp.fc1.bias"]},
      "Dense_1": {"kernel": T(c[q + "mlp.fc2.weight"]), "bias": c[q + "mlp.fc2.bias"]},
    },
  }


def siglip_bigvision():
  c = ld("siglip")
  H = 4
  w, b = (
    c["vision_model.head.attention.in_proj_weight"],
    c["vision_model.head.attention.in_proj_bias"],
  )
  img = {
    "embedding": {
      "kernel": conv2(c["vision_model.embeddings.patch_embedding.weight"]),
      "bias": c["vision_model.embeddings.patch_embedding.bias"],
    },
    "pos_embedding": c["vision_model.embeddings.position_embedding.weight"][None],
    "Transformer": {
      **{
        f"encoderblock_{i}": _bv_block(c, f"vision_model.encoder.layers.{i}.", H) for i in range(2)
      },
      "encoder_norm": {
        "scale": c["vision_model.post_layernorm.weight"],
        "bias": c["vision_model.post_layernorm.bias"],
      },
    },
    "MAPHead_0": {
      "probe": c["vision_model.head.probe"],
      "MultiHeadDotProductAttention_0": {
        **{
          m: {
            "kernel": heads_in(w[j * 32 : (j + 1) * 32], H),
            "bias": b[j * 32 : (j + 1) * 32].reshape(H, -1),
          }
          for j, m in enumerate(("query", "key", "value"))
        },
        "out": {
          "kernel": heads_out(c["vision_model.head.attention.out_proj.weight"], H),
          "bias": c["vision_model.head.attention.out_proj.bias"],
        },
      },
      "LayerNorm_0": {
        "scale": c["vision_model.head.layernorm.weight"],
        "bias": c["vision_model.head.layernorm.bias"],
      },
      "MlpBlock_0": {
        "Dense_0": {
          "kernel": T(c["vision_model.head.mlp.fc1.weight"]),
          "bias": c["vision_model.head.mlp.fc1.bias"],
        },
        "Dense_1": {
          "kernel": T(c["vision_model.head.mlp.fc2.weight"]),
          "bias": c["vision_model.head.mlp.fc2.bias"],
        },
      },
    },
  }
  txt = {
    "Embed_0": {"embedding": c["text_model.embeddings.token_embedding.weight"]},
    "pos_embedding": c["text_model.embeddings.position_embedding.weight"][None],
    "Encoder_0": {
      **{f"encoderblock_{i}": _bv_block(c, f"text_model.encoder.layers.{i}.", H) for i in range(2)},
      "encoder_norm": {
        "scale": c["text_model.final_layer_norm.weight"],
        "bias": c["text_model.final_layer_norm.bias"],
      },
    },
    "head": {"kernel": T(c["text_model.head.weight"]), "bias": c["text_model.head.bias"]},
  }
  return "siglip", {"params": {"img": img, "txt": txt, "t": c["logit_scale"], "b": c["logit_bias"]}}


def _eqx_layer(c, q):
  a = q + "self_attn."

  def lin(k):
    return {"weight": c[k + ".weight"], "bias": c[k + ".bias"]}

  return {
    "ln1": lin(q + "layer_norm1"),
    "attn": {
      "query_proj": lin(a + "q_proj"),
      "key_proj": lin(a + "k_proj"),
      "value_proj": lin(a + "v_proj"),
      "output_proj": lin(a + "out_proj"),
    },
    "ln2": lin(q + "layer_norm2"),
    "mlp": {"layers": [lin(q + "mlp.fc1"), lin(q + "mlp.fc2")]},
  }


def clip_equinox():
  c = ld("clip")
  t = {
    "token_embedding": {"weight": c["text_model.embeddings.token_embedding.weight"]},
    "position_embedding": {"weight": c["text_model.embeddings.position_embedding.weight"]},
    "layers": [_eqx_layer(c, f"text_model.encoder.layers.{i}.") for i in range(2)],
    "ln_final": {
      "weight": c["text_model.final_layer_norm.weight"],
      "bias": c["text_model.final_layer_norm.bias"],
    },
  }
  v = {
    "conv1": {"weight": c["vision_model.embeddings.patch_embedding.weight"]},
    "class_embedding": c["vision_model.embeddings.class_embedding"],
    "positional_embedding": c["vision_model.embeddings.position_embedding.weight"],
    "ln_pre": {
      "weight": c["vision_model.pre_layrnorm.weight"],
      "bias": c["vision_model.pre_layrnorm.bias"],
    },
    "layers": [_eqx_layer(c, f"vision_model.encoder.layers.{i}.") for i in range(2)],
    "ln_post": {
      "weight": c["vision_model.post_layernorm.weight"],
      "bias": c["vision_model.post_layernorm.bias"],
    },
  }
  return "clip", {
    "transformer": t,
    "visual": v,
    "text_projection": c["text_projection.weight"],
    "visual_proj": c["visual_projection.weight"],
    "logit_scale": c["logit_scale"],
  }


def clip_equinox_vmapped():
  """:func:`clip_equinox` with each tower's layers built by ``eqx.filter_vmap``: one stacked
  layer per tower, whose MLP is still equinox's list (``layers/mlp/layers/0``: its modules,
  not layers)."""
  name, tree = clip_equinox()
  for tower in ("transformer", "visual"):
    layers = tree[tower]["layers"]
    tree[tower]["layers"] = jax.tree.map(lambda *xs: np.ascontiguousarray(np.stack(xs)), *layers)
  return name, tree


def dinov2_levanter():
  """stacked layers, out-first heads split [L, H, Dh, D] like haliax code"""
  c = ld("dinov2")
  H = 4
  L = 2

  def st(f):
    return np.stack([f(f"encoder.layer.{i}.") for i in range(L)])

  def hs(w):
    return w.reshape(H, -1, w.shape[1])  # torch [H*Dh, D] -> [H, Dh, D]

  def ho(w):
    return w.reshape(w.shape[0], H, -1)  # o [D, H*Dh] -> [D, H, Dh]

  a = "attention.attention."
  e = {
    "embeddings": {
      "patch_embed": {
        "weight": c["embeddings.patch_embeddings.projection.weight"],
        "bias": c["embeddings.patch_embeddings.projection.bias"],
      },
      "cls_token": c["embeddings.cls_token"],
      "mask_token": c["embeddings.mask_token"],
      "position_embeddings": c["embeddings.position_embeddings"],
    },
    "encoder": {
      "layers": {
        "stacked": {
          "norm1": {
            "weight": st(lambda q: c[q + "norm1.weight"]),
            "bias": st(lambda q: c[q + "norm1.bias"]),
          },
          "attn": {
            **{
              n: {
                "weight": st(lambda q, n=n: hs(c[q + a + f"{n}.weight"])),
                "bias": st(lambda q, n=n: c[q + a + f"{n}.bias"].reshape(H, -1)),
              }
              for n in ("query", "key", "value")
            },
            "out": {
              "weight": st(lambda q: ho(c[q + "attention.output.dense.weight"])),
              "bias": st(lambda q: c[q + "attention.output.dense.bias"]),
            },
          },
          "ls1": st(lambda q: c[q + "layer_scale1.lambda1"]),
          "norm2": {
            "weight": st(lambda q: c[q + "norm2.weight"]),
            "bias": st(lambda q: c[q + "norm2.bias"]),
          },
          "mlp": {
            "fc1": {
              "weight": st(lambda q: c[q + "mlp.fc1.weight"]),
              "bias": st(lambda q: c[q + "mlp.fc1.bias"]),
            },
            "fc2": {
              "weight": st(lambda q: c[q + "mlp.fc2.weight"]),
              "bias": st(lambda q: c[q + "mlp.fc2.bias"]),
            },
          },
          "ls2": st(lambda q: c[q + "layer_scale2.lambda1"]),
        }
      }
    },
    "layernorm": {"weight": c["layernorm.weight"], "bias": c["layernorm.bias"]},
  }
  return "dinov2", e


def qwen3_gemma_style():
  """google-deepmind/gemma's flax layout: einsum weights, kv stacked, gate/up stacked"""
  c = ld("qwen3")
  H, K, Dh, D = 4, 2, 8, 32
  e = {
    "embedder": {"input_embedding": c["model.embed_tokens.weight"]},
    "final_norm": {"scale": c["model.norm.weight"]},
  }
  for i in range(2):
    q = f"model.layers.{i}."
    qw = c[q + "self_attn.q_proj.weight"].reshape(H, Dh, D).transpose(0, 2, 1)  # [N, D, H]
    kw = c[q + "self_attn.k_proj.weight"].reshape(K, Dh, D).transpose(0, 2, 1)
    vw = c[q + "self_attn.v_proj.weight"].reshape(K, Dh, D).transpose(0, 2, 1)
    ow = c[q + "self_attn.o_proj.weight"].T.reshape(H, Dh, D)  # [N, H, D]
    e[f"layer_{i}"] = {
      "pre_attention_norm": {"scale": c[q + "input_layernorm.weight"]},
      "attn": {
        "q_einsum": {"w": np.ascontiguousarray(qw)},
        "kv_einsum": {"w": np.ascontiguousarray(np.stack([kw, vw]))},
        "attn_vec_einsum": {"w": np.ascontiguousarray(ow)},
        "_query_norm": {"scale": c[q + "self_attn.q_norm.weight"]},
        "_key_norm": {"scale": c[q + "self_attn.k_norm.weight"]},
      },
      "pre_ffw_norm": {"scale": c[q + "post_attention_layernorm.weight"]},
      "mlp": {
        "gating_einsum": np.ascontiguousarray(
          np.stack([c[q + "mlp.gate_proj.weight"], c[q + "mlp.up_proj.weight"]])
        ),
        "linear": np.ascontiguousarray(c[q + "mlp.down_proj.weight"].T),
      },
    }
  e["lm_head"] = T(c["lm_head.weight"])
  return "qwen3", {"transformer": e}


def electra_nnx_vit_like():
  """flax NNX BERT-ish with `nnx.MultiHeadAttention` names and heads split"""
  c = ld("electra")
  H = 4
  e = {
    "embeddings": {
      "word": {"embedding": c["embeddings.word_embeddings.weight"]},
      "position": {"embedding": c["embeddings.position_embeddings.weight"]},
      "token_type": {"embedding": c["embeddings.token_type_embeddings.weight"]},
      "norm": {"scale": c["embeddings.LayerNorm.weight"], "bias": c["embeddings.LayerNorm.bias"]},
    },
    "project": {"kernel": T(c["embeddings_project.weight"]), "bias": c["embeddings_project.bias"]},
    "layers": [],
  }
  for i in range(2):
    q = f"encoder.layer.{i}."
    a = q + "attention.self."
    e["layers"].append(
      {
        "attention": {
          **{
            n: {
              "kernel": heads_in(c[a + f"{n}.weight"], H),
              "bias": c[a + f"{n}.bias"].reshape(H, -1),
            }
            for n in ("query", "key", "value")
          },
          "out": {
            "kernel": heads_out(c[q + "attention.output.dense.weight"], H),
            "bias": c[q + "attention.output.dense.bias"],
          },
        },
        "attention_norm": {
          "scale": c[q + "attention.output.LayerNorm.weight"],
          "bias": c[q + "attention.output.LayerNorm.bias"],
        },
        "mlp_in": {
          "kernel": T(c[q + "intermediate.dense.weight"]),
          "bias": c[q + "intermediate.dense.bias"],
        },
        "mlp_out": {"kernel": T(c[q + "output.dense.weight"]), "bias": c[q + "output.dense.bias"]},
        "mlp_norm": {
          "scale": c[q + "output.LayerNorm.weight"],
          "bias": c[q + "output.LayerNorm.bias"],
        },
      }
    )
  return "electra", e


def swin_flax_auto():
  c = ld("swin")
  e = {
    "PatchEmbed_0": {
      "Conv_0": {
        "kernel": conv2(c["embeddings.patch_embeddings.projection.weight"]),
        "bias": c["embeddings.patch_embeddings.projection.bias"],
      },
      "LayerNorm_0": {"scale": c["embeddings.norm.weight"], "bias": c["embeddings.norm.bias"]},
    }
  }
  for s in range(2):
    st = {}
    for b in range(2):
      q = f"encoder.layers.{s}.blocks.{b}."
      a = q + "attention.self."
      st[f"SwinBlock_{b}"] = {
        "LayerNorm_0": {
          "scale": c[q + "layernorm_before.weight"],
          "bias": c[q + "layernorm_before.bias"],
        },
        "WindowAttention_0": {
          "Dense_0": {"kernel": T(c[a + "query.weight"]), "bias": c[a + "query.bias"]},
          "Dense_1": {"kernel": T(c[a + "key.weight"]), "bias": c[a + "key.bias"]},
          "Dense_2": {"kernel": T(c[a + "value.weight"]), "bias": c[a + "value.bias"]},
          "relative_position_bias_table": c[a + "relative_position_bias_table"],
          "Dense_3": {
            "kernel": T(c[q + "attention.output.dense.weight"]),
            "bias": c[q + "attention.output.dense.bias"],
          },
        },
        "LayerNorm_1": {
          "scale": c[q + "layernorm_after.weight"],
          "bias": c[q + "layernorm_after.bias"],
        },
        "Mlp_0": {
          "Dense_0": {
            "kernel": T(c[q + "intermediate.dense.weight"]),
            "bias": c[q + "intermediate.dense.bias"],
          },
          "Dense_1": {
            "kernel": T(c[q + "output.dense.weight"]),
            "bias": c[q + "output.dense.bias"],
          },
        },
      }
    if s == 0:
      st["PatchMerging_0"] = {
        "LayerNorm_0": {
          "scale": c["encoder.layers.0.downsample.norm.weight"],
          "bias": c["encoder.layers.0.downsample.norm.bias"],
        },
        "Dense_0": {"kernel": T(c["encoder.layers.0.downsample.reduction.weight"])},
      }
    e[f"BasicLayer_{s}"] = st
  e["LayerNorm_0"] = {"scale": c["layernorm.weight"], "bias": c["layernorm.bias"]}
  return "swin", {"params": e}


def wav2vec2_equinox():
  c = ld("wav2vec2")

  def lin(k):
    return {"weight": c[k + ".weight"], "bias": c[k + ".bias"]}

  g = "encoder.pos_conv_embed.conv."
  e = {
    "feature_extractor": {
      "conv_layers": [
        {"conv": {"weight": c[f"feature_extractor.conv_layers.{j}.conv.weight"]}} for j in range(2)
      ]
    },
    "feature_projection": {
      "layer_norm": lin("feature_projection.layer_norm"),
      "projection": lin("feature_projection.projection"),
    },
    "masked_spec_embed": c["masked_spec_embed"],
    "encoder": {
      "pos_conv_embed": {
        "conv": {
          "weight_g": c[g + "parametrizations.weight.original0"],
          "weight_v": c[g + "parametrizations.weight.original1"],
          "bias": c[g + "bias"],
        }
      },
      "layer_norm": lin("encoder.layer_norm"),
      "layers": [
        {
          "attention": {
            n: lin(f"encoder.layers.{i}.attention.{n}_proj") for n in ("q", "k", "v", "out")
          },
          "layer_norm": lin(f"encoder.layers.{i}.layer_norm"),
          "feed_forward": {
            "intermediate_dense": lin(f"encoder.layers.{i}.feed_forward.intermediate_dense"),
            "output_dense": lin(f"encoder.layers.{i}.feed_forward.output_dense"),
          },
          "final_layer_norm": lin(f"encoder.layers.{i}.final_layer_norm"),
        }
        for i in range(2)
      ],
    },
  }
  e["feature_extractor"]["conv_layers"][0]["layer_norm"] = lin(
    "feature_extractor.conv_layers.0.layer_norm"
  )
  return "wav2vec2", e


def wav2vec2_equinox_vmapped():
  """:func:`wav2vec2_equinox` with its encoder layers built by ``eqx.filter_vmap``: a
  stacked layer's ``final_layer_norm`` is its MLP's norm (as in a numbered layer), not the
  model's last."""
  name, tree = wav2vec2_equinox()
  layers = tree["encoder"]["layers"]
  stacked = jax.tree.map(lambda *xs: np.ascontiguousarray(np.stack(xs)), *layers)
  tree["encoder"]["layers"] = stacked
  return name, tree


def _deepseek_layer(c, i):
  """One DeepSeek-V3 layer as MaxText names it (see :func:`deepseek_maxtext`)."""
  p = f"model.layers.{i}."
  a = p + "self_attn."
  blk = {
    "self_attention": {
      "wq_a": {"kernel": T(c[a + "q_a_proj.weight"])},
      "q_norm": {"scale": c[a + "q_a_layernorm.weight"]},
      "wq_b": {"kernel": T(c[a + "q_b_proj.weight"])},
      "wkv_a": {"kernel": T(c[a + "kv_a_proj_with_mqa.weight"])},
      "kv_norm": {"scale": c[a + "kv_a_layernorm.weight"]},
      "wkv_b": {"kernel": T(c[a + "kv_b_proj.weight"])},
      "out": {"kernel": T(c[a + "o_proj.weight"])},
    },
    "pre_self_attention_layer_norm": {"scale": c[p + "input_layernorm.weight"]},
    "post_self_attention_layer_norm": {"scale": c[p + "post_attention_layernorm.weight"]},
  }
  if i == 0:
    blk["mlp"] = {
      "wi_0": {"kernel": T(c[p + "mlp.gate_proj.weight"])},
      "wi_1": {"kernel": T(c[p + "mlp.up_proj.weight"])},
      "wo": {"kernel": T(c[p + "mlp.down_proj.weight"])},
    }
    return blk

  def ex(n):
    return np.ascontiguousarray(
      np.stack([c[p + f"mlp.experts.{e}.{n}.weight"].T for e in range(4)])
    )

  blk["DeepSeekMoeBlock_0"] = {
    "MoeBlock_0": {
      "gate": {
        "kernel": T(c[p + "mlp.gate.weight"]),
        "bias": c[p + "mlp.gate.e_score_correction_bias"],
      },
      "wi_0": ex("gate_proj"),
      "wi_1": ex("up_proj"),
      "wo": ex("down_proj"),
    },
    "shared_experts": {
      "wi_0": {"kernel": T(c[p + "mlp.shared_experts.gate_proj.weight"])},
      "wi_1": {"kernel": T(c[p + "mlp.shared_experts.up_proj.weight"])},
      "wo": {"kernel": T(c[p + "mlp.shared_experts.down_proj.weight"])},
    },
  }
  return blk


def _deepseek_outside(c, decoder):
  return {
    "token_embedder": {"embedding": c["model.embed_tokens.weight"]},
    "decoder": {
      **decoder,
      "decoder_norm": {"scale": c["model.norm.weight"]},
      "logits_dense": {"kernel": T(c["lm_head.weight"])},
    },
  }


def deepseek_maxtext():
  """MaxText's DeepSeek-V3 names: latent attention ``wq_a``/``wkv_a``/``wkv_b`` beside
  ``q_norm``/``kv_norm``, a dense first layer, then ``DeepSeekMoeBlock_0/MoeBlock_0`` (the router
  ``gate`` with the score-correction bias, experts stacked ``wi_0``/``wi_1``/``wo``) and
  ``shared_experts``."""
  c = ld("deepseek_v3")
  return "deepseek_v3", _deepseek_outside(c, {"layers": [_deepseek_layer(c, i) for i in range(3)]})


def deepseek_maxtext_scanned():
  """MaxText's DeepSeek-V3 as it trains it, scanned: the dense layer in ``dense_layers``, the
  MoE ones in ``moe_layers``, each leaf with its stack's layers on axis 1
  (``param_scan_axis``; experts ``[E, L, ...]``)."""
  c = ld("deepseek_v3")

  def scanned(layers):
    blocks = [_deepseek_layer(c, i) for i in layers]
    return jax.tree.map(lambda *xs: np.ascontiguousarray(np.stack(xs, axis=1)), *blocks)

  decoder = {"dense_layers": scanned([0]), "moe_layers": scanned([1, 2])}
  return "deepseek_v3", _deepseek_outside(c, decoder)


def qwen2_moe_nnx():
  """Qwen2-MoE in NNX: experts stacked ``[E, in, out]``, a shared expert and its gate."""
  c = ld("qwen2_moe")
  layers = []
  for i in range(2):
    p = f"model.layers.{i}."
    a = p + "self_attn."

    def ex(n):
      return np.ascontiguousarray(
        np.stack([c[p + f"mlp.experts.{e}.{n}.weight"].T for e in range(4)])
      )

    layers.append(
      {
        "attn": {
          **{
            n: {"kernel": T(c[a + f"{n}_proj.weight"]), "bias": c[a + f"{n}_proj.bias"]}
            for n in "qkv"
          },
          "o": {"kernel": T(c[a + "o_proj.weight"])},
        },
        "attn_norm": {"scale": c[p + "input_layernorm.weight"]},
        "mlp_norm": {"scale": c[p + "post_attention_layernorm.weight"]},
        "moe": {
          "router": {"kernel": T(c[p + "mlp.gate.weight"])},
          "experts": {"gate": ex("gate_proj"), "up": ex("up_proj"), "down": ex("down_proj")},
          "shared": {
            n: {"kernel": T(c[p + f"mlp.shared_expert.{n}_proj.weight"])}
            for n in ("gate", "up", "down")
          },
          "shared_gate": {"kernel": T(c[p + "mlp.shared_expert_gate.weight"])},
        },
      }
    )
  return "qwen2_moe", {
    "embed": {"embedding": c["model.embed_tokens.weight"]},
    "layers": layers,
    "final_norm": {"scale": c["model.norm.weight"]},
    "lm_head": {"kernel": T(c["lm_head.weight"])},
  }


def qwen2_moe_scanned():
  """:func:`qwen2_moe_nnx` under ``nnx.scan``: every leaf stacked over the layers, the shared
  expert's ``gate`` beside the shared expert's own ``shared_gate`` (``shared_expert.gate_proj``
  and ``shared_expert_gate``: one concept, two tensors)."""
  name, tree = qwen2_moe_nnx()
  stacked = jax.tree.map(lambda *xs: np.ascontiguousarray(np.stack(xs)), *tree["layers"])
  return name, {**tree, "layers": stacked}


def _modernbert(attn_and_mlp):
  """ModernBERT's tree around each layer's attention and MLP (``attn_and_mlp(c, prefix)``):
  the norms (layer 0 has no attention norm), the embeddings and the MLM head."""
  c = ld("modernbert")
  layers = []
  for i in range(3):
    p = f"model.layers.{i}."
    blk = {"mlp_norm": {"scale": c[p + "mlp_norm.weight"]}, **attn_and_mlp(c, p)}
    if i:
      blk["attn_norm"] = {"scale": c[p + "attn_norm.weight"]}
    layers.append(blk)
  return "modernbert", {
    "embeddings": {
      "tok": {"embedding": c["model.embeddings.tok_embeddings.weight"]},
      "norm": {"scale": c["model.embeddings.norm.weight"]},
    },
    "layers": layers,
    "final_norm": {"scale": c["model.final_norm.weight"]},
    "head": {
      "dense": {"kernel": T(c["head.dense.weight"])},
      "norm": {"scale": c["head.norm.weight"]},
    },
    "decoder": {"bias": c["decoder.bias"]},
  }


def modernbert_fused():
  """ModernBERT with its fused ``Wqkv`` and ``Wi`` kept fused."""

  def fused(c, p):
    return {
      "attn": {
        "qkv": {"kernel": T(c[p + "attn.Wqkv.weight"])},
        "out": {"kernel": T(c[p + "attn.Wo.weight"])},
      },
      "mlp": {
        "wi": {"kernel": T(c[p + "mlp.Wi.weight"])},
        "wo": {"kernel": T(c[p + "mlp.Wo.weight"])},
      },
    }

  return _modernbert(fused)


def modernbert_split():
  """ModernBERT with q/k/v and a Llama-style gate/up: ``Wi``'s first half is the activated
  one (``act(input) * gate``), Llama's gate."""

  def split(c, p):
    qkv, wi = c[p + "attn.Wqkv.weight"], c[p + "mlp.Wi.weight"]
    return {
      "attn": {
        **{n: {"kernel": T(qkv[32 * j : 32 * j + 32])} for j, n in enumerate("qkv")},
        "o": {"kernel": T(c[p + "attn.Wo.weight"])},
      },
      # llama's act(gate) * up is ModernBERT's act(input) * gate: its first half is the gate
      "mlp": {
        "gate": {"kernel": T(wi[:48])},
        "up": {"kernel": T(wi[48:])},
        "down": {"kernel": T(c[p + "mlp.Wo.weight"])},
      },
    }

  return _modernbert(split)


def gemma2_library():
  """Gemma 2 as Google's gemma library keeps it: einsum weights, four norms."""
  c = ld("gemma2")
  t = {
    "embedder": {"input_embedding": c["model.embed_tokens.weight"]},
    "final_norm": {"scale": c["model.norm.weight"]},
  }
  for i in range(2):
    p = f"model.layers.{i}."
    t[f"layer_{i}"] = {
      "pre_attention_norm": {"scale": c[p + "input_layernorm.weight"]},
      "post_attention_norm": {"scale": c[p + "post_attention_layernorm.weight"]},
      "pre_ffw_norm": {"scale": c[p + "pre_feedforward_layernorm.weight"]},
      "post_ffw_norm": {"scale": c[p + "post_feedforward_layernorm.weight"]},
      **gemma_layer(c, p, 4, 2, 8, 32),
    }
  return "gemma2", {"transformer": t}


def beit_timm():
  """BEiT as timm writes it, ported to flax: ``attn/qkv`` fused ``[q|k|v]`` with no bias
  beside ``q_bias``/``v_bias`` (the checkpoint has no key bias), a relative position table
  per block, layer scales ``gamma_1``/``gamma_2`` (the checkpoint's ``lambda_1``/``lambda_2``),
  ``fc_norm`` over the mean-pooled patches."""
  c = ld("beit")
  e = {
    "cls_token": c["embeddings.cls_token"],
    "patch_embed": {
      "proj": {
        "kernel": conv2(c["embeddings.patch_embeddings.projection.weight"]),
        "bias": c["embeddings.patch_embeddings.projection.bias"],
      }
    },
    "blocks": [],
  }
  for i in range(2):
    q = f"encoder.layer.{i}."
    a = q + "attention.attention."
    qkv = [T(c[f"{a}{n}.weight"]) for n in ("query", "key", "value")]
    e["blocks"].append(
      {
        "norm1": {
          "scale": c[q + "layernorm_before.weight"],
          "bias": c[q + "layernorm_before.bias"],
        },
        "attn": {
          "qkv": {"kernel": np.concatenate(qkv, axis=1)},
          "q_bias": c[a + "query.bias"],
          "v_bias": c[a + "value.bias"],
          "relative_position_bias_table": c[
            a + "relative_position_bias.relative_position_bias_table"
          ],
          "proj": {
            "kernel": T(c[q + "attention.output.dense.weight"]),
            "bias": c[q + "attention.output.dense.bias"],
          },
        },
        "gamma_1": c[q + "lambda_1"],
        "gamma_2": c[q + "lambda_2"],
        "norm2": {"scale": c[q + "layernorm_after.weight"], "bias": c[q + "layernorm_after.bias"]},
        "mlp": {
          "fc1": {
            "kernel": T(c[q + "intermediate.dense.weight"]),
            "bias": c[q + "intermediate.dense.bias"],
          },
          "fc2": {"kernel": T(c[q + "output.dense.weight"]), "bias": c[q + "output.dense.bias"]},
        },
      }
    )
  e["fc_norm"] = {"scale": c["pooler.layernorm.weight"], "bias": c["pooler.layernorm.bias"]}
  return "beit", e


def beit_timm_scanned():
  """:func:`beit_timm` with its blocks under ``nn.scan`` (``blocks/attn/qkv/kernel [L, D, 3D]``)."""
  name, tree = beit_timm()
  stacked = jax.tree.map(lambda *xs: np.ascontiguousarray(np.stack(xs)), *tree["blocks"])
  return name, {**tree, "blocks": stacked}


def segformer_hf_flax():
  """SegFormer kept under transformers' own names, in flax's conventions (``kernel`` ``[in,
  out]``, conv kernels HWIO, norms' ``scale``), as a port of the PyTorch model writes it:
  ``encoder/block/{stage}/{block}`` a list of lists, and ``layer_norm_1``/``layer_norm_2`` one
  concept told apart only by the leaf's own path."""
  out = {}
  for key, value in ld("segformer").items():
    *path, leaf = key.split(".")
    if leaf == "weight":
      leaf = "scale" if value.ndim == 1 else "kernel"
      value = conv2(value) if value.ndim == 4 else value.T
    node = out
    for part in path:
      node = node.setdefault(part, {})
    node[leaf] = np.ascontiguousarray(value)
  return "segformer", out


def _stages_scanned(tree, stages):
  """Each stage's ``blocks`` under ``nn.scan``/``nnx.scan``: one leaf per parameter, the
  stage's blocks on axis 0; the stages stay a list (their widths differ)."""
  for stage in tree[stages]:
    stage["blocks"] = jax.tree.map(lambda *xs: np.ascontiguousarray(np.stack(xs)), *stage["blocks"])
  return tree


def convnext_timm_scanned():
  """:func:`convnext_timm` with each stage's blocks scanned (``stages/1/blocks/fc1/kernel``
  ``[blocks, in, out]``): a stage's stack holds that stage's blocks, and closure (``gamma``,
  ``conv_dw``) reads them."""
  name, tree = convnext_timm()
  return name, _stages_scanned(tree, "stages")


def swin_nnx_scanned():
  """:func:`swin_nnx` with each stage's blocks scanned (``layers/1/blocks/attn/q/kernel``):
  the stage is ``layers/1``, and its ``blocks`` a stack of its own."""
  name, tree = swin_nnx()
  return name, _stages_scanned(tree, "layers")


def gemma2_library_scanned():
  """:func:`gemma2_library` with its layers under ``nn.scan`` (``transformer/layers``, every
  leaf stacked): the MLP's ``linear`` is the tensor left once ``gating_einsum`` took gate and
  up in every layer."""
  name, tree = gemma2_library()
  t = tree["transformer"]
  layers = [t.pop(f"layer_{i}") for i in range(2)]
  t["layers"] = jax.tree.map(lambda *xs: np.ascontiguousarray(np.stack(xs)), *layers)
  return name, tree


def _gemma2_maxtext_layer(c, i, suffix):
  """One Gemma 2 layer as MaxText names it, its modules ending ``_local`` or ``_global``."""
  p = f"model.layers.{i}."
  a = p + "self_attn."
  mlp = (("wi_0", "gate_proj"), ("wi_1", "up_proj"), ("wo", "down_proj"))
  blk = {
    "pre_self_attention_norm": {"scale": c[p + "input_layernorm.weight"]},
    "self_attention": {
      "query": {"kernel": heads_in(c[a + "q_proj.weight"], 4)},
      "key": {"kernel": heads_in(c[a + "k_proj.weight"], 2)},
      "value": {"kernel": heads_in(c[a + "v_proj.weight"], 2)},
      "out": {"kernel": heads_out(c[a + "o_proj.weight"], 4)},
    },
    "post_self_attention_norm": {"scale": c[p + "post_attention_layernorm.weight"]},
    "pre_ffw_norm": {"scale": c[p + "pre_feedforward_layernorm.weight"]},
    "mlp": {n: {"kernel": T(c[p + f"mlp.{m}.weight"])} for n, m in mlp},
    "post_ffw_norm": {"scale": c[p + "post_feedforward_layernorm.weight"]},
  }
  return {f"{k}_{suffix}": v for k, v in blk.items()}


def _gemma2_maxtext(layers):
  c = ld("gemma2")
  return "gemma2", {
    "token_embedder": {"embedding": c["model.embed_tokens.weight"]},
    "decoder": {**layers(c), "decoder_norm": {"scale": c["model.norm.weight"]}},
  }


def gemma2_maxtext():
  """Gemma 2 as MaxText keeps it unscanned: each ``layers_{j}`` holds a local
  (sliding-window) and a global layer, as ``*_local`` and ``*_global`` modules
  (``self_attention_local/query`` ``[emb, heads, head_dim]``). Which is which: the config's
  ``layer_types``."""

  def layers(c):  # layer_types: sliding, full
    return {
      "layers_0": _gemma2_maxtext_layer(c, 0, "local") | _gemma2_maxtext_layer(c, 1, "global")
    }

  return _gemma2_maxtext(layers)


def gemma2_maxtext_scanned():
  """:func:`gemma2_maxtext` as MaxText trains it: scanned, layers on axis 1."""

  def layers(c):
    blocks = [_gemma2_maxtext_layer(c, 0, "local") | _gemma2_maxtext_layer(c, 1, "global")]
    stack = jax.tree.map(lambda *xs: np.ascontiguousarray(np.stack(xs, axis=1)), *blocks)
    return {"layers": stack}

  return _gemma2_maxtext(layers)


def phi_haiku():
  """Phi (one norm, parallel attention and MLP) in haiku's flat ``~`` module paths."""
  c = ld("phi")
  t = {}
  for i in range(2):
    p = f"model.layers.{i}."
    a = p + "self_attn."

    def lin(k):
      return {"w": T(c[k + ".weight"]), "b": c[k + ".bias"]}

    t[f"phi/~/layer_{i}/~/attention/~/query"] = lin(a + "q_proj")
    t[f"phi/~/layer_{i}/~/attention/~/key"] = lin(a + "k_proj")
    t[f"phi/~/layer_{i}/~/attention/~/value"] = lin(a + "v_proj")
    t[f"phi/~/layer_{i}/~/attention/~/linear"] = lin(a + "dense")
    t[f"phi/~/layer_{i}/~/layer_norm"] = {
      "scale": c[p + "input_layernorm.weight"],
      "offset": c[p + "input_layernorm.bias"],
    }
    t[f"phi/~/layer_{i}/~/mlp/~/linear"] = lin(p + "mlp.fc1")
    t[f"phi/~/layer_{i}/~/mlp/~/linear_1"] = lin(p + "mlp.fc2")
  t["phi/~/embed"] = {"embeddings": c["model.embed_tokens.weight"]}
  t["phi/~/layer_norm"] = {
    "scale": c["model.final_layernorm.weight"],
    "offset": c["model.final_layernorm.bias"],
  }
  t["phi/~/unembed"] = {"w": T(c["lm_head.weight"]), "b": c["lm_head.bias"]}
  return "phi", t


def mamba_flax():
  """Mamba as a flax port keeps it: the mixer's projections as ``[in, out]`` kernels, its
  depthwise ``conv1d`` as flax's ``[width, 1, channels]``, ``A_log`` and ``D`` bare."""
  c = ld("mamba")
  layers = []
  for i in range(2):
    p = f"backbone.layers.{i}."
    m = p + "mixer."
    layers.append(
      {
        "norm": {"scale": c[p + "norm.weight"]},
        "mixer": {
          "in_proj": {"kernel": T(c[m + "in_proj.weight"])},
          "conv1d": {"kernel": conv1(c[m + "conv1d.weight"]), "bias": c[m + "conv1d.bias"]},
          "x_proj": {"kernel": T(c[m + "x_proj.weight"])},
          "dt_proj": {"kernel": T(c[m + "dt_proj.weight"]), "bias": c[m + "dt_proj.bias"]},
          "A_log": c[m + "A_log"],
          "D": c[m + "D"],
          "out_proj": {"kernel": T(c[m + "out_proj.weight"])},
        },
      }
    )
  return "mamba", {
    "embedding": {"embedding": c["backbone.embeddings.weight"]},
    "layers": layers,
    "norm_f": {"scale": c["backbone.norm_f.weight"]},
  }


def _vae_tree(c, lists):
  """diffusers' ``AutoencoderKL`` as its flax port kept it: linen list attributes
  (``down_blocks_0/resnets_0``), or an NNX port's lists (``down_blocks/0/resnets/0``); flax
  conv kernels ``[h, w, in, out]``, the attention's ``query``/``key``/``value``/``proj_attn``
  ``[in, out]`` (square, like every weight of the attention block)."""

  def items(word, values):
    return {word: values} if lists else {f"{word}_{j}": v for j, v in enumerate(values)}

  norm, conv, dense = (functools.partial(f, c) for f in (_norm, _conv, _linear))

  def resnet(p):
    r = {"norm1": norm(p + ".norm1"), "conv1": conv(p + ".conv1")}
    r |= {"norm2": norm(p + ".norm2"), "conv2": conv(p + ".conv2")}
    return r | (
      {"conv_shortcut": conv(p + ".conv_shortcut")} if p + ".conv_shortcut.weight" in c else {}
    )

  def mid(p):
    a = p + ".attentions.0"
    attention = {"group_norm": norm(a + ".group_norm"), "proj_attn": dense(a + ".to_out.0")}
    attention |= {n: dense(f"{a}.to_{n[0]}") for n in ("query", "key", "value")}
    resnets = [resnet(f"{p}.resnets.{j}") for j in range(2)]
    return items("resnets", resnets) | items("attentions", [attention])

  def blocks(tower, kind, n):
    out = []
    for i in range(2):
      p = f"{tower}.{kind}_blocks.{i}"
      b = items("resnets", [resnet(f"{p}.resnets.{j}") for j in range(n)])
      sampler = "downsamplers" if kind == "down" else "upsamplers"
      if f"{p}.{sampler}.0.conv.weight" in c:
        b |= items(sampler, [{"conv": conv(f"{p}.{sampler}.0.conv")}])
      out.append(b)
    return items(f"{kind}_blocks", out)

  def tower(name, kind, n):
    t = {"conv_in": conv(name + ".conv_in"), "mid_block": mid(name + ".mid_block")}
    t |= blocks(name, kind, n)
    return t | {
      "conv_norm_out": norm(name + ".conv_norm_out"),
      "conv_out": conv(name + ".conv_out"),
    }

  return {
    "encoder": tower("encoder", "down", 1),
    "decoder": tower("decoder", "up", 2),
    "quant_conv": conv("quant_conv"),
    "post_quant_conv": conv("post_quant_conv"),
  }


def vae_flax_linen():
  """A diffusion VAE in linen, its lists set up as attributes (``resnets_0``): the numbers
  are in the names, not apart as the checkpoint's (``resnets.0``)."""
  return "vae", _vae_tree(ld("vae"), lists=False)


def vae_nnx():
  """The VAE as an NNX port keeps it: lists (``resnets/0``)."""
  return "vae", _vae_tree(ld("vae"), lists=True)


def _diffusers_flax(c, lists):
  """A diffusers checkpoint as its flax port named it: ``to_q``/``to_k``/``to_v``/``to_out.0``
  are ``query``/``key``/``value``/``proj_attn``; a list's items ``resnets_0`` (linen list
  attributes) or ``resnets/0`` (``lists``: NNX); conv kernels ``[h, w, in, out]``, dense
  kernels ``[in, out]``, norms ``scale``/``bias``."""
  renames = {"to_q": "query", "to_k": "key", "to_v": "value"}
  tree: dict = {}
  for key, value in c.items():
    *modules, kind = key.replace(".to_out.0.", ".proj_attn.").split(".")
    path: list[str] = []
    for m in modules:
      if m.isdigit() and not lists:
        path[-1] = f"{path[-1]}_{m}"
      else:
        path.append(renames.get(m, m))
    if value.ndim == 4:
      leaf, value = "kernel", conv2(value)
    elif value.ndim == 2:
      leaf, value = "kernel", T(value)
    else:
      leaf = "bias" if kind == "bias" else "scale"
    if kind not in ("weight", "bias"):  # a bare parameter (scale_shift_table): as stored
      path, leaf, value = [*path, kind], None, c[key]
    node = tree
    for m in path[:-1] if leaf is None else path:
      node = node.setdefault(m, {})
    node[path[-1] if leaf is None else leaf] = value
  return tree


def unet_flax_linen():
  """A Stable Diffusion UNet as diffusers' flax port set it up: ``up_blocks_1/attentions_1/
  transformer_blocks_0/attn2/query``, ``ff/net_0/proj`` (GEGLU kept fused), ``time_embedding/
  linear_1``; one up block holds two attention items alike but for their numbers."""
  return "unet", _diffusers_flax(ld("unet"), lists=False)


def unet_nnx():
  """The UNet in NNX: lists of items (``up_blocks/1/attentions/1``); the feed-forward's
  ``net`` keeps its parameterless GELU's place (``net/0``, ``net/2``)."""
  return "unet", _diffusers_flax(ld("unet"), lists=True)


def _llava_towers(c):
  """LLaVA's three towers as NNX code names them: ``vision`` (a CLIP ViT: ``cls_token``,
  ``attn/query``, ``norm1``), ``projector`` (``linear_1``, ``linear_2``), ``llm`` (a Llama:
  ``attn/q``, ``attn_norm``), each tower's layers a list."""

  def ln(p):
    return {"scale": c[p + ".weight"], "bias": c[p + ".bias"]}

  def dense(p, bias=True):
    return {"kernel": T(c[p + ".weight"])} | ({"bias": c[p + ".bias"]} if bias else {})

  v, lm = "vision_tower.", "language_model.model."
  vision = {
    "cls_token": c[v + "embeddings.class_embedding"],
    "patch_embed": {"kernel": conv2(c[v + "embeddings.patch_embedding.weight"])},
    "pos_embed": {"embedding": c[v + "embeddings.position_embedding.weight"]},
    "pre_norm": ln(v + "pre_layrnorm"),
    "layers": [],
    "post_norm": ln(v + "post_layernorm"),
  }
  llm = {"embed": {"embedding": c[lm + "embed_tokens.weight"]}, "layers": []}
  for i in range(2):
    p = f"{v}encoder.layers.{i}."
    names = {"query": "q_proj", "key": "k_proj", "value": "v_proj", "out": "out_proj"}
    vision["layers"].append(
      {
        "attn": {n: dense(p + f"self_attn.{m}") for n, m in names.items()},
        "norm1": ln(p + "layer_norm1"),
        "norm2": ln(p + "layer_norm2"),
        "mlp": {"fc1": dense(p + "mlp.fc1"), "fc2": dense(p + "mlp.fc2")},
      }
    )
    p = f"{lm}layers.{i}."
    llm["layers"].append(
      {
        "attn": {n: dense(p + f"self_attn.{n}_proj", False) for n in "qkvo"},
        "mlp": {n: dense(p + f"mlp.{n}_proj", False) for n in ("gate", "up", "down")},
        "attn_norm": {"scale": c[p + "input_layernorm.weight"]},
        "mlp_norm": {"scale": c[p + "post_attention_layernorm.weight"]},
      }
    )
  llm["norm"] = {"scale": c[lm + "norm.weight"]}
  projector = {n: dense(f"multi_modal_projector.{n}") for n in ("linear_1", "linear_2")}
  lm_head = {"kernel": T(c["language_model.lm_head.weight"])}
  return {"vision": vision, "projector": projector, "llm": llm, "lm_head": lm_head}


def llava_nnx():
  """LLaVA in NNX: a CLIP vision tower and a Llama of other widths, and the projector between
  them; every layer of both towers alike within its tower."""
  return "llava", _llava_towers(ld("llava"))


def llava_scanned():
  """:func:`llava_nnx` with each tower's layers under ``nnx.scan`` (``vision/layers`` and
  ``llm/layers`` stacked)."""
  tree = _llava_towers(ld("llava"))
  for tower in ("vision", "llm"):
    layers = tree[tower]["layers"]
    tree[tower]["layers"] = jax.tree.map(lambda *xs: np.ascontiguousarray(np.stack(xs)), *layers)
  return "llava", tree


def llava_flax_auto():
  """:func:`llava_nnx` with each tower a flax module auto-named for its class
  (``VisionTransformer_0/EncoderBlock_1``, ``LlamaModel_0/DecoderLayer_0``): a class named
  for its tower is that tower (``cls_token`` alone is too unlike ``class_embedding``)."""
  tree = _llava_towers(ld("llava"))
  for tower, cls, block in (
    ("vision", "VisionTransformer_0", "EncoderBlock"),
    ("llm", "LlamaModel_0", "DecoderLayer"),
  ):
    t = tree.pop(tower)
    tree[cls] = {k: v for k, v in t.items() if k != "layers"}
    tree[cls] |= {f"{block}_{i}": layer for i, layer in enumerate(t["layers"])}
  return "llava", tree


def pixart_flax_linen():
  """PixArt-alpha (a diffusion transformer) in linen names: ``transformer_blocks_0/attn1`` and
  ``attn2`` of one width (every projection square: each attention's output projection is the
  tensor left in its own module, not in the block), a bare ``scale_shift_table``, and
  ``adaln_single/emb/timestep_embedder/linear_2`` a square linear inside an embedder."""
  return "pixart", _diffusers_flax(ld("pixart"), lists=False)


def pixart_nnx():
  """PixArt-alpha in NNX lists (``transformer_blocks/0``)."""
  return "pixart", _diffusers_flax(ld("pixart"), lists=True)


def _stacked(layers):
  return jax.tree.map(lambda *xs: np.ascontiguousarray(np.stack(xs)), *layers)


def _linear(c, k, heads=None, out=False):
  """A torch linear as flax keeps it: ``[in, out]``, or with its heads split."""
  if heads and out:
    return {"kernel": heads_out(c[k + ".weight"], heads), "bias": c[k + ".bias"]}
  if heads:
    return {"kernel": heads_in(c[k + ".weight"], heads), "bias": c[k + ".bias"].reshape(heads, -1)}
  return {"kernel": T(c[k + ".weight"]), **({"bias": c[k + ".bias"]} if k + ".bias" in c else {})}


def _norm(c, k):
  return {"scale": c[k + ".weight"], "bias": c[k + ".bias"]}


def _conv(c, k):
  """A torch conv as flax keeps it: the kernel OIHW -> HWIO, its bias."""
  return {"kernel": conv2(c[k + ".weight"]), "bias": c[k + ".bias"]}


def deit_timm_nnx():
  """DeiT as timm names it, in NNX lists: a fused ``qkv``, ``cls_token`` beside
  ``dist_token`` (one shape: ``dist`` abbreviates the checkpoint's ``distillation``), and
  ``head`` beside ``head_dist``; which classifier is ``head`` nothing but elimination says."""
  c, p = ld("deit"), "deit."
  blocks = []
  for i in range(2):
    q = f"{p}encoder.layer.{i}."
    a = q + "attention.attention."
    qkv = [_linear(c, a + n) for n in ("query", "key", "value")]
    blocks.append(
      {
        "norm1": _norm(c, q + "layernorm_before"),
        "attn": {
          "qkv": {k: np.concatenate([x[k] for x in qkv], -1) for k in ("kernel", "bias")},
          "proj": _linear(c, q + "attention.output.dense"),
        },
        "norm2": _norm(c, q + "layernorm_after"),
        "mlp": {"fc1": _linear(c, q + "intermediate.dense"), "fc2": _linear(c, q + "output.dense")},
      }
    )
  e = p + "embeddings."
  return "deit", {
    "patch_embed": {
      "proj": {
        "kernel": conv2(c[e + "patch_embeddings.projection.weight"]),
        "bias": c[e + "patch_embeddings.projection.bias"],
      }
    },
    "cls_token": c[e + "cls_token"],
    "dist_token": c[e + "distillation_token"],
    "pos_embed": c[e + "position_embeddings"],
    "blocks": blocks,
    "norm": _norm(c, p + "layernorm"),
    "head": _linear(c, "cls_classifier"),
    "head_dist": _linear(c, "distillation_classifier"),
  }


def _mae_block(c, q):
  a = q + "attention.attention."
  return {
    "norm1": _norm(c, q + "layernorm_before"),
    "attn": {
      **{n: _linear(c, a + w, 4) for n, w in (("q", "query"), ("k", "key"), ("v", "value"))},
      "o": _linear(c, q + "attention.output.dense", 4, out=True),
    },
    "norm2": _norm(c, q + "layernorm_after"),
    "mlp": {"fc1": _linear(c, q + "intermediate.dense"), "fc2": _linear(c, q + "output.dense")},
  }


def vit_mae_scanned():
  """An MAE with its encoder's and its decoder's blocks scanned: the decoder has one block,
  so its stack of one is that block's tensors (one candidate, not also each tensor
  reshaped to a leading 1), and its width differs from the encoder's."""
  c = ld("vit_mae")
  e, d = "vit.embeddings.", "decoder."
  return "vit_mae", {
    "encoder": {
      "patch_embed": {
        "kernel": conv2(c[e + "patch_embeddings.projection.weight"]),
        "bias": c[e + "patch_embeddings.projection.bias"],
      },
      "cls_token": c[e + "cls_token"],
      "pos_embed": c[e + "position_embeddings"],
      "blocks": _stacked([_mae_block(c, f"vit.encoder.layer.{i}.") for i in range(2)]),
      "norm": _norm(c, "vit.layernorm"),
    },
    "decoder": {
      "embed": _linear(c, d + "decoder_embed"),
      "mask_token": c[d + "mask_token"],
      "pos_embed": c[d + "decoder_pos_embed"],
      "blocks": _stacked([_mae_block(c, d + "decoder_encoder.layer.0.")]),
      "norm": _norm(c, d + "decoder_norm"),
      "pred": _linear(c, d + "decoder_pred"),
    },
  }


def mobilenet_nnx():
  """MobileNetV2 in NNX lists, each unit a conv and its batch norm (``blocks/3/dw/conv``,
  ``blocks/3/dw/bn``; the norm's statistics beside its scale). The expanding and the
  depthwise units are as wide, so a norm's shape and name fit both units' norms: the unit
  its conv came from (its shape is its own) says which."""
  c, m = ld("mobilenet_v2"), "mobilenet_v2."

  def unit(q):
    n = q + ".normalization."
    return {
      "conv": {"kernel": conv2(c[q + ".convolution.weight"])},
      "bn": {
        "scale": c[n + "weight"],
        "bias": c[n + "bias"],
        "mean": c[n + "running_mean"],
        "var": c[n + "running_var"],
      },
    }

  parts = (("expand", "expand_1x1"), ("dw", "conv_3x3"), ("project", "reduce_1x1"))
  stem = (("conv", "first_conv"), ("dw", "conv_3x3"), ("project", "reduce_1x1"))
  return "mobilenet_v2", {
    "stem": {n: unit(f"{m}conv_stem.{k}") for n, k in stem},
    "blocks": [{n: unit(f"{m}layer.{i}.{k}") for n, k in parts} for i in range(16)],
    "head": unit(m + "conv_1x1"),
    "classifier": _linear(c, "classifier"),
  }


def mobilenet_lists():
  """MobileNetV2 as equinox-style lists keep it: torch's layouts (``[out, in, h, w]``), each
  block a list of its three units (``blocks/3/1/conv/weight`` is block 3's depthwise unit:
  over layers of one number the inner list is the block's sequence, not a stage's blocks),
  and the head's norm named only by the unit its conv came from (``head/bn`` beside
  ``conv_1x1.convolution``)."""
  c, m = ld("mobilenet_v2"), "mobilenet_v2."

  def unit(q):
    n = q + ".normalization."
    stats = {"mean": c[n + "running_mean"], "var": c[n + "running_var"]}
    return {
      "conv": {"weight": c[q + ".convolution.weight"]},
      "bn": {"weight": c[n + "weight"], "bias": c[n + "bias"], **stats},
    }

  parts = ("expand_1x1", "conv_3x3", "reduce_1x1")
  return "mobilenet_v2", {
    "stem": [unit(f"{m}conv_stem.{k}") for k in ("first_conv", "conv_3x3", "reduce_1x1")],
    "blocks": [[unit(f"{m}layer.{i}.{k}") for k in parts] for i in range(16)],
    "head": unit(m + "conv_1x1"),
    "classifier": {"weight": c["classifier.weight"], "bias": c["classifier.bias"]},
  }


def mobilenet_flax_auto():
  """MobileNetV2 as a linen ``@nn.compact`` writes it: ``InvertedResidual_0`` .. ``_15``, each
  ``Conv_0``..``Conv_2`` and ``BatchNorm_0``..``BatchNorm_2`` in call order, the statistics
  in ``batch_stats``. The expanding and the depthwise units' norms are as wide: the k-th
  ``BatchNorm`` is the norm of the unit the k-th ``Conv`` came from (the checkpoint keeps a
  conv and its norm in one unit), and a norm's statistics follow its scale across the
  collections."""
  c, m = ld("mobilenet_v2"), "mobilenet_v2."

  def bn(q):
    n = q + ".normalization."
    return (
      {"scale": c[n + "weight"], "bias": c[n + "bias"]},
      {"mean": c[n + "running_mean"], "var": c[n + "running_var"]},
    )

  def units(names):
    p, b = {}, {}
    for j, q in enumerate(names):
      p[f"Conv_{j}"] = {"kernel": conv2(c[q + ".convolution.weight"])}
      p[f"BatchNorm_{j}"], b[f"BatchNorm_{j}"] = bn(q)
    return p, b

  P, B = units([f"{m}conv_stem.{k}" for k in ("first_conv", "conv_3x3", "reduce_1x1")])
  for i in range(16):
    block = [f"{m}layer.{i}.{k}" for k in ("expand_1x1", "conv_3x3", "reduce_1x1")]
    P[f"InvertedResidual_{i}"], B[f"InvertedResidual_{i}"] = units(block)
  P["Conv_3"] = {"kernel": conv2(c[m + "conv_1x1.convolution.weight"])}
  P["BatchNorm_3"], B["BatchNorm_3"] = bn(m + "conv_1x1")
  P["Dense_0"] = _linear(c, "classifier")
  return "mobilenet_v2", {"params": P, "batch_stats": B}


def efficientnet_flax_auto():
  """EfficientNet as a linen ``@nn.compact`` writes it (``MBConvBlock_3/Conv_1``,
  ``BatchNorm_1``, ``SqueezeExcite_0``): the first block has no expansion, so its
  ``BatchNorm_0`` is the depthwise conv's norm where every other block's is the expansion's
  (the layers offer it other tensors: no disagreement between the layers)."""
  c, e = ld("efficientnet"), "efficientnet."

  def bn(q):
    return (
      {"scale": c[q + ".weight"], "bias": c[q + ".bias"]},
      {"mean": c[q + ".running_mean"], "var": c[q + ".running_var"]},
    )

  P, B = {"Conv_0": {"kernel": conv2(c[e + "embeddings.convolution.weight"])}}, {}
  P["BatchNorm_0"], B["BatchNorm_0"] = bn(e + "embeddings.batchnorm")
  for i in range(8):
    q = f"{e}encoder.blocks.{i}."
    units = [(q + "depthwise_conv.depthwise_conv", q + "depthwise_conv.depthwise_norm")]
    if q + "expansion.expand_conv.weight" in c:
      units.insert(0, (q + "expansion.expand_conv", q + "expansion.expand_bn"))
    units.append((q + "projection.project_conv", q + "projection.project_bn"))
    p, b = {}, {}
    for j, (conv, norm) in enumerate(units):
      p[f"Conv_{j}"] = {"kernel": conv2(c[conv + ".weight"])}
      p[f"BatchNorm_{j}"], b[f"BatchNorm_{j}"] = bn(norm)
    se = q + "squeeze_excite."
    p["SqueezeExcite_0"] = {
      f"Conv_{k}": {"kernel": conv2(c[f"{se}{n}.weight"]), "bias": c[f"{se}{n}.bias"]}
      for k, n in enumerate(("reduce", "expand"))
    }
    P[f"MBConvBlock_{i}"], B[f"MBConvBlock_{i}"] = p, b
  P["Conv_1"] = {"kernel": conv2(c[e + "encoder.top_conv.weight"])}
  P["BatchNorm_1"], B["BatchNorm_1"] = bn(e + "encoder.top_bn")
  P["Dense_0"] = _linear(c, "classifier")
  return "efficientnet", {"params": P, "batch_stats": B}


def rwkv_flax():
  """RWKV as its JAX ports write it (``blocks_0/att/time_mix_k``, ``ffn/receptance``, the
  first block's ``ln0``): bare time-mix parameters of one shape in both the attention and
  the feed-forward, each taken in the module the block's decided kernels align its own
  with; ``att`` is the attention."""
  c, b = ld("rwkv"), "rwkv.blocks."

  def norm(k):
    return _norm(c, k)

  t = {"emb": {"embedding": c["rwkv.embeddings.weight"]}}
  for i in range(2):
    q = f"{b}{i}."
    a, f = q + "attention.", q + "feed_forward."
    block = {"ln1": norm(q + "ln1"), "ln2": norm(q + "ln2")}
    if i == 0:
      block["ln0"] = norm(q + "pre_ln")
    block["att"] = {
      **{f"time_mix_{n[0]}": c[a + f"time_mix_{n}"] for n in ("key", "value", "receptance")},
      "time_decay": c[a + "time_decay"],
      "time_first": c[a + "time_first"],
      **{n: {"kernel": T(c[a + n + ".weight"])} for n in ("key", "value", "receptance", "output")},
    }
    block["ffn"] = {
      **{f"time_mix_{n[0]}": c[f + f"time_mix_{n}"] for n in ("key", "receptance")},
      **{n: {"kernel": T(c[f + n + ".weight"])} for n in ("key", "receptance", "value")},
    }
    t[f"blocks_{i}"] = block
  t["ln_out"] = norm("rwkv.ln_out")
  t["head"] = {"kernel": T(c["head.weight"])}
  return "rwkv", t


def jamba_nnx():
  """Jamba in NNX lists: Mamba layers with an MLP and attention layers with a mixture of
  experts, alternating (the layers differ in kind); ``ffn_norm`` is the checkpoint's
  ``pre_ff_layernorm``."""
  c = ld("jamba")
  layers = []
  for i in range(4):
    q = f"model.layers.{i}."
    layer = {
      "norm": {"scale": c[q + "input_layernorm.weight"]},
      "ffn_norm": {"scale": c[q + "pre_ff_layernorm.weight"]},
    }
    if i % 2 == 0:
      m = q + "mamba."
      layer["mamba"] = {
        **{n: {"kernel": T(c[f"{m}{n}.weight"])} for n in ("in_proj", "x_proj", "out_proj")},
        "conv1d": {"kernel": conv1(c[m + "conv1d.weight"]), "bias": c[m + "conv1d.bias"]},
        "dt_proj": {"kernel": T(c[m + "dt_proj.weight"]), "bias": c[m + "dt_proj.bias"]},
        "A_log": c[m + "A_log"],
        "D": c[m + "D"],
        **{f"{n}_norm": {"scale": c[f"{m}{n}_layernorm.weight"]} for n in ("dt", "b", "c")},
      }
      layer["mlp"] = {
        n: {"kernel": T(c[f"{q}feed_forward.{n}_proj.weight"])} for n in ("gate", "up", "down")
      }
    else:
      a, e = q + "self_attn.", q + "feed_forward."
      layer["attn"] = {
        "q": {"kernel": heads_in(c[a + "q_proj.weight"], 4)},
        "k": {"kernel": heads_in(c[a + "k_proj.weight"], 2)},
        "v": {"kernel": heads_in(c[a + "v_proj.weight"], 2)},
        "o": {"kernel": heads_out(c[a + "o_proj.weight"], 4)},
      }
      layer["moe"] = {
        "router": {"kernel": T(c[e + "router.weight"])},
        "experts": {
          n: {"kernel": np.stack([T(c[f"{e}experts.{j}.{n}_proj.weight"]) for j in range(2)])}
          for n in ("gate", "up", "down")
        },
      }
    layers.append(layer)
  return "jamba", {
    "embed": {"embedding": c["model.embed_tokens.weight"]},
    "layers": layers,
    "final_norm": {"scale": c["model.final_layernorm.weight"]},
    "lm_head": {"kernel": T(c["lm_head.weight"])},
  }


def videomae_nnx():
  """VideoMAE in NNX lists: a ``Conv3d`` tubelet embedding (``[out, in, t, h, w]`` into
  flax's ``[t, h, w, in, out]``) and the attention's query and value biases stored apart
  from their weights (``attention.q_bias`` beside ``attention.query.weight``: one module)."""
  c = ld("videomae")
  blocks = []
  for i in range(2):
    q = f"encoder.layer.{i}."
    a = q + "attention.attention."
    blocks.append(
      {
        "norm1": _norm(c, q + "layernorm_before"),
        "attn": {
          "q": {
            "kernel": heads_in(c[a + "query.weight"], 4),
            "bias": c[a + "q_bias"].reshape(4, -1),
          },
          "k": {"kernel": heads_in(c[a + "key.weight"], 4)},
          "v": {
            "kernel": heads_in(c[a + "value.weight"], 4),
            "bias": c[a + "v_bias"].reshape(4, -1),
          },
          "o": _linear(c, q + "attention.output.dense", 4, out=True),
        },
        "norm2": _norm(c, q + "layernorm_after"),
        "mlp": {"fc1": _linear(c, q + "intermediate.dense"), "fc2": _linear(c, q + "output.dense")},
      }
    )
  p = "embeddings.patch_embeddings.projection."
  return "videomae", {
    "patch_embed": {
      "kernel": np.ascontiguousarray(c[p + "weight"].transpose(2, 3, 4, 1, 0)),
      "bias": c[p + "bias"],
    },
    "blocks": blocks,
    "norm": _norm(c, "layernorm"),
  }


def resnet_haiku():
  """ResNet as haiku's ``hk.nets.ResNet`` names it (``res_net/~/block_group_1/~/block_0/~/
  conv_1``, ``batchnorm_1`` with its statistics in ``batchnorm_1/~/mean_ema``'s ``average``,
  ``shortcut_conv``), each module one escaped key: ``block_group_{s}/~/block_{b}`` is the
  checkpoint's ``stages.{s}.layers.{b}``, whose ``layer.{j}`` is the block's ``conv_{j}``;
  a moving average is its norm's own. Nothing in the checkpoint is named like
  ``initial_batchnorm``: the norm beside ``initial_conv``'s convolution in its unit is it."""
  c, r, p = ld("resnet"), "resnet.encoder.stages.", "res_net/~/"
  t = {}

  def unit(conv, norm, q):
    n = q + ".normalization."
    t[conv] = {"w": conv2(c[q + ".convolution.weight"])}
    t[norm] = {"scale": c[n + "weight"], "offset": c[n + "bias"]}
    t[norm + "/~/mean_ema"] = {"average": c[n + "running_mean"]}
    t[norm + "/~/var_ema"] = {"average": c[n + "running_var"]}

  unit(p + "initial_conv", p + "initial_batchnorm", "resnet.embedder.embedder")
  for s in range(2):
    for b in range(2):
      q, block = f"{r}{s}.layers.{b}.", f"{p}block_group_{s}/~/block_{b}/~/"
      for j in range(2):
        unit(f"{block}conv_{j}", f"{block}batchnorm_{j}", f"{q}layer.{j}")
      if q + "shortcut.convolution.weight" in c:
        unit(block + "shortcut_conv", block + "shortcut_batchnorm", q + "shortcut")
  t[p + "logits"] = {"w": T(c["classifier.1.weight"]), "b": c["classifier.1.bias"]}
  return "resnet", t


def gemma3_nnx():
  """Gemma 3 stacked by ``nnx.scan`` in the gemma library's words: four norms a layer
  (``pre_attention_norm`` .. ``post_ffw_norm``) and ``query_norm``/``key_norm``."""
  c = ld("gemma3")
  layers = []
  for i in range(2):
    q = f"model.layers.{i}."
    a = q + "self_attn."

    def w(k):
      return {"scale": c[q + k + ".weight"]}

    layers.append(
      {
        "pre_attention_norm": w("input_layernorm"),
        "post_attention_norm": w("post_attention_layernorm"),
        "pre_ffw_norm": w("pre_feedforward_layernorm"),
        "post_ffw_norm": w("post_feedforward_layernorm"),
        "attn": {
          "q_proj": {"kernel": heads_in(c[a + "q_proj.weight"], 4)},
          "k_proj": {"kernel": heads_in(c[a + "k_proj.weight"], 2)},
          "v_proj": {"kernel": heads_in(c[a + "v_proj.weight"], 2)},
          "o_proj": {"kernel": heads_out(c[a + "o_proj.weight"], 4)},
          "query_norm": {"scale": c[a + "q_norm.weight"]},
          "key_norm": {"scale": c[a + "k_norm.weight"]},
        },
        "mlp": {
          n: {"kernel": T(c[f"{q}mlp.{n}.weight"])} for n in ("gate_proj", "up_proj", "down_proj")
        },
      }
    )
  return "gemma3", {
    "embedder": {"input_embedding": c["model.embed_tokens.weight"]},
    "layers": _stacked(layers),
    "final_norm": {"scale": c["model.norm.weight"]},
  }


def blip_scanned():
  """BLIP's two towers scanned: the text tower's layers hold a self- and a cross-attention of
  one shape and three norms of one width (``attn_norm``, ``xattn_norm``, ``mlp_norm``); the
  vision tower's a fused ``qkv``."""
  c, t, v = ld("blip"), "text_model.", "vision_model."

  def attention(q):
    return {
      **{
        n: _linear(c, q + "self." + w, 4) for n, w in (("q", "query"), ("k", "key"), ("v", "value"))
      },
      "o": _linear(c, q + "output.dense", 4, out=True),
    }

  text = []
  for i in range(2):
    q = f"{t}encoder.layer.{i}."
    text.append(
      {
        "attn": attention(q + "attention."),
        "attn_norm": _norm(c, q + "attention.output.LayerNorm"),
        "xattn": attention(q + "crossattention."),
        "xattn_norm": _norm(c, q + "crossattention.output.LayerNorm"),
        "mlp": {"fc1": _linear(c, q + "intermediate.dense"), "fc2": _linear(c, q + "output.dense")},
        "mlp_norm": _norm(c, q + "output.LayerNorm"),
      }
    )
  vision = []
  for i in range(2):
    q = f"{v}encoder.layers.{i}."
    vision.append(
      {
        "norm1": _norm(c, q + "layer_norm1"),
        "attn": {
          "qkv": _linear(c, q + "self_attn.qkv"),
          "proj": _linear(c, q + "self_attn.projection"),
        },
        "norm2": _norm(c, q + "layer_norm2"),
        "mlp": {"fc1": _linear(c, q + "mlp.fc1"), "fc2": _linear(c, q + "mlp.fc2")},
      }
    )
  return "blip", {
    "text": {
      "embed": {"embedding": c[t + "embeddings.word_embeddings.weight"]},
      "pos_embed": {"embedding": c[t + "embeddings.position_embeddings.weight"]},
      "embed_norm": _norm(c, t + "embeddings.LayerNorm"),
      "layers": _stacked(text),
      "pooler": _linear(c, t + "pooler.dense"),
    },
    "vision": {
      "patch_embed": {
        "kernel": conv2(c[v + "embeddings.patch_embedding.weight"]),
        "bias": c[v + "embeddings.patch_embedding.bias"],
      },
      "cls_token": c[v + "embeddings.class_embedding"],
      "pos_embed": c[v + "embeddings.position_embedding"],
      "layers": _stacked(vision),
      "post_norm": _norm(c, v + "post_layernorm"),
    },
    "text_proj": _linear(c, "text_projection"),
    "vision_proj": _linear(c, "visual_projection"),
    "logit_scale": c["logit_scale"],
  }


def _conformer_front(c):
  """A wav2vec 2.0 Conformer's feature extractor, projection, weight-normed positional conv
  and final norm, named as an audio model's own code would (``frontend/convs/{j}``)."""
  g = "encoder.pos_conv_embed.conv."
  return {
    "frontend": {
      "convs": [
        {"kernel": conv1(c[f"feature_extractor.conv_layers.{j}.conv.weight"])} for j in range(2)
      ],
      "norm": _norm(c, "feature_extractor.conv_layers.0.layer_norm"),
    },
    "input_projection": {
      "ln": _norm(c, "feature_projection.layer_norm"),
      "proj": _linear(c, "feature_projection.projection"),
    },
    "mask_emb": c["masked_spec_embed"],
    "pos_conv": {
      "Conv_0": {
        "kernel": conv1(c[g + "parametrizations.weight.original1"]),
        "bias": c[g + "bias"],
      },
      "WeightNorm_0": {
        "Conv_0/kernel/scale": c[g + "parametrizations.weight.original0"].reshape(-1)
      },
    },
    "final_ln": _norm(c, "encoder.layer_norm"),
  }


def _pointwise(c, k):
  return {"kernel": np.ascontiguousarray(c[k + ".weight"][:, :, 0].T)}  # [o, i, 1] -> [i, o]


def conformer_praxis_nnx():
  """A Conformer named as lingvo and praxis name it, in NNX lists: ``fflayer_start`` and
  ``fflayer_end`` (the checkpoint's ``ffn1``/``ffn2``: only their order says which),
  ``trans_atten`` with ``post`` its output, ``lconv``'s ``linear_start``/``linear_end`` dense
  kernels of the checkpoint's 1x1 ``pointwise_conv1``/``2`` (the second square), its
  ``conv_norm`` a batch norm beside a layer norm, each block's ``final_ln``."""
  c = ld("conformer")
  layers = []
  for i in range(2):
    q = f"encoder.layers.{i}."
    m, a = q + "conv_module.", q + "self_attn."

    def ff(n, q=q):
      return {
        "ln": _norm(c, q + f"{n}_layer_norm"),
        "ffn_layer1": _linear(c, q + f"{n}.intermediate_dense"),
        "ffn_layer2": _linear(c, q + f"{n}.output_dense"),
      }

    names = (("query", "q"), ("key", "k"), ("value", "v"), ("post", "out"))
    norm = {"scale": c[m + "batch_norm.weight"], "bias": c[m + "batch_norm.bias"]}
    layers.append(
      {
        "fflayer_start": ff("ffn1"),
        "trans_atten": {
          "ln": _norm(c, q + "self_attn_layer_norm"),
          **{t: _linear(c, a + f"linear_{s}") for t, s in names},
        },
        "lconv": {
          "ln": _norm(c, m + "layer_norm"),
          "linear_start": _pointwise(c, m + "pointwise_conv1"),
          "depthwise_conv1d": {"kernel": conv1(c[m + "depthwise_conv.weight"])},
          "conv_norm": {
            **norm,
            "mean": c[m + "batch_norm.running_mean"],
            "var": c[m + "batch_norm.running_var"],
          },
          "linear_end": _pointwise(c, m + "pointwise_conv2"),
        },
        "fflayer_end": ff("ffn2"),
        "final_ln": _norm(c, q + "final_layer_norm"),
      }
    )
  return "conformer", {**_conformer_front(c), "layers": layers}


def conformer_linen():
  """The same Conformer as a linen port of NeMo's names keeps it: ``ff1``/``ff2``, ``mhsa``
  over flax's attention (heads split), a ``conv`` module whose ``bn`` (statistics in
  ``batch_stats``) and ``norm`` are both its norms, ``norm_out``."""
  c = ld("conformer")
  params, stats = _conformer_front(c), {}
  for i in range(2):
    q = f"encoder.layers.{i}."
    m, a = q + "conv_module.", q + "self_attn."

    def ff(n, q=q):
      dense = (_linear(c, q + f"{n}.intermediate_dense"), _linear(c, q + f"{n}.output_dense"))
      return {"norm": _norm(c, q + f"{n}_layer_norm"), "Dense_0": dense[0], "Dense_1": dense[1]}

    attention = {n: _linear(c, a + f"linear_{n[0]}", heads=4) for n in ("query", "key", "value")}
    attention["out"] = _linear(c, a + "linear_out", heads=4, out=True)
    params[f"ConformerBlock_{i}"] = {
      "ff1": ff("ffn1"),
      "mhsa": {
        "norm": _norm(c, q + "self_attn_layer_norm"),
        "MultiHeadDotProductAttention_0": attention,
      },
      "conv": {
        "norm": _norm(c, m + "layer_norm"),
        "pointwise_in": {"kernel": conv1(c[m + "pointwise_conv1.weight"])},
        "depthwise": {"kernel": conv1(c[m + "depthwise_conv.weight"])},
        "bn": {"scale": c[m + "batch_norm.weight"], "bias": c[m + "batch_norm.bias"]},
        "pointwise_out": {"kernel": conv1(c[m + "pointwise_conv2.weight"])},
      },
      "ff2": ff("ffn2"),
      "norm_out": _norm(c, q + "final_layer_norm"),
    }
    bn = {"mean": c[m + "batch_norm.running_mean"], "var": c[m + "batch_norm.running_var"]}
    stats[f"ConformerBlock_{i}"] = {"conv": {"bn": bn}}
  return "conformer", {"params": params, "batch_stats": stats}


def recurrent_gemma_official():
  """RecurrentGemma as google-deepmind/recurrentgemma's JAX code keeps it: ``blocks_{i}`` with
  a ``recurrent_block`` (``conv_1d/w`` ``[K, C]``: the checkpoint's depthwise ``[C, 1, K]``;
  ``rg_lru``'s ``a_gate`` and ``a_param`` its ``recurrent_gate_*`` and ``recurrent_param``)
  or an ``attention_block`` (``proj_final``), and ``mlp_block/ffw_up`` ``[2, d, f]``: the gate
  and the up stacked (gate first), as no separate gate exists in the target."""
  c, p = ld("recurrent_gemma"), "model.layers."
  t = {
    "embedder": {"input_embedding": c["model.embed_tokens.weight"]},
    "final_norm": {"scale": c["model.final_norm.weight"]},
  }
  for i, kind in enumerate(("recurrent", "recurrent", "attention")):
    q, b = f"{p}{i}.", f"{p}{i}.temporal_block."
    mlp = q + "mlp_block."
    block = {
      "temporal_pre_norm": {"scale": c[q + "temporal_pre_norm.weight"]},
      "channel_pre_norm": {"scale": c[q + "channel_pre_norm.weight"]},
      "mlp_block": {
        "ffw_up": {
          "w": np.stack([T(c[mlp + "gate_proj.weight"]), T(c[mlp + "up_proj.weight"])]),
          "b": np.stack([c[mlp + "gate_proj.bias"], c[mlp + "up_proj.bias"]]),
        },
        "ffw_down": _linear(c, mlp + "down_proj"),
      },
    }
    if kind == "recurrent":
      lru = b + "rg_lru."
      block["recurrent_block"] = {
        **{n: _linear(c, b + n) for n in ("linear_y", "linear_x", "linear_out")},
        "conv_1d": {
          "w": np.ascontiguousarray(c[b + "conv_1d.weight"][:, 0, :].T),
          "b": c[b + "conv_1d.bias"],
        },
        "rg_lru": {
          "input_gate": {"w": c[lru + "input_gate_weight"], "b": c[lru + "input_gate_bias"]},
          "a_gate": {"w": c[lru + "recurrent_gate_weight"], "b": c[lru + "recurrent_gate_bias"]},
          "a_param": c[lru + "recurrent_param"],
        },
      }
    else:
      block["attention_block"] = {
        **{f"proj_{n}": _linear(c, b + f"{n}_proj") for n in "qkv"},
        "proj_final": _linear(c, b + "o_proj"),
      }
    t[f"blocks_{i}"] = block
  return "recurrent_gemma", t


def recurrent_gemma_nnx():
  """The same model as an NNX port keeps it: ``layers/{i}`` with ``norm1``/``norm2`` (the
  checkpoint's ``temporal_pre_norm``/``channel_pre_norm``: the sequence mixer's and the
  MLP's), a ``mixer`` that is the recurrence or the attention, flax's ``[K, 1, C]``
  depthwise conv, the RG-LRU's gates as bare leaves, ``log_a`` its ``recurrent_param``."""
  c, p = ld("recurrent_gemma"), "model.layers."
  layers = []
  for i, kind in enumerate(("recurrent", "recurrent", "attention")):
    q, b = f"{p}{i}.", f"{p}{i}.temporal_block."
    layer = {
      "norm1": {"scale": c[q + "temporal_pre_norm.weight"]},
      "norm2": {"scale": c[q + "channel_pre_norm.weight"]},
      "mlp": {n: _linear(c, q + f"mlp_block.{n}_proj") for n in ("gate", "up", "down")},
    }
    if kind == "recurrent":
      lru = b + "rg_lru."
      gates = {
        f"{g}_gate_{s}": c[lru + f"{g}_gate_{n}"]
        for g in ("input", "recurrent")
        for s, n in (("w", "weight"), ("b", "bias"))
      }
      layer["mixer"] = {
        **{n: _linear(c, b + n) for n in ("linear_x", "linear_y")},
        "out": _linear(c, b + "linear_out"),
        "conv": {"kernel": conv1(c[b + "conv_1d.weight"]), "bias": c[b + "conv_1d.bias"]},
        "lru": {**gates, "log_a": c[lru + "recurrent_param"]},
      }
    else:
      layer["mixer"] = {n: _linear(c, b + f"{n}_proj") for n in "qkvo"}
    layers.append(layer)
  return "recurrent_gemma", {
    "embed": {"embedding": c["model.embed_tokens.weight"]},
    "layers": layers,
    "final_norm": {"scale": c["model.final_norm.weight"]},
  }


def _qwen2_vl_text_layer(c, i):
  q = f"model.layers.{i}."
  return {
    "attn_norm": {"scale": c[q + "input_layernorm.weight"]},
    "mlp_norm": {"scale": c[q + "post_attention_layernorm.weight"]},
    "attn": {n: _linear(c, q + f"self_attn.{n}_proj") for n in "qkvo"},
    "mlp": {n: _linear(c, q + f"mlp.{n}_proj") for n in ("gate", "up", "down")},
  }


def _qwen2_vl_vision_block(c, i):
  q = f"visual.blocks.{i}."
  return {
    "norm1": _norm(c, q + "norm1"),
    "norm2": _norm(c, q + "norm2"),
    "attn": {"qkv": _linear(c, q + "attn.qkv"), "proj": _linear(c, q + "attn.proj")},
    "mlp": {"fc1": _linear(c, q + "mlp.fc1"), "fc2": _linear(c, q + "mlp.fc2")},
  }


def _conv3(w):
  return np.ascontiguousarray(w.transpose(2, 3, 4, 1, 0))  # OIDHW -> DHWIO


def qwen2_vl_nnx():
  """Qwen2-VL in NNX towers of the user's own words: ``vision/merger/fc1`` is the checkpoint's
  ``visual.merger.mlp.0`` (a sequential's first module at the tower's level, not a layer: layers
  hold MLPs, never the other way round), a ``Conv3d`` patch embedding, a Qwen2 ``llm``."""
  c = ld("qwen2_vl")
  return "qwen2_vl", {
    "vision": {
      "patch_embed": {"kernel": _conv3(c["visual.patch_embed.proj.weight"])},
      "blocks": [_qwen2_vl_vision_block(c, i) for i in range(2)],
      "merger": {
        "norm": _norm(c, "visual.merger.ln_q"),
        "fc1": _linear(c, "visual.merger.mlp.0"),
        "fc2": _linear(c, "visual.merger.mlp.2"),
      },
    },
    "llm": {
      "embed": {"embedding": c["model.embed_tokens.weight"]},
      "layers": [_qwen2_vl_text_layer(c, i) for i in range(2)],
      "norm": {"scale": c["model.norm.weight"]},
      "lm_head": {"kernel": T(c["lm_head.weight"])},
    },
  }


def qwen2_vl_scanned():
  """The same model in the checkpoint's own words, both towers' layers under ``nnx.scan``."""
  c = ld("qwen2_vl")
  return "qwen2_vl", {
    "visual": {
      "patch_embed": {"proj": {"kernel": _conv3(c["visual.patch_embed.proj.weight"])}},
      "blocks": _stacked([_qwen2_vl_vision_block(c, i) for i in range(2)]),
      "merger": {
        "ln_q": _norm(c, "visual.merger.ln_q"),
        "mlp": {"0": _linear(c, "visual.merger.mlp.0"), "2": _linear(c, "visual.merger.mlp.2")},
      },
    },
    "model": {
      "embed_tokens": {"embedding": c["model.embed_tokens.weight"]},
      "layers": _stacked([_qwen2_vl_text_layer(c, i) for i in range(2)]),
      "norm": {"scale": c["model.norm.weight"]},
    },
    "lm_head": {"kernel": T(c["lm_head.weight"])},
  }


def qwen2_vl_big_vision():
  """Its vision tower as big_vision writes a ViT (``encoderblock_{i}``, flax's attention with
  q, k and v apart and heads split, ``MlpBlock_0``), the merger as ``Dense_0``/``Dense_1``:
  the fused ``qkv``'s layout is all that is asked (its model type says none)."""
  c = ld("qwen2_vl")
  img = {"embedding": {"kernel": _conv3(c["visual.patch_embed.proj.weight"])}}
  for i in range(2):
    q = f"visual.blocks.{i}."
    w, b = c[q + "attn.qkv.weight"], c[q + "attn.qkv.bias"]  # contiguous [q | k | v]
    parts = {n: (w[j * 16 : (j + 1) * 16], b[j * 16 : (j + 1) * 16]) for j, n in enumerate(QKV)}
    img[f"encoderblock_{i}"] = {
      "LayerNorm_0": _norm(c, q + "norm1"),
      "LayerNorm_1": _norm(c, q + "norm2"),
      "MultiHeadDotProductAttention_0": {
        **{
          n: {"kernel": heads_in(pw, 2), "bias": pb.reshape(2, -1)} for n, (pw, pb) in parts.items()
        },
        "out": {"kernel": heads_out(c[q + "attn.proj.weight"], 2), "bias": c[q + "attn.proj.bias"]},
      },
      "MlpBlock_0": {"Dense_0": _linear(c, q + "mlp.fc1"), "Dense_1": _linear(c, q + "mlp.fc2")},
    }
  img["merger"] = {
    "LayerNorm_0": _norm(c, "visual.merger.ln_q"),
    "Dense_0": _linear(c, "visual.merger.mlp.0"),
    "Dense_1": _linear(c, "visual.merger.mlp.2"),
  }
  llm = {
    "embedder": {"input_embedding": c["model.embed_tokens.weight"]},
    "layers": [_qwen2_vl_text_layer(c, i) for i in range(2)],
    "final_norm": {"scale": c["model.norm.weight"]},
    "head": {"kernel": T(c["lm_head.weight"])},
  }
  return "qwen2_vl", {"img": img, "llm": llm}


QKV = ("query", "key", "value")


def resnet_torch_names():
  """``resnet_flax`` as a linen port of torchvision's names it: ``BasicBlock_{n}`` numbered
  across the stages, each with ``conv1``/``bn1``/``conv2``/``bn2`` (torch counts from 1:
  ``conv1`` is the checkpoint's ``layer.0``, never ``layer.1``), ``downsample_conv``/
  ``downsample_bn``, and ``fc``."""
  names = {"conv_proj": "downsample_conv", "norm_proj": "downsample_bn", "Dense_0": "fc"}
  names.update({f"Conv_{j}": f"conv{j + 1}" for j in range(2)})
  names.update({f"BatchNorm_{j}": f"bn{j + 1}" for j in range(2)})

  def torch(tree):
    return {
      names.get(k, k.replace("ResNetBlock_", "BasicBlock_")): torch(v) if isinstance(v, dict) else v
      for k, v in tree.items()
    }

  name, expect = resnet_flax()
  return name, torch(expect)


def _detr_backbone(c):
  """DETR's ResNet backbone as a linen port writes it: ``ResidualStage_{s}/BasicBlock_{b}``
  with torch's ``conv1``/``bn1`` names, the checkpoint's ``stages.{s}.layers.{b}.layer.{j}``."""
  r = "model.backbone.conv_encoder.model."

  def bn(k):
    return _batch_norm(c, k)

  p, s = {}, {}
  p["stem_conv"] = {"kernel": conv2(c[r + "embedder.embedder.convolution.weight"])}
  p["stem_bn"], s["stem_bn"] = bn(r + "embedder.embedder.normalization")
  for st in range(2):
    q, blk, bst = f"{r}encoder.stages.{st}.layers.0.", {}, {}
    for j in range(2):
      blk[f"conv{j + 1}"] = {"kernel": conv2(c[q + f"layer.{j}.convolution.weight"])}
      blk[f"bn{j + 1}"], bst[f"bn{j + 1}"] = bn(q + f"layer.{j}.normalization")
    if st == 1:
      blk["proj_conv"] = {"kernel": conv2(c[q + "shortcut.convolution.weight"])}
      blk["proj_bn"], bst["proj_bn"] = bn(q + "shortcut.normalization")
    p[f"ResidualStage_{st}"] = {"BasicBlock_0": blk}
    s[f"ResidualStage_{st}"] = {"BasicBlock_0": bst}
  return p, s


def _detr_mha(c, a):
  return {
    **{n: _linear(c, a + f"{s}_proj", heads=4) for n, s in (("query", "q"), ("key", "k"))},
    "value": _linear(c, a + "v_proj", heads=4),
    "out": _linear(c, a + "out_proj", heads=4, out=True),
  }


def detr_linen():
  """DETR as a linen port writes it: the stage-numbered ResNet backbone beside one-number
  ``encoderblock_{i}``/``decoderblock_{i}`` (flax's attention with heads split,
  ``LayerNorm_0..2`` in call order: the self-attention's, the cross-attention's, the MLP's),
  the box head's ``Dense_0..2`` (the checkpoint's ``bbox_predictor.layers.{j}``: a list of one
  module's linears, not layers). Asked: ``class_embed``."""
  c = ld("detr")
  bp, bs = _detr_backbone(c)
  enc, dec = {}, {}
  for i in range(2):
    q = f"model.encoder.layers.{i}."
    enc[f"encoderblock_{i}"] = {
      "MultiHeadDotProductAttention_0": _detr_mha(c, q + "self_attn."),
      "LayerNorm_0": _norm(c, q + "self_attn_layer_norm"),
      "MlpBlock_0": {"Dense_0": _linear(c, q + "fc1"), "Dense_1": _linear(c, q + "fc2")},
      "LayerNorm_1": _norm(c, q + "final_layer_norm"),
    }
    q = f"model.decoder.layers.{i}."
    dec[f"decoderblock_{i}"] = {
      "self_attention": _detr_mha(c, q + "self_attn."),
      "LayerNorm_0": _norm(c, q + "self_attn_layer_norm"),
      "cross_attention": _detr_mha(c, q + "encoder_attn."),
      "LayerNorm_1": _norm(c, q + "encoder_attn_layer_norm"),
      "MlpBlock_0": {"Dense_0": _linear(c, q + "fc1"), "Dense_1": _linear(c, q + "fc2")},
      "LayerNorm_2": _norm(c, q + "final_layer_norm"),
    }
  dec["decoder_norm"] = _norm(c, "model.decoder.layernorm")
  params = {
    "backbone": bp,
    "input_proj": {
      "kernel": conv2(c["model.input_projection.weight"]),
      "bias": c["model.input_projection.bias"],
    },
    "query_emb": {"embedding": c["model.query_position_embeddings.weight"]},
    "transformer": {"encoder": enc, "decoder": dec},
    "class_embed": _linear(c, "class_labels_classifier"),
    "bbox_embed": {f"Dense_{j}": _linear(c, f"bbox_predictor.layers.{j}") for j in range(3)},
  }
  return "detr", {"params": params, "batch_stats": {"backbone": bs}}


def detr_nnx():
  """The same model in NNX: batch statistics beside each norm's scale, layers in lists, a
  decoder layer's ``norm1``/``norm2``/``norm3`` (the self-attention's, the cross-attention's,
  the MLP's: ``norm2`` is the MLP's only in a block of two), ``box_head/layers/{j}``. Asked:
  ``class_head`` and ``queries`` (a bare ``[queries, d]`` table)."""
  c = ld("detr")
  bp, bs = _detr_backbone(c)
  bp["stem_bn"].update(bs["stem_bn"])
  for st in range(2):
    for n, stats in bs[f"ResidualStage_{st}"]["BasicBlock_0"].items():
      bp[f"ResidualStage_{st}"]["BasicBlock_0"][n].update(stats)

  def attn(a):
    return {n: _linear(c, a + f"{s}_proj") for n, s in zip("qkvo", ("q", "k", "v", "out"))}

  def mlp(q):
    return {"fc1": _linear(c, q + "fc1"), "fc2": _linear(c, q + "fc2")}

  enc, dec = [], []
  for i in range(2):
    q = f"model.encoder.layers.{i}."
    enc.append(
      {
        "attn": attn(q + "self_attn."),
        "norm1": _norm(c, q + "self_attn_layer_norm"),
        "mlp": mlp(q),
        "norm2": _norm(c, q + "final_layer_norm"),
      }
    )
    q = f"model.decoder.layers.{i}."
    dec.append(
      {
        "self_attn": attn(q + "self_attn."),
        "norm1": _norm(c, q + "self_attn_layer_norm"),
        "cross_attn": attn(q + "encoder_attn."),
        "norm2": _norm(c, q + "encoder_attn_layer_norm"),
        "mlp": mlp(q),
        "norm3": _norm(c, q + "final_layer_norm"),
      }
    )
  return "detr", {
    "backbone": bp,
    "input_proj": {
      "kernel": conv2(c["model.input_projection.weight"]),
      "bias": c["model.input_projection.bias"],
    },
    "queries": c["model.query_position_embeddings.weight"],
    "encoder": {"layers": enc},
    "decoder": {"layers": dec, "norm": _norm(c, "model.decoder.layernorm")},
    "class_head": _linear(c, "class_labels_classifier"),
    "box_head": {"layers": [_linear(c, f"bbox_predictor.layers.{j}") for j in range(3)]},
  }


def convnext_sequential_head():
  """ConvNeXt timm-style with its stem and head as sequentials of compound names, as
  vit-pytorch writes a head: ``conv_stem/0`` (the patchify conv), ``conv_stem/1`` (its norm),
  ``mlp_head/0`` (the final norm), ``mlp_head/1`` (the classifier): a number after a head's,
  a stem's or an embedding's word is a module's place, never a layer's. Asked: ``mlp_head/0``,
  one of two norms outside the layers (only a name would say which)."""
  name, e = convnext_timm()
  head = e.pop("head")
  e["mlp_head"] = [head["norm"], head["fc"]]
  e["conv_stem"] = e.pop("stem")
  return name, e


def unet_ldm_time_embed():
  """The NNX UNet with its time embedding as the original LDM code names it, a sequential
  ``time_embed/0`` and ``time_embed/2`` (its SiLU between): diffusers' ``time_embedding``'s
  ``linear_1`` and ``linear_2``."""
  name, e = unet_nnx()
  te = e.pop("time_embedding")
  e["time_embed"] = {"0": te["linear_1"], "2": te["linear_2"]}
  return name, e


MAPPED = {
  f.__name__: f
  for f in (
    vit_mae_scanned,
    clip_compact_same_class,
    resnet_haiku,
    resnet_torch_names,
    conformer_praxis_nnx,
    conformer_linen,
    recurrent_gemma_official,
    recurrent_gemma_nnx,
    qwen2_vl_nnx,
    qwen2_vl_scanned,
    mobilenet_nnx,
    mobilenet_flax_auto,
    mobilenet_lists,
    efficientnet_flax_auto,
    rwkv_flax,
    jamba_nnx,
    videomae_nnx,
    gemma3_nnx,
    blip_scanned,
    pixart_flax_linen,
    pixart_nnx,
    llava_nnx,
    llava_scanned,
    llava_flax_auto,
    unet_flax_linen,
    unet_nnx,
    unet_ldm_time_embed,
    vae_flax_linen,
    vae_nnx,
    convnext_timm,
    convnext_timm_scanned,
    beit_timm,
    beit_timm_scanned,
    segformer_hf_flax,
    convnext_flax,
    qwen3_vmap,
    dinov2_bigvision,
    dinov2_levanter,
    clip_nnx,
    clip_equinox,
    clip_equinox_vmapped,
    wav2vec2_flax,
    wav2vec2_equinox,
    wav2vec2_equinox_vmapped,
    electra_haiku,
    bigcode_flax,
    swin_nnx,
    swin_nnx_scanned,
    swin_flax_auto,
    qwen3_gemma_style,
    electra_nnx_vit_like,
    resnet_flax,
    siglip_bigvision,
    deepseek_maxtext,
    deepseek_maxtext_scanned,
    qwen2_moe_nnx,
    qwen2_moe_scanned,
    modernbert_fused,
    modernbert_split,
    gemma2_library,
    gemma2_library_scanned,
    gemma2_maxtext,
    gemma2_maxtext_scanned,
    phi_haiku,
    mamba_flax,
  )
}
# what is still asked, and how many questions (each a concept: gate and up are one pair)
ASKED = {
  # the fused vision qkv's layout (its model type says none): one line for kernels and biases
  "qwen2_vl_big_vision": (qwen2_vl_big_vision, 1, True),
  "qwen2_vl_big_vision, no config": (qwen2_vl_big_vision, 1, False),
  # class_embed [d, 3 classes + 1]: the box MLP's last linear ([d, 4 coordinates]) fits too,
  # and no name says which (only elimination would: never outside a layer)
  "detr_linen": (detr_linen, 1, True),
  "detr_linen, no config": (detr_linen, 1, False),
  # class_head and queries: a classifier and a bare table no checkpoint name says
  "detr_nnx": (detr_nnx, 2, True),
  "detr_nnx, no config": (detr_nnx, 2, False),
  "convnext_sequential_head": (convnext_sequential_head, 1, True),
  "qwen3_flax_auto": (qwen3_flax_auto, 2, True),  # Mlp_0's Dense_0/Dense_1: gate and up
  # head/kernel (its bias follows): the class token's classifier or the distillation token's
  "deit_timm_nnx": (deit_timm_nnx, 1, True),
  "deit_timm_nnx, no config": (deit_timm_nnx, 1, False),
  # no config.json: nothing says how Wqkv and Wi are laid out
  "modernbert_split, no config": (modernbert_split, 2, False),
}


def _target(expect):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), expect)


def _assert_restores(expect, target, src, m):
  """Restores ``m`` and checks every leaf against ``expect``; returns what it restored."""
  got = prj.restore(target, src, recipes=m)
  flat = jax.tree_util.tree_flatten_with_path(expect)[0]
  assert len(flat) == len(jax.tree.leaves(got))
  for (path, want), leaf in zip(flat, jax.tree.leaves(got)):
    np.testing.assert_array_equal(np.asarray(leaf), want, err_msg=jax.tree_util.keystr(path))
  return got


@pytest.mark.parametrize("case", sorted(MAPPED))
def test_maps_with_no_hint_and_every_leaf_is_the_hand_conversion(case):
  name, expect = MAPPED[case]()
  src = prj.open_source(str(DATA / name))
  target = _target(expect)
  m = prj.match(target, src)
  _assert_restores(expect, target, src, m)


# the cases that map without their config.json too (what names and shapes alone say)
WITHOUT_CONFIG = (
  "vit_mae_scanned",
  "resnet_haiku",
  "resnet_torch_names",
  "conformer_praxis_nnx",
  "conformer_linen",
  "recurrent_gemma_official",
  "recurrent_gemma_nnx",
  "qwen2_vl_nnx",
  "qwen2_vl_scanned",
  "mobilenet_nnx",
  "mobilenet_flax_auto",
  "mobilenet_lists",
  "efficientnet_flax_auto",
  "rwkv_flax",
  "jamba_nnx",
  "videomae_nnx",
  "gemma3_nnx",
  "blip_scanned",
  "pixart_flax_linen",
  "pixart_nnx",
  "llava_nnx",
  "llava_scanned",
  "llava_flax_auto",
  "unet_flax_linen",
  "unet_nnx",
  "vae_flax_linen",
  "vae_nnx",
  "deepseek_maxtext",
  "deepseek_maxtext_scanned",
  "qwen2_moe_nnx",
  "qwen2_moe_scanned",
  "modernbert_fused",
  "phi_haiku",
  "mamba_flax",
  "convnext_timm_scanned",
  "swin_nnx_scanned",
  "beit_timm",
  "beit_timm_scanned",
  "segformer_hf_flax",
)


@pytest.mark.parametrize("case", WITHOUT_CONFIG)
def test_maps_without_its_config_and_every_leaf_is_the_hand_conversion(case):
  name, expect = MAPPED[case]()
  src = prj.MemorySource(ld(name))
  target = _target(expect)
  _assert_restores(expect, target, src, prj.match(target, src))


@pytest.mark.parametrize("case", sorted(ASKED))
def test_what_is_asked_is_few_questions_with_the_truth_among_the_lines(case):
  build, questions, with_config = ASKED[case]
  name, expect = build()
  src = prj.open_source(str(DATA / name)) if with_config else prj.MemorySource(ld(name))
  target = _target(expect)
  want = {
    prj.path_to_name(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(expect)[0]
  }
  data = {k: np.asarray(v) for k, v in ld(name).items()}
  with pytest.raises(prj.MatchError) as e:
    prj.match(target, src)
  entries = literal_entries(e.value)
  assert len(entries) == questions, e.value.hints_code
  _assert_restores(expect, target, src, _chosen(entries, e.value, target, src, want, data))


def _chosen(entries, error, target, src, want, data):
  """The match a user reaches by uncommenting, per entry, the one line that holds the true
  values: a parameter's line by the values it names; a fused tensor's layout line (keyed by
  the tensor) by the restore it gives, the lines of every layout entry tried together."""
  hints, layouts = {}, {}
  for key, lines in entries.items():
    values = [uncommented(line)[key] for line in lines]
    if all(is_layout(v) for v in values):
      layouts[key] = values
      continue
    members = expand_template(key, list(want))
    right = [
      v
      for v in values
      if all(
        _holds_in(v if at is None else hints_lib._at_layer(v, at), want[n], data, None)
        for n, at in members
      )
    ]
    assert len(right) == 1, f"{key}: {len(right)} lines hold its values:\n{error.hints_code}"
    hints[key] = right[0]
  found = []
  for combo in itertools.product(*layouts.values()):
    tried = {**hints, **dict(zip(layouts, combo))}
    m = prj.match(target, src, hints=tried)
    got = prj.restore(target, src, recipes=m)
    if all(
      np.array_equal(np.asarray(x), want[prj.path_to_name(p)])
      for p, x in jax.tree_util.tree_flatten_with_path(got)[0]
    ):
      found.append(m)
  assert len(found) == 1, f"{len(found)} choices of layout restore it:\n{error.hints_code}"
  return found[0]


def test_groups_of_a_stacked_layer_without_layer_types_offer_each_order_and_one_is_true():
  """MaxText's Gemma 2 without its config: the local and global layers are alike in their
  tensors, so which group holds layer 0 is asked; of the two hints offered, exactly one
  restores the hand conversion (the other is the same tensors, swapped)."""
  name, expect = gemma2_maxtext_scanned()
  src = prj.MemorySource(ld(name))
  target = _target(expect)
  with pytest.raises(prj.MatchError) as e:
    prj.match(target, src)
  (problem,) = e.value.problems
  offered = [eval(h) for h in re.findall(r"hints=(\{[^}]*\})", problem)]
  assert len(offered) == 2 and "layer_types" in problem, problem
  right = []
  for hints in offered:
    got = prj.restore(target, src, recipes=prj.match(target, src, hints=hints))
    leaves = zip(jax.tree.leaves(expect), jax.tree.leaves(got), strict=True)
    if all(np.array_equal(np.asarray(g), w) for w, g in leaves):
      right.append(hints)
  assert right == [{"decoder/layers/*_local": range(0, 1), "decoder/layers/*_global": range(1, 2)}]


def test_groups_of_a_numbered_layer_without_layer_types_ask_for_the_config_that_says_them():
  name, expect = gemma2_maxtext()
  target = _target(expect)
  with pytest.raises(prj.MatchError) as e:
    prj.match(target, prj.MemorySource(ld(name)))
  assert e.value.problems == (
    "the target's layers (decoder/layers_0, ...) each hold 2 of the checkpoint's 2 layers, as "
    "modules named *_global and *_local, and nothing says which layers are which kind: pass "
    "the model's config.json, whose layer_types says it (match(..., config=...))",
  )
  config = json.loads((DATA / name / "config.json").read_text())
  src = prj.MemorySource(ld(name))
  _assert_restores(expect, target, src, prj.match(target, src, config=config))


def test_a_fused_tensor_kept_fused_is_no_layout_question():
  """ModernBERT's ``Wqkv`` and ``Wi`` kept fused by the target, without ``config.json``:
  a leaf as large as the fused tensor is that tensor (transposed), whatever its layout."""
  _, expect = modernbert_fused()
  src = prj.MemorySource(ld("modernbert"))
  target = _target(expect)
  _assert_restores(expect, target, src, prj.match(target, src))


def _holds_in(value, want, data, at):
  if isinstance(value, str) and "{i}" in value and at is None:  # a stacked leaf: every layer's
    layers = [named_keys(value.replace("{i}", str(i)), list(data)) for i in range(len(data))]
    got = np.concatenate([data[k[0]].ravel() for k in layers if len(k) == 1] or [np.zeros(0)])
  elif isinstance(value, str):
    named = named_keys(value.replace("{i}", at or ""), list(data))
    if len(named) != 1:
      return False
    got = data[named[0]]
  else:
    got = np.asarray(R.evaluate(value, prj.MemorySource(data)))
  return got.size == want.size and np.array_equal(np.sort(got.ravel()), np.sort(want.ravel()))


def test_a_resnet_numbered_across_its_stages_says_which_block_is_which():
  """flax's ResNet example numbers its blocks across stages (``ResNetBlock_2`` is
  transformers' ``stages.1.layers.0``): read in order, said in the table, and each block's
  ``Conv_0``/``Conv_1`` are its ``layer.0``/``layer.1`` (compared by value above)."""
  name, expect = resnet_flax()
  src = prj.open_source(str(DATA / name))
  m = prj.match(_target(expect), src)
  assert m.layers == (("0", "(0, 0)"), ("1", "(0, 1)"), ("2", "(1, 0)"), ("3", "(1, 1)"))
  assert "layers (numbered across stages, in order): 0 = (0, 0), 1 = (0, 1)" in str(m)
  assert "Layers (numbered across stages, in order): 0 = (0, 0)" in m._repr_html_()
  assert all("num_batches_tracked" in k for k in m.ignored_keys)  # a counter, not a weight


def test_blocks_whose_shapes_do_not_follow_the_stages_are_not_renumbered():
  """The same ResNet with its blocks in another order (stage 1's first): the sizes of block 0
  do not fit the checkpoint's first block, so the numbers are not read in order and the
  blocks are refused; nothing in ``.partial`` is wrong."""
  name, expect = resnet_flax()
  p, b = expect["params"], expect["batch_stats"]
  order = [2, 3, 0, 1]
  for tree in (p, b):
    blocks = {n: tree.pop(f"ResNetBlock_{n}") for n in range(4)}
    tree.update({f"ResNetBlock_{k}": blocks[n] for k, n in enumerate(order)})
  src = prj.open_source(str(DATA / name))
  with pytest.raises(prj.MatchError) as e:
    prj.match(_target(expect), src)
  partial = e.value.partial
  assert not partial.layers and "ResNetBlock_0" in str(e.value)
  want = {
    prj.path_to_name(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(expect)[0]
  }
  data = {k: np.asarray(v) for k, v in ld(name).items()}
  assert len(partial) >= 3  # the stem and the classifier
  for leaf, _recipe, _ in partial.rows():
    got = np.asarray(R.evaluate(partial[leaf], prj.MemorySource(data)))
    np.testing.assert_array_equal(got, want[leaf], err_msg=leaf)


def _torchvision_names(c):
  """The ResNet fixture's tensors under the names torchvision and timm give them: ``conv1``
  and ``bn1`` for the stem, ``layer{s}.{b}.conv1``/``bn1``/``conv2``/``bn2`` for a block,
  ``downsample.0``/``.1`` for its projection shortcut, ``fc`` for the classifier."""
  out = {}
  for k, v in c.items():
    k = k.replace("resnet.embedder.embedder.convolution", "conv1")
    k = k.replace("resnet.embedder.embedder.normalization", "bn1").replace("classifier.1", "fc")
    if k.startswith("resnet.encoder.stages."):
      s, _, b, rest = k.removeprefix("resnet.encoder.stages.").split(".", 3)
      for old, new in [
        ("layer.0.convolution", "conv1"),
        ("layer.0.normalization", "bn1"),
        ("layer.1.convolution", "conv2"),
        ("layer.1.normalization", "bn2"),
        ("shortcut.convolution", "downsample.0"),
        ("shortcut.normalization", "downsample.1"),
      ]:
        rest = rest.replace(old, new)
      k = f"layer{int(s) + 1}.{b}.{rest}"
    out[k] = v
  return out


def test_a_torchvision_resnet_maps_into_flax_resnet_example(tmp_path):
  """torchvision's (and timm's) ResNet names: stages numbered in their own names
  (``layer1``, ``layer2``), each block's modules too (``conv1``, ``bn2``), its shortcut a
  sequential (``downsample.0``/``.1``). Read in order into flax's example, every leaf is the
  hand conversion."""
  from safetensors.numpy import save_file

  _, expect = resnet_flax()
  names = _torchvision_names(ld("resnet"))
  assert "layer2.0.downsample.1.running_var" in names and "bn1.num_batches_tracked" in names
  save_file(names, str(tmp_path / "model.safetensors"))
  src = prj.open_source(str(tmp_path / "model.safetensors"))
  target = _target(expect)
  m = prj.match(target, src)
  assert m.layers == (("0", "(1, 0)"), ("1", "(1, 1)"), ("2", "(2, 0)"), ("3", "(2, 1)"))
  _assert_restores(expect, target, src, m)


def _timm_vit_names(c):
  """The DINOv2 fixture's tensors under the names timm gives its ViT (``blocks.{i}``,
  ``attn.qkv`` fused ``[q|k|v]`` rows, ``attn.proj``, ``ls1.gamma``, ``patch_embed.proj``,
  ``pos_embed``, ``norm``), with no ``config.json`` beside them (timm ships none)."""
  out = {
    "cls_token": c["embeddings.cls_token"],
    "pos_embed": c["embeddings.position_embeddings"],
    "patch_embed.proj.weight": c["embeddings.patch_embeddings.projection.weight"],
    "patch_embed.proj.bias": c["embeddings.patch_embeddings.projection.bias"],
    "norm.weight": c["layernorm.weight"],
    "norm.bias": c["layernorm.bias"],
  }
  for i in range(2):
    q, b, a = f"encoder.layer.{i}.", f"blocks.{i}.", f"encoder.layer.{i}.attention.attention."
    for kind in ("weight", "bias"):
      out[b + f"attn.qkv.{kind}"] = np.concatenate([c[a + f"{n}.{kind}"] for n in QKV])
      out[b + f"attn.proj.{kind}"] = c[q + f"attention.output.dense.{kind}"]
      for n in ("norm1", "norm2", "mlp.fc1", "mlp.fc2"):
        out[b + f"{n}.{kind}"] = c[q + f"{n}.{kind}"]
    out[b + "ls1.gamma"] = c[q + "layer_scale1.lambda1"]
    out[b + "ls2.gamma"] = c[q + "layer_scale2.lambda1"]
  return out


def _without_mask_token(expect):
  """The target less DINOv2's ``mask_token`` (timm's ViT has none)."""

  def drop(tree):
    return (
      {k: drop(v) for k, v in tree.items() if k != "mask_token"} if isinstance(tree, dict) else tree
    )

  return drop(expect)


@pytest.mark.parametrize("build", [dinov2_bigvision, dinov2_levanter])
def test_a_timm_vit_with_no_config_asks_its_fused_qkv_layout_with_the_truth_on_a_line(
  build, tmp_path
):
  """The same DINOv2 saved as timm saves a ViT: q, k and v are rows of one ``qkv`` tensor,
  and no ``config.json`` says how (contiguous ``[q|k|v]`` in timm, per head in GPT-NeoX,
  grouped in Falcon). Nothing is split by guess: the layout is asked, every other leaf is
  decided; choosing the true lines restores every leaf as the hand conversion."""
  from safetensors.numpy import save_file

  _, expect = build()
  expect = _without_mask_token(expect)
  data = _timm_vit_names(ld("dinov2"))
  save_file(data, str(tmp_path / "model.safetensors"))
  src = prj.open_source(str(tmp_path / "model.safetensors"))
  target = _target(expect)
  want = {
    prj.path_to_name(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(expect)[0]
  }
  with pytest.raises(prj.MatchError) as e:
    prj.match(target, src)
  assert "nothing is split by guess" in str(e.value) and "qkv" in str(e.value)
  assert not [n for n, _, _ in e.value.partial.rows() if "query" in n or "key" in n]
  assert "(no config.json)" in str(e.value)
  entries = literal_entries(e.value)
  assert list(entries) == ["blocks.{i}.attn.qkv"]  # kernels and biases: one question
  _assert_restores(expect, target, src, _chosen(entries, e.value, target, src, want, data))
  # timm's own config.json beside it says nothing of the layout, and the refusal says so
  timm = {"architecture": "vit_small_patch14_dinov2", "num_classes": 0, "num_features": 32}
  (tmp_path / "config.json").write_text(json.dumps(timm))
  with pytest.raises(prj.MatchError) as e:
    prj.match(target, prj.open_source(str(tmp_path / "model.safetensors")))
  assert "(its config has no model_type: not a transformers config.json)" in str(e.value)


def _openclip_names(c):
  """The CLIP fixture's tensors under OpenAI's and open_clip's names: the text tower at the
  top level (``transformer.resblocks.{i}``, ``token_embedding``, ``ln_final``), the vision
  tower under ``visual.``; torch ``nn.MultiheadAttention`` (``attn.in_proj_weight``, rows
  ``[q|k|v]``), ``mlp.c_fc``/``c_proj``, and the projections kept as raw ``[in, out]``
  parameters (``text_projection``, ``visual.proj``: ``x @ proj``)."""
  out = {
    "token_embedding.weight": c["text_model.embeddings.token_embedding.weight"],
    "positional_embedding": c["text_model.embeddings.position_embedding.weight"],
    "ln_final.weight": c["text_model.final_layer_norm.weight"],
    "ln_final.bias": c["text_model.final_layer_norm.bias"],
    "text_projection": T(c["text_projection.weight"]),
    "logit_scale": c["logit_scale"],
    "visual.class_embedding": c["vision_model.embeddings.class_embedding"],
    "visual.positional_embedding": c["vision_model.embeddings.position_embedding.weight"],
    "visual.conv1.weight": c["vision_model.embeddings.patch_embedding.weight"],
    "visual.ln_pre.weight": c["vision_model.pre_layrnorm.weight"],
    "visual.ln_pre.bias": c["vision_model.pre_layrnorm.bias"],
    "visual.ln_post.weight": c["vision_model.post_layernorm.weight"],
    "visual.ln_post.bias": c["vision_model.post_layernorm.bias"],
    "visual.proj": T(c["visual_projection.weight"]),
  }
  for tower, into in (("text_model", ""), ("vision_model", "visual.")):
    for i in range(2):
      q, b = f"{tower}.encoder.layers.{i}.", f"{into}transformer.resblocks.{i}."
      a = q + "self_attn."
      for kind in ("weight", "bias"):
        out[b + f"attn.in_proj_{kind}"] = np.concatenate([c[a + f"{n}_proj.{kind}"] for n in "qkv"])
        out[b + f"attn.out_proj.{kind}"] = c[a + f"out_proj.{kind}"]
        out[b + f"ln_1.{kind}"] = c[q + f"layer_norm1.{kind}"]
        out[b + f"ln_2.{kind}"] = c[q + f"layer_norm2.{kind}"]
        out[b + f"mlp.c_fc.{kind}"] = c[q + f"mlp.fc1.{kind}"]
        out[b + f"mlp.c_proj.{kind}"] = c[q + f"mlp.fc2.{kind}"]
  return out


@pytest.mark.parametrize("build", [clip_nnx, clip_equinox])
def test_an_open_clip_checkpoint_maps_into_each_style(build, tmp_path):
  """The same CLIP saved with OpenAI's and open_clip's names: one tower at the top level and
  the other under ``visual.``, fused torch attention, raw ``[in, out]`` projections of one
  shape in both towers. Every leaf is the hand conversion."""
  from safetensors.numpy import save_file

  _, expect = build()
  save_file(_openclip_names(ld("clip")), str(tmp_path / "model.safetensors"))
  src = prj.open_source(str(tmp_path / "model.safetensors"))
  target = _target(expect)
  m = prj.match(target, src)
  _assert_restores(expect, target, src, m)


# --- a head of the shape of every layer's MLP kernel (unique.fit counts undecided leaves) -------

HF = pathlib.Path(__file__).parent / "data" / "hf"


def _neox_part(w, j, heads=4):
  """GPT-NeoX's fused ``query_key_value`` keeps each head's q, k, v together: part ``j``."""
  size = w.shape[0] // (3 * heads)
  return np.concatenate([w[(h * 3 + j) * size : (h * 3 + j + 1) * size] for h in range(heads)])


def gpt_neox_compact():
  """GPT-NeoX as a linen ``@nn.compact`` writes it: the untied head a top-level ``Dense_0``
  ``[32, 64]``, the shape of each layer's ``Mlp_0/Dense_0`` too."""
  c = load_file(str(HF / "gpt_neox" / "model.safetensors"))
  dense = lambda w, b: {"kernel": T(w), "bias": b}  # noqa: E731  (a fused tensor's part)
  norm = functools.partial(_norm, c)
  p = {
    "Embed_0": {"embedding": c["gpt_neox.embed_in.weight"]},
    "LayerNorm_0": norm("gpt_neox.final_layer_norm"),
    "Dense_0": {"kernel": T(c["embed_out.weight"])},
  }
  for i in range(2):
    q = f"gpt_neox.layers.{i}."
    w, b = c[q + "attention.query_key_value.weight"], c[q + "attention.query_key_value.bias"]
    attention = {f"Dense_{j}": dense(_neox_part(w, j), _neox_part(b, j)) for j in range(3)}
    attention["Dense_3"] = _linear(c, q + "attention.dense")
    mlp = {
      f"Dense_{j}": _linear(c, q + f"mlp.{n}")
      for j, n in enumerate(("dense_h_to_4h", "dense_4h_to_h"))
    }
    p[f"TransformerLayer_{i}"] = {
      "LayerNorm_0": norm(q + "input_layernorm"),
      "LayerNorm_1": norm(q + "post_attention_layernorm"),
      "Attention_0": attention,
      "Mlp_0": mlp,
    }
  return {"params": p}


def test_a_head_shaped_like_every_layers_mlp_kernel_is_the_one_left_of_its_shape():
  """The head ``Dense_0/kernel`` and ``embed_out.weight`` share no name, and three leaves
  have the head's shape; but the layers' two are sure by name (``Mlp_0/Dense_0`` is
  ``dense_h_to_4h``), so the head is the one leaf of its shape left, and ``embed_out`` the
  one tensor (the config says the embedding is no head). Without the config, the embedding
  read transposed is a head too: asked, both on the lines."""
  expect = gpt_neox_compact()
  target = _target(expect)
  src = prj.open_source(str(HF / "gpt_neox"))
  m = prj.match(target, src)
  assert (
    "unique shape, both linear weights"
    in dict((t, why) for t, _, why in m.rows())["params/Dense_0/kernel"]
  )
  _assert_restores(expect, target, src, m)
  with pytest.raises(prj.MatchError) as e:
    prj.match(target, prj.MemorySource(load_file(str(HF / "gpt_neox" / "model.safetensors"))))
  lines = literal_entries(e.value)["params/Dense_0/kernel"]
  assert any("'embed_out.weight'" in x or '"embed_out.weight"' in x for x in lines), lines


def bloom_compact():
  """BLOOM as a linen ``@nn.compact`` writes it: outside the blocks, ``LayerNorm_0`` (after
  the embedding: ``word_embeddings_layernorm``) and ``LayerNorm_1`` (the final ``ln_f``)."""
  c = load_file(str(HF / "bloom" / "model.safetensors"))
  norm, dense = functools.partial(_norm, c), functools.partial(_linear, c)
  p = {
    "Embed_0": {"embedding": c["transformer.word_embeddings.weight"]},
    "LayerNorm_0": norm("transformer.word_embeddings_layernorm"),
    "LayerNorm_1": norm("transformer.ln_f"),
  }
  for i in range(2):
    q = f"transformer.h.{i}."
    p[f"BloomBlock_{i}"] = {
      "LayerNorm_0": norm(q + "input_layernorm"),
      "LayerNorm_1": norm(q + "post_attention_layernorm"),
      "Attention_0": {
        "Dense_0": dense(q + "self_attention.query_key_value"),
        "Dense_1": dense(q + "self_attention.dense"),
      },
      "Mlp_0": {
        "Dense_0": dense(q + "mlp.dense_h_to_4h"),
        "Dense_1": dense(q + "mlp.dense_4h_to_h"),
      },
    }
  return {"params": p}


@pytest.mark.parametrize("config", [True, False], ids=["config", "no config"])
def test_norms_outside_the_blocks_take_the_embeddings_and_the_final_norm_in_order(config):
  """Both outer norms name nothing but a norm (each reads as the final one): the embeddings'
  norm comes first in call order, the final norm last."""
  expect = bloom_compact()
  target = _target(expect)
  path = HF / "bloom"
  src = prj.open_source(str(path)) if config else prj.MemorySource(ld_path(path))
  m = prj.match(target, src)
  why = {t: reason for t, _, reason in m.rows()}
  assert "in order: LayerNorm_0 of 2 is the embeddings' norm" in why["params/LayerNorm_0/scale"]
  _assert_restores(expect, target, src, m)


def ld_path(path):
  return load_file(str(path / "model.safetensors"))


def vit_linen_sequential():
  """A ViT whose MLP is linen's ``nn.Sequential([nn.Dense, nn.gelu, nn.Dense])``: its items
  are ``Sequential_0/layers_0`` and ``layers_2`` (the gelu is the second), which are no
  layers of the model but the MLP's up and down projections, in call order."""
  c = load_file(str(HF / "vit" / "model.safetensors"))
  norm, dense = functools.partial(_norm, c), functools.partial(_linear, c)
  t = {
    "embedding": _conv(c, "embeddings.patch_embeddings.projection"),
    "cls": c["embeddings.cls_token"],
    "pos_embedding": c["embeddings.position_embeddings"],
    "encoder_norm": norm("layernorm"),
    "pre_logits": dense("pooler.dense"),
  }
  for i in range(2):
    q = f"encoder.layer.{i}."
    a = q + "attention.attention."
    t[f"encoderblock_{i}"] = {
      "LayerNorm_0": norm(q + "layernorm_before"),
      "Attention_0": {n: dense(a + n) for n in ("query", "key", "value")}
      | {"out": dense(q + "attention.output.dense")},
      "LayerNorm_1": norm(q + "layernorm_after"),
      "Sequential_0": {
        "layers_0": dense(q + "intermediate.dense"),
        "layers_2": dense(q + "output.dense"),
      },
    }
  return t


def test_a_linen_sequentials_items_are_no_layers():
  expect = vit_linen_sequential()
  target = _target(expect)
  src = prj.open_source(str(HF / "vit"))
  _assert_restores(expect, target, src, prj.match(target, src))


def mixtral_compact_experts():
  """Mixtral as a linen ``@nn.compact`` writes it: each expert a module of its class,
  ``SparseMoe_0/Expert_{e}/w1``: the expert's number is in its name, as in ``experts.{e}``."""
  c = load_file(str(HF / "mixtral" / "model.safetensors"))
  kernel = functools.partial(_linear, c)  # no bias in the checkpoint: a kernel alone
  p = {
    "Embed_0": {"embedding": c["model.embed_tokens.weight"]},
    "RMSNorm_0": {"scale": c["model.norm.weight"]},
    "lm_head": kernel("lm_head"),
  }
  for i in range(2):
    q, m = f"model.layers.{i}.", f"model.layers.{i}.block_sparse_moe."
    experts = {
      f"Expert_{e}": {w: kernel(m + f"experts.{e}.{w}") for w in ("w1", "w2", "w3")}
      for e in range(4)
    }
    p[f"DecoderLayer_{i}"] = {
      "RMSNorm_0": {"scale": c[q + "input_layernorm.weight"]},
      "RMSNorm_1": {"scale": c[q + "post_attention_layernorm.weight"]},
      "Attention_0": {f"w{r}": kernel(q + f"self_attn.{r}_proj") for r in "qkvo"},
      "SparseMoe_0": {"router": kernel(m + "gate"), **experts},
    }
  return {"params": p}


def test_an_expert_numbered_in_its_own_name_is_that_expert():
  """``Expert_2`` read as a word lost its number: every expert's ``w1`` was one concept."""
  expect = mixtral_compact_experts()
  target = _target(expect)
  src = prj.open_source(str(HF / "mixtral"))
  _assert_restores(expect, target, src, prj.match(target, src))


def _hk(i, base):
  """haiku's name for the ``i``-th module of a class: the first has no number."""
  return f"{base}_{i}" if i else base


def gpt2_haiku_auto():
  """GPT-2 as haiku names a loop of unnamed ``Block()`` modules: ``transformer/~/block``,
  ``transformer/~/block_1``; each block's norms ``layer_norm``, ``layer_norm_1``, its
  attention's ``query``/``key``/``value`` (the fused ``c_attn``'s thirds) and ``linear``."""
  c = load_file(str(HF / "gpt2" / "model.safetensors"))
  d = c["transformer.wte.weight"].shape[1]
  norm = lambda k: {"scale": c[k + ".weight"], "offset": c[k + ".bias"]}  # noqa: E731
  conv1d = lambda k: {"w": c[k + ".weight"], "b": c[k + ".bias"]}  # noqa: E731  ([in, out])
  p = {
    "embed": {"embeddings": c["transformer.wte.weight"]},
    "positional_embeddings": {"embeddings": c["transformer.wpe.weight"]},
    "transformer/~/layer_norm": norm("transformer.ln_f"),
  }
  for i in range(2):
    q, block = f"transformer.h.{i}.", f"transformer/~/{_hk(i, 'block')}"
    w, b = c[q + "attn.c_attn.weight"], c[q + "attn.c_attn.bias"]
    for j, part in enumerate(("query", "key", "value")):
      third = slice(j * d, (j + 1) * d)
      p[f"{block}/~/multi_head_attention/~/{part}"] = {"w": w[:, third], "b": b[third]}
    p[f"{block}/~/multi_head_attention/~/linear"] = conv1d(q + "attn.c_proj")
    p[f"{block}/~/layer_norm"] = norm(q + "ln_1")
    p[f"{block}/~/layer_norm_1"] = norm(q + "ln_2")
    p[f"{block}/~/linear"] = conv1d(q + "mlp.c_fc")
    p[f"{block}/~/linear_1"] = conv1d(q + "mlp.c_proj")
  return p


def test_haikus_unnumbered_first_layer_is_layer_0():
  """``block`` beside ``block_1`` is layer 0, not a module outside the layers: read so, it
  maps as the others do; before, its leaves looked for tensors among the final norm and
  the embeddings, and the true tensor was on no line."""
  expect = gpt2_haiku_auto()
  target = _target(expect)
  src = prj.open_source(str(HF / "gpt2"))
  m = prj.match(target, src)
  assert "transformer~1~0~1block~1~0~1layer_norm/scale" in {t for t, _, _ in m.rows()}
  _assert_restores(expect, target, src, m)


def llama_haiku_auto():
  """Llama as haiku names a loop of unnamed ``DecoderLayer()`` modules: ``decoder_layer``,
  ``decoder_layer_1``; the MLP's ``linear``, ``linear_1``, ``linear_2`` are gate, up, down
  (gate and up: code calls them either way round, so they are asked)."""
  c = load_file(str(HF / "llama" / "model.safetensors"))
  w = lambda k: {"w": T(c[k + ".weight"])}  # noqa: E731
  p = {"embed": {"embeddings": c["model.embed_tokens.weight"]}, "linear": w("lm_head")}
  p["rms_norm"] = {"scale": c["model.norm.weight"]}
  for i in range(2):
    q, layer = f"model.layers.{i}.", _hk(i, "decoder_layer")
    p[f"{layer}/~/rms_norm"] = {"scale": c[q + "input_layernorm.weight"]}
    p[f"{layer}/~/rms_norm_1"] = {"scale": c[q + "post_attention_layernorm.weight"]}
    for j, r in enumerate("qkvo"):
      p[f"{layer}/~/attention/~/{_hk(j, 'linear')}"] = w(q + f"self_attn.{r}_proj")
    for j, r in enumerate(("gate", "up", "down")):
      p[f"{layer}/~/mlp/~/{_hk(j, 'linear')}"] = w(q + f"mlp.{r}_proj")
  return p


def test_a_refusal_over_haikus_unnumbered_layer_names_the_targets_own_leaves():
  """What ``match`` raises names the target's leaves as they are (``decoder_layer``, never
  the ``decoder_layer_0`` it reads), asks gate and up once for every layer, and the lines
  chosen (a ``{i}`` key covers layer 0) or a hint by the target's own name restore."""
  expect = llama_haiku_auto()
  target = _target(expect)
  src = prj.open_source(str(HF / "llama"))
  with pytest.raises(prj.MatchError) as e:
    prj.match(target, src)
  said = [str(e.value), e.value.hints_code, *map(str, e.value.problems)]
  said += [t for p in e.value.problems for t in (*p.targets, *p.choices)]
  said += [p.target for p in e.value.partial.proposals]
  assert not [s for s in said if "decoder_layer_0" in s]
  assert "decoder_layer~1~0~1rms_norm/scale" in {p.target for p in e.value.partial.proposals}
  entries = literal_entries(e.value)
  assert sorted(entries) == [
    "decoder_layer_{i}~1~0~1mlp~1~0~1linear/w",
    "decoder_layer_{i}~1~0~1mlp~1~0~1linear_1/w",
  ]
  gate = "decoder_layer_{i}~1~0~1mlp~1~0~1linear/w"
  up = "decoder_layer_{i}~1~0~1mlp~1~0~1linear_1/w"
  hints = {
    gate: "model.layers.{i}.mlp.gate_proj.weight",
    up: "model.layers.{i}.mlp.up_proj.weight",
  }
  for key, lines in entries.items():
    assert any(uncommented(x) == {key: hints[key]} for x in lines), lines
  _assert_restores(expect, target, src, prj.match(target, src, hints=hints))
  own = {  # the same by the target's own names, layer by layer
    "decoder_layer~1~0~1mlp~1~0~1linear/w": "model.layers.0.mlp.gate_proj.weight",
    "decoder_layer~1~0~1mlp~1~0~1linear_1/w": "model.layers.0.mlp.up_proj.weight",
    "decoder_layer_1~1~0~1mlp~1~0~1linear/w": "model.layers.1.mlp.gate_proj.weight",
    "decoder_layer_1~1~0~1mlp~1~0~1linear_1/w": "model.layers.1.mlp.up_proj.weight",
  }
  _assert_restores(expect, target, src, prj.match(target, src, hints=own))


class _Upsampler(nn.Module):
  """The fixture's upsampler as flax writes it: ``ConvTranspose_0`` (4 -> 4, DPT's
  ``resize``), ``ConvTranspose_1`` (4 -> 3, padding 1 as torch's)."""

  transpose_kernel: bool

  @nn.compact
  def __call__(self, x):
    up = functools.partial(nn.ConvTranspose, transpose_kernel=self.transpose_kernel)
    x = up(4, (2, 2), strides=(2, 2), padding="VALID")(x)
    return up(3, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))(x)


@pytest.mark.parametrize("transpose_kernel", [False, True])
def test_a_transposed_convolution_is_flipped_as_flax_applies_it(transpose_kernel):
  """torch keeps a ``ConvTranspose2d`` kernel ``[in, out, h, w]``; flax's ``ConvTranspose``
  keeps ``[h, w, in, out]`` unflipped (its default) or ``[h, w, out, in]`` flipped by
  itself (``transpose_kernel=True``). Read as a convolution's ``[out, in, h, w]``, a kernel
  with as many in as out channels was taken without the flip, and the swap: its output
  wrong, no error. Where the channels differ, the shape says which; where they are alike,
  asked with both on the lines. The forward pass equals torch's."""
  path = DATA / "conv_transpose"
  ref = np.load(path / "reference.npz")
  model = _Upsampler(transpose_kernel)
  x = jnp.asarray(ref["x"].transpose(0, 2, 3, 1))
  target = jax.eval_shape(model.init, jax.random.key(0), x)
  src = prj.open_source(str(path))
  with pytest.raises(prj.MatchError) as e:
    prj.match(target, src)
  entries = literal_entries(e.value)
  assert sorted(entries) == ["params/ConvTranspose_0/kernel"], e.value
  flag = f"transpose_kernel={transpose_kernel}"
  (line,) = [x for x in entries["params/ConvTranspose_0/kernel"] if flag in x]
  m = prj.match(target, src, hints=uncommented(line))
  params = prj.restore(target, src, recipes=m)
  y = model.apply(params, x)
  np.testing.assert_allclose(np.asarray(y).transpose(0, 3, 1, 2), ref["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("transpose_kernel", [False, True])
def test_an_nnx_transposed_convolution_says_how_it_applies_its_kernel(transpose_kernel):
  """An NNX module holds its flag: ``match`` reads each ``nnx.ConvTranspose``'s own, so the
  upsampler maps with no hint, its attributes named for nothing (``resize``, ``upscale``),
  and its forward pass equals torch's."""
  from flax import nnx

  class Upsampler(nnx.Module):
    def __init__(self, rngs):
      up = functools.partial(nnx.ConvTranspose, transpose_kernel=transpose_kernel, rngs=rngs)
      self.resize = up(4, 4, (2, 2), strides=(2, 2), padding="VALID")
      self.upscale = up(4, 3, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))

    def __call__(self, x):
      return self.upscale(self.resize(x))

  path = DATA / "conv_transpose"
  ref = np.load(path / "reference.npz")
  model = Upsampler(nnx.Rngs(0))
  src = prj.open_source(str(path))
  nnx.update(model, prj.restore(model, src, recipes=prj.match(model, src)))
  y = model(jnp.asarray(ref["x"].transpose(0, 2, 3, 1)))
  np.testing.assert_allclose(np.asarray(y).transpose(0, 3, 1, 2), ref["y"], rtol=1e-5, atol=1e-5)


# --- GPT-OSS's experts: bare [E, in, out] parameters, gate and up alternating ------------------


def _gpt_oss_target(hidden, width, experts=4):
  """A JAX port's MoE block: the router a ``Dense``, each expert weight stacked ``[E, in,
  out]``, gate and up apart (as MaxText and most ports keep them)."""
  sds = lambda *s: jax.ShapeDtypeStruct(s, np.float32)  # noqa: E731
  part = lambda i, o: {"kernel": sds(experts, i, o), "bias": sds(experts, o)}  # noqa: E731
  mlp = {
    "router": {"kernel": sds(hidden, experts), "bias": sds(experts)},
    "experts": {
      "gate": part(hidden, width),
      "up": part(hidden, width),
      "down": part(width, hidden),
    },
  }
  return {"layers_0": {"mlp": mlp}}


def _gpt_oss_block(params, x, top_k=2, alpha=1.702, limit=7.0):
  """The block as GPT-OSS computes it (the config's ``swiglu_alpha``, ``swiglu_limit``)."""
  p = params["layers_0"]["mlp"]
  logits = x @ p["router"]["kernel"] + p["router"]["bias"]
  top, chosen = jax.lax.top_k(logits, top_k)
  weights = jnp.einsum(
    "tk,tke->te", jax.nn.softmax(top, -1), jax.nn.one_hot(chosen, logits.shape[-1])
  )
  e = p["experts"]
  gate = jnp.einsum("td,edi->tei", x, e["gate"]["kernel"]) + e["gate"]["bias"]
  up = jnp.einsum("td,edi->tei", x, e["up"]["kernel"]) + e["up"]["bias"]
  gate, up = jnp.minimum(gate, limit), jnp.clip(up, -limit, limit)
  h = (up + 1) * gate * jax.nn.sigmoid(gate * alpha)
  out = jnp.einsum("tei,eid->ted", h, e["down"]["kernel"]) + e["down"]["bias"]
  return jnp.einsum("te,ted->td", weights, out)


@pytest.mark.parametrize(
  ("name", "hidden", "width"), [("gpt_oss_experts", 8, 8), ("gpt_oss_experts_wide", 6, 3)]
)
def test_gpt_oss_experts_in_first_map_with_no_hint_and_compute_as_torch(name, hidden, width):
  """GPT-OSS keeps its experts as bare ``[E, in, out]`` parameters (``x @ W``), where
  transformers 5's other MoE models keep ``[E, out, in]``; the config's ``[out, in]`` is its
  linear modules', not theirs. Released GPT-OSS is square (hidden = expert width): it was
  refused. With hidden = twice the width, ``[E, D, 2I]`` has the shape of ``[E, 2I, D]``: it
  was split on the wrong axis and transposed, and loaded without an error. Now the axis the
  parts' widths tile, or the bare tensors already decided, orient them; the forward pass
  equals torch's."""
  path = DATA / name
  ref = np.load(path / "reference.npz")
  target = _gpt_oss_target(hidden, width)
  src = prj.open_source(str(path))
  m = prj.match(target, src)
  params = prj.restore(target, src, recipes=m)
  y = _gpt_oss_block(params, jnp.asarray(ref["x"][0]))
  np.testing.assert_allclose(np.asarray(y), ref["y"][0], rtol=1e-5, atol=1e-5)
  rows = {t: why for t, _, why in m.rows()}
  assert "interleaved" in rows["layers_0/mlp/experts/gate/kernel"], rows


@pytest.mark.parametrize("name", ["gpt_oss_experts", "gpt_oss_experts_wide"])
def test_gpt_oss_experts_without_the_config_are_asked_and_a_line_holds_them(name):
  """Without the config nothing says gate and up alternate: asked (and a square ``down``'s
  orientation with it). Uncommenting the one layout line is enough: the parts it cuts
  orient ``down``, and every value is the one transformers computes with."""
  path = DATA / name
  data = load_file(path / "model.safetensors")
  src = prj.MemorySource(data)
  _, width, hidden = data["model.layers.0.mlp.experts.down_proj"].shape  # [E, I, D]
  target = _gpt_oss_target(hidden, width)
  with pytest.raises(prj.MatchError) as e:
    prj.match(target, src)
  x = "model.layers.0.mlp."
  gu, gub = data[x + "experts.gate_up_proj"], data[x + "experts.gate_up_proj_bias"]
  want = {
    "layers_0/mlp/router/kernel": data[x + "router.weight"].T,
    "layers_0/mlp/router/bias": data[x + "router.bias"],
    "layers_0/mlp/experts/gate/kernel": gu[..., ::2],
    "layers_0/mlp/experts/gate/bias": gub[..., ::2],
    "layers_0/mlp/experts/up/kernel": gu[..., 1::2],
    "layers_0/mlp/experts/up/bias": gub[..., 1::2],
    "layers_0/mlp/experts/down/kernel": data[x + "experts.down_proj"],
    "layers_0/mlp/experts/down/bias": data[x + "experts.down_proj_bias"],
  }
  entries = literal_entries(e.value)
  key = x + "experts.gate_up_proj"
  (line,) = [line for line in entries[key] if '"interleaved"' in line]  # its bias's too
  got = prj.restore(target, src, recipes=prj.match(target, src, hints=uncommented(line)))
  for p, leaf in jax.tree_util.tree_flatten_with_path(got)[0]:
    np.testing.assert_array_equal(np.asarray(leaf), want[prj.path_to_name(p)])


# --- DBRX: experts flattened [E * I, D], gate and up [out, in] per expert, down [in, out] -------


def _dbrx(c, experts=4):
  """A JAX port of DBRX: flax kernels, each expert weight stacked ``[E, in, out]``; the hand
  conversion from DBRX's own code (``x @ w1[e].T``, ``x @ v1[e].T``, ``h @ w2[e]``)."""
  d = c["transformer.wte.weight"].shape[1]
  p = {
    "wte": {"embedding": c["transformer.wte.weight"]},
    "norm_f": {"scale": c["transformer.norm_f.weight"]},
    "lm_head": {"kernel": T(c["lm_head.weight"])},
  }
  for i in range(2):
    q = f"transformer.blocks.{i}."
    qkv = c[q + "norm_attn_norm.attn.Wqkv.weight"]  # [q | k | v], one kv head of 8
    width = c[q + "ffn.experts.mlp.w1"].shape[0] // experts
    each = lambda n: c[q + f"ffn.experts.mlp.{n}"].reshape(experts, width, d)  # noqa: E731
    attn = {n: {"kernel": T(w)} for n, w in zip("qkv", np.split(qkv, [d, d + d // 2]))}
    p[f"blocks_{i}"] = {
      "norm_1": {"scale": c[q + "norm_attn_norm.norm_1.weight"]},
      "norm_2": {"scale": c[q + "norm_attn_norm.norm_2.weight"]},
      "attn": {**attn, "o": {"kernel": T(c[q + "norm_attn_norm.attn.out_proj.weight"])}},
      "ffn": {
        "router": {"kernel": T(c[q + "ffn.router.layer.weight"])},
        "experts": {
          "gate": {"kernel": each("w1").transpose(0, 2, 1)},
          "up": {"kernel": each("v1").transpose(0, 2, 1)},
          "down": {"kernel": each("w2")},
        },
      },
    }
  return p


def _dbrx_ffn(block, x, top_k=2):
  """DBRX's MoE feed-forward (softmax router, top-k weights normalised to sum 1, SiLU GLU)."""
  probs = jax.nn.softmax(x @ block["router"]["kernel"], -1)
  top, chosen = jax.lax.top_k(probs, top_k)
  top = top / top.sum(-1, keepdims=True)
  weights = jnp.einsum("tk,tke->te", top, jax.nn.one_hot(chosen, probs.shape[-1]))
  e = block["experts"]
  gate = jnp.einsum("td,edi->tei", x, e["gate"]["kernel"])
  up = jnp.einsum("td,edi->tei", x, e["up"]["kernel"])
  out = jnp.einsum("tei,eid->ted", jax.nn.silu(gate) * up, e["down"]["kernel"])
  return jnp.einsum("te,ted->td", weights, out)


def _dbrx_check(path, target, src, m, expect):
  """Every leaf the hand conversion, and the first block's feed-forward torch's output."""
  params = _assert_restores(expect, target, src, m)
  ref = np.load(path / "reference.npz")
  y = _dbrx_ffn(params["blocks_0"]["ffn"], jnp.asarray(ref["x"][0]))
  np.testing.assert_allclose(np.asarray(y), ref["y"][0], rtol=1e-5, atol=1e-5)


def test_dbrx_maps_with_no_hint_and_its_experts_compute_as_torch():
  """Four things DBRX does its own way. Two are read from evidence that holds for any model:
  its attention's ``out_proj`` sits in a block named ``norm_attn_norm`` (it was read as a
  norm and taken untransposed: no error); its experts are ``[E * I, D]``, gate and up split
  per expert and transposed (no reading did that: refused), down split as it is. Two are
  DBRX's own words, in the tables: ``v1`` is the up projection beside ``mlp.w1``, and its
  ``Wqkv`` is ``[q | k | v]`` (its config's model type). Every leaf equals the hand
  conversion, and the feed-forward equals torch's."""
  path = DATA / "dbrx"
  expect = _dbrx(load_file(path / "model.safetensors"))
  target = _target(expect)
  src = prj.open_source(str(path))
  _dbrx_check(path, target, src, prj.match(target, src), expect)


def test_dbrx_square_experts_are_asked_both_ways_and_a_line_computes_as_torch():
  """With the expert width equal to the hidden size, each expert's ``[I, D]`` is square: gate
  and up ``[out, in]`` and down ``[in, out]`` fit either way, and DBRX lays them out both
  ways. Asked once per concept for every layer, both readings on the lines (a plain split
  was taken before, gate and up untransposed); the lines a user who read DBRX's code
  uncomments restore it, and nothing in ``.partial`` is wrong."""
  path = DATA / "dbrx_square"
  expect = _dbrx(load_file(path / "model.safetensors"))
  target = _target(expect)
  src = prj.open_source(str(path))
  with pytest.raises(prj.MatchError) as e:
    prj.match(target, src)
  for name, recipe in e.value.partial.items():
    want = expect
    for k in name.split("/"):
      want = want[k]
    np.testing.assert_array_equal(np.asarray(R.evaluate(recipe, src)), want, err_msg=name)
  entries = literal_entries(e.value)
  prefix = "blocks_{i}/ffn/experts/"
  assert sorted(entries) == [prefix + n + "/kernel" for n in ("down", "gate", "up")], entries
  chosen = {}
  for part, stored, turned in (("gate", "w1", True), ("up", "v1", True), ("down", "w2", False)):
    tensor = re.compile(rf"mlp\.{stored}['\"]")
    lines = [x for x in entries[prefix + part + "/kernel"] if tensor.search(x)]
    assert len(lines) == 2, lines  # both readings offered
    (line,) = [x for x in lines if ("each transposed" in x) == turned]
    chosen |= uncommented(line)
  _dbrx_check(path, target, src, prj.match(target, src, hints=chosen), expect)


def _glm(c):
  """A JAX port of GLM in flax auto-names: gate and up apart (``Dense_0``, ``Dense_1``), as
  the hand conversion from GLM's code (``gate, up = gate_up_proj(x).chunk(2, -1)``)."""
  p = {
    "Embed_0": {"embedding": c["model.embed_tokens.weight"]},
    "RMSNorm_0": {"scale": c["model.norm.weight"]},
    "lm_head": {"kernel": T(c["lm_head.weight"])},
  }
  for i in range(2):
    q = f"model.layers.{i}."
    gate, up = np.split(c[q + "mlp.gate_up_proj.weight"], 2)
    attn = {f"Dense_{j}": _linear(c, q + f"self_attn.{s}_proj") for j, s in enumerate("qkv")}
    p[f"Block_{i}"] = {
      "RMSNorm_0": {"scale": c[q + "input_layernorm.weight"]},
      "RMSNorm_1": {"scale": c[q + "post_attention_layernorm.weight"]},
      "Attention_0": {**attn, "Dense_3": _linear(c, q + "self_attn.o_proj")},
      "Mlp_0": {
        "gate": {"kernel": T(gate)},
        "up": {"kernel": T(up)},
        "down": {"kernel": T(c[q + "mlp.down_proj.weight"])},
      },
    }
  return p


def test_glm_fused_gate_up_is_split_as_its_config_says_and_computes_as_torch():
  """GLM fuses gate and up ``[gate | up]``: known from its config's model type (before, the
  layout was asked). Every leaf equals the hand conversion, and the MLP equals torch's."""
  path = DATA / "glm"
  expect = _glm(load_file(path / "model.safetensors"))
  target = _target(expect)
  src = prj.open_source(str(path))
  got = _assert_restores(expect, target, src, prj.match(target, src))["Block_0"]
  ref = np.load(path / "reference.npz")
  mlp = got["Mlp_0"]
  x = jnp.asarray(ref["x"][0])
  y = (jax.nn.silu(x @ mlp["gate"]["kernel"]) * (x @ mlp["up"]["kernel"])) @ mlp["down"]["kernel"]
  np.testing.assert_allclose(np.asarray(y), ref["y"][0], rtol=1e-5, atol=1e-5)


def _llama4(c):
  """A flax port of Llama 4's text model: its MoE layer's experts as ``[E, in, out]`` kernels,
  gate and up apart (the hand conversion from its code: ``gate, up = (x @
  gate_up_proj).chunk(2, -1)``), and the shared expert and the dense layer's MLP as kernels."""
  p = {
    "embed": {"embedding": c["model.embed_tokens.weight"]},
    "norm": {"scale": c["model.norm.weight"]},
    "lm_head": {"kernel": T(c["lm_head.weight"])},
  }
  for i in range(2):
    q = f"model.layers.{i}."
    ff = q + "feed_forward."
    layer = {
      "attn_norm": {"scale": c[q + "input_layernorm.weight"]},
      "mlp_norm": {"scale": c[q + "post_attention_layernorm.weight"]},
      "attn": {n: {"kernel": T(c[q + f"self_attn.{n}_proj.weight"])} for n in "qkvo"},
    }
    if i == 0:
      layer["mlp"] = {n: {"kernel": T(c[ff + f"{n}_proj.weight"])} for n in ("gate", "up", "down")}
    else:
      gate, up = np.split(c[ff + "experts.gate_up_proj"], 2, axis=-1)
      shared = ff + "shared_expert."
      layer["moe"] = {
        "router": {"kernel": T(c[ff + "router.weight"])},
        "experts": {
          "gate": {"kernel": np.ascontiguousarray(gate)},
          "up": {"kernel": np.ascontiguousarray(up)},
          "down": {"kernel": c[ff + "experts.down_proj"]},
        },
        "shared": {
          n: {"kernel": T(c[shared + f"{n}_proj.weight"])} for n in ("gate", "up", "down")
        },
      }
    p[f"layers_{i}"] = layer
  return p


def test_llama4_square_experts_split_as_its_config_says_and_compute_as_torch():
  """Llama 4 keeps its experts bare, ``gate_up_proj`` ``[E, D, 2I]`` used as ``x @ W``, and
  with the hidden size twice the expert width it is square: which axis holds gate and up is
  said by the non-square ``down_proj`` ``[E, I, D]`` beside it (bare, input first), and the
  layout (``[gate | up]``) by the config's model type (before, it was asked). Every leaf
  equals the hand conversion, and the experts compute as torch's ``Llama4TextExperts``."""
  path = DATA / "llama4"
  expect = _llama4(load_file(path / "model.safetensors"))
  target = _target(expect)
  src = prj.open_source(str(path))
  got = _assert_restores(expect, target, src, prj.match(target, src))
  e = got["layers_1"]["moe"]["experts"]
  ref = np.load(path / "reference.npz")
  x = jnp.asarray(ref["x"]).reshape(4, -1, 16)  # as the experts read it: [E, tokens, D]
  gate = jnp.einsum("etd,edi->eti", x, e["gate"]["kernel"])
  up = jnp.einsum("etd,edi->eti", x, e["up"]["kernel"])
  y = jnp.einsum("eti,eid->etd", up * jax.nn.silu(gate), e["down"]["kernel"])
  np.testing.assert_allclose(np.asarray(y).reshape(-1, 16), ref["y"], rtol=1e-5, atol=1e-5)
