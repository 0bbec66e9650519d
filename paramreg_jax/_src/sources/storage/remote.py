"""Byte stores under a safetensors file at a URL, read by range requests (``stores.py`` has
the local ones; both answer ``size`` and ``pread_into(array, offset, what)``).

``RemoteFile`` reads a URL through fsspec (HTTP(S) with aiohttp; ``gs://``, ``s3://``, ``hf://``
with their fsspec packages), one range request per read, never the whole object:

- an HTTP server that ignores ``Range`` (status 200 with the whole body) is detected from the
  first response's headers and refused before its body is read;
- transient failures (a connection dropped mid-body, a timeout, HTTP 5xx or 429) are retried
  with exponential backoff (``retries`` times); permanent ones (404, 403, a short object) are an
  error naming the URL at once;
- every request has a timeout (``timeout`` seconds to connect and between received bytes) and
  a deadline (``timeout`` plus its bytes at ``min_throughput``);
- the object is pinned when it is opened (size, ETag or Last-Modified, ``If-Match``), and a
  ``206`` must name exactly the bytes asked for: a changed object is an error, never its bytes.

``RemoteFolder`` is the URL prefix the files live under: its documents (index, config,
tokenizer) are read whole, capped while they stream, with the same retries; an index entry
that leaves it, in any spelling, is refused.
"""

from __future__ import annotations

import functools
import pathlib
import urllib.parse
from typing import Any

import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.sources.storage import answers
from paramreg_jax._src.sources.storage import fsspec_http
from paramreg_jax._src.sources.storage import http_ranges
from paramreg_jax._src.sources.storage import pinning
from paramreg_jax._src.sources.storage.answers import Changed
from paramreg_jax._src.sources.storage.answers import RangeNotSupported
from paramreg_jax._src.sources.storage.answers import Refused
from paramreg_jax._src.sources.storage.answers import TooLarge
from paramreg_jax._src.sources.storage.answers import Transient

# Protocols whose objects are read by range requests here (fsspec's names).
PROTOCOLS = ("http", "https", "gs", "gcs", "s3", "s3a", "hf", "az", "abfs")


def check_remote_args(
  url: str, options: Any, retries: Any, timeout: Any, min_throughput: Any
) -> dict[str, Any] | None:
  """The arguments of a URL source, checked before any request; a ``StoreError`` names the
  argument, what it got and what it takes."""
  protocol = url.split("://", 1)[0].lower()
  if protocol not in PROTOCOLS:
    raise errors.StoreError(
      f"{url}: {protocol}:// is not a protocol read here; use one of "
      f"{', '.join(p + '://' for p in PROTOCOLS)}, or a local path"
    )
  if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
    raise errors.StoreError(f"{url}: retries must be an int >= 0, got {retries!r}")
  for name, value in (("timeout", timeout), ("min_throughput", min_throughput)):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
      raise errors.StoreError(f"{url}: {name} must be a positive number, got {value!r}")
  if options is not None and not isinstance(options, dict):
    raise errors.StoreError(
      f"{url}: storage_options must be a dict of the filesystem's options, got "
      f"{type(options).__name__}"
    )
  for key in ("client_kwargs", "headers"):
    if options and key in options and not isinstance(options[key], dict):
      raise errors.StoreError(
        f"{url}: storage_options[{key!r}] must be a dict, got {type(options[key]).__name__}"
      )
  return options


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
  except Exception as e:
    raise errors.SourceIOError(
      f"{url}: no filesystem for {protocol}:// ({e}); install its fsspec package (gcsfs for "
      "gs://, s3fs for s3://, huggingface_hub for hf://)"
    ) from None
  return fs, url


# what the request that opens a remote object asks for: its first 64 KiB hold the 8-byte length
# and the JSON header of most checkpoints (a 7B model's shard: about 30 KB), so opening is one
# request instead of three
HEAD_BYTES = 64 << 10
# every request's deadline: ``timeout`` plus its bytes at this throughput (a server that
# trickles is an error, not a read that takes hours); ``min_throughput=`` overrides it
MIN_THROUGHPUT = 1 << 20  # bytes per second
# the largest index or config document read (streamed; refused past it)
DOCUMENT_CAP = 64 << 20
# what a URL keeps as it is when it is sent (its own escapes included)
_URL_SAFE = ":/?#[]@!$&'()*+,;=%~"


