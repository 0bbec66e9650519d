"""``match`` on a quantized checkpoint (a ``GGUFSource``): decided on values, read as blocks.

``match`` sees a quantized source through :class:`ValuesView`: each quantized tensor has its
shape in values and a float32 dtype, so names, shapes and layouts are decided as for any
checkpoint. :func:`stored` then rewrites each proposal to read what is stored: a quantized
``source(k)`` becomes ``dequantize(source(k), format)``, and the rows of q and k that llama.cpp
permuted for its rotary layout are put back (llama-family architectures; for an architecture
whose permutation is not known, q and k are refused, never guessed).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from paramreg_jax._src.match import candidates as cand_lib
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.sources import base as source_lib
from paramreg_jax._src.sources import selection as sel_lib

# llama.cpp's converter permutes the rows of q and k for these architectures (its LlamaModel
# family), and not for these others
PERMUTED = frozenset({"llama"})
NOT_PERMUTED = frozenset({"qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3"})
_QK = re.compile(r"^blk\.\d+\.attn_([qk])\.weight$")


def is_quantized(source: Any) -> bool:
  """Whether ``source`` holds quantized tensors (it answers ``quantization(key)``)."""
  quantization = getattr(source, "quantization", None)
  return callable(quantization) and any(quantization(k) for k in source.keys())


class ValuesView(source_lib.BaseSource):
  """A quantized source as its values: metadata in values, float32; reads dequantize."""

  def __init__(self, source: Any):
    super().__init__()
    self.source = source

  def keys(self) -> tuple[str, ...]:
    return tuple(self.source.keys())

  def metadata(self, key: str) -> source_lib.TensorMetadata:
    if self.source.quantization(key) is None:
      return self.source.metadata(key)
    return source_lib.TensorMetadata(self.source.logical_shape(key), np.dtype(np.float32))

  def _read(self, key: str, region: sel_lib.Region) -> np.ndarray:
    from paramreg_jax._src.restore import evaluate

    recipe = to_stored(ops.Source(key), self.source, {})
    return evaluate.evaluate(recipe, self.source, sel_lib.region_slices(region))

  @property
  def config(self) -> Any:
    return self.source.config

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


def to_stored(recipe: ops.Recipe, source: Any, config: dict[str, Any]) -> ops.Recipe:
  """``recipe`` over values rewritten to read the stored blocks (see the module docstring).

  Raises:
    ValueError: a permutation that cannot be undone (the message names the tensor).
  """

  def stored_source(node: ops.Source) -> ops.Recipe:
    key = node.key
    fmt = source.quantization(key)
    perm = rows_permutation(key, config)
    if isinstance(perm, str):
      raise ValueError(perm)
    inner: ops.Recipe = ops.Source(key)
    if perm is not None:
      rows = source.logical_shape(key)[0] if fmt else source.metadata(key).shape[0]
      inner = ops.Source(key, sel_lib.Indices(0, _unpermute(rows, perm)))
    if fmt is not None:
      inner = ops.dequantize(inner, fmt)
    if isinstance(node.selection, sel_lib.Full):
      return inner
    if fmt is None and perm is None:
      return node
    return ops.select(inner, node.selection)

  return cand_lib.map_sources(recipe, stored_source)
