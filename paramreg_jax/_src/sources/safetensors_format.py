"""The safetensors file format: a header parsed and validated with the rules of the
``safetensors`` package (no truncation, a header inside the file, known dtypes, sizes that match
the shapes, no duplicate names, data offsets that tile the data section exactly), and regions
read by positional reads into 64-byte aligned buffers (rows only, bounded scratch)."""

from __future__ import annotations

import json
import struct
from typing import Any

import ml_dtypes
import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.sources import checkpoint_source as source_lib
from paramreg_jax._src.sources import host_memory
from paramreg_jax._src.sources import selection as sel_lib
from paramreg_jax._src.sources.storage import remote
from paramreg_jax._src.sources.storage import stores

DTYPES: dict[str, np.dtype] = {
  "BOOL": np.dtype(np.bool_),
  "U8": np.dtype(np.uint8),
  "I8": np.dtype(np.int8),
  "U16": np.dtype(np.uint16),
  "I16": np.dtype(np.int16),
  "U32": np.dtype(np.uint32),
  "I32": np.dtype(np.int32),
  "U64": np.dtype(np.uint64),
  "I64": np.dtype(np.int64),
  "F16": np.dtype(np.float16),
  "BF16": np.dtype(ml_dtypes.bfloat16),
  "F32": np.dtype(np.float32),
  "F64": np.dtype(np.float64),
  "C64": np.dtype(np.complex64),
  "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
  "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
}
if hasattr(ml_dtypes, "float8_e8m0fnu"):
  DTYPES["F8_E8M0"] = np.dtype(ml_dtypes.float8_e8m0fnu)

_MAX_HEADER = 100_000_000  # the safetensors package's own limit
INDEX_NAME = "model.safetensors.index.json"


class _DuplicateName(ValueError):
  pass


def _no_duplicate_names(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
  seen: dict[str, Any] = {}
  for key, value in pairs:
    if key in seen:
      raise _DuplicateName(f"tensor {key!r} appears twice in the header")
    seen[key] = value
  return seen


def _no_constant(token: str) -> Any:
  raise ValueError(f"{token} is not JSON")


def _non_negative_int(text: str) -> int:
  if text == "-0":  # int("-0") is 0; sizes and offsets are unsigned (safetensors refuses it)
    raise ValueError("-0 in the header, where sizes and offsets are unsigned")
  return int(text)


def _text_problem(header: dict[str, Any]) -> str | None:
  """What the safetensors format forbids beyond JSON: names that are not valid UTF-8 (lone
  surrogates), and ``__metadata__`` that is not a ``{str: str}`` object."""
  meta = header.get("__metadata__")
  if meta is not None and not (
    isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())
  ):
    return f"__metadata__ must be an object of strings, got {json.dumps(meta)[:60]}"
  texts = [*header, *(meta or {}), *(meta or {}).values()]
  for text in texts:
    try:
      text.encode("utf-8")
    except UnicodeEncodeError:
      return f"the name {text!r} is not valid UTF-8 (a lone surrogate)"
  return None


