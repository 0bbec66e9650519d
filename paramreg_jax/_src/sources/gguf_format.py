"""The GGUF file format: the header parsed and validated from the open file itself.

The header is read through the descriptor the tensors are read from later, so the file that
was validated is the file that is read (a file renamed over the path after opening changes
nothing). Every count the header states (string lengths, array lengths, tensor and key
counts, dimensions) is checked against the bytes left in the file before anything is
allocated for it, and the layout is checked as llama.cpp checks it: a known version, no
duplicate keys or tensor names, at most 4 dimensions, a power-of-two ``general.alignment``,
tensor offsets that are multiples of it, and tensors that lie inside the file without
overlapping. Any failure is a ``MalformedGGUFError`` naming the file, and the tensor or key
where one is involved.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

from paramreg_jax._src import errors

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_DIMS = 4  # llama.cpp's GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32
_CHUNK = 1 << 20  # the header is read this many bytes at a time

# value type id -> (struct code, size); 8 is a string, 9 an array
_SCALARS: dict[int, tuple[str, int]] = {
  0: ("B", 1),
  1: ("b", 1),
  2: ("H", 2),
  3: ("h", 2),
  4: ("I", 4),
  5: ("i", 4),
  6: ("f", 4),
  7: ("?", 1),
  10: ("Q", 8),
  11: ("q", 8),
  12: ("d", 8),
}
_STRING, _ARRAY = 8, 9
_SKIPPED = ("tokenizer.ggml.",)  # token lists: walked over, never decoded


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  """One tensor of the header: its GGUF type id, dimensions (as GGUF lists them, innermost
  first) and absolute byte offset in the file."""

  name: str
  type_id: int
  dims: tuple[int, ...]
  offset: int


@dataclasses.dataclass(frozen=True)
class Header:
  fields: dict[str, Any]
  tensors: list[TensorInfo]
  alignment: int
  data_start: int


class _Cursor:
  """Sequential little-endian reads of the header through ``pread``, bounded by the file."""

  def __init__(self, file: Any, size: int, where: str):
    self.file, self.size, self.where = file, size, where
    self.pos = 0
    self._buf = b""
    self._buf_at = 0

  def left(self) -> int:
    return self.size - self.pos

  def take(self, n: int, what: str) -> bytes:
    if n > self.left():
      raise self.error(f"{what} needs {n} bytes at offset {self.pos}, the file has {self.left()}")
    start = self.pos - self._buf_at
    if start + n > len(self._buf):
      self._buf = self.file.pread(max(n, _CHUNK), self.pos)
      self._buf_at, start = self.pos, 0
      if len(self._buf) < n:
        raise self.error(f"{what}: the file ended at offset {self.pos + len(self._buf)}")
    self.pos += n
    return self._buf[start : start + n]

  def scalar(self, code: str, size: int, what: str) -> Any:
    return struct.unpack("<" + code, self.take(size, what))[0]

  def count(self, what: str, each: int) -> int:
    """A u64 count of items of at least ``each`` bytes, bounded by what the file holds."""
    n = self.scalar("Q", 8, what)
    if n * each > self.left():
      raise self.error(
        f"{what} claims {n} items of at least {each} bytes, but {self.left()} bytes are left"
      )
    return n

  def string(self, what: str) -> bytes:
    return self.take(self.count(what, 1), what)

  def error(self, message: str) -> errors.MalformedGGUFError:
    return errors.MalformedGGUFError(f"{self.where}: {message}; nothing was read from it")


def parse(file: Any, size: int, where: str) -> Header:
  """The validated header of the GGUF file open as ``file`` (``pread(n, offset)``)."""
  cur = _Cursor(file, size, where)
  if cur.left() < 24 or cur.take(4, "the magic") != MAGIC:
    raise errors.MalformedGGUFError(
      f"{where}: not a readable GGUF file (no GGUF magic); nothing was read from it"
    )
  version = cur.scalar("I", 4, "the version")
  if version not in VERSIONS:
    swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
    kind = "a big-endian file, which" if swapped in VERSIONS else f"version {version}, which"
    raise cur.error(
      f"{kind} is not supported (little-endian GGUF versions {', '.join(map(str, VERSIONS))})"
    )
  n_tensors = cur.count("the tensor count", 24)  # name length, dims, type, offset
  n_fields = cur.count("the metadata count", 13)  # key length, type, one byte
  fields = {}
  for _ in range(n_fields):
    key = _text(cur.string("a metadata key"), cur, "a metadata key")
    if key in fields:
      raise cur.error(f"metadata key {key!r} appears twice")
    fields[key] = _value(cur, cur.scalar("I", 4, f"{key}'s type"), key)
  tensors = _tensor_infos(cur, n_tensors)
  alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
  if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
    raise cur.error(f"general.alignment is {alignment!r}, not a power of two")
  data_start = -(-cur.pos // alignment) * alignment
  placed = []
  for t in tensors:
    if t.offset % alignment:
      raise cur.error(
        f"tensor {t.name!r} starts at data offset {t.offset}, not a multiple of "
        f"general.alignment ({alignment})"
      )
    placed.append(dataclasses.replace(t, offset=data_start + t.offset))
  visible = {k: v for k, v in fields.items() if not k.startswith(_SKIPPED)}
  return Header(visible, placed, alignment, data_start)


def check_layout(where: str, spans: list[tuple[str, int, int]], size: int) -> None:
  """Tensors ``(name, start, stop)`` lie inside the file and no two share a byte."""
  last_name, last_stop = "", 0
  for name, start, stop in sorted(spans, key=lambda s: (s[1], s[2])):
    if stop > size:
      raise errors.MalformedGGUFError(
        f"{where}: tensor {name!r} needs bytes {start}..{stop}, but the file has {size} "
        "(truncated?); nothing was read from it"
      )
    if start < last_stop:
      raise errors.MalformedGGUFError(
        f"{where}: tensors {last_name!r} and {name!r} overlap (bytes {start}..{last_stop} "
        "belong to both): one would be read with the other's bytes; nothing was read from it"
      )
    if stop > last_stop:
      last_name, last_stop = name, stop


def _tensor_infos(cur: _Cursor, n: int) -> list[TensorInfo]:
  out, seen = [], set()
  for _ in range(n):
    name = _text(cur.string("a tensor name"), cur, "a tensor name")
    if name in seen:
      raise cur.error(f"tensor {name!r} appears twice")
    seen.add(name)
    n_dims = cur.scalar("I", 4, f"tensor {name!r}'s rank")
    if n_dims > MAX_DIMS:
      raise cur.error(f"tensor {name!r} has {n_dims} dimensions; GGUF allows {MAX_DIMS}")
    dims = tuple(cur.scalar("Q", 8, f"tensor {name!r}'s shape") for _ in range(n_dims))
    type_id = cur.scalar("I", 4, f"tensor {name!r}'s type")
    offset = cur.scalar("Q", 8, f"tensor {name!r}'s offset")
    out.append(TensorInfo(name, type_id, dims, offset))
  return out


def _value(cur: _Cursor, type_id: int, key: str, *, in_array: bool = False) -> Any:
  if type_id in _SCALARS:
    code, size = _SCALARS[type_id]
    return cur.scalar(code, size, key)
  if type_id == _STRING:
    return _text(cur.string(key), cur, key, strict=False)
  if type_id == _ARRAY and not in_array:
    item = cur.scalar("I", 4, f"{key}'s item type")
    if item == _ARRAY:
      raise cur.error(f"metadata {key!r} is an array of arrays, which GGUF readers refuse")
    if item not in _SCALARS and item != _STRING:
      raise cur.error(f"metadata {key!r} has items of unknown type {item}")
    each = _SCALARS[item][1] if item in _SCALARS else 8
    n = cur.count(f"metadata {key!r}", each)
    if key.startswith(_SKIPPED):  # walked over: a vocabulary is not config
      if item == _STRING:
        for _ in range(n):
          cur.take(cur.count(key, 1), key)
      else:
        cur.take(n * each, key)
      return None
    if item in _SCALARS:
      code, size = _SCALARS[item]
      return list(struct.unpack(f"<{n}{code}", cur.take(n * size, key)))
    return [_value(cur, item, key, in_array=True) for _ in range(n)]
  raise cur.error(f"metadata {key!r} has unknown type {type_id}")


def _text(raw: bytes, cur: _Cursor, what: str, *, strict: bool = True) -> Any:
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError:
    if strict:
      raise cur.error(f"{what} is not UTF-8 ({raw[:40]!r})") from None
    return None
