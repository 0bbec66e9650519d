"""Forward passes of Hugging Face architectures in JAX, and the targets a JAX user would write.

``tests/test_match_architectures.py`` restores each tiny checkpoint under ``tests/data/hf/``
through ``match`` into targets written in three styles, runs the forward pass below on what was
restored, and compares it with the output PyTorch produced (``reference.npz``).

One forward pass serves every decoder and encoder here; an architecture is a set of switches
(:class:`Arch`). It reads *canonical* weights: ``[in, out]`` kernels with heads merged, one
dict per layer. Each target style is a naming and a layout of those weights (:class:`Style`);
``to_canonical`` undoes the style's layout (a reshape or an unstack: the user's model's own
reading of its parameters), never anything taken from the checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

DATA = pathlib.Path(__file__).parent / "data" / "hf"


@dataclasses.dataclass(frozen=True)
class Arch:
  """The switches of one architecture's forward pass (sizes come from its ``config.json``)."""

  norm: str = "layer"  # "layer", "rms", "rms1p" (Gemma: x * (1 + w))
  norm_bias: bool = True
  block: str = "pre"  # "pre", "post" (BERT), "parallel1" (one norm), "parallel2" (two norms),
  # "post_sub" (OLMo 2: x + norm(attn(x)), x + norm(mlp(x)))
  mlp: str = "plain"  # "plain" (act(up) -> down) or "gated" (act(gate) * up -> down)
  act: str = "gelu"  # "gelu", "gelu_tanh", "relu", "relu2", "silu"
  # "full" (OLMo 2: over all heads), "head" (Persimmon: one per head_dim, shared by the heads),
  # "per_head" (StableLM: one norm for each head)
  qk_norm: str = "none"
  positions: str = "rotary"  # "rotary", "learned", "alibi" (BLOOM, MPT), "none"
  rotary: str = "half"  # "half" (NeoX/Llama), "pairs" (GPT-J/CodeGen)
  rotary_fraction: float = 1.0
  pos_offset: int = 0  # OPT: 2; RoBERTa: padding_idx + 1
  pos_extra: int = 0  # rows beyond max_position_embeddings (OPT: the offset)
  eps: float = 1e-5  # when the config names none (torch.nn.LayerNorm's default)
  experts: bool = False  # a mixture of experts in place of the MLP (Mixtral: softmax, top-k)
  patches: bool = False  # ViT: a conv patch embedding and a class token instead of token ids
  types: bool = False  # token type embeddings (BERT)
  embed_norm: bool = False
  final_norm: bool = True
  causal: bool = True
  head: bool = True
  head_bias: bool = False
  embed_scale: bool = False  # Gemma: embeddings times sqrt(hidden)
  qkv_bias: bool = False
  o_bias: bool = False
  mlp_bias: bool = False


_BIASES = dict(qkv_bias=True, o_bias=True, mlp_bias=True)  # every linear layer has a bias
_LLAMA = dict(norm="rms", norm_bias=False, mlp="gated", act="silu")
_ENCODER = dict(
  block="post", positions="learned", embed_norm=True, final_norm=False, causal=False, head=False
)