class RemoteFile:
  """An object at a URL, read by range requests."""

  def __init__(
    self,
    url: str,
    *,
    options: dict[str, Any] | None,
    retries: int,
    timeout: float,
    min_throughput: float = MIN_THROUGHPUT,
    immutable: bool = False,
  ):
    self.name: Any = url
    self.immutable = immutable  # a commit's file (hf://): nothing to pin, no If-Match sent
    self.pinned: pinning.Pinned | None = None
    self.retries = retries
    self.timeout = timeout
    self.min_throughput = min_throughput
    self.http = url.split("://", 1)[0] in ("http", "https")
    # the standard library's reader where it honours the options (faster: http_ranges.py)
    self.plain = self.http and http_ranges.plain_options(options)
    self.headers = dict((options or {}).get("headers") or {})
    self.fs: Any = None  # fsspec's, where the standard-library reader cannot serve
    self.path = url
    if not self.plain:
      self.fs, self.path = filesystem(url, options, timeout)
    self.closed = False
    self.etag: str | None = None  # the validators the object had when it was opened
    self.modified: str | None = None
    self._size = -1
    self._head = b""  # the object's first bytes, from the request that opened it
    try:
      if self.http:  # the first range request also says the size (Content-Range: .../size)
        self._head = self._retrying(lambda: self._http_range(0, HEAD_BYTES), "the header")
      else:
        self.pinned = self._retrying(lambda: pinning.open_object(self.fs, self.path), "the size")
        self._size = self.pinned.size
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
    if self.plain:  # straight into ``array``
      self._retrying(lambda: self._http_range(offset, offset + want, into=out), what)
      return
    data = self._retrying(lambda: self._get(offset, offset + want), what)
    out[:] = np.frombuffer(data, np.uint8)

  def _get(self, start: int, end: int) -> bytes:
    if self.http:
      data = self._http_range(start, end)
    else:
      assert self.pinned is not None
      data = pinning.read(self.fs, self.path, self.pinned, start, end)
    if len(data) != end - start:  # a body cut short without an error: try again
      raise Transient(f"received {len(data)} of {end - start} bytes")
    return data

  def _http_range(self, start: int, end: int, into: np.ndarray | None = None) -> bytes:
    """One ``Range`` GET, within its deadline; the status, the range and the validators are
    checked before the body is read, so a server that ignores ``Range`` never sends us the
    whole object, and an object replaced since it was opened is never read as good. With
    ``into``, the body is received into it (exactly ``end - start`` bytes)."""
    headers = {**self.headers, "Range": f"bytes={start}-{end - 1}"}
    if self.etag and not self.etag.startswith("W/") and not self.immutable:
      headers["If-Match"] = self.etag  # the server refuses (412) if the object changed
    deadline = self.timeout + (end - start) / self.min_throughput
    on_head = functools.partial(self._on_head, start=start, end=end)
    if self.plain:
      url = urllib.parse.quote(self.path, safe=_URL_SAFE)
      return http_ranges.get(
        url,
        headers,
        on_head,
        timeout=self.timeout,
        deadline_seconds=deadline,
        into=into,
        cap=end - start,
        ranged=True,
      )
    assert into is None
    return fsspec_http.get(
      self.fs,
      self.path,
      headers,
      on_head,
      timeout=self.timeout,
      deadline_seconds=deadline,
      cap=end - start,
      ranged=True,
    )

  def _on_head(self, status: int, reason: str, headers: Any, *, start: int, end: int) -> bool:
    """Judges a response before its body: raises for a status or range refused here; False
    for the empty object's 416 (nothing to read)."""
    if status == 404:
      raise FileNotFoundError(self.path)
    if status in (401, 403):
      raise PermissionError(f"HTTP {status} {reason}")
    if status == 412:
      raise Changed(f"the server says it no longer matches ETag {self.etag}")
    if status == 429 or status >= 500:
      raise Transient(f"HTTP {status} {reason}")
    if status == 416 and start == 0:  # an empty object
      self._size = 0
      return False
    if status != 206:
      raise RangeNotSupported(
        f"HTTP {status} to a Range request (the server ignores Range and would send the "
        f"whole object, {headers.get('Content-Length', '?')} bytes)"
      )
    self._check_response(headers, start, end)
    return True

  def _check_response(self, headers: Any, start: int, end: int) -> None:
    """A 206 names exactly the bytes asked for, of an object of the opened size and
    validators; the first response pins them."""
    named = answers.content_range(headers.get("Content-Range"))
    if named is None:
      raise RangeNotSupported(
        f"a 206 response whose Content-Range ({headers.get('Content-Range')!r}) does not name "
        "the bytes and the object's size"
      )
    first, last, total = named
    if self._size >= 0 and total != self._size:
      raise Changed(f"its size is now {total} bytes, it was {self._size} when opened")
    if (first, last) != (start, min(end, total) - 1):
      raise RangeNotSupported(
        f"asked for bytes {start}-{end - 1}, the server answered bytes {first}-{last}"
      )
    etag, modified = headers.get("ETag"), headers.get("Last-Modified")
    if self._size < 0:  # the request that opened it
      self._size, self.etag, self.modified = total, etag, modified
    elif self.etag and etag and etag != self.etag:
      raise Changed(f"its ETag is now {etag}, it was {self.etag} when opened")
    elif not self.etag and self.modified and modified and modified != self.modified:
      raise Changed(f"it was modified at {modified}, opened as of {self.modified}")

  def _retrying(self, call: Any, what: str) -> Any:
    return retrying(call, what, url=self.name, retries=self.retries, timeout=self.timeout)

  def close(self) -> None:
    self.closed = True


