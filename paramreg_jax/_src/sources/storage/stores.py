"""Byte stores under a safetensors file on this machine: a file, and the folder it lives in.

Both answer what a safetensors source asks a store (``remote.py`` has the same for URLs):
``size`` and ``pread_into(array, offset, what)`` (fill a C-contiguous array from a byte offset,
or raise ``SourceIOError`` naming the file and ``what``).

``LocalFile`` keeps the validated file open until ``close()`` and reads positionally (no memory
map: a file that shrinks gives a short read, an error, never a ``SIGBUS``); a read holds the
descriptor while it uses it, so ``close()`` during a read never lets it land on a reused one.
"""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import threading
from typing import Any

import numpy as np

from paramreg_jax._src import errors

# A strided region (columns of a matrix) is read as whole rows through a scratch buffer of at
# most this many bytes at a time; contiguous regions go straight into the output buffer.
SCRATCH_BYTES = 8 * 1024 * 1024


# A contiguous read of at least 2 * PART_BYTES is split into up to PARALLEL_PARTS parts of at
# least PART_BYTES, read by a shared pool (pread releases the GIL).
PART_BYTES = 2 * 1024 * 1024
PARALLEL_PARTS = 8
_POOL: list[concurrent.futures.ThreadPoolExecutor] = []
_POOL_LOCK = threading.Lock()


def _parts(n: int) -> list[tuple[int, int]]:
  """``[0, n)`` cut into the byte ranges read at once (one range below ``2 * PART_BYTES``)."""
  count = max(1, min(PARALLEL_PARTS, n // PART_BYTES))
  step = -(-n // count)
  step += -step % 4096  # page-aligned parts
  return [(a, min(n, a + step)) for a in range(0, n, step)]


def _io_pool() -> concurrent.futures.ThreadPoolExecutor:
  with _POOL_LOCK:
    if not _POOL:
      _POOL.append(
        concurrent.futures.ThreadPoolExecutor(PARALLEL_PARTS, thread_name_prefix="paramreg-io")
      )
    return _POOL[0]


def is_url(path: Any) -> bool:
  text = os.fspath(path) if isinstance(path, os.PathLike) else path
  return isinstance(text, str) and "://" in text and not text.startswith("file://")


class LocalFile:
  """A local file, open from validation to the last read. Reads hold the descriptor while they
  use it: ``close()`` while a read is in flight closes it when that read is done, and refuses
  new reads, so no read can land on a descriptor number the system gave to another file."""

  def __init__(self, path: pathlib.Path):
    self.name: Any = path
    self.fd = -1
    self._lock = threading.Lock()
    self._users = 0
    self._closing = False
    try:
      self.fd = os.open(path, os.O_RDONLY)
    except OSError as e:
      raise errors.SourceIOError(f"{path}: cannot open: {e}") from e

  def _acquire(self) -> int:
    with self._lock:
      if self.fd < 0 or self._closing:
        raise errors.SourceIOError(f"{self.name}: the source was closed; open it again to read")
      self._users += 1
      return self.fd

  def _release(self) -> None:
    with self._lock:
      self._users -= 1
      if self._closing and self._users == 0 and self.fd >= 0:
        os.close(self.fd)
        self.fd = -1

  @property
  def size(self) -> int:
    fd = self._acquire()
    try:
      return os.fstat(fd).st_size
    finally:
      self._release()

  def pread(self, n: int, offset: int) -> bytes:
    fd = self._acquire()
    try:
      return os.pread(fd, n, offset)
    finally:
      self._release()

  def pread_into(self, array: np.ndarray, offset: int, what: str) -> None:
    """Fills the C-contiguous ``array`` from ``offset``; a short read (the file shrank) is an
    error. A large read is split into parts read at once (``PARALLEL_PARTS``): a cold disk
    serves several requests faster than one, and the page cache is copied by several cores."""
    assert array.flags.c_contiguous  # reshape would copy otherwise, and the read would be lost
    out = array.reshape(-1).view(np.uint8).data
    fd = self._acquire()
    try:
      parts = _parts(len(out))
      if len(parts) == 1:
        self._fill(fd, out, offset, offset + len(out), what)
      else:
        pending = [
          _io_pool().submit(self._fill, fd, out[a:b], offset + a, offset + len(out), what)
          for a, b in parts
        ]
        concurrent.futures.wait(pending)  # every part done before the descriptor is let go
        for f in pending:
          f.result()
    finally:
      self._release()

  def _fill(self, fd: int, out: memoryview, offset: int, end: int, what: str) -> None:
    done, want = 0, len(out)
    while done < want:
      n = os.preadv(fd, [out[done:]], offset + done)
      if n == 0:
        raise errors.SourceIOError(
          f"{self.name}: {what} needs bytes up to {end}, but the file is now "
          f"{os.fstat(fd).st_size} bytes (truncated after it was opened?)"
        )
      done += n

  def close(self, _os_close=os.close) -> None:
    # ``os.close`` is bound at definition: at interpreter exit ``__del__`` may run after the
    # module's globals (``os``) are gone.
    with self._lock:
      self._closing = True
      if self.fd >= 0 and self._users == 0:
        _os_close(self.fd)
        self.fd = -1


class LocalFolder:
  """The directory a checkpoint's files live in."""

  def __init__(self, root: pathlib.Path):
    self.root = root

  def describe(self, name: str) -> Any:
    return self.root / name

  def exists(self, name: str) -> bool:
    return (self.root / name).is_file()

  def read_text(self, name: str) -> str:
    return (self.root / name).read_text()

  def read_bytes(self, name: str) -> bytes:
    return (self.root / name).read_bytes()

  def escapes(self, name: str) -> bool:
    """``name`` points outside the folder (absolute, ``..``, or a link leading out)."""
    root = self.root.resolve()
    target = (root / name).resolve()
    pure = pathlib.PurePath(name)
    return pure.is_absolute() or ".." in pure.parts or root not in target.parents

  def open(self, name: str) -> LocalFile:
    return LocalFile(self.root / name)


def read_box(
  store: Any,
  offset: int,
  shape: tuple[int, ...],
  itemsize: int,
  region: Any,
  out: np.ndarray,
  what: str,
) -> None:
  """Fills ``out`` with ``region`` of the row-major tensor of ``shape`` stored at ``offset``:
  contiguous rows straight into ``out``, a strided region as whole rows through a bounded
  scratch buffer (a row larger than it: row by row). ``what`` names the read in errors."""
  if not shape:
    store.pread_into(out, offset, what)
    return
  (a, b), rest = region[0], region[1:]
  row = itemsize
  for d in shape[1:]:
    row *= d
  if all(lo == 0 and hi == d for (lo, hi), d in zip(rest, shape[1:])):  # contiguous rows
    store.pread_into(out, offset + a * row, what)
    return
  if row > SCRATCH_BYTES:  # one row is large: recurse into it, row by row
    for i in range(a, b):
      read_box(store, offset + i * row, shape[1:], itemsize, rest, out[i - a], what)
    return
  per = max(1, SCRATCH_BYTES // row)
  scratch = np.empty(min(per, b - a) * row, np.uint8)
  inner = tuple(slice(lo, hi) for lo, hi in rest)
  for i in range(a, b, per):
    m = min(per, b - i)
    buf = scratch[: m * row]
    store.pread_into(buf, offset + i * row, what)
    block = buf.view(out.dtype).reshape((m, *shape[1:]))
    out[i - a : i - a + m] = block[(slice(None), *inner)]
