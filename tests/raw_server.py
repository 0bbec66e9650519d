"""A scripted HTTP server on 127.0.0.1 for the security and fault tests: each request is
answered by a function of the test's, byte by byte if it likes (a status line that trickles, a
body with no length), and every request is recorded as it arrived, with whether it came over
TLS. One port serves TLS and plain HTTP alike (the first byte of a connection tells), so a
redirect from ``https://h:P`` to ``http://h:P`` can be followed to the same server.

Every connection is handled in its own daemon thread and ends when the script returns or the
client hangs up; ``close()`` stops accepting.
"""

from __future__ import annotations

import dataclasses
import pathlib
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass
class Request:
  method: str
  path: str
  headers: dict[str, str]  # lower-case names
  tls: bool


def self_signed(folder: pathlib.Path) -> tuple[str, str]:
  """``(certificate, key)`` files for 127.0.0.1, made with the openssl command."""
  cert, key = folder / "cert.pem", folder / "key.pem"
  subprocess.run(
    ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
     "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
     "-keyout", str(key), "-out", str(cert)],
    check=True, capture_output=True,
  )  # fmt: skip
  return str(cert), str(key)


class RawServer:
  """``script(request, send)`` answers each request; ``send(bytes)`` writes to the client."""

  def __init__(self, script: Callable[[Request, Callable[[bytes], None]], None], tls=None):
    self.script = script
    self.requests: list[Request] = []
    self.sent = 0
    self._lock = threading.Lock()
    self._tls = None
    if tls is not None:
      self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
      self._tls.load_cert_chain(*tls)
    self._sock = socket.create_server(("127.0.0.1", 0))
    self._sock.settimeout(0.2)
    self._open = True
    threading.Thread(target=self._accept, daemon=True).start()

  @property
  def port(self) -> int:
    return self._sock.getsockname()[1]

  def url(self, scheme: str = "http") -> str:
    return f"{scheme}://127.0.0.1:{self.port}"

  def close(self) -> None:
    self._open = False
    self._sock.close()

  def _accept(self) -> None:
    while self._open:
      try:
        conn, _ = self._sock.accept()
      except (TimeoutError, OSError):
        continue
      threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

  def _serve(self, conn: socket.socket) -> None:
    try:
      conn.settimeout(30)
      tls = self._tls is not None and conn.recv(1, socket.MSG_PEEK) == b"\x16"
      if tls:
        conn = self._tls.wrap_socket(conn, server_side=True)
      while self._open:
        head = b""
        while b"\r\n\r\n" not in head:
          chunk = conn.recv(4096)
          if not chunk:
            return
          head += chunk
        lines = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
          name, _, value = line.partition(":")
          headers[name.strip().lower()] = value.strip()
        request = Request(method, path, headers, tls)
        with self._lock:
          self.requests.append(request)

        def send(data: bytes) -> None:
          conn.sendall(data)
          with self._lock:
            self.sent += len(data)

        if self.script(request, send) is False:  # the script closed the exchange
          return
    except (OSError, ValueError, ssl.SSLError):
      return
    finally:
      conn.close()


def response(status: int, body: bytes = b"", headers: dict[str, Any] | None = None) -> bytes:
  """A whole response with ``Content-Length`` (unless ``headers`` set it to None)."""
  fields = {"Content-Length": len(body), **(headers or {})}
  head = f"HTTP/1.1 {status} X\r\n" + "".join(
    f"{k}: {v}\r\n" for k, v in fields.items() if v is not None
  )
  return head.encode() + b"\r\n" + body
