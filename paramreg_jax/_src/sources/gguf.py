"""``GGUFSource``: a llama.cpp ``.gguf`` file, its tensors and its metadata.

The header (metadata, tensor names, types, shapes, offsets) is parsed from the open file itself
(``gguf_format``): every count bounded by the file, tensors aligned, inside the file, whole
blocks of their type and never overlapping. Payload reads are positional reads of the rows a region needs (as for
safetensors, no memory map is kept), so a row range of a quantized tensor reads only its
blocks.

What a tensor looks like to recipes:

* ``F32``, ``F16``, ``F64``, ``BF16`` and the integer types: the values, in numpy's (and
  ml_dtypes') dtype, in row-major order (GGUF lists dimensions innermost first; they are
  reversed here, as the ``gguf`` package does);
* a block-quantized type (``Q8_0``, ``Q4_K``, ...): its raw rows, ``uint8 [..., row bytes]``;
  ``recipes.dequantize(source(key), source.quantization(key))`` gives the float32 values and
  ``match`` adds it for you.
"""

from __future__ import annotations

import functools
import os
import pathlib
from typing import Any

import ml_dtypes
import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.sources import checkpoint_source as source_lib
from paramreg_jax._src.sources import gguf_format
from paramreg_jax._src.sources import host_memory
from paramreg_jax._src.sources import selection as sel_lib
from paramreg_jax._src.sources.storage import stores

_PLAIN: dict[str, np.dtype] = {
  "F32": np.dtype(np.float32),
  "F16": np.dtype(np.float16),
  "F64": np.dtype(np.float64),
  "BF16": np.dtype(ml_dtypes.bfloat16),
  "I8": np.dtype(np.int8),
  "I16": np.dtype(np.int16),
  "I32": np.dtype(np.int32),
  "I64": np.dtype(np.int64),
}

# general.architecture -> the Hugging Face model_type, and how its keys name the config
_ARCH = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3"}
_CONFIG = {
  "block_count": "num_hidden_layers",
  "embedding_length": "hidden_size",
  "feed_forward_length": "intermediate_size",
  "context_length": "max_position_embeddings",
  "attention.head_count": "num_attention_heads",
  "attention.head_count_kv": "num_key_value_heads",
  "attention.layer_norm_rms_epsilon": "rms_norm_eps",
  "rope.freq_base": "rope_theta",
  "rope.dimension_count": "head_dim",
  "vocab_size": "vocab_size",
}


