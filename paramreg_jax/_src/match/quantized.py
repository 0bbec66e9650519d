"""``match`` on a quantized checkpoint: decided on values, read as stored.

A quantized checkpoint stores a weight as more than its values: GGUF block rows, an FP8 tensor
and its ``weight_scale_inv`` (or ``weight_scale``), gpt-oss's ``*_blocks`` and ``*_scales``.
``match`` sees it through :class:`ValuesView`: each such weight is one tensor, under the name
of its values, with its shape in values and a float32 dtype, so names, shapes and layouts are
decided as for any checkpoint. :func:`to_stored` then rewrites each proposal to read what is
stored (``dequantize``, ``scale_blocks``, ``mxfp4``), and puts back the rows of q and k that
llama.cpp permuted for its rotary layout (llama-family GGUF files; for a GGUF architecture
whose permutation is not known, q and k are refused, never guessed).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.match import candidates as cand_lib
from paramreg_jax._src.recipes import inference
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.sources import base as source_lib
from paramreg_jax._src.sources import selection as sel_lib

# llama.cpp's converter permutes the rows of q and k for these architectures (its LlamaModel
# family), and not for these others
PERMUTED = frozenset({"llama"})
NOT_PERMUTED = frozenset({"qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3"})
_QK = re.compile(r"^blk\.\d+\.attn_([qk])\.weight$")
_SCALE_SUFFIXES = ("_scale_inv", "_scale")  # DeepSeek-V3; compressed-tensors
_ACTIVATION_SCALES = re.compile(r"(^|\.)input_scale$")  # FP8 activation scales: not weights


def stored_forms(source: Any, config: Any = None) -> tuple[dict[str, ops.Recipe], set[str]]:
  """``({weight name: the recipe that reads its values}, keys no weight reads)`` of a quantized
  checkpoint; empty when nothing is quantized."""
  keys = list(source.keys())
  quantization = getattr(source, "quantization", None)
  if callable(quantization):  # GGUF: block rows
    return {k: ops.dequantize(ops.Source(k), q) for k in keys if (q := quantization(k))}, set()
  have = set(keys)
  forms: dict[str, ops.Recipe] = {}
  hidden: set[str] = set()
  block = _block_size(config if config is not None else getattr(source, "config", None))
  for k in keys:
    dtype = source_lib.metadata_of(source, k).dtype
    if dtype.itemsize == 1 and dtype.kind == "V" and "e8m0" not in dtype.name:  # float8
      scale = next((k + s for s in _SCALE_SUFFIXES if k + s in have), None)
      if scale is not None:
        forms[k] = ops.scale_blocks(ops.Source(k), ops.Source(scale), block)
        hidden.add(scale)
    name = k.removesuffix("_blocks")
    if name != k and name + "_scales" in have and _mxfp4_pair(source, k, name + "_scales"):
      forms[name] = ops.mxfp4(ops.Source(k), ops.Source(name + "_scales"))
      hidden |= {k, name + "_scales"}
  if forms:
    hidden |= {k for k in keys if _ACTIVATION_SCALES.search(k)}
  return forms, hidden


def _mxfp4_pair(source: Any, blocks: str, scales: str) -> bool:
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


def check_forms(forms: dict[str, ops.Recipe], source: Any) -> None:
  """Every weight's values can be read, or a ``MatchError`` naming each that cannot."""
  problems = []
  for name, form in forms.items():
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


class ValuesView(source_lib.BaseSource):
  """A quantized source as its weights' values: one float32 tensor per weight."""

  def __init__(self, source: Any, forms: dict[str, ops.Recipe], hidden: set[str]):
    super().__init__()
    self.source = source
    self.forms = forms
    shown = [k for k in source.keys() if k not in hidden and k not in forms]
    self._keys = tuple(sorted({*shown, *forms}))

  def keys(self) -> tuple[str, ...]:
    return self._keys

  def metadata(self, key: str) -> source_lib.TensorMetadata:
    form = self.forms.get(key)
    if form is None:
      return source_lib.metadata_of(self.source, key)
    return source_lib.TensorMetadata(inference.infer(form, self.source).shape, np.dtype(np.float32))

  def _read(self, key: str, region: sel_lib.Region) -> np.ndarray:
    from paramreg_jax._src.restore import evaluate

    recipe = to_stored(ops.Source(key), self, dict(self.config or {}))
    return evaluate.evaluate(recipe, self.source, sel_lib.region_slices(region))

  @property
  def config(self) -> Any:
    return getattr(self.source, "config", None)

  def __repr__(self) -> str:
    return repr(self.source)


def rows_permutation(key: str, config: dict[str, Any]) -> int | str | None:
  """The head count whose rotary halves llama.cpp interleaved in ``key``'s rows (None: not
  permuted), or a problem."""
  m = _QK.match(key)
  arch = config.get("gguf_architecture")
  if m is None or arch in NOT_PERMUTED:
    return None
  if arch not in PERMUTED:
    return (
      f"{key}: whether llama.cpp permuted the rows of q and k for its rotary layout is not "
      f"known for the GGUF architecture {arch!r} (known: {', '.join(sorted(PERMUTED))} "
      f"permuted; {', '.join(sorted(NOT_PERMUTED))} not); nothing is guessed: give its recipe "
      "as a hint"
    )
  heads = config.get("num_attention_heads" if m.group(1) == "q" else "num_key_value_heads")
  if not isinstance(heads, int) or heads <= 0:
    return f"{key}: the GGUF metadata gives no head count, so its permuted rows cannot be undone"
  return heads


def _unpermute(rows: int, heads: int) -> tuple[int, ...]:
  """Hugging Face row ``(h, j, d)`` is llama.cpp row ``(h, d, j)`` (half ``j`` of head ``h``)."""
  dim = rows // heads // 2
  return tuple(h * 2 * dim + d * 2 + j for h in range(heads) for j in range(2) for d in range(dim))


def to_stored(recipe: ops.Recipe, view: ValuesView, config: dict[str, Any]) -> ops.Recipe:
  """``recipe`` over the view's values rewritten to read what is stored.

  Raises:
    ValueError: a permutation that cannot be undone (the message names the tensor).
  """

  def stored_source(node: ops.Source) -> ops.Recipe:
    form = view.forms.get(node.key)
    gguf = callable(getattr(view.source, "quantization", None))
    perm = rows_permutation(node.key, config) if gguf else None
    if isinstance(perm, str):
      raise ValueError(perm)
    inner = form if form is not None else ops.Source(node.key)
    if perm is not None:
      rows = view.metadata(node.key).shape[0]
      picked = ops.Source(node.key, sel_lib.Indices(0, _unpermute(rows, perm)))
      inner = cand_lib.map_sources(inner, lambda s: picked if s.key == node.key else s)
    if isinstance(node.selection, sel_lib.Full):
      return inner
    if form is None and perm is None:
      return node
    return ops.select(inner, node.selection)

  return cand_lib.map_sources(recipe, stored_source)