ARCHS: dict[str, Arch] = {
  "gpt2": Arch(act="gelu_tanh", positions="learned", **_BIASES),
  "gpt_neox": Arch(block="parallel2", rotary_fraction=0.5, **_BIASES),
  "codegen": Arch(
    block="parallel1", act="gelu_tanh", rotary="pairs", mlp_bias=True, head_bias=True
  ),
  "falcon_grouped": Arch(block="parallel2"),
  "falcon_mqa": Arch(block="parallel1"),
  "falcon_mha": Arch(**_BIASES),
  "opt": Arch(act="relu", positions="learned", pos_offset=2, pos_extra=2, **_BIASES),
  "llama": Arch(**_LLAMA),
  "mistral": Arch(**_LLAMA),
  "mixtral": Arch(**_LLAMA, experts=True),
  "qwen2": Arch(**_LLAMA, qkv_bias=True),
  "phi3": Arch(**_LLAMA),
  "gemma": Arch(**{**_LLAMA, "norm": "rms1p", "act": "gelu_tanh"}, embed_scale=True),
  "bert": Arch(**_ENCODER, types=True, **_BIASES),
  "roberta": Arch(**_ENCODER, types=True, pos_offset=2, **_BIASES),
  "distilbert": Arch(**_ENCODER, eps=1e-12, **_BIASES),
  "vit": Arch(patches=True, positions="learned", causal=False, head=False, **_BIASES),
  "gptj": Arch(
    block="parallel1",
    act="gelu_tanh",
    rotary="pairs",
    rotary_fraction=0.5,
    mlp_bias=True,
    head_bias=True,
  ),
  "olmo2": Arch(**_LLAMA, block="post_sub", qk_norm="full"),
  "persimmon": Arch(act="relu2", rotary_fraction=0.5, qk_norm="head", **_BIASES),
  "bloom": Arch(act="gelu_tanh", positions="alibi", embed_norm=True, **_BIASES),
  "mpt": Arch(positions="alibi", norm_bias=False),
  "stablelm": Arch(
    mlp="gated", act="silu", rotary_fraction=0.25, qk_norm="per_head", qkv_bias=True
  ),
  "mixtral_fused": Arch(**_LLAMA, experts=True),
}