class GGUFSource(source_lib.BoxSource):
  """A ``.gguf`` file: tensors by their GGUF names, metadata as the model's config.

  Args:
    path: the ``.gguf`` file.

  Raises:
    MalformedGGUFError: not a GGUF file, a truncated or damaged one (a count larger than the
      file can hold, duplicate names), or a tensor whose bytes are not inside the file, not
      aligned or shared with another tensor (nothing is read from it).

  Examples:
    >>> import os, tempfile
    >>> import numpy as np, gguf
    >>> import paramreg_jax as prj
    >>> from paramreg_jax import recipes as R
    >>> path = os.path.join(tempfile.mkdtemp(), "tiny.gguf")
    >>> w = gguf.GGUFWriter(path, "llama")
    >>> w.add_block_count(1)
    >>> values = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    >>> q8 = gguf.GGMLQuantizationType.Q8_0
    >>> w.add_tensor("blk.0.ffn_up.weight", gguf.quants.quantize(values, q8), raw_dtype=q8)
    >>> w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    >>> src = prj.GGUFSource(path)
    >>> src.metadata("blk.0.ffn_up.weight"), src.quantization("blk.0.ffn_up.weight")
    (TensorMetadata(shape=(2, 34), dtype=dtype('uint8'), nbytes=68), 'Q8_0')
    >>> r = R.dequantize(R.source("blk.0.ffn_up.weight"), "Q8_0")
    >>> bool(np.abs(R.evaluate(r, src) - values).max() < 0.01), src.config["num_hidden_layers"]
    (True, 1)
  """

  config_origin = "the GGUF metadata"  # what Match reports its facts came from

  def __init__(self, path: str | os.PathLike[str]):
    super().__init__()
    self.path = pathlib.Path(path)
    self._file = stores.LocalFile(self.path)
    try:
      self._entries, self._fields = _parse(self.path, self._file)
    except BaseException:
      self._file.close()
      raise

  def keys(self) -> tuple[str, ...]:
    return tuple(self._entries)

  def metadata(self, key: str) -> source_lib.TensorMetadata:
    entry = self._entries.get(key)
    if entry is None:
      raise self.unknown_key(key)
    return entry[0]

  def quantization(self, key: str) -> str | None:
    """The block format of ``key`` (``"Q4_K"``), or None for plain values."""
    self.metadata(key)
    return self._entries[key][2]

  def logical_shape(self, key: str) -> tuple[int, ...]:
    """``key``'s shape in values (for a quantized tensor: not its bytes)."""
    self.metadata(key)
    return self._entries[key][3]

  def _read(self, key: str, region: sel_lib.Region) -> np.ndarray:
    meta, offset, _, _ = self._entries[key]
    out = host_memory.aligned_empty(sel_lib.region_shape(region), meta.dtype)
    if out.size:
      stores.read_box(self._file, offset, meta.shape, meta.dtype.itemsize, region, out, repr(key))
    return out

  def storage_box(self, key: str, box: sel_lib.Region) -> sel_lib.Region:
    """``box`` widened to whole rows: a row of blocks is contiguous in the file."""
    return source_lib.whole_rows(box, self.metadata(key).shape)

  @property
  def gguf_metadata(self) -> dict[str, Any]:
    """Every metadata field of the file (``general.architecture``, ``llama.block_count``, ...)
    with its value; token lists are left out (``tokenizer.ggml.*``)."""
    return dict(self._fields)

  @functools.cached_property
  def config(self) -> dict[str, Any]:
    """The model's description in Hugging Face's words, from the GGUF metadata (``match``
    reads it as it reads a ``config.json``): ``model_type``, layer and head counts, norm
    epsilon, rope base, and ``tie_word_embeddings`` (no ``output.weight`` tensor)."""
    arch = self._fields.get("general.architecture")
    out: dict[str, Any] = {"gguf_architecture": arch}
    if isinstance(arch, str):
      out["model_type"] = _ARCH.get(arch, arch)
      for suffix, name in _CONFIG.items():
        value = self._fields.get(f"{arch}.{suffix}")
        if value is not None:
          out[name] = value
    out["tie_word_embeddings"] = "output.weight" not in self._entries
    return out

  def close(self) -> None:
    """Closes the file (it stays open from validation to the last read)."""
    self._file.close()

  def __repr__(self) -> str:
    return f"GGUFSource({str(self.path)!r}, {len(self._entries)} tensors)"


def _parse(path: pathlib.Path, file: stores.LocalFile) -> tuple[dict[str, Any], dict[str, Any]]:
  """``({key: (metadata, offset, format, logical shape)}, {field: value})`` from the header,
  read through ``file`` (the descriptor the tensors are read from)."""
  try:
    import gguf
  except ImportError:  # pragma: no cover - the extra is missing
    raise ImportError(
      "GGUFSource needs the gguf package: pip install 'paramreg-jax[gguf]'"
    ) from None
  size = file.size
  header = gguf_format.parse(file, size, str(path))
  entries = {t.name: _entry(path, t, gguf) for t in header.tensors}
  gguf_format.check_layout(
    str(path), [(k, e[1], e[1] + e[0].nbytes) for k, e in entries.items()], size
  )
  return entries, header.fields


def _entry(path: pathlib.Path, tensor: gguf_format.TensorInfo, gguf: Any) -> tuple[Any, ...]:
  """One tensor's catalog entry: its stored metadata, offset, format and shape in values."""
  name = tensor.name
  try:
    kind_type = gguf.GGMLQuantizationType(tensor.type_id)
  except ValueError:
    raise errors.MalformedGGUFError(
      f"{path}: tensor {name!r} has GGUF type {tensor.type_id}, which no GGUF reader knows; "
      "nothing was read from it"
    ) from None
  kind = kind_type.name
  logical = tuple(int(d) for d in reversed(tensor.dims))
  block, nbytes = gguf.GGML_QUANT_SIZES[kind_type]
  if logical and logical[-1] % block:
    raise errors.MalformedGGUFError(
      f"{path}: tensor {name!r}: rows of {logical[-1]} values are not whole {kind} blocks of "
      f"{block}; nothing was read from it"
    )
  if kind in _PLAIN:
    meta = source_lib.TensorMetadata(logical, _PLAIN[kind])
    quant = None
  else:
    raw = (*logical[:-1], logical[-1] // block * nbytes) if logical else (nbytes,)
    meta = source_lib.TensorMetadata(raw, np.dtype(np.uint8))
    quant = kind
  return meta, tensor.offset, quant, logical
