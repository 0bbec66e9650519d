"""Range GETs over HTTP(S) with the standard library, the body read straight into its buffer.

Each reading thread keeps one keep-alive connection per host, and a body is received by
``recv_into`` into the caller's array: no event loop to share, no chunk list to join, no copy
besides the kernel's.
The GIL is released while a thread waits on its socket, so 16 threads read in parallel
(fsspec's aiohttp path runs every body through one event-loop thread, and copied each twice:
``benchmarks/remote.py``). ``RemoteFile`` uses it for ``http(s)://`` and ``hf://`` when the
storage options are only ``headers``; with other aiohttp options it keeps fsspec's client.

Redirects are followed (the Hub's ``resolve`` URLs answer 302 to their storage) under one
credential policy (:func:`follow`): headers other than the request's own (``Range``,
``If-Match``, ...) are credentials, and go only to the origin (scheme, host and port) they were
given for; a redirect from ``https`` to plain ``http`` is refused, naming both URLs. Every
receive, from the status line to the body's last byte, waits at most ``timeout`` seconds and
never past the request's deadline: a server that trickles fails on time.
"""

from __future__ import annotations

import functools
import http.client
import io
import math
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import numpy as np

from paramreg_jax._src.sources.storage.answers import Refused
from paramreg_jax._src.sources.storage.answers import TooLarge
from paramreg_jax._src.sources.storage.answers import Transient

REDIRECTS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 5
_REDIRECT_BODY = 1 << 16  # a redirect's body is drained up to this, else its connection dropped
# the headers that describe the request, not who makes it: kept across origins
_REQUEST_HEADERS = frozenset(
  {"range", "if-match", "if-none-match", "accept", "accept-encoding", "user-agent"}
)
_PORTS = {"http": 80, "https": 443}
_local = threading.local()
_tls: ssl.SSLContext | None = None

# ``on_head(status, reason, headers)`` checks a response before its body is read: it raises for
# a status or range it refuses, and returns whether the body is wanted
OnHead = Callable[[int, str, Any], bool]


def plain_options(options: dict[str, Any] | None) -> bool:
  """Whether the standard library can honour ``options`` (only ``headers``)."""
  return set(options or {}) <= {"headers"}


def origin(url: str) -> tuple[str, str, int | None]:
  """``(scheme, host, port)`` of ``url``: what credentials are given for."""
  parts = urllib.parse.urlsplit(url)
  scheme = parts.scheme.lower()
  return scheme, (parts.hostname or "").lower(), parts.port or _PORTS.get(scheme)


def follow(url: str, location: str, headers: dict[str, str]) -> tuple[str, dict[str, str]]:
  """The redirect from ``url`` to ``location``, and the headers it may carry: credentials (any
  header but the request's own) only to the origin they were given for.

  Raises:
    Refused: a redirect from ``https`` to plain ``http`` (it would carry the request, and any
      credentials, in clear text).
  """
  target = urllib.parse.urljoin(url, location)
  before, after = origin(url), origin(target)
  if before[0] == "https" and after[0] != "https":
    raise Refused(
      f"{url} redirected to {target}: a redirect from https to {after[0] or 'another scheme'} "
      "is refused (the request and its credentials would travel in clear text)"
    )
  if after != before:
    headers = {k: v for k, v in headers.items() if k.lower() in _REQUEST_HEADERS}
  return target, headers


class _Clock:
  """The deadline and the per-receive timeout of the request a connection serves."""

  def __init__(self) -> None:
    self.deadline = math.inf
    self.timeout: float | None = None
    self.got = 0


class _TimedReader(io.RawIOBase):
  """A socket's receives, each within the clock's timeout and before its deadline: the status
  line and the headers as much as the body (``http.client`` bounds only each receive)."""

  def __init__(self, sock: Any, clock: _Clock):
    # the socket's own raw file holds it open after a closing response's connection lets go
    self.sock, self.raw, self.clock = sock, sock.makefile("rb", buffering=0), clock

  def readable(self) -> bool:
    return True

  def readinto(self, buffer: Any) -> int:
    left = self.clock.deadline - time.monotonic()
    if left <= 0:
      raise TimeoutError(f"received {self.clock.got} bytes before the request's deadline")
    timeout = self.clock.timeout
    self.sock.settimeout(left if timeout is None else min(timeout, left))
    n = self.raw.readinto(buffer)
    self.clock.got += n or 0
    return n

  def close(self) -> None:
    self.raw.close()
    super().close()


class _TimedSocket:
  """What ``HTTPResponse`` reads its response from: the socket through a :class:`_TimedReader`."""

  def __init__(self, sock: Any, clock: _Clock):
    self.sock, self.clock = sock, clock

  def makefile(self, mode: str, *args: Any, **kwargs: Any) -> io.BufferedReader:
    del mode, args, kwargs
    return io.BufferedReader(_TimedReader(self.sock, self.clock))


def _response(clock: _Clock, sock: Any, *args: Any, **kwargs: Any) -> http.client.HTTPResponse:
  return http.client.HTTPResponse(_TimedSocket(sock, clock), *args, **kwargs)  # type: ignore[arg-type]


class _Pool(dict):
  """One thread's connections, closed when the thread ends (its locals are then dropped)."""

  def __del__(self) -> None:
    for conn in self.values():
      conn.close()