class SafetensorsFile:
  """One parsed safetensors file: ``{key: (metadata, absolute byte offset)}``."""

  def __init__(self, store: stores.LocalFile | remote.RemoteFile):
    # A local file stays open from validation to the last read: a newer save renamed over the
    # path (what a training loop saving "latest" does) cannot put other bytes under these offsets.
    self.store = store
    self.path = store.name
    self.entries: dict[str, tuple[source_lib.TensorMetadata, int]] = {}
    try:
      self._parse()
    except BaseException:
      self.close()
      raise
    drop_head = getattr(store, "drop_head", None)
    if drop_head is not None:  # a remote object's first bytes: the header is parsed now
      drop_head()

  def close(self) -> None:
    self.store.close()

  def __del__(self) -> None:
    store = getattr(self, "store", None)
    if store is not None:
      store.close()

  def _bad(self, message: str) -> errors.MalformedSafetensorsError:
    return errors.MalformedSafetensorsError(f"{self.path}: {message}; nothing was read from it")

  def _parse(self) -> None:
    try:
      size = self.store.size
      head = self.store.pread(8, 0)
      if len(head) < 8:
        raise self._bad(f"truncated: {size} bytes, shorter than the 8-byte header length")
      (n,) = struct.unpack("<Q", head)
      if n > size - 8:
        raise self._bad(f"header length {n} runs past the end of the file ({size} bytes)")
      if n > _MAX_HEADER:
        raise self._bad(f"header length {n} exceeds {_MAX_HEADER} bytes")
      raw = self.store.pread(n, 8)
    except OSError as e:
      raise errors.SourceIOError(f"{self.path}: cannot read the header: {e}") from e
    try:
      header = json.loads(
        raw.decode("utf-8"),
        object_pairs_hook=_no_duplicate_names,
        parse_constant=_no_constant,
        parse_int=_non_negative_int,
      )
    except _DuplicateName as e:
      raise self._bad(str(e)) from None
    except (UnicodeDecodeError, ValueError) as e:
      raise self._bad(f"the header is not valid JSON ({e})") from None
    except RecursionError:
      raise self._bad("the header is not valid JSON (nested too deeply to parse)") from None
    if not isinstance(header, dict):
      raise self._bad("the header is not a JSON object")
    problem = _text_problem(header)
    if problem:
      raise self._bad(problem)
    self._add_entries(header, 8 + n, size - 8 - n)

  def _add_entries(self, header: dict[str, Any], data_start: int, data_len: int) -> None:
    """Checks every tensor entry of the header and records where its bytes are."""
    spans: list[tuple[int, int, str]] = []
    for key, info in header.items():
      if key == "__metadata__":
        continue
      meta, begin, end = self._entry(key, info, data_len)
      spans.append((begin, end, key))
      self.entries[key] = (meta, data_start + begin)
    self._check_tiling(sorted(spans), data_len)

  def _entry(
    self, key: str, info: Any, data_len: int
  ) -> tuple[source_lib.TensorMetadata, int, int]:
    """One header entry checked: ``(metadata, begin, end)`` in the data section."""
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
      raise self._bad(f"tensor {key!r}: entry must have dtype, shape and data_offsets")
    dtype = DTYPES.get(info["dtype"])
    if dtype is None:
      raise self._bad(
        f"tensor {key!r}: unknown dtype {info['dtype']!r} (supported: {', '.join(sorted(DTYPES))})"
      )
    shape = info["shape"]
    if not isinstance(shape, list) or not all(
      isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
      raise self._bad(f"tensor {key!r}: shape {shape!r} must be a list of non-negative ints")
    offsets = info["data_offsets"]
    if (
      not isinstance(offsets, list)
      or len(offsets) != 2
      or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
    ):
      raise self._bad(f"tensor {key!r}: data_offsets {offsets!r} must be [begin, end]")
    begin, end = offsets
    meta = source_lib.TensorMetadata(tuple(shape), dtype)
    if not 0 <= begin <= end <= data_len:
      raise self._bad(
        f"tensor {key!r}: data_offsets [{begin}, {end}] fall outside the data section "
        f"(0..{data_len} bytes)"
      )
    if end - begin != meta.nbytes:
      raise self._bad(
        f"tensor {key!r}: data_offsets span {end - begin} bytes, but {tuple(shape)} "
        f"{info['dtype']} needs {meta.nbytes}"
      )
    return meta, begin, end

  def _check_tiling(self, spans: list[tuple[int, int, str]], data_len: int) -> None:
    """Tensors must tile the data section: each starts where the previous one ended."""
    at, last = 0, "the start of the data section"
    for begin, end, key in spans:
      if begin != at:
        what = (
          f"overlaps {last}, which ends at byte {at}"
          if begin < at
          else f"leaves a gap of {begin - at} bytes after {last}"
        )
        raise self._bad(f"tensor {key!r}: data_offsets [{begin}, {end}] {what}")
      at, last = end, f"tensor {key!r}"
    if at != data_len:
      raise self._bad(
        f"{data_len - at} bytes after the last tensor are covered by no tensor (data section "
        f"is {data_len} bytes)"
      )

  def read(self, key: str, region: sel_lib.Region) -> np.ndarray:
    """``region`` of ``key`` in a new 64-byte aligned array (positional reads on the file as
    it was validated, no mapping)."""
    meta, offset = self.entries[key]
    out = host_memory.aligned_empty(sel_lib.region_shape(region), meta.dtype)
    if out.size == 0:
      return out
    stores.read_box(self.store, offset, meta.shape, meta.dtype.itemsize, region, out, repr(key))
    return out
