"""Range GETs over HTTP(S) with the standard library, the body read straight into its buffer.

Each reading thread keeps one keep-alive connection per host, and a body is received by
``recv_into`` into the caller's array: no event loop to share, no chunk list to join, no copy
besides the kernel's.
The GIL is released while a thread waits on its socket, so 16 threads read in parallel
(fsspec's aiohttp path runs every body through one event-loop thread, and copied each twice:
``benchmarks/remote.py``). ``RemoteFile`` uses it for ``http(s)://`` and ``hf://`` when the
storage options are only ``headers``; with other aiohttp options it keeps fsspec's client.

Redirects are followed (the Hub's ``resolve`` URLs answer 302 to their storage), without the
``Authorization`` header once the host changes. Every receive waits at most ``timeout``
seconds, and never past the request's deadline: a server that trickles fails on time.
"""

from __future__ import annotations

import http.client
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import numpy as np

from paramreg_jax._src.sources.pinning import TooLarge
from paramreg_jax._src.sources.pinning import Transient

_REDIRECTS = (301, 302, 303, 307, 308)
_MAX_REDIRECTS = 5
_local = threading.local()
_tls: ssl.SSLContext | None = None

# ``on_head(status, reason, headers)`` checks a response before its body is read: it raises for
# a status or range it refuses, and returns whether the body is wanted
OnHead = Callable[[int, str, Any], bool]


def plain_options(options: dict[str, Any] | None) -> bool:
  """Whether the standard library can honour ``options`` (only ``headers``)."""
  return set(options or {}) <= {"headers"}


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
  pool[(scheme, netloc)] = conn
  return conn, True


def _drop(scheme: str, netloc: str) -> None:
  conn = _local.__dict__.get("pool", {}).pop((scheme, netloc), None)
  if conn is not None:
    conn.close()


def _send(
  url: str, headers: dict[str, str], timeout: float, method: str = "GET"
) -> tuple[http.client.HTTPResponse, Any]:
  """The response to ``GET url`` (status and headers read, body not), and its socket. A reused
  connection that the server closed while idle is replaced once, without counting as a
  failure."""
  parts = urllib.parse.urlsplit(url)
  target = parts.path + (f"?{parts.query}" if parts.query else "")
  for _ in range(2):
    conn, fresh = _connection(parts.scheme, parts.netloc, timeout)
    try:
      if conn.sock is not None:
        conn.sock.settimeout(timeout)
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


def _arm(sock: Any, deadline: float, timeout: float, got: int) -> None:
  """Bounds the next receive by ``timeout`` and by what is left of the deadline."""
  left = deadline - time.monotonic()
  if left <= 0:
    raise TimeoutError(f"received {got} bytes before the request's deadline")
  if sock is not None:
    sock.settimeout(min(timeout, left))


def _body_into(
  r: http.client.HTTPResponse, sock: Any, out: memoryview, deadline: float, timeout: float
) -> None:
  """Receives exactly ``len(out)`` body bytes into ``out``, each receive within ``timeout``
  and the whole before ``deadline``."""
  got = 0
  while got < len(out):
    _arm(sock, deadline, timeout, got)
    n = r.fp.readinto1(out[got:])  # type: ignore[union-attr]
    if not n:
      raise Transient(f"the connection closed after {got} of {len(out)} bytes")
    got += n
  r.length = 0  # the body is consumed: the connection serves the next request
  r.close()


def _read_all(
  r: http.client.HTTPResponse, sock: Any, deadline: float, timeout: float, cap: int | None
) -> bytes:
  """The whole body (chunked or not), each receive within ``timeout`` and the whole before
  ``deadline``; refused (``TooLarge``) once it passes ``cap`` bytes."""
  body = bytearray()
  while True:
    _arm(sock, deadline, timeout, len(body))
    chunk = r.read1(1 << 16)
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
) -> bytes:
  """``method url`` with ``headers`` (a ``Range``), following redirects. ``on_head`` judges
  the final response; its body goes into ``into`` (which it must fill exactly) and ``b""`` is
  returned, or, without ``into``, is returned: at most ``cap`` bytes of it (``TooLarge``
  past them, raised while it streams)."""
  deadline = time.monotonic() + deadline_seconds
  origin = urllib.parse.urlsplit(url).netloc
  for _ in range(_MAX_REDIRECTS + 1):
    r, sock = _send(url, headers, timeout, method)
    parts = urllib.parse.urlsplit(url)
    try:
      if r.status in _REDIRECTS and r.getheader("Location"):
        _read_all(r, sock, deadline, timeout, 1 << 20)
        url = urllib.parse.urljoin(url, r.getheader("Location", ""))
        if urllib.parse.urlsplit(url).netloc != origin:  # credentials stay with their host
          headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        continue
      if not on_head(r.status, r.reason, r.headers):
        _read_all(r, sock, deadline, timeout, 1 << 20)
        return b""
      if into is None or r.chunked or r.length is None:
        data = _read_all(r, sock, deadline, timeout, cap)
        if into is None:
          return data
        if len(data) != into.nbytes:
          raise Transient(f"received {len(data)} of {into.nbytes} bytes")
        into.reshape(-1).view(np.uint8)[:] = np.frombuffer(data, np.uint8)
        return b""
      if r.length != into.nbytes:
        raise Transient(f"the response has {r.length} bytes, {into.nbytes} were asked for")
      flat: Any = into.reshape(-1).view(np.uint8)
      _body_into(r, sock, memoryview(flat), deadline, timeout)
      return b""
    except BaseException:
      _drop(parts.scheme, parts.netloc)  # a body not read to its end: the connection is done
      raise
  raise Transient(f"{url}: more than {_MAX_REDIRECTS} redirects")
