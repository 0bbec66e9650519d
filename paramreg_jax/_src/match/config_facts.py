"""What a checkpoint's ``config.json`` says to ``match`` (:class:`Facts`: the model type, head
counts, tied embeddings, post-norms, layer types) and the layouts a fused q/k/v or gate/up
tensor is stored in: which rows of it each part takes (:func:`part_rows`), and the fused
tensors whose name alone says their layout.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

# The layouts a fused q/k/v (or gate/up) tensor is stored in, along its fused axis.
LAYOUTS = {
  "contiguous": "[q | k | v] one after the other",
  "per_head": "per head, [heads, 3, head_dim] (GPT-NeoX, Bloom, Falcon without multi-query)",
  "grouped": "per kv group, [kv_heads, heads / kv_heads + 2, head_dim] (Falcon's new decoder)",
  "blocked_qvk4": "4 blocks of [q | v | k] (CodeGen)",
  "interleaved": "gate and up alternating, [g, u, g, u, ...] (GPT-OSS's experts)",
}
GATE_UP_LAYOUTS = ("contiguous", "interleaved")  # those a fused gate_up may be in

# model_type -> the layout of its fused qkv; Falcon depends on two config flags (below)
_QKV_LAYOUTS = {
  "gpt2": "contiguous",
  "gpt_bigcode": "contiguous",
  "phi3": "contiguous",
  "mpt": "contiguous",
  "modernbert": "contiguous",  # Wqkv viewed as [3, heads, head_dim]
  "dbrx": "contiguous",  # Wqkv split [hidden, kv heads * head_dim, kv heads * head_dim]
  "gpt_neox": "per_head",
  "gpt_neox_japanese": "per_head",
  "bloom": "per_head",
  "persimmon": "per_head",
  "codegen": "blocked_qvk4",
}
# Model types whose ``post_attention_layernorm`` normalises the attention's *output* (a
# post-norm; their MLP has its own pre- or post-norm), unlike Llama's, where it is the MLP's
# input norm.
_POST_NORM_TYPES = {"olmo2", "olmo3", "gemma2", "gemma3", "gemma3_text"}
# [gate | up]; GPT-OSS's experts alternate them (its code reads gate_up[..., ::2], [..., 1::2])
_GATE_UP_LAYOUTS = {
  "phi3": "contiguous",
  "modernbert": "contiguous",
  "glm": "contiguous",  # gate_up_proj(x).chunk(2, dim=-1)
  "glm4": "contiguous",
  "gpt_oss": "interleaved",
  "llama4": "contiguous",  # experts' (x @ gate_up_proj).chunk(2, dim=-1)
  "llama4_text": "contiguous",
}
# Hugging Face model types whose linear layers are GPT-2's Conv1D ([in, out]); all others are
# torch.nn.Linear ([out, in]).
_CONV1D_TYPES = {"gpt2", "openai-gpt", "imagegpt", "decision_transformer"}


@dataclasses.dataclass(frozen=True)
class Facts:
  """What a checkpoint's own description (``config.json``) says, for ``match``."""

  model_type: str | None = None
  heads: int | None = None
  kv_heads: int | None = None
  head_dim: int | None = None
  tied: bool | None = None  # tie_word_embeddings
  convention: str | None = None  # of its linear weights: "t" ([out, in]) or "same" ([in, out])
  qkv_layout: str | None = None  # a key of LAYOUTS
  gate_up_layout: str | None = None
  post_norms: bool = False  # post_attention_layernorm is the attention's post-norm
  # each layer's kind (``layer_types``: "sliding_attention", "full_attention"), if given
  layer_types: tuple[str, ...] = ()
  # a config was given that is no transformers config.json (no model_type: timm's, a
  # training framework's): its keys say nothing here
  foreign: bool = False

  def rows(self) -> list[tuple[str, str]]:
    """``(fact, value)`` for the table: only what the config said."""
    out = []
    if self.model_type:
      out.append(("model_type", self.model_type))
    if self.heads:
      heads = f"{self.heads}" + (f" (kv {self.kv_heads})" if self.kv_heads != self.heads else "")
      out.append(("attention heads", f"{heads} x {self.head_dim}"))
    if self.tied is not None:
      out.append(("tie_word_embeddings", str(self.tied).lower()))
    if self.convention:
      out.append(("linear weights", "[out, in]" if self.convention == "t" else "[in, out]"))
    if self.qkv_layout:
      out.append(("fused qkv", LAYOUTS[self.qkv_layout]))
    if self.gate_up_layout:
      out.append(("fused gate_up", "[gate | up] one after the other"))
    if self.post_norms:
      out.append(("post_attention_layernorm", "the attention's post-norm"))
    return out


