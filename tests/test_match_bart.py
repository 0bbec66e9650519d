"""``match`` on a real BART checkpoint (a post-norm encoder-decoder), checked by the forward pass.

A tiny ``BartForConditionalGeneration`` that ``transformers`` saved (``tests/make_hf_fixtures.py``),
restored through ``match`` with no hints into a flax-style target (a module per layer) and an
NNX-style one (layers stacked, heads split); the logits are compared with PyTorch's. What
``match`` must read right: the decoder's ``self_attn_norm`` and ``cross_attn_norm`` (two norms
of one shape, told apart by ``encoder_attn``), ``final_layer_norm`` inside a layer (the MLP's
norm), ``layernorm_embedding``, positions offset by 2, and the head tied to ``shared``.
"""

from __future__ import annotations

import json

import hf_models as hf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paramreg_jax as prj
from paramreg_jax import SafetensorsSource

NAME = "bart"


def layer_norm(x, p, eps=1e-5):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def dense(p, x):
  return x @ p["kernel"] + p["bias"]


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


def mlp(p, x):
  return dense(p["fc2"], jax.nn.gelu(dense(p["fc1"], x), approximate=False))


def embed(w, stack, ids):
  x = w["embed"]["embedding"][ids] + stack["pos_embed"]["embedding"][np.arange(ids.shape[1]) + 2]
  return layer_norm(x, stack["embed_norm"])


def forward(c, w, ids, decoder_ids):
  enc_w, dec_w = w["encoder"], w["decoder"]
  x = embed(w, enc_w, ids)
  for p in enc_w["layers"]:  # post-norm: x = norm(x + sublayer(x))
    x = layer_norm(x + attention(c, p["self_attn"], x, x, False), p["self_attn_norm"])
    x = layer_norm(x + mlp(p["mlp"], x), p["mlp_norm"])
  y = embed(w, dec_w, decoder_ids)
  for p in dec_w["layers"]:
    y = layer_norm(y + attention(c, p["self_attn"], y, y, True), p["self_attn_norm"])
    y = layer_norm(y + attention(c, p["cross_attn"], y, x, False), p["cross_attn_norm"])
    y = layer_norm(y + mlp(p["mlp"], y), p["mlp_norm"])
  return y @ w["embed"]["embedding"].T + w["final_logits_bias"]  # the head is tied to shared


