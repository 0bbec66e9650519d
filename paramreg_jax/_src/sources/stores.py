"""Byte stores under a safetensors file: a local file descriptor, or a URL read by range.

Both answer ``size`` and ``pread_into(array, offset, what)`` (fill a C-contiguous array from a
byte offset, or raise ``SourceIOError`` naming the file and ``what``).

``LocalFile`` keeps the validated file open until ``close()`` and reads positionally (no memory
map: a file that shrinks gives a short read, an error, never a ``SIGBUS``).

``RemoteFile`` reads a URL through fsspec (HTTP(S) with aiohttp; ``gs://``, ``s3://``, ``hf://``
with their fsspec packages), one range request per read, never the whole object:

- an HTTP server that ignores ``Range`` (status 200 with the whole body) is detected from the
  first response's headers and refused before its body is read;
- transient failures (a connection dropped mid-body, a timeout, HTTP 5xx or 429) are retried
  with exponential backoff (``retries`` times); permanent ones (404, 403, a short object) are an
  error naming the URL at once;
- every request has a timeout (``timeout`` seconds to connect and between received bytes).
"""

from __future__ import annotations

import os
import pathlib
import time
from typing import Any

import numpy as np

from paramreg_jax._src import errors


def is_url(path: Any) -> bool:
  text = os.fspath(path) if isinstance(path, os.PathLike) else path
  return isinstance(text, str) and "://" in text and not text.startswith("file://")


class LocalFile:
  """A local file, open from validation to the last read."""

  def __init__(self, path: pathlib.Path):
    self.name: Any = path
    self.fd = -1
    try:
      self.fd = os.open(path, os.O_RDONLY)
    except OSError as e:
      raise errors.SourceIOError(f"{path}: cannot open: {e}") from e

  @property
  def size(self) -> int:
    return os.fstat(self.fd).st_size

  def pread(self, n: int, offset: int) -> bytes:
    return os.pread(self.fd, n, offset)

  def pread_into(self, array: np.ndarray, offset: int, what: str) -> None:
    """Fills the C-contiguous ``array`` from ``offset``; a short read (the file shrank) is an
    error."""
    if self.fd < 0:
      raise errors.SourceIOError(f"{self.name}: the source was closed; open it again to read")
    assert array.flags.c_contiguous  # reshape would copy otherwise, and the read would be lost
    out = array.reshape(-1).view(np.uint8).data
    done, want = 0, len(out)
    while done < want:
      n = os.preadv(self.fd, [out[done:]], offset + done)
      if n == 0:
        raise errors.SourceIOError(
          f"{self.name}: {what} needs bytes up to {offset + want}, but the file is now "
          f"{self.size} bytes (truncated after it was opened?)"
        )
      done += n

  def close(self, _os_close=os.close) -> None:
    # ``os.close`` is bound at definition: at interpreter exit ``__del__`` may run after the
    # module's globals (``os``) are gone.
    if self.fd >= 0:
      _os_close(self.fd)
      self.fd = -1


class RangeNotSupported(Exception):
  pass


class _Transient(Exception):
  pass


def filesystem(url: str, options: dict[str, Any] | None, timeout: float) -> tuple[Any, str]:
  """``(fsspec filesystem, path)`` for ``url``; a clear error when fsspec (or the protocol's
  package) is missing."""
  try:
    import fsspec
  except ImportError:
    raise errors.SourceIOError(
      f"{url}: reading URLs needs fsspec: pip install 'paramreg-jax[remote]'"
    ) from None
  protocol = url.split("://", 1)[0]
  kwargs = dict(options or {})
  if protocol in ("http", "https"):
    try:
      import aiohttp
    except ImportError:
      raise errors.SourceIOError(
        f"{url}: reading HTTP URLs needs aiohttp: pip install 'paramreg-jax[remote]'"
      ) from None
    client = dict(kwargs.pop("client_kwargs", {}))
    client.setdefault(
      "timeout", aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)
    )
    kwargs["client_kwargs"] = client
  try:
    fs = fsspec.filesystem(protocol, **kwargs)
  except (ImportError, ValueError) as e:
    raise errors.SourceIOError(
      f"{url}: no filesystem for {protocol}:// ({e}); install its fsspec package (gcsfs for "
      "gs://, s3fs for s3://, huggingface_hub for hf://)"
    ) from None
  return fs, url


# what the request that opens a remote object asks for: its first 64 KiB hold the 8-byte length
# and the JSON header of most checkpoints (a 7B model's shard: about 30 KB), so opening is one
# request instead of three
HEAD_BYTES = 64 << 10


