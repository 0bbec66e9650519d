"""``match`` on a checkpoint whose tensors are not their values: decided on values, read as
stored.

A quantized checkpoint stores a weight as more than its values: GGUF block rows, an FP8 tensor
and its ``weight_scale_inv`` (or ``weight_scale``), gpt-oss's ``*_blocks`` and ``*_scales``.
A GGUF file also stores some weights *transformed* by llama.cpp's converter, whatever the
storage type (F32, F16, BF16 or any block format): the rows of q and k permuted for its rotary
layout (llama-family files), Gemma's and Nemotron's norm weights with 1 added, Mamba's ``A`` as
``-exp(A_log)``. ``match`` sees such a checkpoint through :class:`ValuesView`: each weight is
one tensor, under the name of its values, with its shape in values, so names, shapes and
layouts are decided as for any checkpoint. :func:`to_stored` then rewrites each proposal to
read what is stored: the recipe of each tensor's values is decided once, per tensor, from the
file's own metadata (:func:`stored_forms`), and a convention that is not known for the file's
architecture is refused for the tensors it concerns, never guessed.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.recipes import inference
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.sources import checkpoint_source as source_lib
from paramreg_jax._src.sources import gguf as gguf_source
from paramreg_jax._src.sources import selection as sel_lib

# llama.cpp's converter permutes the rows of q and k (weights and biases) for these
# architectures (its LlamaModel family), and not for these others
PERMUTED = frozenset({"llama"})
NOT_PERMUTED = frozenset(
  {
    "qwen2",
    "qwen3",
    "qwen2moe",
    "qwen3moe",
    "gemma",
    "gemma2",
    "gemma3",
    "phi3",
    "gpt2",
    "bloom",
    "falcon",
    "stablelm",
    "starcoder2",
    "mamba",
    "mamba2",
    "t5",
    "t5encoder",
    "nemotron",
  }
)
# ... and stores every ``*norm.weight`` with 1 added for these (transformers subtracts it)
NORM_PLUS_ONE = frozenset({"gemma", "gemma2", "gemma3", "nemotron"})
# ... and an SSM's ``A_log`` as ``A = -exp(A_log)`` for these (transformers takes log(-A))
NEG_EXP_A = frozenset({"mamba", "mamba2"})
_QK = re.compile(r"^blk\.\d+\.attn_([qk])\.(weight|bias)$")
_NORM = re.compile(r"norm\.weight$")
_SSM_A = re.compile(r"^blk\.\d+\.ssm_a$")
# ... and keeps Phi-3's fused gate_up_proj as ffn_up ([gate | up]): the view names it for what
# it holds, so it is split for a model with gate and up of its own
_FUSED_UP = {"phi3": (re.compile(r"^(blk\.\d+\.ffn)_up\.weight$"), r"\1_gate_up.weight")}
_SCALE_SUFFIXES = ("_scale_inv", "_scale")  # DeepSeek-V3; compressed-tensors
_ACTIVATION_SCALES = re.compile(r"(^|\.)input_scale$")  # FP8 activation scales: not weights


@dataclasses.dataclass
class Forms:
  """How a checkpoint's weights are read as values.

  Attributes:
    forms: ``{weight name: the recipe of its values}`` where that is not a plain read.
    hidden: keys that are part of another weight (scales), not weights of their own.
    refused: ``{weight name: why its values cannot be read}`` (an unknown convention).
    values_differ: whether the checkpoint is to be seen through a :class:`ValuesView`.
  """

  forms: dict[str, ops.Recipe] = dataclasses.field(default_factory=dict)
  hidden: set[str] = dataclasses.field(default_factory=set)
  refused: dict[str, str] = dataclasses.field(default_factory=dict)
  values_differ: bool = False


def stored_forms(source: source_lib.CheckpointSource, config: Any = None) -> Forms:
  """How ``source``'s weights are read as values: every tensor of a GGUF file (its
  conventions undone, whatever its storage type), FP8 weights with their scales, gpt-oss's
  MXFP4 pairs; empty for a checkpoint of plain values."""
  if isinstance(source, gguf_source.GGUFSource):
    return _gguf_forms(source, {**source.config, **dict(config or {})})
  keys = list(source.keys())
  have = set(keys)
  out = Forms()
  block = _block_size(config if config is not None else source.config)
  for k in keys:
    dtype = source_lib.metadata_of(source, k).dtype
    if dtype.itemsize == 1 and dtype.kind == "V" and "e8m0" not in dtype.name:  # float8
      scale = next((k + s for s in _SCALE_SUFFIXES if k + s in have), None)
      if scale is not None:
        out.forms[k] = ops.scale_blocks(ops.Source(k), ops.Source(scale), block)
        out.hidden.add(scale)
    name = k.removesuffix("_blocks")
    if name != k and name + "_scales" in have and _mxfp4_pair(source, k, name + "_scales"):
      out.forms[name] = ops.mxfp4(ops.Source(k), ops.Source(name + "_scales"))
      out.hidden |= {k, name + "_scales"}
  if out.forms:
    out.hidden |= {k for k in keys if _ACTIVATION_SCALES.search(k)}
    out.values_differ = True
  return out


def _gguf_forms(source: gguf_source.GGUFSource, config: dict[str, Any]) -> Forms:
  """Each GGUF tensor's values: its rows un-permuted, its blocks dequantized, its +1 or
  ``-exp`` undone, as the file's architecture says llama.cpp stored it."""
  arch = config.get("gguf_architecture")
  out = Forms(values_differ=True)
  unknown = _unknown_architecture(arch)
  for k in source.keys():
    if unknown:
      out.refused[k] = f"{k}: {unknown}"
    perm = rows_permutation(k, config)
    if isinstance(perm, str):  # matched on its shape, refused when a proposal reads it
      out.refused.setdefault(k, perm)
      perm = None
    read: ops.Recipe = ops.Source(k)
    if perm is not None:
      rows = source.logical_shape(k)[0]
      read = ops.Source(k, sel_lib.Indices(0, _unpermute(rows, perm)))
    fmt = source.quantization(k)
    form = ops.dequantize(read, fmt) if fmt else read
    if arch in NORM_PLUS_ONE and _NORM.search(k):
      form = ops.subtract_one(form)
    elif arch in NEG_EXP_A and _SSM_A.match(k):
      form = ops.neg_log(form)
    shown = k
    fused = _FUSED_UP.get(str(arch))
    if fused is not None and fused[0].match(k):
      shown = fused[0].sub(fused[1], k)
      out.hidden.add(k)
      if k in out.refused:
        out.refused[shown] = out.refused[k]
    if form != ops.Source(shown):
      out.forms[shown] = form
  return out


