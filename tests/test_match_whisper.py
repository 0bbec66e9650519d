"""``match`` on a real Whisper checkpoint (audio encoder-decoder), checked by the forward pass.

A tiny ``WhisperForConditionalGeneration`` that ``transformers`` saved
(``tests/make_hf_fixtures.py``), restored through ``match`` with no hints into a flax-style
target (a module per layer, ``nn.Conv`` kernels ``[width, in, out]``) and an NNX-style one
(layers stacked, heads split); the logits are compared with PyTorch's. What ``match`` must read
right: the ``Conv1d`` front-end (``[out, in, width]``, square in its second convolution), the
decoder's ``encoder_attn`` and its norm, ``final_layer_norm`` inside a layer (the MLP's norm)
against the stacks' own ``layer_norm``, and the head tied to the token embedding.
"""

from __future__ import annotations

import json

import hf_models as hf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

import paramreg_jax as prj
from paramreg_jax import SafetensorsSource

NAME = "whisper"


def layer_norm(x, p, eps=1e-5):
  mu = x.mean(-1, keepdims=True)
  return (x - mu) * jax.lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * p["scale"] + p[
    "bias"
  ]


def dense(p, x):
  return x @ p["kernel"] + p["bias"] if "bias" in p else x @ p["kernel"]


def attention(c, p, x, kv, causal):
  h = c["encoder_attention_heads"]
  split = lambda y: y.reshape(*y.shape[:2], h, -1)  # noqa: E731
  q = split(dense(p["q"], x)) * (c["d_model"] // h) ** -0.5
  k, v = split(dense(p["k"], kv)), split(dense(p["v"], kv))
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
  if causal:
    t = x.shape[1]
    scores = jnp.where(np.tril(np.ones((t, t), bool)), scores, -1e30)
  out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), v).reshape(x.shape)
  return dense(p["o"], out)


def conv1d(p, x, stride):
  """``x`` [batch, frames, in], kernel [width, in, out], padding 1 (``nn.Conv1d(..., padding=1)``)."""
  y = jax.lax.conv_general_dilated(
    x,
    p["kernel"],
    (stride,),
    [(1, 1)],
    dimension_numbers=("NWC", "WIO", "NWC"),
    precision=jax.lax.Precision.HIGHEST,
  )
  return y + p["bias"]


def forward(c, w, features, decoder_ids):
  gelu = lambda y: jax.nn.gelu(y, approximate=False)  # noqa: E731
  enc_w, dec_w = w["encoder"], w["decoder"]
  x = gelu(conv1d(enc_w["conv1"], jnp.transpose(features, (0, 2, 1)), 1))
  x = gelu(conv1d(enc_w["conv2"], x, 2))
  x = x + enc_w["pos_embed"]["embedding"][: x.shape[1]]
  for p in enc_w["layers"]:
    x = x + attention(
      c, p["attn"], layer_norm(x, p["attn_norm"]), layer_norm(x, p["attn_norm"]), False
    )
    h = layer_norm(x, p["mlp_norm"])
    x = x + dense(p["mlp"]["down"], gelu(dense(p["mlp"]["up"], h)))
  enc = layer_norm(x, enc_w["final_norm"])
  y = (
    dec_w["embed"]["embedding"][decoder_ids]
    + dec_w["pos_embed"]["embedding"][: decoder_ids.shape[1]]
  )
  for p in dec_w["layers"]:
    h = layer_norm(y, p["attn_norm"])
    y = y + attention(c, p["attn"], h, h, True)
    y = y + attention(c, p["xattn"], layer_norm(y, p["xattn_norm"]), enc, False)
    h = layer_norm(y, p["mlp_norm"])
    y = y + dense(p["mlp"]["down"], gelu(dense(p["mlp"]["up"], h)))
  y = layer_norm(y, dec_w["final_norm"])
  return y @ dec_w["embed"]["embedding"].T  # proj_out is tied to the token embedding