class RemoteFile:
  """An object at a URL, read by range requests."""

  def __init__(self, url: str, *, options: dict[str, Any] | None, retries: int, timeout: float):
    self.name: Any = url
    self.retries = retries
    self.timeout = timeout
    self.fs, self.path = filesystem(url, options, timeout)
    self.http = url.split("://", 1)[0] in ("http", "https")
    self.closed = False
    self._size = -1
    self._head = b""  # the object's first bytes, from the request that opened it
    try:
      if self.http:  # the first range request also says the size (Content-Range: .../size)
        self._head = self._retrying(lambda: self._http_range(0, HEAD_BYTES), "the header")
      else:
        self._size = int(self._retrying(lambda: self.fs.size(self.path), "the size"))
    except FileNotFoundError:
      raise errors.MissingShardError(f"{url}: not found (HTTP 404 or no such object)") from None

  @property
  def size(self) -> int:
    return self._size

  def pread(self, n: int, offset: int) -> bytes:
    """Up to ``n`` bytes from ``offset`` (fewer at the end of the object); a safetensors header
    that fits in the first ``HEAD_BYTES`` comes from the request that opened the object."""
    end = min(offset + n, self._size)
    if end <= offset:
      return b""
    if end <= len(self._head):
      return self._head[offset:end]
    return self._retrying(lambda: self._get(offset, end), f"bytes {offset}:{end}")

  def drop_head(self) -> None:
    """Forgets the object's first bytes (once its header is parsed)."""
    self._head = b""

  def pread_into(self, array: np.ndarray, offset: int, what: str) -> None:
    if self.closed:
      raise errors.SourceIOError(f"{self.name}: the source was closed; open it again to read")
    assert array.flags.c_contiguous
    out = array.reshape(-1).view(np.uint8)
    want = out.size
    if offset + want > self._size:
      raise errors.SourceIOError(
        f"{self.name}: {what} needs bytes up to {offset + want}, but the object is "
        f"{self._size} bytes"
      )
    data = self._retrying(lambda: self._get(offset, offset + want), what)
    out[:] = np.frombuffer(data, np.uint8)

  def _get(self, start: int, end: int) -> bytes:
    if self.http:
      data = self._http_range(start, end)
    else:
      data = self.fs.cat_file(self.path, start=start, end=end)
    if len(data) != end - start:  # a body cut short without an error: try again
      raise _Transient(f"received {len(data)} of {end - start} bytes")
    return data

  def _http_range(self, start: int, end: int) -> bytes:
    """One ``Range`` GET; the status and headers are checked before the body is read, so a
    server that ignores ``Range`` never sends us the whole object."""
    from fsspec.asyn import sync

    async def fetch() -> bytes:
      session = await self.fs.set_session()
      headers = {**self.fs.kwargs.get("headers", {}), "Range": f"bytes={start}-{end - 1}"}
      kw = {k: v for k, v in self.fs.kwargs.items() if k != "headers"}
      async with session.get(self.fs.encode_url(self.path), headers=headers, **kw) as r:
        if r.status == 404:
          raise FileNotFoundError(self.path)
        if r.status in (401, 403):
          raise PermissionError(f"HTTP {r.status} {r.reason}")
        if r.status == 429 or r.status >= 500:
          raise _Transient(f"HTTP {r.status} {r.reason}")
        if r.status == 416 and start == 0:  # an empty object
          self._size = 0
          return b""
        if r.status != 206:
          raise RangeNotSupported(
            f"HTTP {r.status} to a Range request (the server ignores Range and would send the "
            f"whole object, {r.headers.get('Content-Length', '?')} bytes)"
          )
        total = r.headers.get("Content-Range", "").rpartition("/")[2]
        if total.isdigit():
          self._size = int(total)
        elif self._size < 0:
          raise RangeNotSupported("a 206 response without the object's size in Content-Range")
        return await r.read()

    return sync(self.fs.loop, fetch)

  def _retrying(self, call: Any, what: str) -> Any:
    delay = 0.05
    for attempt in range(self.retries + 1):
      try:
        return call()
      except (FileNotFoundError, PermissionError, RangeNotSupported) as e:
        if isinstance(e, FileNotFoundError):
          raise
        raise errors.SourceIOError(f"{self.name}: reading {what}: {e}; not retried") from None
      except Exception as e:  # connection dropped, timeout, 5xx: transient
        if not _is_transient(e) or attempt == self.retries:
          kind = "timed out" if _is_timeout(e) else f"failed ({type(e).__name__}: {e})"
          raise errors.SourceIOError(
            f"{self.name}: reading {what} {kind} after {attempt + 1} attempt(s) "
            f"(timeout {self.timeout:g} s, retries={self.retries})"
          ) from e
        time.sleep(delay)
        delay = min(2 * delay, 2.0)
    raise AssertionError("unreachable")

  def close(self) -> None:
    self.closed = True


def _is_timeout(e: BaseException) -> bool:
  import asyncio

  return isinstance(e, (TimeoutError, asyncio.TimeoutError)) or "Timeout" in type(e).__name__


def _is_transient(e: BaseException) -> bool:
  if isinstance(e, (_Transient, ConnectionError, OSError)) or _is_timeout(e):
    return True
  module = type(e).__module__ or ""
  return module.startswith("aiohttp")  # payload errors, disconnects (client errors are above)


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


class RemoteFolder:
  """A URL prefix that a checkpoint's files live under."""

  def __init__(self, root: str, *, options: dict[str, Any] | None, retries: int, timeout: float):
    self.root = root.rstrip("/")
    self.options, self.retries, self.timeout = options, retries, timeout
    self.fs, _ = filesystem(self.root, options, timeout)

  def describe(self, name: str) -> Any:
    return f"{self.root}/{name}"

  def exists(self, name: str) -> bool:
    try:
      return bool(self.fs.exists(self.describe(name)))
    except Exception:
      return False

  def read_text(self, name: str) -> str:
    url = self.describe(name)
    try:
      return self.fs.cat_file(url).decode("utf-8")
    except FileNotFoundError:
      raise FileNotFoundError(f"{url}: not found") from None

  def read_bytes(self, name: str) -> bytes:
    url = self.describe(name)
    try:
      return bytes(self.fs.cat_file(url))
    except FileNotFoundError:
      raise FileNotFoundError(f"{url}: not found") from None

  def escapes(self, name: str) -> bool:
    pure = pathlib.PurePosixPath(name)
    return pure.is_absolute() or ".." in pure.parts or "://" in name or "\\" in name

  def open(self, name: str) -> RemoteFile:
    return RemoteFile(
      self.describe(name), options=self.options, retries=self.retries, timeout=self.timeout
    )