def _mxfp4_pair(source: source_lib.CheckpointSource, blocks: str, scales: str) -> bool:
  """Whether ``blocks`` and ``scales`` are gpt-oss MXFP4: uint8 ``[..., G, 16]`` and one byte
  per group (other tensors that happen to be named so are left as they are)."""
  b, s = source_lib.metadata_of(source, blocks), source_lib.metadata_of(source, scales)
  return (
    b.dtype == np.uint8
    and len(b.shape) >= 2
    and b.shape[-1] == 16
    and s.dtype.itemsize == 1
    and tuple(s.shape) == tuple(b.shape[:-1])
  )


def check_forms(forms: Forms, source: source_lib.CheckpointSource) -> None:
  """Every weight's values can be read, or a ``MatchError`` naming each that cannot."""
  problems = []
  for name, form in forms.forms.items():
    try:
      inference.infer(form, source)
    except errors.RecipeError as e:
      fix = (
        "; give match the block size: config={'quantization_config': "
        "{'weight_block_size': [128, 128]}} (DeepSeek-V3's)"
        if isinstance(form, ops.ScaleBlocks)
        else ""
      )
      problems.append(f"{name}: {e}{fix}")
  if problems:
    raise errors.MatchError(
      errors.collected("read the quantized checkpoint's weights", problems, "nothing was chosen"),
      tuple(problems),
    )