def _int(config: Mapping[str, Any], *names: str) -> int | None:
  for n in names:
    v = config.get(n)
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
      return v
  return None


def facts_from_config(config: Mapping[str, Any] | None) -> Facts:
  """Reads a Hugging Face ``config.json`` (a dict); ``Facts()`` for None or another format.

  Examples:
    >>> from paramreg_jax._src.match.config_facts import facts_from_config
    >>> f = facts_from_config({"model_type": "gpt_neox", "num_attention_heads": 4,
    ...                        "hidden_size": 32, "tie_word_embeddings": False})
    >>> f.qkv_layout, f.heads, f.head_dim, f.tied, f.convention
    ('per_head', 4, 8, False, 't')
  """
  if not isinstance(config, Mapping):
    return Facts()
  config = dict(config)
  for sub in ("text_config",):  # multimodal configs nest the language model's
    if isinstance(config.get(sub), Mapping) and "model_type" not in config:
      config = dict(config[sub])
  model_type = config.get("model_type")
  if not isinstance(model_type, str):
    return Facts(foreign=bool(config))
  heads = _int(config, "num_attention_heads", "n_head", "n_heads", "num_heads")
  if heads is None:  # BART, Whisper, Marian: each stack's own count, said where they agree
    encoder, decoder = (_int(config, f"{s}_attention_heads") for s in ("encoder", "decoder"))
    heads = encoder if decoder in (None, encoder) else None
  hidden = _int(config, "hidden_size", "n_embd", "d_model", "dim")
  kv = _int(config, "num_key_value_heads", "num_kv_heads", "n_head_kv") or heads
  qkv = _QKV_LAYOUTS.get(model_type)
  if model_type == "falcon":
    if config.get("new_decoder_architecture"):
      qkv = "grouped"
    elif config.get("multi_query", True):
      qkv, kv = "contiguous", 1
    else:
      qkv, kv = "per_head", heads
  # T5's d_kv: its heads' width need not be d_model / heads (t5-11b: 128 heads of 128 over 1024)
  head_dim = _int(config, "head_dim", "kv_channels", "d_kv") or (
    hidden // heads if hidden and heads else None
  )
  tied = config.get("tie_word_embeddings")
  convention = "same" if model_type in _CONV1D_TYPES else "t"
  gate_up = _GATE_UP_LAYOUTS.get(model_type)
  if config.get("gguf_architecture"):
    # llama.cpp's converter writes every matrix [out, in] (GPT-2's Conv1D transposed), every
    # fused qkv as [q | k | v] (Bloom's and Falcon's per-head layouts reordered) and a fused
    # ffn_up as [gate | up]: the file's layout, whatever the Hugging Face model's was
    convention, qkv, gate_up = "t", "contiguous", "contiguous"
  return Facts(
    model_type=model_type,
    heads=heads,
    kv_heads=kv,
    head_dim=head_dim,
    tied=tied if isinstance(tied, bool) else None,
    convention=convention,
    qkv_layout=qkv,
    gate_up_layout=gate_up,
    post_norms=model_type in _POST_NORM_TYPES,
    layer_types=_layer_types(config.get("layer_types")),
  )


def _layer_types(value: Any) -> tuple[str, ...]:
  """transformers' ``layer_types`` (one kind per layer), or () for anything else."""
  if isinstance(value, (list, tuple)) and all(isinstance(t, str) for t in value):
    return tuple(value)
  return ()


def layout_by_name(key: str, stored: tuple[int, ...] = (), axis: int | None = None) -> str | None:
  """A fused tensor whose name alone says its layout: GPT-2's ``attn.c_attn``, torch's own
  ``nn.MultiheadAttention`` (``in_proj_weight``: ``[q | k | v]``, always), and transformers
  5's fused experts ``experts.gate_up_proj`` ``[E, 2I, D]`` (``[gate | up]``, always; where
  its parts are split on another ``axis`` of its ``stored`` shape, the name says nothing:
  GPT-OSS keeps ``[E, D, 2I]`` with gate and up alternating).

  Examples:
    >>> layout_by_name("model.layers.0.mlp.experts.gate_up_proj", (4, 12, 8), 1)
    'contiguous'
    >>> layout_by_name("model.layers.0.mlp.experts.gate_up_proj", (4, 8, 12), 2) is None
    True
  """
  if re.search(r"(^|\.)attn\.c_attn\.|(^|\.)in_proj_(weight|bias)$", key):
    return "contiguous"
  if re.search(r"(^|\.)experts\.gate_up_proj$", key):
    return "contiguous" if axis is None or axis == len(stored) - 2 else None
  return None