def target(c, stacked):
  d, f, h, n = c["d_model"], c["encoder_ffn_dim"], c["encoder_attention_heads"], c["encoder_layers"]
  one = lambda *s: jax.ShapeDtypeStruct(s, np.float32)  # noqa: E731
  lay = lambda *s: one(n, *s) if stacked else one(*s)  # noqa: E731
  norm = lambda: {"scale": lay(d), "bias": lay(d)}  # noqa: E731

  def proj(name):
    if not stacked:
      return {"kernel": lay(d, d), "bias": lay(d)}
    if name == "o":
      return {"kernel": lay(h, d // h, d), "bias": lay(d)}
    return {"kernel": lay(d, h, d // h), "bias": lay(h, d // h)}

  def block(cross):
    b = {
      "self_attn": {x: proj(x) for x in "qkvo"},
      "self_attn_norm": norm(),
      "mlp": {
        "fc1": {"kernel": lay(d, f), "bias": lay(f)},
        "fc2": {"kernel": lay(f, d), "bias": lay(d)},
      },
      "mlp_norm": norm(),
    }
    if cross:
      b |= {"cross_attn": {x: proj(x) for x in "qkvo"}, "cross_attn_norm": norm()}
    return b

  def stack(cross):
    layers = (
      {"layers": block(cross)} if stacked else {f"layers_{i}": block(cross) for i in range(n)}
    )
    return {
      **layers,
      "pos_embed": {"embedding": one(c["max_position_embeddings"] + 2, d)},
      "embed_norm": {"scale": one(d), "bias": one(d)},
    }

  return {
    "embed": {"embedding": one(c["vocab_size"], d)},
    "encoder": stack(False),
    "decoder": stack(True),
    "final_logits_bias": one(1, c["vocab_size"]),
  }


def canonical(c, restored, stacked):
  """Per-layer modules with heads merged, as the forward pass reads them."""
  r = jax.tree.map(np.asarray, restored)
  d, n = c["d_model"], c["encoder_layers"]
  merge = lambda p: {k: (v.reshape(d, d) if k == "kernel" else v.reshape(d)) for k, v in p.items()}  # noqa: E731
  out = {"embed": r["embed"], "final_logits_bias": r["final_logits_bias"]}
  for name in ("encoder", "decoder"):
    s = r[name]
    layers = []
    for i in range(n):
      b = jax.tree.map(lambda x, i=i: x[i], s["layers"]) if stacked else s[f"layers_{i}"]
      for a in ("self_attn", "cross_attn"):
        if a in b:
          b[a] = {x: merge(p) for x, p in b[a].items()}
      layers.append(b)
    out[name] = {**{k: v for k, v in s.items() if not k.startswith("layers")}, "layers": layers}
  return out


@pytest.mark.parametrize("stacked", [False, True], ids=["flax", "nnx"])
def test_bart_forward_pass_matches_pytorch_with_no_hints(stacked, tmp_path):
  c = json.loads((hf.DATA / NAME / "config.json").read_text())
  ref = dict(np.load(hf.DATA / NAME / "reference.npz"))
  src = SafetensorsSource(hf.DATA / NAME / "model.safetensors")
  tree = target(c, stacked)
  m = prj.match(tree, src)
  assert src.stats.reads == 0
  norm = (
    "decoder/layers/cross_attn_norm/scale" if stacked else "decoder/layers_0/cross_attn_norm/scale"
  )
  assert any(t == norm and "encoder_attn_layer_norm" in e for t, e, _ in m.rows())
  restored = prj.restore(tree, src, recipes=m)
  got = np.asarray(
    forward(c, canonical(c, restored, stacked), ref["input_ids"], ref["decoder_input_ids"])
  )
  np.testing.assert_allclose(got, ref["output"], atol=1e-5, rtol=1e-5, err_msg=str(m))
  prj.export(restored, m, tmp_path / "out")  # and back, bit for bit
  want = SafetensorsSource(hf.DATA / NAME / "model.safetensors")
  back = SafetensorsSource(tmp_path / "out" / "model.safetensors")
  assert sorted(back.keys()) == sorted(want.keys())
  for k in want.keys():
    assert want.lease(k).read().tobytes() == back.lease(k).read().tobytes(), k


# the norms as NNX ports of torch code number them: a decoder layer's three in call order
_NUMBERED = {
  "encoder": {"self_attn_norm": "norm1", "mlp_norm": "norm2"},
  "decoder": {"self_attn_norm": "norm1", "cross_attn_norm": "norm2", "mlp_norm": "norm3"},
}


def _renamed(tree, names):
  """``tree`` with each layer's norms renamed by ``names[stack]`` (or back, inverted)."""
  out = dict(tree)
  for stack, rename in names.items():
    out[stack] = {
      k: ({rename.get(m, m): p for m, p in v.items()} if k.startswith("layers") else v)
      for k, v in tree[stack].items()
    }
  return out


def test_a_decoder_layers_norm1_norm2_norm3_are_self_cross_and_mlp_by_the_forward_pass():
  """``norm2`` of a decoder layer beside a cross-attention is the cross-attention's norm,
  ``norm3`` the MLP's (``norm2`` is the MLP's in the encoder's block of two). Both are one
  shape: these loaded swapped, with no error, before three numbered norms were read so."""
  c = json.loads((hf.DATA / NAME / "config.json").read_text())
  ref = dict(np.load(hf.DATA / NAME / "reference.npz"))
  src = SafetensorsSource(hf.DATA / NAME / "model.safetensors")
  tree = _renamed(target(c, False), _NUMBERED)
  m = prj.match(tree, src)
  assert any(
    t == "decoder/layers_0/norm2/scale" and "encoder_attn_layer_norm" in e for t, e, _ in m.rows()
  )
  restored = prj.restore(tree, src, recipes=m)
  back = {s: {v: k for k, v in names.items()} for s, names in _NUMBERED.items()}
  params = canonical(c, _renamed(restored, back), False)
  got = np.asarray(forward(c, params, ref["input_ids"], ref["decoder_input_ids"]))
  np.testing.assert_allclose(got, ref["output"], atol=1e-5, rtol=1e-5, err_msg=str(m))


def _auto_named(tree):
  """``target(c, False)`` as a linen ``@nn.compact`` names it: ``EncoderLayer_{i}``/
  ``DecoderLayer_{i}``, the self-attention ``MultiHeadDotProductAttention_0`` and the
  cross-attention ``..._1`` (``query``, ``key``, ``value``, ``out``), ``LayerNorm_0..2`` and
  ``Dense_0``/``Dense_1`` in call order; and ``back``, the inverse renaming."""
  proj = {"q": "query", "k": "key", "v": "value", "o": "out"}
  out, back = {"embed": tree["embed"], "final_logits_bias": tree["final_logits_bias"]}, {}
  for stack, cls in (("encoder", "EncoderLayer"), ("decoder", "DecoderLayer")):
    s = tree[stack]
    out[stack] = {"Embed_0": s["pos_embed"], "LayerNorm_0": s["embed_norm"]}
    back[f"{stack}/Embed_0/"], back[f"{stack}/LayerNorm_0/"] = (
      f"{stack}/pos_embed/",
      f"{stack}/embed_norm/",
    )
    for i in range(sum(k.startswith("layers_") for k in s)):
      b, new, old = s[f"layers_{i}"], f"{stack}/{cls}_{i}/", f"{stack}/layers_{i}/"
      norms = ["self_attn_norm", *(["cross_attn_norm"] if "cross_attn" in b else []), "mlp_norm"]
      layer = {f"LayerNorm_{j}": b[n] for j, n in enumerate(norms)}
      back |= {f"{new}LayerNorm_{j}/": f"{old}{n}/" for j, n in enumerate(norms)}
      for j, a in enumerate(a for a in ("self_attn", "cross_attn") if a in b):
        mha = f"MultiHeadDotProductAttention_{j}"
        layer[mha] = {proj[x]: p for x, p in b[a].items()}
        back |= {f"{new}{mha}/{proj[x]}/": f"{old}{a}/{x}/" for x in b[a]}
      for j, n in enumerate(("fc1", "fc2")):
        layer[f"Dense_{j}"] = b["mlp"][n]
        back[f"{new}Dense_{j}/"] = f"{old}mlp/{n}/"
      out[stack][f"{cls}_{i}"] = layer
  return out, back


def test_a_compact_decoder_layers_two_attentions_are_self_then_cross_by_the_forward_pass():
  """In a compact decoder layer the self-attention is called before the cross-attention:
  ``MultiHeadDotProductAttention_0`` and ``_1`` (one shape, no word between them) are
  ``self_attn`` and ``encoder_attn``, with no hint, by the order of their calls."""
  c = json.loads((hf.DATA / NAME / "config.json").read_text())
  ref = dict(np.load(hf.DATA / NAME / "reference.npz"))
  src = SafetensorsSource(hf.DATA / NAME / "model.safetensors")
  tree, back = _auto_named(target(c, False))
  m = prj.match(tree, src)
  cross = "decoder/DecoderLayer_0/MultiHeadDotProductAttention_1/query/kernel"
  assert any(t == cross and "encoder_attn.q_proj" in e and "in order" in w for t, e, w in m.rows())
  restored = prj.restore(tree, src, recipes=m)
  flat: dict = {}
  for path, value in jax.tree_util.tree_flatten_with_path(restored)[0]:
    name = prj.path_to_name(path)
    for new, old in back.items():
      name = old + name[len(new) :] if name.startswith(new) else name
    node = flat
    *head, last = name.split("/")
    for part in head:
      node = node.setdefault(part, {})
    node[last] = value
  got = np.asarray(
    forward(c, canonical(c, flat, False), ref["input_ids"], ref["decoder_input_ids"])
  )
  np.testing.assert_allclose(got, ref["output"], atol=1e-5, rtol=1e-5, err_msg=str(m))