@dataclasses.dataclass(frozen=True)
class Sizes:
  vocab: int
  hidden: int
  heads: int
  kv_heads: int
  head_dim: int
  ffn: int
  layers: int
  positions: int
  types: int
  eps: float
  theta: float
  experts: int
  top_k: int
  patch: int
  channels: int

  @classmethod
  def of(cls, c: dict[str, Any], arch: Arch) -> Sizes:
    g = lambda *names, default=None: next((c[n] for n in names if c.get(n) is not None), default)  # noqa: E731
    hidden = g("hidden_size", "n_embd", "dim", "d_model")
    heads = g("num_attention_heads", "n_head", "n_heads")
    kv = g("num_key_value_heads", "num_kv_heads", default=heads)
    if c.get("model_type") == "falcon" and not c.get("new_decoder_architecture"):
      kv = 1 if c.get("multi_query") else heads
    rope = c.get("rope_parameters") or {}
    patch = g("patch_size", default=0)
    if patch:  # ViT: the patches and the class token are the positions
      c = {**c, "max_position_embeddings": (c["image_size"] // patch) ** 2 + 1}
    return cls(
      vocab=g("vocab_size", default=0),
      hidden=hidden,
      heads=heads,
      kv_heads=kv,
      head_dim=g("head_dim", default=hidden // heads),
      ffn=g("intermediate_size", "ffn_dim", "hidden_dim", "n_inner", default=4 * hidden),
      layers=g("num_hidden_layers", "n_layer", "n_layers"),
      positions=g("max_position_embeddings", "n_positions", default=0),
      types=g("type_vocab_size", default=0),
      eps=g("layer_norm_eps", "rms_norm_eps", "layer_norm_epsilon", default=arch.eps),
      theta=rope.get("rope_theta", c.get("rope_theta", 10000.0)),
      experts=g("num_local_experts", default=0),
      top_k=g("num_experts_per_tok", default=0),
      patch=patch,
      channels=g("num_channels", default=0),
    )


def case(name: str) -> tuple[Arch, Sizes, dict[str, Any], dict[str, np.ndarray]]:
  """The architecture, sizes, config and reference outputs of the fixture ``name``."""
  config = json.loads((DATA / name / "config.json").read_text())
  ref = dict(np.load(DATA / name / "reference.npz"))
  return ARCHS[name], Sizes.of(config, ARCHS[name]), config, ref


# --- the forward pass over canonical weights --------------------------------------------------


def _norm(a: Arch, s: Sizes, p: dict[str, Any], x: jax.Array) -> jax.Array:
  if a.norm == "layer":
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    y = (x - mu) / jnp.sqrt(var + s.eps) * p["w"]
  else:
    y = x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + s.eps)
    y = y * (1 + p["w"] if a.norm == "rms1p" else p["w"])
  return y + p["b"] if "b" in p else y


def _act(a: Arch, x: jax.Array) -> jax.Array:
  if a.act == "gelu":
    return jax.nn.gelu(x, approximate=False)
  if a.act == "gelu_tanh":
    return jax.nn.gelu(x, approximate=True)
  if a.act == "relu2":
    return jnp.square(jax.nn.relu(x))
  return jax.nn.relu(x) if a.act == "relu" else jax.nn.silu(x)


def _dense(p: dict[str, Any], x: jax.Array) -> jax.Array:
  y = x @ p["w"]
  return y + p["b"] if "b" in p else y


def _rotary(a: Arch, s: Sizes, x: jax.Array) -> jax.Array:
  """``x``: [batch, seq, heads, head_dim]."""
  rot = int(s.head_dim * a.rotary_fraction)
  inv = 1.0 / (s.theta ** (np.arange(0, rot, 2, dtype=np.float32) / rot))
  ang = np.arange(x.shape[1], dtype=np.float32)[:, None] * inv[None, :]  # [seq, rot/2]
  xr, xp = x[..., :rot], x[..., rot:]
  if a.rotary == "half":
    cos = np.concatenate([np.cos(ang)] * 2, -1)[None, :, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, -1)[None, :, None, :]
    x1, x2 = xr[..., : rot // 2], xr[..., rot // 2 :]
    turned = jnp.concatenate([-x2, x1], -1)
  else:
    cos = np.repeat(np.cos(ang), 2, -1)[None, :, None, :]
    sin = np.repeat(np.sin(ang), 2, -1)[None, :, None, :]
    turned = jnp.stack([-xr[..., 1::2], xr[..., ::2]], -1).reshape(xr.shape)
  return jnp.concatenate([xr * cos + turned * sin, xp], -1)


def _attention(a: Arch, s: Sizes, p: dict[str, Any], x: jax.Array) -> jax.Array:
  b, t, _ = x.shape
  q, k = _dense(p["q"], x), _dense(p["k"], x)
  if a.qk_norm == "full":
    q, k = _norm(a, s, p["q_norm"], q), _norm(a, s, p["k_norm"], k)
  q = q.reshape(b, t, s.heads, s.head_dim)
  k = k.reshape(b, t, s.kv_heads, s.head_dim)
  if a.qk_norm in ("head", "per_head"):  # a [head_dim] or a [heads, head_dim] norm
    q, k = _norm(a, s, p["q_norm"], q), _norm(a, s, p["k_norm"], k)
  v = _dense(p["v"], x).reshape(b, t, s.kv_heads, s.head_dim)
  if a.positions == "rotary":
    q, k = _rotary(a, s, q), _rotary(a, s, k)
  k = jnp.repeat(k, s.heads // s.kv_heads, axis=2)
  v = jnp.repeat(v, s.heads // s.kv_heads, axis=2)
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(s.head_dim)
  if a.positions == "alibi":  # slope_h * key position (BLOOM's and MPT's at a power-of-2 heads)
    slopes = 2.0 ** (-8.0 * np.arange(1, s.heads + 1) / s.heads)
    logits = logits + (slopes[:, None, None] * np.arange(t)[None, None, :]).astype(np.float32)
  if a.causal:
    logits = jnp.where(np.tril(np.ones((t, t), bool)), logits, -1e30)
  out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, -1), v).reshape(b, t, -1)
  return _dense(p["o"], out)


def _moe(a: Arch, s: Sizes, p: dict[str, Any], x: jax.Array) -> jax.Array:
  """Mixtral: softmax over the router's logits, the top-k renormalised, experts summed."""
  probs = jax.nn.softmax(x @ p["router"]["w"], -1)
  top, idx = jax.lax.top_k(probs, s.top_k)
  top = top / top.sum(-1, keepdims=True)
  weights = (jax.nn.one_hot(idx, s.experts) * top[..., None]).sum(-2)  # [b, t, experts]
  gate = jnp.einsum("btd,edf->btef", x, p["e_gate"]["w"])
  up = jnp.einsum("btd,edf->btef", x, p["e_up"]["w"])
  out = jnp.einsum("btef,efd->bted", _act(a, gate) * up, p["e_down"]["w"])
  return jnp.einsum("bte,bted->btd", weights, out)


def _mlp(a: Arch, p: dict[str, Any], x: jax.Array, s: Sizes | None = None) -> jax.Array:
  if a.experts:
    return _moe(a, s, p, x)
  if a.mlp == "gated":
    return _dense(p["down"], _act(a, _dense(p["gate"], x)) * _dense(p["up"], x))
  return _dense(p["down"], _act(a, _dense(p["up"], x)))


def forward(a: Arch, s: Sizes, w: dict[str, Any], ids: np.ndarray) -> jax.Array:
  """Logits (or, without a head, the last hidden state) for ``ids`` [batch, seq] (for ViT,
  pixel values [batch, channels, height, width])."""
  if a.patches:
    return _encode(a, s, w, _patches(s, w, ids) + w["pos"]["w"].reshape(-1, s.hidden))
  x = w["embed"]["w"][ids]
  if a.embed_scale:
    x = x * jnp.asarray(math.sqrt(s.hidden), x.dtype)
  if a.positions == "learned":
    x = x + w["pos"]["w"][np.arange(ids.shape[1]) + a.pos_offset]
  if a.types:
    x = x + w["type"]["w"][0]
  if a.embed_norm:
    x = _norm(a, s, w["embed_norm"], x)
  return _encode(a, s, w, x)


def _patches(s: Sizes, w: dict[str, Any], pixels: np.ndarray) -> jax.Array:
  """ViT's conv patch embedding (stride = kernel = patch) as a matmul, the class token first."""
  b, c, hh, ww = pixels.shape
  p = s.patch
  patches = pixels.reshape(b, c, hh // p, p, ww // p, p).transpose(0, 2, 4, 3, 5, 1)
  x = patches.reshape(b, -1, p * p * c) @ w["patch"]["w"].reshape(-1, s.hidden) + w["patch"]["b"]
  cls = jnp.broadcast_to(w["cls"]["w"].reshape(1, 1, -1), (b, 1, s.hidden))
  return jnp.concatenate([cls, x], axis=1)


def _encode(a: Arch, s: Sizes, w: dict[str, Any], x: jax.Array) -> jax.Array:
  for p in w["layers"]:
    if a.block == "post_sub":
      x = x + _norm(a, s, p["post_attn_norm"], _attention(a, s, p, x))
      x = x + _norm(a, s, p["post_mlp_norm"], _mlp(a, p, x, s))
    elif a.block == "post":
      x = _norm(a, s, p["attn_norm"], x + _attention(a, s, p, x))
      x = _norm(a, s, p["mlp_norm"], x + _mlp(a, p, x))
    elif a.block == "parallel1":
      h = _norm(a, s, p["attn_norm"], x)
      x = x + _attention(a, s, p, h) + _mlp(a, p, h)
    elif a.block == "parallel2":
      x = (
        x
        + _attention(a, s, p, _norm(a, s, p["attn_norm"], x))
        + _mlp(a, p, _norm(a, s, p["mlp_norm"], x))
      )
    else:
      x = x + _attention(a, s, p, _norm(a, s, p["attn_norm"], x))
      x = x + _mlp(a, p, _norm(a, s, p["mlp_norm"], x), s)
  if a.final_norm:
    x = _norm(a, s, w["final_norm"], x)
  if not a.head:
    return x
  head = w.get("head") or {"w": w["embed"]["w"].T}
  return _dense(head, x)


# --- the parameters an architecture has, canonically ------------------------------------------


def canonical_shapes(a: Arch, s: Sizes) -> dict[str, Any]:
  """``{role: {kind: shape}}`` globally, and ``layers``: one such dict per layer."""
  D, H, KV, Dh, F = s.hidden, s.heads, s.kv_heads, s.head_dim, s.ffn

  def lin(i, o, bias):
    return {"w": (i, o), **({"b": (o,)} if bias else {})}

  norm = {"w": (D,), **({"b": (D,)} if a.norm_bias else {})}
  layer = {
    "attn_norm": norm,
    "q": lin(D, H * Dh, a.qkv_bias),
    "k": lin(D, KV * Dh, a.qkv_bias),
    "v": lin(D, KV * Dh, a.qkv_bias),
    "o": lin(H * Dh, D, a.o_bias),
    "up": lin(D, F, a.mlp_bias),
    "down": lin(F, D, a.mlp_bias),
  }
  if a.block != "parallel1":
    layer["mlp_norm"] = norm
  if a.block == "post_sub":
    layer["post_attn_norm"] = layer.pop("attn_norm")
    layer["post_mlp_norm"] = layer.pop("mlp_norm")
  if a.qk_norm == "full":
    layer["q_norm"], layer["k_norm"] = {"w": (H * Dh,)}, {"w": (KV * Dh,)}
  elif a.qk_norm == "head":
    layer["q_norm"] = layer["k_norm"] = {"w": (Dh,), "b": (Dh,)}
  elif a.qk_norm == "per_head":
    layer["q_norm"], layer["k_norm"] = {"w": (H, Dh)}, {"w": (KV, Dh)}
  if a.mlp == "gated":
    layer["gate"] = lin(D, F, a.mlp_bias)
  if a.experts:
    E = s.experts
    for role in ("gate", "up", "down"):
      del layer[role]
    layer |= {
      "router": {"w": (D, E)},
      "e_gate": {"w": (E, D, F)},
      "e_up": {"w": (E, D, F)},
      "e_down": {"w": (E, F, D)},
    }
  out: dict[str, Any] = {"embed": {"w": (s.vocab, D)}, "layers": [layer] * s.layers}
  if a.patches:  # conv kernel HWIO, the class token, positions [1, patches + 1, D]
    del out["embed"]
    out["patch"] = {"w": (s.patch, s.patch, s.channels, D), "b": (D,)}
    out["cls"] = {"w": (1, 1, D)}
    out["pos"] = {"w": (1, s.positions, D)}
  elif a.positions == "learned":
    out["pos"] = {"w": (s.positions + a.pos_extra, D)}
  if a.types:
    out["type"] = {"w": (s.types, D)}
  if a.embed_norm:
    out["embed_norm"] = norm
  if a.final_norm:
    out["final_norm"] = norm
  return out


def with_head(shapes: dict[str, Any], a: Arch, s: Sizes) -> dict[str, Any]:
  """The same, with an untied ``head`` (a target model with its own output layer)."""
  return {
    **shapes,
    "head": {"w": (s.hidden, s.vocab), **({"b": (s.vocab,)} if a.head_bias else {})},
  }


# --- target styles: how a JAX user names and lays out those parameters ------------------------

_HEADS = {"q": "heads", "k": "kv_heads", "v": "kv_heads"}


@dataclasses.dataclass(frozen=True)
class Style:
  """A naming (``names``: canonical role -> module path) and layout of the canonical weights."""

  name: str
  stacked: bool  # layers on a leading axis (``nn.scan``/``nnx.scan``)
  split_heads: bool  # q/k/v kernels [in, heads, head_dim], o [heads, head_dim, out]
  layer_prefix: str  # "layers_{i}/" (linen), "layers/{i}/" (dict), "layers/" (stacked)
  names: dict[str, str]
  plain_mlp: tuple[str, str] = ("mlp/up", "mlp/down")  # a non-gated MLP's two layers
  # the leaf names: a weight, a bias, an embedding table, a norm's scale and its bias
  leaves: tuple[str, str, str, str, str] = ("kernel", "bias", "embedding", "scale", "bias")
  out_first: bool = False  # linear weights [out, in] (experts [E, out, in]), convs [O, I, H, W]
  scan_axis: int = 0  # where a stacked leaf keeps its layers (MaxText: 1, experts first)
  lists: bool = False  # layers (and numbered modules) in Python lists, not dicts


# the MLP, mixture of experts and output of both flax-module styles
_FLAX_MLP = {
  "gate": "mlp/gate",
  "up": "mlp/up",
  "down": "mlp/down",
  "router": "moe/router",
  "e_gate": "moe/experts/gate",
  "e_up": "moe/experts/up",
  "e_down": "moe/experts/down",
  "final_norm": "final_norm",
  "head": "lm_head",
}

# an NNX model's own short names (equinox code names its modules the same way)
_NNX_NAMES = {
  "patch": "patch_embed",
  "cls": "cls_token",
  "embed": "embed",
  "pos": "pos_embed",
  "type": "type_embed",
  "embed_norm": "embed_norm",
  "attn_norm": "attn_norm",
  "mlp_norm": "mlp_norm",
  "post_attn_norm": "post_attn_norm",
  "post_mlp_norm": "post_mlp_norm",
  "q_norm": "attn/q_norm",
  "k_norm": "attn/k_norm",
  "q": "attn/q",
  "k": "attn/k",
  "v": "attn/v",
  "o": "attn/o",
  **_FLAX_MLP,
}

STYLES = {
  "flax": Style(  # linen modules with flax's own attention layout (nn.MultiHeadDotProductAttention)
    "flax",
    stacked=False,
    split_heads=True,
    layer_prefix="layers_{i}/",
    names={
      "patch": "patch_embed",
      "cls": "cls_token",
      "embed": "token_embed",
      "pos": "pos_embed",
      "type": "seg_embed",
      "embed_norm": "embed_norm",
      "attn_norm": "attention_norm",
      "mlp_norm": "mlp_norm",
      "post_attn_norm": "post_attention_norm",
      "post_mlp_norm": "post_mlp_norm",
      "q_norm": "attention/query_norm",
      "k_norm": "attention/key_norm",
      "q": "attention/query",
      "k": "attention/key",
      "v": "attention/value",
      "o": "attention/out",
      **_FLAX_MLP,
    },
    plain_mlp=("mlp/ffn_in", "mlp/ffn_out"),
  ),
  "nnx": Style(  # an NNX model built with nnx.scan: every layer stacked, heads split
    "nnx",
    stacked=True,
    split_heads=True,
    layer_prefix="layers/",
    names=_NNX_NAMES,
    plain_mlp=("mlp/up", "mlp/down"),
  ),
  "meta": Style(  # a plain-JAX dict named like Meta's reference code: no kind suffix
    "meta",
    stacked=False,
    split_heads=False,
    layer_prefix="layers/{i}/",
    names={
      "patch": "patch_embeddings",
      "cls": "cls_token",
      "embed": "tok_embeddings",
      "pos": "pos_embeddings",
      "type": "seg_embeddings",
      "embed_norm": "embed_norm",
      "attn_norm": "attention_norm",
      "mlp_norm": "ffn_norm",
      "post_attn_norm": "post_attention_norm",
      "post_mlp_norm": "post_ffn_norm",
      "q_norm": "attention/q_norm",
      "k_norm": "attention/k_norm",
      "q": "attention/q",
      "k": "attention/k",
      "v": "attention/v",
      "o": "attention/o",
      "gate": "feed_forward/1",
      "up": "feed_forward/3",
      "down": "feed_forward/2",
      "router": "feed_forward/router",
      "e_gate": "feed_forward/experts/{e}/w1",  # one leaf per expert
      "e_up": "feed_forward/experts/{e}/w3",
      "e_down": "feed_forward/experts/{e}/w2",
      "final_norm": "norm",
      "head": "output",
    },
    plain_mlp=("feed_forward/w_in", "feed_forward/w_out"),
  ),
  "haiku": Style(  # haiku/penzai-style names: a module per layer, w/b leaves, norms scale/offset
    "haiku",
    stacked=False,
    split_heads=False,
    layer_prefix="layer_{i}/",
    names={
      "patch": "patch_embed",
      "cls": "cls_token",
      "embed": "embed",
      "pos": "pos_embed",
      "type": "type_embed",
      "embed_norm": "embed_ln",
      "attn_norm": "ln1",
      "mlp_norm": "ln2",
      "post_attn_norm": "post_attn_ln",
      "post_mlp_norm": "post_mlp_ln",
      "q_norm": "attn/q_ln",
      "k_norm": "attn/k_ln",
      "q": "attn/q",
      "k": "attn/k",
      "v": "attn/v",
      "o": "attn/o",
      **_FLAX_MLP,
      "final_norm": "final_ln",
      "head": "unembed",
    },
    plain_mlp=("mlp/fc1", "mlp/fc2"),
    leaves=("w", "b", "embeddings", "scale", "offset"),
  ),
  "equinox": Style(  # equinox modules: torch's [out, in] ``weight``, layers in a list
    "equinox",
    stacked=False,
    split_heads=False,
    layer_prefix="layers/{i}/",
    names=_NNX_NAMES,
    plain_mlp=("mlp/fc1", "mlp/fc2"),
    leaves=("weight", "bias", "weight", "weight", "bias"),
    out_first=True,
    lists=True,
  ),
  "maxtext": Style(  # MaxText: nn.scan with param_scan_axis=1, so experts stay first
    "maxtext",
    stacked=True,
    split_heads=True,
    layer_prefix="decoder/layers/",
    names={
      "patch": "patch_embed",
      "cls": "cls_token",
      "embed": "token_embedder",
      "pos": "position_embedder",
      "type": "type_embedder",
      "embed_norm": "embed_norm",
      "attn_norm": "pre_self_attention_norm",
      "mlp_norm": "pre_mlp_norm",
      "post_attn_norm": "post_self_attention_norm",
      "post_mlp_norm": "post_mlp_norm",
      "q_norm": "self_attention/query_norm",
      "k_norm": "self_attention/key_norm",
      "q": "self_attention/query",
      "k": "self_attention/key",
      "v": "self_attention/value",
      "o": "self_attention/out",
      "gate": "mlp/wi_0",
      "up": "mlp/wi_1",
      "down": "mlp/wo",
      "router": "MoeBlock_0/gate",
      "e_gate": "MoeBlock_0/wi_0",
      "e_up": "MoeBlock_0/wi_1",
      "e_down": "MoeBlock_0/wo",
      "final_norm": "decoder/decoder_norm",
      "head": "decoder/logits_dense",
    },
    plain_mlp=("mlp/wi", "mlp/wo"),
    scan_axis=1,
  ),
}
# Meta names its projections wq/wk/wv/wo and w1/w2/w3, biases bq...: spelled out here
_META_LEAVES = {
  "attention/q": ("attention/wq", "attention/bq"),
  "attention/k": ("attention/wk", "attention/bk"),
  "attention/v": ("attention/wv", "attention/bv"),
  "attention/o": ("attention/wo", "attention/bo"),
  "feed_forward/1": ("feed_forward/w1", "feed_forward/b1"),
  "feed_forward/3": ("feed_forward/w3", "feed_forward/b3"),
  "feed_forward/2": ("feed_forward/w2", "feed_forward/b2"),
  "feed_forward/w_in": ("feed_forward/w_in", "feed_forward/b_in"),
  "feed_forward/w_out": ("feed_forward/w_out", "feed_forward/b_out"),
}


def _leaf_name(style: Style, role: str, kind: str, gated: bool) -> str:
  if style.name == "meta":
    if not gated and role in ("up", "down"):
      path = style.plain_mlp[0 if role == "up" else 1]
    else:
      path = style.names[role]
    if path in _META_LEAVES:
      return _META_LEAVES[path][0 if kind == "w" else 1]
    return path if kind == "w" else f"{path}_bias"
  path = (
    style.plain_mlp[0 if role == "up" else 1]
    if (not gated and role in ("up", "down"))
    else style.names[role]
  )
  if role == "cls":  # a bare parameter in every style
    return path
  weight, bias, table, scale, shift = style.leaves
  if "norm" in role:
    leaf = shift if kind == "b" else scale
  elif kind == "b":
    leaf = bias
  elif role in ("embed", "pos", "type"):
    leaf = table
  else:
    leaf = weight
  return f"{path}/{leaf}"


# the roles whose weight multiplies (its orientation is the style's); the patch is a conv
_LINEAR = ("q", "k", "v", "o", "gate", "up", "down", "router", "head", "e_gate", "e_up", "e_down")
_OIHW = (3, 2, 0, 1)  # a conv kernel HWIO -> OIHW


def _styled_shape(style: Style, role: str, kind: str, shape: tuple[int, ...], s: Sizes):
  if style.out_first and kind == "w" and role in (*_LINEAR, "patch"):
    return tuple(shape[a] for a in _OIHW) if role == "patch" else (*shape[:-2], *shape[:-3:-1])
  if not style.split_heads or role not in ("q", "k", "v", "o"):
    return shape
  if role == "o":
    return (s.heads, s.head_dim, shape[1]) if kind == "w" else shape
  heads = getattr(s, _HEADS[role])
  return (shape[0], heads, s.head_dim) if kind == "w" else (heads, s.head_dim)


def _entries(style: Style, shapes: dict[str, Any], a: Arch, s: Sizes):
  """``(target name, role, kind, layer or None, canonical shape, target shape)``."""
  gated = a.mlp == "gated"
  for role, kinds in shapes.items():
    if role == "layers":
      continue
    for kind, shape in kinds.items():
      tshape = _styled_shape(style, role, kind, shape, s)
      yield _leaf_name(style, role, kind, gated), role, kind, None, shape, tshape
  layers = shapes["layers"]
  for role, kinds in layers[0].items():
    for kind, shape in kinds.items():
      tshape = _styled_shape(style, role, kind, shape, s)
      leaf = _leaf_name(style, role, kind, gated)
      if "{e}" in leaf:  # one leaf per expert
        for i in range(len(layers)):
          for e in range(shape[0]):
            name = style.layer_prefix.format(i=i) + leaf.format(e=e)
            yield name, role, kind, (i, e), shape, shape[1:]
        continue
      if style.stacked:
        at = style.scan_axis if len(tshape) >= style.scan_axis else 0
        stacked = (*tshape[:at], len(layers), *tshape[at:])
        yield style.layer_prefix + leaf, role, kind, "all", shape, stacked
      else:
        for i in range(len(layers)):
          yield style.layer_prefix.format(i=i) + leaf, role, kind, i, shape, tshape


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
  out: dict[str, Any] = {}
  for name, value in flat.items():
    node = out
    *head, last = name.split("/")
    for part in head:
      node = node.setdefault(part, {})
    node[last] = value
  return out


def _listed(tree: Any) -> Any:
  """Every dict whose keys are 0..n-1 as a list (equinox keeps its layers in one)."""
  if not isinstance(tree, dict):
    return tree
  tree = {k: _listed(v) for k, v in tree.items()}
  if tree and sorted(tree) == sorted(str(j) for j in range(len(tree))):
    return [tree[str(j)] for j in range(len(tree))]
  return tree


def target(style: Style, shapes: dict[str, Any], a: Arch, s: Sizes) -> dict[str, Any]:
  """The abstract target tree (``jax.ShapeDtypeStruct`` leaves)."""
  tree = _nest(
    {
      name: jax.ShapeDtypeStruct(tshape, np.float32)
      for name, *_, tshape in _entries(style, shapes, a, s)
    }
  )
  return _listed(tree) if style.lists else tree


def _unstyled(style: Style, role: str, kind: str, value: np.ndarray, shape: tuple[int, ...]):
  """One layer's leaf back in the canonical layout (``_styled_shape`` undone)."""
  if style.out_first and kind == "w" and role in (*_LINEAR, "patch"):
    value = value.transpose(np.argsort(_OIHW)) if role == "patch" else np.swapaxes(value, -1, -2)
  return value.reshape(shape)


def to_canonical(style: Style, shapes: dict[str, Any], a: Arch, s: Sizes, restored: Any):
  """The restored tree read back the way the user's model reads it, as canonical weights."""
  flat = {
    "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): np.asarray(v)
    for path, v in jax.tree_util.tree_flatten_with_path(restored)[0]
  }
  out: dict[str, Any] = {"layers": [{} for _ in shapes["layers"]]}
  for name, role, kind, layer, shape, _ in _entries(style, shapes, a, s):
    value = flat[name]
    if layer is None:
      out.setdefault(role, {})[kind] = _unstyled(style, role, kind, value, shape)
    elif layer == "all":
      at = style.scan_axis if value.ndim > style.scan_axis else 0
      for i, v in enumerate(np.moveaxis(value, at, 0)):
        out["layers"][i].setdefault(role, {})[kind] = _unstyled(style, role, kind, v, shape)
    elif isinstance(layer, tuple):  # one expert's leaf: stacked back into [experts, ...]
      i, e = layer
      stack = out["layers"][i].setdefault(role, {}).setdefault(kind, np.zeros(shape, value.dtype))
      stack[e] = value
    else:
      out["layers"][layer].setdefault(role, {})[kind] = _unstyled(style, role, kind, value, shape)
  return out
