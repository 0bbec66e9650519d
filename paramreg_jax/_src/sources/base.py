"""The checkpoint-source protocol, tensor metadata, and bounded reads (leases).

A :class:`CheckpointSource` is a catalog: ``keys()`` and ``metadata(key)`` never read payload
bytes. ``lease(key, selection)`` hands out a :class:`CheckpointLease`, a handle on one tensor
selection whose ``read(index)`` reads **only** the requested region. Every physical read is
counted in ``source.stats`` so tests and benchmarks can assert what was touched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import sys
import threading
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any
from typing import Protocol
from typing import Self
from typing import runtime_checkable

import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.sources import selection as sel_lib


def check_source(source: Any, where: str) -> None:
  """A clear ``TypeError`` unless ``source`` is a checkpoint source (it has ``keys`` and
  ``metadata``): a path or a dict of arrays is the usual slip."""
  if not (callable(getattr(source, "keys", None)) and callable(getattr(source, "metadata", None))):
    raise TypeError(
      f"{where}: source must be a checkpoint source such as prj.SafetensorsSource(path), "
      f"prj.OrbaxSource(path) or prj.MemorySource(arrays); got {type(source).__name__} "
      f"{source!r:.60}"
    )


def quantization_of(source: Any, key: str) -> str | None:
  """The block format ``source`` records for ``key``, or None (plain values, or a source that
  records none)."""
  record = getattr(source, "quantization", None)
  return record(key) if callable(record) else None


def metadata_of(source: Any, key: str) -> TensorMetadata:
  """``source.metadata(key)``, checked: a duck-typed source must return a shape and a dtype."""
  meta = source.metadata(key)
  if isinstance(meta, TensorMetadata):
    return meta
  shape, dtype = getattr(meta, "shape", None), getattr(meta, "dtype", None)
  if shape is None or dtype is None:
    raise TypeError(
      f"{type(source).__name__}.metadata({key!r}) returned {type(meta).__name__} {meta!r:.40}; "
      "a checkpoint source's metadata(key) must return a TensorMetadata(shape, dtype)"
    )
  return TensorMetadata(tuple(shape), np.dtype(dtype))


def has_key(source: Any, key: str) -> bool:
  """Whether ``source`` holds ``key``: O(1) for our sources, any protocol object otherwise."""
  if isinstance(source, BaseSource):
    return key in source
  return key in source.keys()


def nbytes_of(shape: Sequence[int], dtype: Any) -> int:
  size = 1
  for d in shape:
    size *= int(d)
  return size * np.dtype(dtype).itemsize


HOST_ALIGNMENT = 64


def aligned_empty(shape: Sequence[int], dtype: Any) -> np.ndarray:
  """An uninitialised C-order array whose data is 64-byte aligned.

  ``jax.device_put`` on the CPU backend adopts such a buffer without copying it, so reading a
  region straight into one saves a full copy per shard.
  """
  dtype = np.dtype(dtype)
  n = nbytes_of(shape, dtype)
  if n >= _HUGE_MIN and _huge_pages():
    raw = np.empty(n + _HUGE, np.uint8)
    offset = (-raw.ctypes.data) % _HUGE
    _madvise_huge(raw.ctypes.data + offset, n - n % _HUGE)
  else:
    raw = np.empty(n + HOST_ALIGNMENT, np.uint8)
    offset = (-raw.ctypes.data) % HOST_ALIGNMENT
  return raw[offset : offset + n].view(dtype).reshape(tuple(shape))


_HUGE = 2 * 2**20
_HUGE_MIN = 4 * 2**20
_MADV_HUGEPAGE = 14


@functools.cache
def _huge_pages() -> bool:
  """Whether restore buffers of 4 MiB and more ask for transparent huge pages: on Linux unless
  ``PARAMREG_HUGEPAGES=0``. Huge pages make the first-touch page faults of large restored
  arrays cheaper (docs/benchmarks.md); only whole 2 MiB pages inside the buffer are advised, so
  no page outside the array becomes resident."""
  return sys.platform == "linux" and os.environ.get("PARAMREG_HUGEPAGES") != "0"


def _madvise_huge(address: int, length: int) -> None:
  """``madvise(MADV_HUGEPAGE)``; a kernel without THP refuses it, which changes nothing."""
  import ctypes

  try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(length), _MADV_HUGEPAGE)
  except (OSError, AttributeError):
    pass


def read_into_aligned(value: Any, dtype: Any) -> np.ndarray:
  """``np.array(value)`` (one copy), into a 64-byte aligned buffer."""
  out = aligned_empty(np.shape(value), dtype)
  np.copyto(out, value, casting="no")
  return out


@dataclasses.dataclass(frozen=True)
class TensorMetadata:
  """What a checkpoint says about one tensor, known without reading it.

  Attributes:
    shape: the stored shape.
    dtype: the stored numpy dtype (ml_dtypes for bfloat16 and float8).
    nbytes: the stored payload size; ``-1`` (the default) computes it from shape and dtype.

  Examples:
    >>> import numpy as np
    >>> from paramreg_jax.sources import TensorMetadata
    >>> TensorMetadata((2, 3), np.float32)
    TensorMetadata(shape=(2, 3), dtype=dtype('float32'), nbytes=24)
  """

  shape: tuple[int, ...]
  dtype: np.dtype
  nbytes: int = -1

  def __post_init__(self) -> None:
    object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
    object.__setattr__(self, "dtype", np.dtype(self.dtype))
    if self.nbytes < 0:
      object.__setattr__(self, "nbytes", nbytes_of(self.shape, self.dtype))

  @classmethod
  def of(cls, shape: tuple[int, ...], dtype: np.dtype) -> TensorMetadata:
    """Without validation, for a shape of ints and a ``np.dtype`` derived from validated
    metadata (recipe inference builds one per node: 300,000 for a 50,000-tensor MoE match)."""
    out = object.__new__(cls)
    object.__setattr__(out, "shape", shape)
    object.__setattr__(out, "dtype", dtype)
    object.__setattr__(out, "nbytes", math.prod(shape) * dtype.itemsize)
    return out

  def __str__(self) -> str:
    return f"{self.shape} {self.dtype.name}"


@dataclasses.dataclass(frozen=True)
class SourceStats:
  """Physical payload reads of a source so far (a snapshot).

  Attributes:
    reads: the number of physical reads (a coalesced run of blocks counts once).
    bytes_read: the payload bytes those reads fetched.

  Examples:
    >>> import numpy as np
    >>> from paramreg_jax import MemorySource
    >>> src = MemorySource({"w": np.ones((4, 2), np.float32)})
    >>> _ = src.lease("w").read((slice(0, 1),))
    >>> src.stats
    SourceStats(reads=1, bytes_read=8)
  """

  reads: int = 0
  bytes_read: int = 0

  def __sub__(self, other: SourceStats) -> SourceStats:
    return SourceStats(self.reads - other.reads, self.bytes_read - other.bytes_read)


@runtime_checkable
class CheckpointSource(Protocol):
  """A checkpoint catalog that hands out bounded reads.

  Implementations: :class:`~paramreg_jax.OrbaxSource`,
  :class:`~paramreg_jax.SafetensorsSource`, :class:`~paramreg_jax.MemorySource`.

  Examples:
    >>> import numpy as np
    >>> from paramreg_jax.sources import CheckpointSource
    >>> from paramreg_jax import MemorySource
    >>> isinstance(MemorySource({"w": np.zeros(2)}), CheckpointSource)
    True
  """

  def keys(self) -> tuple[str, ...]:
    """Every tensor key, in a deterministic (sorted) order."""
    ...

  def metadata(self, key: str) -> TensorMetadata:
    """Shape, dtype and bytes of ``key``, without reading payload."""
    ...

  def lease(self, key: str, selection: Any = None) -> CheckpointLease:
    """A bounded read handle on ``selection`` of ``key``."""
    ...

  @property
  def stats(self) -> SourceStats:
    """Physical payload reads so far."""
    ...


def stacked_buffer(
  out: np.ndarray | None, n: int, shape: tuple[int, ...], dtype: np.dtype
) -> np.ndarray:
  """``out`` checked to hold ``n`` tensors of ``shape`` and ``dtype`` stacked, or a new
  aligned buffer for them."""
  if out is None:
    return aligned_empty((n, *shape), dtype)
  if out.shape != (n, *shape) or out.dtype != dtype or not out.flags.c_contiguous:
    raise ValueError(
      f"read_stacked(out=...) needs a C-contiguous {(n, *shape)} {dtype.name} array, got "
      f"{out.shape} {out.dtype.name}{'' if out.flags.c_contiguous else ' (not contiguous)'}"
    )
  return out


class BaseSource:
  """Shared machinery: key checks, leases and read accounting. Subclasses implement
  ``keys()``, ``metadata(key)`` (from their catalog) and ``_read(key, region)``.

  A catalog must not change once the source exists: key lookups and recipe inference are
  cached per source (a checkpoint that changes is a new source)."""

  #: Whether reads go over a network: the direct path of small tensors then reads ahead in a
  #: thread (a local read is faster in the calling thread than a thread waiting for the GIL).
  remote: bool = False

  def __init__(self) -> None:
    self._lock = threading.Lock()
    self._reads = 0
    self._bytes = 0

  # -- to implement -------------------------------------------------------------------------
  def keys(self) -> tuple[str, ...]:
    raise NotImplementedError

  def metadata(self, key: str) -> TensorMetadata:
    raise NotImplementedError

  def _read(self, key: str, region: sel_lib.Region) -> np.ndarray:
    raise NotImplementedError

  def _physical_bytes(self, key: str, region: sel_lib.Region) -> int:
    """Bytes a read of ``region`` touches; the region's own bytes unless chunked."""
    return nbytes_of(sel_lib.region_shape(region), self.metadata(key).dtype)

  def quantization(self, key: str) -> str | None:
    """The block format ``key`` is stored in (``"Q4_K"``), or None for plain values (the
    default: a source of plain tensors). ``dequantize`` refuses any other format for it."""
    del key
    return None

  def prepare(self, keys: Sequence[str]) -> None:
    """Called once before reading ``keys``: a source may open them all at once (orbax does,
    concurrently). The default does nothing."""
    del keys

  def confirm_unchanged(self) -> None:
    """Called once after a restore's reads, before anything is kept: a source whose storage
    can change under it (a checkpoint in a bucket) raises ``SourceIOError`` if it did. The
    default does nothing."""

  def close(self) -> None:
    """Releases what the source holds open (files, connections); nothing, by default."""

  def __enter__(self) -> Self:
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()

  def storage_box(self, key: str, box: sel_lib.Region) -> sel_lib.Region:
    """The smallest box the storage serves that holds ``box`` (chunk- or row-aligned).

    Reading the widened box costs no more bytes than reading ``box`` itself, and the part
    other shards need comes with it; the default (memory) serves any box as it is.
    """
    del key
    return box

  # -- shared ------------------------------------------------------------------------------
  @property
  def stats(self) -> SourceStats:
    with self._lock:
      return SourceStats(self._reads, self._bytes)

  def __contains__(self, key: object) -> bool:
    known = self.__dict__.get("_key_set")
    if known is None:  # a catalog never changes: one set for O(1) lookups
      known = self.__dict__["_key_set"] = frozenset(self.keys())
    return key in known

  def unknown_key(self, key: str) -> errors.UnknownTensorError:
    known = self.keys()
    return errors.UnknownTensorError(
      f"{key!r} is not in {self!r} ({len(known)} tensors)"
      f"{errors.did_you_mean(str(key), known) or '.'} Check the key or add a rename"
    )

  def lease(self, key: str, selection: Any = None) -> CheckpointLease:
    selection = sel_lib.check_selection(selection)
    meta = self.metadata(key)
    shape = selection.apply_shape(meta.shape, where=key)
    return CheckpointLease(self, key, selection, meta, shape)

  def read_region(self, key: str, region: sel_lib.Region) -> np.ndarray:
    """One physical read of ``region`` of ``key`` (counted in ``stats``)."""
    with self.reading(key, region):
      out = self._read(key, region)
    self.count_read(key, region)
    return out

  @contextlib.contextmanager
  def reading(self, key: str, region: sel_lib.Region) -> Iterator[None]:
    """Names ``key`` in whatever a read of ``region`` of it raises: an I/O or decoding error
    becomes the ``SourceIOError`` of :meth:`read_failed`, a ``SourceIOError`` that names no
    tensor gets this one, and an interrupt is tagged with it (``.paramreg_source_key``)."""
    try:
      yield
    except errors.SourceIOError as e:
      if e.key is None:  # the source did not say which tensor: it is this one
        e.key = key
      raise
    except errors.ParamRegError:
      raise
    except (OSError, ValueError, RuntimeError) as e:
      raise self.read_failed(key, region, e) from e
    except KeyboardInterrupt as e:
      e.paramreg_source_key = key  # type: ignore[attr-defined]
      raise

  def read_failed(
    self, key: str, region: sel_lib.Region, cause: BaseException
  ) -> errors.SourceIOError:
    """The error for a failed physical read (one message for every source)."""
    return errors.SourceIOError(
      f"{key}: reading {sel_lib.region_slices(region)} failed: {cause}", key
    )

  def count_read(self, key: str, region: sel_lib.Region) -> None:
    """Records one physical read of ``region`` in ``stats``."""
    self.count_run(self._physical_bytes(key, region))

  def count_run(self, nbytes: int) -> None:
    """Records one physical read of ``nbytes`` (one region, or several tensors at once)."""
    with self._lock:
      self._reads += 1
      self._bytes += nbytes

  def start_reads(
    self, requests: Sequence[tuple[str, sel_lib.Region]]
  ) -> Callable[[], list[np.ndarray]]:
    """Begins reading ``requests``; the returned function finishes and returns them.

    Sources with asynchronous I/O (orbax) issue the reads here; the default reads when the
    function is called (positional reads are synchronous).
    """
    return functools.partial(self.read_many, list(requests))

  def read_many(self, requests: Sequence[tuple[str, sel_lib.Region]]) -> list[np.ndarray]:
    """Several physical reads; sources that can overlap I/O (orbax) issue them concurrently.

    An interrupt is tagged with the key being read (``.paramreg_source_key``).
    """
    return [self.read_region(key, region) for key, region in requests]

  def read_stacked(self, keys: Sequence[str], out: np.ndarray | None = None) -> np.ndarray:
    """The whole tensors ``keys`` (one shape and dtype) stacked along a new first axis, in a
    64-byte aligned buffer (or into ``out``, C-contiguous, of that shape and dtype).

    Sources that store tensors back to back (safetensors) read each run of adjacent ones in
    one physical read; the default reads them one by one.

    Examples:
      >>> import numpy as np
      >>> from paramreg_jax import MemorySource
      >>> src = MemorySource({"a": np.zeros(2, np.float32), "b": np.ones(2, np.float32)})
      >>> src.read_stacked(["b", "a"]).tolist()
      [[1.0, 1.0], [0.0, 0.0]]
    """
    shape, dtype = self.stacked_layout(keys)
    out = stacked_buffer(out, len(keys), shape, dtype)
    full = sel_lib.full_region(shape)
    for i, value in enumerate(self.read_many([(key, full) for key in keys])):
      out[i] = value
    return out

  def stacked_layout(self, keys: Sequence[str]) -> tuple[tuple[int, ...], np.dtype]:
    """The one ``(shape, dtype)`` of ``keys`` (for :meth:`read_stacked`)."""
    if not keys:
      raise ValueError("read_stacked needs at least one key")
    first = self.metadata(keys[0])
    for key in keys[1:]:
      meta = self.metadata(key)
      if (meta.shape, meta.dtype) != (first.shape, first.dtype):
        raise ValueError(
          f"read_stacked needs one shape and dtype: {keys[0]!r} is {first.shape} "
          f"{first.dtype.name}, {key!r} is {meta.shape} {meta.dtype.name}"
        )
    return first.shape, first.dtype