def retrying(call: Any, what: str, *, url: Any, retries: int, timeout: float) -> Any:
  """``call()``, retried with backoff on transient failures (a dropped connection, a timeout,
  HTTP 5xx or 429); every other failure, and the last transient one, is a ``SourceIOError``
  naming ``url`` and what was being read. ``FileNotFoundError`` and ``TooLarge`` pass through
  for the caller to name."""
  for attempt in answers.attempts(retries):
    try:
      return call()
    except (FileNotFoundError, PermissionError, RangeNotSupported, Refused, Changed, TooLarge) as e:
      if isinstance(e, (FileNotFoundError, TooLarge)):
        raise
      if isinstance(e, Changed):
        raise errors.SourceIOError(
          f"{url}: the object changed after it was opened ({e}); nothing read from it "
          "is used: open the source again"
        ) from None
      if isinstance(e, PermissionError):
        raise _denied(url, what, e) from None
      raise errors.SourceIOError(f"{url}: reading {what}: {e}; not retried") from None
    except Exception as e:  # connection dropped, timeout, 5xx: transient
      if getattr(e, "code", None) in (401, 403) or str(e).startswith("Forbidden"):  # gcsfs
        raise _denied(url, what, e) from None
      if not _is_transient(e) or attempt == retries:
        kind = "timed out" if _is_timeout(e) else f"failed ({type(e).__name__}: {e})"
        raise errors.SourceIOError(
          f"{url}: reading {what} {kind} after {attempt + 1} attempt(s) "
          f"(timeout {timeout:g} s, retries={retries})"
        ) from e
  raise errors.SourceIOError(f"{url}: reading {what}: no attempt was made")


# where each protocol's filesystem finds its credentials (docs/howto/remote.md)
CREDENTIALS = {
  "s3": "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or storage_options="
  "{'key': ..., 'secret': ...}",
  "gs": "GOOGLE_APPLICATION_CREDENTIALS, `gcloud auth application-default login`, or "
  "storage_options={'token': ...}",
  "http": "storage_options={'headers': {'Authorization': ...}}",
}


def _denied(url: Any, what: str, e: BaseException) -> errors.SourceIOError:
  protocol = str(url).split("://", 1)[0].lower()
  hint = CREDENTIALS[{"s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs"}.get(protocol, "http")]
  detail = str(e).strip().replace("\n", ": ")
  return errors.SourceIOError(
    f"{url}: the store denied reading {what} ({detail}); not retried: check the credentials "
    f"it reads ({hint})"
  )


def _is_timeout(e: BaseException) -> bool:
  import asyncio

  return isinstance(e, (TimeoutError, asyncio.TimeoutError)) or "Timeout" in type(e).__name__


def _is_transient(e: BaseException) -> bool:
  import http.client

  transient = (Transient, ConnectionError, OSError, http.client.HTTPException)
  if isinstance(e, transient) or _is_timeout(e):
    return True
  module = type(e).__module__ or ""
  return module.startswith("aiohttp")  # payload errors, disconnects (client errors are above)