def _block_size(config: Any) -> tuple[int, ...] | None:
  """The FP8 block size a checkpoint's config declares (``weight_block_size``), if any."""
  q = config.get("quantization_config") if isinstance(config, dict) else None
  size = q.get("weight_block_size") if isinstance(q, dict) else None
  return tuple(int(s) for s in size) if isinstance(size, (list, tuple)) else None


class ValuesView(source_lib.BoxSource):
  """A checkpoint as its weights' values: one tensor per weight (float32 where dequantized)."""

  def __init__(self, source: source_lib.CheckpointSource, forms: Forms):
    self.source = source
    self.remote = source.remote
    self.forms = forms.forms
    self.refused = forms.refused
    shown = [k for k in source.keys() if k not in forms.hidden and k not in self.forms]
    self._keys = tuple(sorted({*shown, *self.forms}))

  def keys(self) -> tuple[str, ...]:
    return self._keys

  def metadata(self, key: str) -> source_lib.TensorMetadata:
    form = self.forms.get(key)
    if form is None:
      return source_lib.metadata_of(self.source, key)
    meta = inference.infer(form, self.source)
    return source_lib.TensorMetadata(meta.shape, meta.dtype)

  def _read(self, key: str, region: sel_lib.Region) -> np.ndarray:
    from paramreg_jax._src.restore import evaluate

    recipe = to_stored(ops.Source(key), self)
    return evaluate.evaluate(recipe, self.source, sel_lib.region_slices(region))

  @property
  def config(self) -> dict[str, Any] | None:
    return self.source.config

  @property
  def config_origin(self) -> str:  # type: ignore[override]
    return self.source.config_origin

  def __repr__(self) -> str:
    return repr(self.source)


def _unknown_architecture(arch: Any) -> str | None:
  """Why no tensor of a GGUF file of architecture ``arch`` can be read as values, or None."""
  if arch in PERMUTED | NOT_PERMUTED:
    return None
  return (
    f"which conventions llama.cpp's converter applied to the GGUF architecture {arch!r} (q/k "
    "rows permuted for its rotary layout, norms stored with 1 added, ...) is not known here "
    f"(known: {', '.join(sorted(PERMUTED | NOT_PERMUTED))}); nothing is guessed: give its "
    "recipe as a hint, or restore with recipes of your own"
  )


def rows_permutation(key: str, config: dict[str, Any]) -> int | str | None:
  """The head count whose rotary halves llama.cpp interleaved in ``key``'s rows (None: not
  permuted), or a problem."""
  m = _QK.match(key)
  arch = config.get("gguf_architecture")
  if m is None or arch not in PERMUTED:
    return None
  heads = config.get("num_attention_heads" if m.group(1) == "q" else "num_key_value_heads")
  if not isinstance(heads, int) or heads <= 0:
    return f"{key}: the GGUF metadata gives no head count, so its permuted rows cannot be undone"
  return heads


def _unpermute(rows: int, heads: int) -> tuple[int, ...]:
  """Hugging Face row ``(h, j, d)`` is llama.cpp row ``(h, d, j)`` (half ``j`` of head ``h``)."""
  dim = rows // heads // 2
  return tuple(h * 2 * dim + d * 2 + j for h in range(heads) for j in range(2) for d in range(dim))


def to_stored(recipe: ops.Recipe, view: ValuesView) -> ops.Recipe:
  """``recipe`` over the view's values rewritten to read what is stored.

  Raises:
    ValueError: a tensor whose values cannot be read (the message names it).
  """

  def stored_source(node: ops.Source) -> ops.Recipe:
    problem = view.refused.get(node.key)
    if problem is not None:
      raise ValueError(problem)
    form = view.forms.get(node.key)
    if form is None:
      return node
    if isinstance(node.selection, sel_lib.Full):
      return form
    return ops.select(form, node.selection)

  return ops.map_sources(recipe, stored_source)
