"""The checkpoint-source contract, tensor metadata, and bounded reads (leases).

A :class:`CheckpointSource` is a catalog: ``keys()`` and ``metadata(key)`` never read payload
bytes; ``read(key, index)`` reads **only** the requested box. Everything else the engine calls
(leases, batched and stacked reads, storage alignment, pinning checks) is a method of the base
class with a working default, which a source overrides where its format can do better. Every
physical read is counted in ``source.stats`` so tests and benchmarks can assert what was
touched.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import functools
import math
import threading
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any
from typing import Self

import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.sources import selection as sel_lib
from paramreg_jax._src.sources.host_memory import nbytes_of
from paramreg_jax._src.sources.host_memory import read_into_aligned
from paramreg_jax._src.sources.host_memory import stacked_buffer


def check_source(source: Any, where: str) -> CheckpointSource:
  """``source``, or a clear ``TypeError`` unless it is a :class:`CheckpointSource` (a path or a
  dict of arrays is the usual slip; a class of one's own that does not derive from it the
  other)."""
  if isinstance(source, CheckpointSource):
    return source
  own = callable(getattr(source, "keys", None)) and callable(getattr(source, "metadata", None))
  fix = (
    f"make {type(source).__name__} derive from paramreg_jax.sources.CheckpointSource (it "
    "implements keys(), metadata(key) and read(key, index); the rest has defaults)"
    if own and not isinstance(source, dict)
    else "prj.open_source(path_or_url) opens a file or URL by what it is"
  )
  raise TypeError(
    f"{where}: source must be a checkpoint source such as prj.SafetensorsSource(path), "
    f"prj.OrbaxSource(path) or prj.MemorySource(arrays); got {type(source).__name__} "
    f"{source!r:.60}; {fix}"
  )


def metadata_of(source: CheckpointSource, key: str) -> TensorMetadata:
  """``source.metadata(key)``, checked: a source of one's own must return a shape and a
  dtype."""
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


class CheckpointSource(abc.ABC):
  """A checkpoint catalog that hands out bounded reads: the one contract every source meets.

  A source of your own derives from this class and implements three methods: ``keys()``,
  ``metadata(key)`` and ``read(key, index)``. Everything else the engine calls has a working
  default built on those three (leases, ``stats``, batched and stacked reads, the storage's
  alignment, pinning checks); override one where your storage can do better. The built-in
  sources are :class:`~paramreg_jax.SafetensorsSource`, :class:`~paramreg_jax.GGUFSource`,
  :class:`~paramreg_jax.OrbaxSource` and :class:`~paramreg_jax.MemorySource`.

  ``read`` is called from several threads at once, and only for boxes inside the tensor. What
  it returns is checked against the tensor's metadata and copied, so it may be a view of
  storage the source keeps. A catalog must not change once the source exists (a checkpoint
  that changes is a new source).

  Examples:
    >>> import numpy as np
    >>> import paramreg_jax as prj
    >>> from paramreg_jax.sources import CheckpointSource, TensorMetadata
    >>> class Ramp(CheckpointSource):  # every tensor is computed, none is stored
    ...   def keys(self):
    ...     return ("w",)
    ...   def metadata(self, key):
    ...     return TensorMetadata((4, 3), np.float32)
    ...   def read(self, key, index):
    ...     return np.arange(12, dtype=np.float32).reshape(4, 3)[index]
    >>> src = Ramp()
    >>> prj.restore({"w": np.zeros((4, 3), np.float32)}, src)["w"][1].tolist()
    [3.0, 4.0, 5.0]
    >>> src.stats
    SourceStats(reads=1, bytes_read=48)
  """

  #: Whether reads go over a network: the direct path of small tensors then reads ahead in a
  #: thread (a local read is faster in the calling thread than a thread waiting for the GIL).
  remote: bool = False

  #: Where :attr:`config` comes from, in ``match``'s report.
  config_origin: str = "config.json"

  # -- to implement -------------------------------------------------------------------------
  @abc.abstractmethod
  def keys(self) -> Sequence[str]:
    """Every tensor key, in a deterministic (sorted) order."""

  @abc.abstractmethod
  def metadata(self, key: str) -> TensorMetadata:
    """Shape and dtype of ``key``, without reading payload (``self.unknown_key(key)`` is the
    error to raise for a key the source does not hold)."""

  @abc.abstractmethod
  def read(self, key: str, index: tuple[slice, ...]) -> np.ndarray:
    """The stored values of ``key`` at ``index``, reading only those bytes.

    ``index`` has one ``slice(start, stop)`` per axis, inside the tensor; the result has the
    box's shape and ``metadata(key).dtype``.
    """

  # -- what a source may override -----------------------------------------------------------
  @property
  def config(self) -> dict[str, Any] | None:
    """The model's ``config.json`` beside the weights, if the checkpoint has one (``match``
    reads head counts from it); None by default."""
    return None

  def quantization(self, key: str) -> str | None:
    """The block format ``key`` is stored in (``"Q4_K"``), or None for plain values (the
    default: a source of plain tensors). ``dequantize`` refuses any other format for it."""
    del key
    return None

  def has_companion(self, name: str) -> bool:
    """Whether a file ``name`` (``tokenizer.json``) lies beside the weights, for ``export`` to
    copy; a source without a folder has none (the default)."""
    del name
    return False

  def companion(self, name: str) -> bytes:
    """The bytes of the file ``name`` beside the weights (when :meth:`has_companion`)."""
    raise errors.SourceIOError(f"{self!r} has no file {name!r} beside its weights")

  def storage_box(self, key: str, box: sel_lib.Region) -> sel_lib.Region:
    """The smallest box the storage serves that holds ``box`` (chunk- or row-aligned).

    Reading the widened box costs no more bytes than reading ``box`` itself, and the part
    other shards need comes with it; the default serves any box as it is.
    """
    del key
    return box

  def prepare(self, keys: Sequence[str]) -> None:
    """Called once before reading ``keys``: a source may open them all at once (orbax does,
    concurrently). The default does nothing."""
    del keys

  def confirm_unchanged(self) -> None:
    """Called once after a restore's reads, before anything is kept: a source whose storage
    can change under it (a checkpoint in a bucket) raises ``SourceIOError`` if it did. The
    default does nothing."""
    return None

  def close(self) -> None:
    """Releases what the source holds open (files, connections); nothing, by default."""
    return None

  def _read(self, key: str, region: sel_lib.Region) -> np.ndarray:
    """``read(key, index)`` for a box, checked against the metadata and copied into an owned,
    64-byte aligned buffer (a source that reads boxes natively overrides this)."""
    meta = metadata_of(self, key)
    index = sel_lib.region_slices(region)
    want = sel_lib.region_shape(region)
    out = np.asarray(self.read(key, index))
    if out.shape != want or out.dtype != meta.dtype:
      raise errors.SourceIOError(
        f"{key}: {type(self).__name__}.read({key!r}, {index}) returned {out.shape} "
        f"{out.dtype.name}, expected {want} {meta.dtype.name} (that box of the stored {meta} "
        "tensor); read(key, index) must return the stored values at index, as metadata(key) "
        "describes them",
        key,
      )
    return read_into_aligned(out, meta.dtype)

  def _physical_bytes(self, key: str, region: sel_lib.Region) -> int:
    """Bytes a read of ``region`` touches; the region's own bytes unless chunked."""
    return nbytes_of(sel_lib.region_shape(region), self.metadata(key).dtype)

  def __repr__(self) -> str:
    """``Name(N tensors)``, in reports and errors (a source may say more: its path)."""
    try:
      return f"{type(self).__name__}({len(self.keys())} tensors)"
    except Exception:  # a catalog that cannot be listed right now: still a name
      return f"{type(self).__name__}()"

  def __enter__(self) -> Self:
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()

  # -- shared ------------------------------------------------------------------------------
  @property
  def _counter(self) -> _Counter:
    counter = self.__dict__.get("_paramreg_counter")
    if counter is None:  # no __init__ to call: a subclass's own __init__ need not call ours
      counter = self.__dict__.setdefault("_paramreg_counter", _Counter())
    return counter

  @property
  def stats(self) -> SourceStats:
    """Physical payload reads so far (a snapshot)."""
    counter = self._counter
    with counter.lock:
      return SourceStats(counter.reads, counter.bytes)

  def __contains__(self, key: object) -> bool:
    known = self.__dict__.get("_key_set")
    if known is None:  # a catalog never changes: one set for O(1) lookups
      known = self.__dict__["_key_set"] = frozenset(self.keys())
    return key in known

  def unknown_key(self, key: str) -> errors.UnknownTensorError:
    """The error for a key the source does not hold (with the nearest keys it does)."""
    known = self.keys()
    return errors.UnknownTensorError(
      f"{key!r} is not in {self!r} ({len(known)} tensors)"
      f"{errors.did_you_mean(str(key), known) or '.'} Check the key or add a rename"
    )

  def lease(self, key: str, selection: Any = None) -> CheckpointLease:
    """A bounded read handle on ``selection`` of ``key`` (``Full()`` by default)."""
    selection = sel_lib.check_selection(selection)
    meta = metadata_of(self, key)
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
    counter = self._counter
    with counter.lock:
      counter.reads += 1
      counter.bytes += nbytes

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
    first = metadata_of(self, keys[0])
    for key in keys[1:]:
      meta = metadata_of(self, key)
      if (meta.shape, meta.dtype) != (first.shape, first.dtype):
        raise ValueError(
          f"read_stacked needs one shape and dtype: {keys[0]!r} is {first.shape} "
          f"{first.dtype.name}, {key!r} is {meta.shape} {meta.dtype.name}"
        )
    return first.shape, first.dtype


class _Counter:
  """A source's read counts and their lock."""

  __slots__ = ("bytes", "lock", "reads")

  def __init__(self) -> None:
    self.lock = threading.Lock()
    self.reads = 0
    self.bytes = 0


class BoxSource(CheckpointSource):
  """A source that reads boxes natively (the built-in ones): it implements ``keys()``,
  ``metadata(key)`` and ``_read(key, region)``, and ``read(key, index)`` comes from those."""

  def read(self, key: str, index: tuple[slice, ...]) -> np.ndarray:
    meta = metadata_of(self, key)
    return self.read_region(key, sel_lib.normalize_index(index, meta.shape, where=key))

  @abc.abstractmethod
  def _read(self, key: str, region: sel_lib.Region) -> np.ndarray:
    """One physical read of ``region`` (inside the tensor) into an owned array."""


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

  source: CheckpointSource
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