@dataclasses.dataclass(frozen=True, eq=False)
class CheckpointLease:
  """A bounded read of one tensor selection. ``read(index)`` reads only that region.

  Handed out by a source's ``lease(key, selection)``.

  Attributes:
    source: the source it reads from.
    key: the tensor's key in the source.
    selection: ``Full()``, ``Range`` or ``Indices``.
    metadata: the stored tensor's metadata.
    shape: the shape after the selection.

  Examples:
    >>> import numpy as np
    >>> from paramreg_jax import MemorySource, Range
    >>> src = MemorySource({"w": np.arange(12, dtype=np.float32).reshape(4, 3)})
    >>> lease = src.lease("w", Range(0, 1, 3))
    >>> lease.shape, lease.read((slice(1, 2), slice(0, 2))).tolist()
    ((2, 3), [[6.0, 7.0]])
  """

  source: BaseSource
  key: str
  selection: sel_lib.Selection
  metadata: TensorMetadata
  shape: tuple[int, ...]

  @property
  def dtype(self) -> np.dtype:
    return self.metadata.dtype

  @property
  def nbytes(self) -> int:
    return nbytes_of(self.shape, self.metadata.dtype)

  def read(self, index: Any = None) -> np.ndarray:
    """Reads ``index`` (a tuple of slices into ``self.shape``; ``None`` for all of it)."""
    region = sel_lib.normalize_index(index, self.shape, where=self.key)
    return sel_lib.read_selected(
      lambda r: self.source.read_region(self.key, r), self.selection, region, self.dtype
    )


def whole_rows(box: sel_lib.Region, shape: tuple[int, ...]) -> sel_lib.Region:
  """``box`` widened to whole rows (leading-axis slices): a row-major tensor in a file costs a
  column block the rows it crosses, and those rows serve every column block at once."""
  return box[:1] + tuple((0, d) for d in shape[1:]) if box else box