class RemoteFolder:
  """A URL prefix that a checkpoint's files live under. Its documents (an index, a config, a
  tokenizer) are read whole but capped (``cap`` bytes, refused while streaming), with the same
  retries as payload reads; a status other than 200/404 is an error naming the URL."""

  def __init__(
    self,
    root: str,
    *,
    options: dict[str, Any] | None,
    retries: int,
    timeout: float,
    min_throughput: float = MIN_THROUGHPUT,
    immutable: bool = False,
  ):
    self.root = root.rstrip("/")
    self.immutable = immutable
    self.options, self.retries, self.timeout = options, retries, timeout
    self.min_throughput = min_throughput
    self.http = self.root.split("://", 1)[0] in ("http", "https")
    self.plain = self.http and http_ranges.plain_options(options)
    self.fs: Any = None if self.plain else filesystem(self.root, options, timeout)[0]

  def describe(self, name: str) -> Any:
    return f"{self.root}/{name}"

  def exists(self, name: str) -> bool:
    """Whether ``name`` is there (a failed request is an error, never a "no")."""
    try:
      self._document(name, 0, probe=True)
      return True
    except FileNotFoundError:
      return False

  def read_text(self, name: str, cap: int = DOCUMENT_CAP) -> str:
    try:
      return self.read_bytes(name, cap).decode("utf-8")
    except UnicodeDecodeError as e:
      raise errors.SourceIOError(f"{self.describe(name)}: not UTF-8 text ({e})") from None

  def read_bytes(self, name: str, cap: int = DOCUMENT_CAP) -> bytes:
    try:
      return self._document(name, cap)
    except FileNotFoundError:
      raise FileNotFoundError(f"{self.describe(name)}: not found") from None

  def _document(self, name: str, cap: int, probe: bool = False) -> bytes:
    url = self.describe(name)
    if not self.http:

      def call() -> bytes:
        size = int(self.fs.size(url))
        if probe:
          return b""
        if size > cap:
          raise TooLarge(size)
        return bytes(self.fs.cat_file(url))
    else:
      call = functools.partial(self._http_document, url, cap, probe)
    try:
      what = "it" if probe else "the document"
      return retrying(call, what, url=url, retries=self.retries, timeout=self.timeout)
    except TooLarge as e:
      raise errors.SourceIOError(
        f"{url}: the document is larger than {cap} bytes ({e.args[0]}); refused before it "
        "was read whole (an index or config is a few MB at most)"
      ) from None

  def _http_document(self, url: str, cap: int, probe: bool) -> bytes:
    judge = functools.partial(_document_head, url, None if probe else cap)
    deadline = self.timeout + cap / self.min_throughput
    method, limit = ("HEAD", None) if probe else ("GET", cap)
    if self.plain:
      headers = dict((self.options or {}).get("headers") or {})
      quoted = urllib.parse.quote(url, safe=_URL_SAFE)
      return http_ranges.get(
        quoted,
        headers,
        judge,
        timeout=self.timeout,
        deadline_seconds=deadline,
        method=method,
        cap=limit,
      )
    return fsspec_http.get(
      self.fs,
      url,
      {},
      judge,
      timeout=self.timeout,
      deadline_seconds=deadline,
      method=method,
      cap=limit,
    )

  def escapes(self, name: str) -> bool:
    """Whether ``name`` (from an index) reaches outside the folder, percent-encoded or not."""
    seen = {name}
    text = name
    for _ in range(4):  # %252e%252e: decoded again by a proxy or a server
      text = urllib.parse.unquote(text)
      seen.add(text)
    return any(_outside(t) for t in seen)

  def open(self, name: str) -> RemoteFile:
    return RemoteFile(
      self.describe(name),
      options=self.options,
      retries=self.retries,
      timeout=self.timeout,
      min_throughput=self.min_throughput,
      immutable=self.immutable,
    )


def _document_head(url: str, cap: int | None, status: int, reason: str, headers: Any) -> bool:
  """Judges a document's response before its body: raises for a status refused here, or a
  declared length past ``cap`` (``None``: a probe, no body read)."""
  if status == 404:
    raise FileNotFoundError(url)
  if status in (401, 403):
    raise PermissionError(f"HTTP {status} {reason} (denied: credentials?)")
  if status == 429 or status >= 500:
    raise Transient(f"HTTP {status} {reason}")
  if status != 200:
    raise RangeNotSupported(f"HTTP {status} {reason}")
  length = headers.get("Content-Length", "") or ""
  if cap is not None and length.isdigit() and int(length) > cap:
    raise TooLarge(int(length))
  return True


def _outside(name: str) -> bool:
  pure = pathlib.PurePosixPath(name)
  return pure.is_absolute() or ".." in pure.parts or "://" in name or "\\" in name