def target(c, stacked):
  d, f, h, n = c["d_model"], c["encoder_ffn_dim"], c["encoder_attention_heads"], c["encoder_layers"]
  one = lambda *s: jax.ShapeDtypeStruct(s, np.float32)  # noqa: E731
  lay = lambda *s: one(n, *s) if stacked else one(*s)  # noqa: E731
  norm = lambda: {"scale": lay(d), "bias": lay(d)}  # noqa: E731

  def proj(name):
    kernel = lay(d, h, d // h) if stacked else lay(d, d)
    if name == "o":
      kernel = lay(h, d // h, d) if stacked else lay(d, d)
    bias = {} if name == "k" else {"bias": lay(h, d // h) if stacked and name != "o" else lay(d)}
    return {"kernel": kernel, **bias}  # Whisper's k projections have no bias

  def block(cross):
    b = {"attn": {x: proj(x) for x in "qkvo"}, "attn_norm": norm(), "mlp_norm": norm()}
    b["mlp"] = {
      "up": {"kernel": lay(d, f), "bias": lay(f)},
      "down": {"kernel": lay(f, d), "bias": lay(d)},
    }
    if cross:
      b |= {"xattn": {x: proj(x) for x in "qkvo"}, "xattn_norm": norm()}
    return b

  def stack(cross):
    layers = (
      {"layers": block(cross)} if stacked else {f"layers_{i}": block(cross) for i in range(n)}
    )
    return {**layers, "final_norm": {"scale": one(d), "bias": one(d)}}

  encoder = stack(False) | {
    "conv1": {"kernel": one(3, c["num_mel_bins"], d), "bias": one(d)},
    "conv2": {"kernel": one(3, d, d), "bias": one(d)},
    "pos_embed": {"embedding": one(c["max_source_positions"], d)},
  }
  decoder = stack(True) | {
    "embed": {"embedding": one(c["vocab_size"], d)},
    "pos_embed": {"embedding": one(c["max_target_positions"], d)},
  }
  return {"encoder": encoder, "decoder": decoder}


def canonical(c, restored, stacked):
  """Per-layer modules with heads merged, as the forward pass reads them."""
  r = jax.tree.map(np.asarray, restored)
  d, n = c["d_model"], c["encoder_layers"]
  merge = lambda p: {  # noqa: E731
    k: (v.reshape(d, d) if k == "kernel" else v.reshape(d)) for k, v in p.items()
  }
  out = {}
  for name, s in r.items():
    layers = []
    for i in range(n):
      b = jax.tree.map(lambda x, i=i: x[i], s["layers"]) if stacked else s[f"layers_{i}"]
      for a in ("attn", "xattn"):
        if a in b:
          b[a] = {x: merge(p) for x, p in b[a].items()}
      layers.append(b)
    out[name] = {**{k: v for k, v in s.items() if not k.startswith("layers")}, "layers": layers}
  return out


@pytest.mark.parametrize("stacked", [False, True], ids=["flax", "nnx"])
def test_whisper_forward_pass_matches_pytorch_with_no_hints(stacked):
  c = json.loads((hf.DATA / NAME / "config.json").read_text())
  ref = dict(np.load(hf.DATA / NAME / "reference.npz"))
  src = SafetensorsSource(hf.DATA / NAME / "model.safetensors")
  tree = target(c, stacked)
  m = prj.match(tree, src)
  assert src.stats.reads == 0
  assert "name + conv kernel OIK -> KIO" in str(m)
  restored = prj.restore(tree, src, recipes=m)
  got = np.asarray(
    forward(c, canonical(c, restored, stacked), ref["input_features"], ref["decoder_input_ids"])
  )
  np.testing.assert_allclose(got, ref["output"], atol=1e-5, rtol=1e-5, err_msg=str(m))


def _suite_case(config):
  """The suite's Whisper: its config, PyTorch's reference outputs, and its checkpoint (with
  its ``config.json``, or the tensors alone)."""
  c = json.loads((hf.DATA / NAME / "config.json").read_text())
  ref = dict(np.load(hf.DATA / NAME / "reference.npz"))
  path = hf.DATA / NAME / "model.safetensors"
  src = SafetensorsSource(path) if config else prj.MemorySource(load_file(str(path)))
  return c, ref, src


def _forward_matches(c, ref, weights, m):
  got = np.asarray(forward(c, weights, ref["input_features"], ref["decoder_input_ids"]))
  np.testing.assert_allclose(got, ref["output"], atol=1e-5, rtol=1e-5, err_msg=str(m))


# --- Whisper as a linen ``@nn.compact`` writes it: every module numbered by its class ------------

_ROLES = ("q", "k", "v", "o")  # an attention's Dense_0..3, in the order it calls them


def compact_target(c):
  """``AudioEncoder_0`` and ``TextDecoder_0`` (two towers numbered by their classes), each
  layer an ``EncoderBlock_{i}``/``DecoderBlock_{i}`` of ``MultiHeadAttention_0`` (and the
  decoder's cross-attention ``MultiHeadAttention_1``) of ``Dense_0..3``, ``LayerNorm_0..2``
  and the MLP's ``Dense_0``/``Dense_1``: no name below the towers says a role."""
  d, f, n = c["d_model"], c["encoder_ffn_dim"], c["encoder_layers"]
  one = lambda *s: jax.ShapeDtypeStruct(s, np.float32)  # noqa: E731
  norm = lambda: {"scale": one(d), "bias": one(d)}  # noqa: E731
  attention = lambda: {  # noqa: E731
    f"Dense_{j}": {"kernel": one(d, d), **({} if r == "k" else {"bias": one(d)})}
    for j, r in enumerate(_ROLES)
  }
  mlp = {
    "Dense_0": {"kernel": one(d, f), "bias": one(f)},
    "Dense_1": {"kernel": one(f, d), "bias": one(d)},
  }

  def block(cross):
    attentions = {f"MultiHeadAttention_{a}": attention() for a in range(1 + cross)}
    return {**attentions, **{f"LayerNorm_{j}": norm() for j in range(2 + cross)}, **mlp}

  encoder = {f"EncoderBlock_{i}": block(False) for i in range(n)} | {
    "Conv_0": {"kernel": one(3, c["num_mel_bins"], d), "bias": one(d)},
    "Conv_1": {"kernel": one(3, d, d), "bias": one(d)},
    "pos_embedding": one(c["max_source_positions"], d),
    "LayerNorm_0": norm(),
  }
  decoder = {f"DecoderBlock_{i}": block(True) for i in range(n)} | {
    "Embed_0": {"embedding": one(c["vocab_size"], d)},
    "pos_embedding": one(c["max_target_positions"], d),
    "LayerNorm_0": norm(),
  }
  return {"params": {"AudioEncoder_0": encoder, "TextDecoder_0": decoder}}


def from_compact(c, restored):
  """The compact tree read in call order, as the forward pass reads it."""
  r = jax.tree.map(np.asarray, restored["params"])
  n = c["encoder_layers"]

  def layer(b, cross):
    attn = lambda a: {x: b[f"MultiHeadAttention_{a}"][f"Dense_{j}"] for j, x in enumerate(_ROLES)}  # noqa: E731
    out = {"attn": attn(0), "attn_norm": b["LayerNorm_0"], "mlp_norm": b[f"LayerNorm_{1 + cross}"]}
    out["mlp"] = {"up": b["Dense_0"], "down": b["Dense_1"]}
    if cross:
      out |= {"xattn": attn(1), "xattn_norm": b["LayerNorm_1"]}
    return out

  enc, dec = r["AudioEncoder_0"], r["TextDecoder_0"]
  return {
    "encoder": {
      "conv1": enc["Conv_0"],
      "conv2": enc["Conv_1"],
      "pos_embed": {"embedding": enc["pos_embedding"]},
      "final_norm": enc["LayerNorm_0"],
      "layers": [layer(enc[f"EncoderBlock_{i}"], False) for i in range(n)],
    },
    "decoder": {
      "embed": dec["Embed_0"],
      "pos_embed": {"embedding": dec["pos_embedding"]},
      "final_norm": dec["LayerNorm_0"],
      "layers": [layer(dec[f"DecoderBlock_{i}"], True) for i in range(n)],
    },
  }


@pytest.mark.parametrize("config", [True, False], ids=["config", "no config"])
def test_a_compact_whisper_maps_its_two_attentions_dense_by_dense_in_call_order(config):
  """The decoder's eight square ``Dense`` kernels (two attentions of four) fit all eight
  projections by name and shape alike: only the nested call order (``MultiHeadAttention_0``'s
  ``Dense_0..3``, then ``_1``'s) says which is which."""
  c, ref, src = _suite_case(config)
  tree = compact_target(c)
  m = prj.match(tree, src)
  why = {t: reason for t, _, reason in m.rows()}
  cross_q = "params/TextDecoder_0/DecoderBlock_1/MultiHeadAttention_1/Dense_0/kernel"
  assert "in order: MultiHeadAttention_1/Dense_0 of 8 is the cross-attention q" in why[cross_q]
  _forward_matches(c, ref, from_compact(c, prj.restore(tree, src, recipes=m)), m)


# --- Whisper as haiku names it: `/~/` paths, `linear`/`linear_1`, `multi_head_attention_1` -------

_HK_ROLES = {"q": "query", "k": "key", "v": "value", "o": "linear"}  # hk.MultiHeadAttention's


def haiku_target(c):
  """haiku's flat ``{module path: {param: array}}``: the towers ``whisper/~/audio_encoder``
  and ``whisper/~/text_decoder``; in a layer, the MLP's ``linear``/``linear_1``, the norms
  ``layer_norm``.. ``layer_norm_2`` (``scale``/``offset``), and the decoder's two
  ``multi_head_attention``, ``multi_head_attention_1`` (haiku numbers the second only)."""
  d, f, n = c["d_model"], c["encoder_ffn_dim"], c["encoder_layers"]
  one = lambda *s: jax.ShapeDtypeStruct(s, np.float32)  # noqa: E731
  norm = {"scale": one(d), "offset": one(d)}
  p: dict = {}
  for tower, cross in (("whisper/~/audio_encoder", False), ("whisper/~/text_decoder", True)):
    p[f"{tower}/~/layer_norm"] = norm
    for i in range(n):
      layer = f"{tower}/~/layer_{i}"
      for a in range(1 + cross):
        mha = f"{layer}/~/multi_head_attention" + (f"_{a}" if a else "")
        for r, hk in _HK_ROLES.items():
          p[f"{mha}/~/{hk}"] = {"w": one(d, d), **({} if r == "k" else {"b": one(d)})}
      for j in range(2 + cross):
        p[f"{layer}/~/layer_norm" + (f"_{j}" if j else "")] = norm
      p[f"{layer}/~/linear"] = {"w": one(d, f), "b": one(f)}
      p[f"{layer}/~/linear_1"] = {"w": one(f, d), "b": one(d)}
  e, t = "whisper/~/audio_encoder", "whisper/~/text_decoder"
  p[f"{e}/~/conv1_d"] = {"w": one(3, c["num_mel_bins"], d), "b": one(d)}
  p[f"{e}/~/conv1_d_1"] = {"w": one(3, d, d), "b": one(d)}
  p[e] = {"pos_embedding": one(c["max_source_positions"], d)}
  p[f"{t}/~/embed"] = {"embeddings": one(c["vocab_size"], d)}
  p[t] = {"pos_embedding": one(c["max_target_positions"], d)}
  return p


def from_haiku(c, restored):
  """The haiku tree read as the forward pass reads it."""
  r = jax.tree.map(np.asarray, restored)
  dense = lambda p: {"kernel": p["w"], **({"bias": p["b"]} if "b" in p else {})}  # noqa: E731
  norm = lambda p: {"scale": p["scale"], "bias": p["offset"]}  # noqa: E731

  def layer(at, cross):
    ln = lambda j: norm(r[f"{at}/~/layer_norm" + (f"_{j}" if j else "")])  # noqa: E731
    attn = lambda a: {  # noqa: E731
      x: dense(r[f"{at}/~/multi_head_attention" + (f"_{a}" if a else "") + f"/~/{hk}"])
      for x, hk in _HK_ROLES.items()
    }
    out = {"attn": attn(0), "attn_norm": ln(0), "mlp_norm": ln(1 + cross)}
    out["mlp"] = {"up": dense(r[f"{at}/~/linear"]), "down": dense(r[f"{at}/~/linear_1"])}
    if cross:
      out |= {"xattn": attn(1), "xattn_norm": ln(1)}
    return out

  e, t, n = "whisper/~/audio_encoder", "whisper/~/text_decoder", c["encoder_layers"]
  return {
    "encoder": {
      "conv1": dense(r[f"{e}/~/conv1_d"]),
      "conv2": dense(r[f"{e}/~/conv1_d_1"]),
      "pos_embed": {"embedding": r[e]["pos_embedding"]},
      "final_norm": norm(r[f"{e}/~/layer_norm"]),
      "layers": [layer(f"{e}/~/layer_{i}", False) for i in range(n)],
    },
    "decoder": {
      "embed": {"embedding": r[f"{t}/~/embed"]["embeddings"]},
      "pos_embed": {"embedding": r[t]["pos_embedding"]},
      "final_norm": norm(r[f"{t}/~/layer_norm"]),
      "layers": [layer(f"{t}/~/layer_{i}", True) for i in range(n)],
    },
  }


@pytest.mark.parametrize("config", [True, False], ids=["config", "no config"])
def test_a_haiku_whisper_maps_with_its_towers_and_unnumbered_first_modules(config):
  """The towers are read through haiku's ``/~/`` (each layer's MLP is then closed among its
  own tower's tensors), and ``multi_head_attention`` (unnumbered) is the first of its family:
  the self-attention, before ``multi_head_attention_1``, the cross-attention."""
  c, ref, src = _suite_case(config)
  tree = haiku_target(c)
  m = prj.match(tree, src)
  assert m.towers == (("audio_encoder", "encoder"), ("text_decoder", "decoder"))
  _forward_matches(c, ref, from_haiku(c, prj.restore(tree, src, recipes=m)), m)