def _connection(
  scheme: str, netloc: str, timeout: float
) -> tuple[http.client.HTTPConnection, bool]:
  """This thread's connection to ``netloc``; whether it was made now."""
  global _tls
  pool = _local.__dict__.setdefault("pool", _Pool())
  conn = pool.get((scheme, netloc))
  if conn is not None:
    return conn, False
  if scheme == "https":
    _tls = _tls or ssl.create_default_context()
    conn = http.client.HTTPSConnection(netloc, timeout=timeout, context=_tls)
  else:
    conn = http.client.HTTPConnection(netloc, timeout=timeout)
  conn.paramreg_clock = clock = _Clock()  # type: ignore[attr-defined]
  conn.response_class = functools.partial(_response, clock)  # type: ignore[assignment]
  pool[(scheme, netloc)] = conn
  return conn, True


def _drop(scheme: str, netloc: str) -> None:
  conn = _local.__dict__.get("pool", {}).pop((scheme, netloc), None)
  if conn is not None:
    conn.close()


def _send(
  url: str, headers: dict[str, str], timeout: float, deadline: float, method: str = "GET"
) -> tuple[http.client.HTTPResponse, Any]:
  """The response to ``GET url`` (status and headers read, body not), and its socket, all
  before ``deadline``. A reused connection that the server closed while idle is replaced
  once, without counting as a failure."""
  parts = urllib.parse.urlsplit(url)
  target = parts.path + (f"?{parts.query}" if parts.query else "")
  for _ in range(2):
    conn, fresh = _connection(parts.scheme, parts.netloc, timeout)
    clock = conn.paramreg_clock  # type: ignore[attr-defined]
    clock.deadline, clock.timeout, clock.got = deadline, timeout, 0
    left = deadline - time.monotonic()
    if left <= 0:
      raise TimeoutError("the request's deadline passed before it was sent")
    try:
      conn.timeout = min(timeout, left)  # connecting
      if conn.sock is not None:
        conn.sock.settimeout(min(timeout, left))
      conn.request(method, target or "/", headers=headers)
      return conn.getresponse(), conn.sock
    except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
      _drop(parts.scheme, parts.netloc)
      if fresh:
        raise
    except BaseException:
      _drop(parts.scheme, parts.netloc)
      raise
  raise AssertionError("unreachable")


def _body_into(r: http.client.HTTPResponse, out: memoryview) -> None:
  """Receives exactly ``len(out)`` body bytes into ``out`` (each receive timed by the
  connection's clock)."""
  got = 0
  while got < len(out):
    n = r.fp.readinto1(out[got:])  # type: ignore[union-attr]
    if not n:
      raise Transient(f"the connection closed after {got} of {len(out)} bytes")
    got += n
  r.length = 0  # the body is consumed: the connection serves the next request
  r.close()


def _read_all(r: http.client.HTTPResponse, cap: int | None) -> bytes:
  """The whole body (chunked or not; each receive timed by the connection's clock); refused
  (``TooLarge``) once it passes ``cap`` bytes."""
  body = bytearray()
  while True:
    chunk = r.read1(1 << 16 if cap is None else min(1 << 16, cap + 1 - len(body)))
    if not chunk:
      r.close()  # a HEAD's response is not closed by reading it; the connection stays open
      return bytes(body)
    body += chunk
    if cap is not None and len(body) > cap:
      raise TooLarge(f"more than {cap}")


def get(
  url: str,
  headers: dict[str, str],
  on_head: OnHead,
  *,
  timeout: float,
  deadline_seconds: float,
  into: np.ndarray | None = None,
  method: str = "GET",
  cap: int | None = None,
  ranged: bool = False,
) -> bytes:
  """``method url`` with ``headers`` (a ``Range``), following redirects (:func:`follow`), the
  whole exchange within ``deadline_seconds``. ``on_head`` judges the final response; its body
  goes into ``into`` (which it must fill exactly) and ``b""`` is returned, or, without
  ``into``, is returned: at most ``cap`` bytes of it (``TooLarge`` past them, raised while it
  streams). A ``ranged`` answer (or one ``into`` an array) longer than asked for is refused
  (``Refused``) after at most that many bytes, whether it states its length or not."""
  deadline = time.monotonic() + deadline_seconds
  for _ in range(MAX_REDIRECTS + 1):
    r, _sock = _send(url, headers, timeout, deadline, method)
    parts = urllib.parse.urlsplit(url)
    try:
      if r.status in REDIRECTS and r.getheader("Location"):
        _discard(r, parts)
        url, headers = follow(url, r.getheader("Location", ""), headers)
        continue
      if not on_head(r.status, r.reason, r.headers):
        _discard(r, parts)
        return b""
      want = into.nbytes if into is not None else cap
      if into is None or r.chunked or r.length is None:
        try:
          data = _read_all(r, want)
        except TooLarge:
          if not (ranged or into is not None):
            raise
          raise Refused(f"the server sent more than the {want} bytes asked for") from None
        if into is None:
          return data
        if len(data) != into.nbytes:
          raise Transient(f"received {len(data)} of {into.nbytes} bytes")
        into.reshape(-1).view(np.uint8)[:] = np.frombuffer(data, np.uint8)
        return b""
      if r.length != into.nbytes:
        raise Transient(f"the response has {r.length} bytes, {into.nbytes} were asked for")
      flat: Any = into.reshape(-1).view(np.uint8)
      _body_into(r, memoryview(flat))
      return b""
    except BaseException:
      _drop(parts.scheme, parts.netloc)  # a body not read to its end: the connection is done
      raise
  raise Transient(f"{url}: more than {MAX_REDIRECTS} redirects")


def _discard(r: http.client.HTTPResponse, parts: Any) -> None:
  """A body nobody reads: drained when it is small and says so, else its connection dropped
  (a 2 MiB redirect body is never received)."""
  if not r.chunked and r.length is not None and r.length <= _REDIRECT_BODY:
    _read_all(r, _REDIRECT_BODY)
  else:
    _drop(parts.scheme, parts.netloc)