def heads_split(stored: tuple[int, ...], split: tuple[int, ...], facts: Facts) -> str | None:
  """Why a stored attention tensor reshaped from ``stored`` into ``split`` (one of its axes
  into two: ``[out, in]`` -> ``[in, heads, head_dim]``, a bias ``[out]`` -> ``[heads,
  head_dim]``) contradicts the config's heads, or None. A split of ``heads * head_dim`` (or
  ``kv_heads * head_dim``) values into any other pair is a model built with another head
  count: its values land, and its attention computes something else.

  Examples:
    >>> f = Facts(heads=4, kv_heads=2, head_dim=8)
    >>> heads_split((32, 32), (32, 4, 8), f) is None, heads_split((16,), (2, 8), f) is None
    (True, True)
    >>> heads_split((32, 8), (32, 1, 8), Facts(heads=4, kv_heads=1, head_dim=8)) is None
    True
    >>> heads_split((32, 32), (32, 8, 4), f)
    'splits its 32 values per row into 8 heads of 4; the config says 4 heads of 8 (kv heads 2)'
  """
  h, kv, d = facts.heads, facts.kv_heads or facts.heads, facts.head_dim
  if not (h and d) or len(split) != len(stored) + 1:
    return None
  wrong = None
  for at, size in enumerate(stored):  # the axis split in two, the others kept in order
    pair = split[at : at + 2]
    if split[:at] + split[at + 2 :] != stored[:at] + stored[at + 1 :] or pair[0] * pair[1] != size:
      continue
    allowed = {(n, d) for n in (h, kv) if n and n * d == size}
    if not allowed or pair in allowed or 1 in pair:  # a size-1 axis: a place, not heads
      return None  # ([32, 8] -> [1, 32, 8]: Gemma's kv_einsum of one kv head of 8)
    wrong = wrong or (size, pair)
  if wrong is None:
    return None
  (size, (n, w)), per = wrong, " per row" if len(stored) > 1 else ""
  kvs = f" (kv heads {kv})" if kv != h else ""
  return (
    f"splits its {size} values{per} into {n} heads of {w}; the config says {h} heads of {d}{kvs}"
  )


def part_rows(
  layout: str, parts: tuple[str, ...], widths: list[int], facts: Facts
) -> dict[str, list[int]] | str:
  """The indices along the fused axis of each part (q, k, v / gate, up), or why they are
  unknown. ``widths`` are the parts' sizes as the target wants them."""
  if layout == "contiguous":
    out, start = {}, 0
    for part, width in zip(parts, widths):
      out[part] = list(range(start, start + width))
      start += width
    return out
  if layout == "interleaved":
    if parts != ("gate", "up") or widths[0] != widths[1]:
      return "alternating rows hold a gate and an up of one width"
    return {p: list(range(n, 2 * widths[0], 2)) for n, p in enumerate(parts)}
  h, kv, d = facts.heads, facts.kv_heads, facts.head_dim
  if not (h and kv and d):
    return "the config gives no head counts"
  if widths != [h * d, kv * d, kv * d]:
    return f"the parts' widths {widths} are not the config's heads ({h} q, {kv} kv, head_dim {d})"
  if layout == "per_head":
    return {
      p: [i * 3 * d + n * d + j for i in range(h) for j in range(d)] for n, p in enumerate(parts)
    }
  if layout == "grouped":
    r = h // kv
    return {
      "q": [(g * (r + 2) + i) * d + j for g in range(kv) for i in range(r) for j in range(d)],
      "k": [(g * (r + 2) + r) * d + j for g in range(kv) for j in range(d)],
      "v": [(g * (r + 2) + r + 1) * d + j for g in range(kv) for j in range(d)],
    }
  if layout == "blocked_qvk4":
    local = h * d // 4
    offset = {"q": 0, "v": 1, "k": 2}
    return {
      p: [m * 3 * local + offset[p] * local + j for m in range(4) for j in range(local)]
      for p in parts
    }
  return f"unknown layout {layout!r}"
