"""A loopback HTTP server for the remote-source tests: serves a directory, honours ``Range``,
counts the bytes it sends per client (the ``X-Client`` request header), and misbehaves on demand.

Run as a script (``python tests/http_server.py DIR``) it prints its URL and serves until killed;
the multi-host test uses that, and reads the counts from ``GET /_stats``.
"""

from __future__ import annotations

import http.server
import json
import os
import pathlib
import re
import sys
import threading
import time
from typing import Any


class Handler(http.server.BaseHTTPRequestHandler):
  server: Server
  protocol_version = "HTTP/1.1"

  def log_message(self, *args: Any) -> None:  # quiet
    pass

  def _file(self) -> pathlib.Path | None:
    path = (self.server.root / self.path.split("?")[0].lstrip("/")).resolve()
    if self.server.root not in path.parents or not path.is_file():
      return None
    return path

  def do_HEAD(self) -> None:
    self._serve(body=False)

  def do_GET(self) -> None:
    if self.path == "/_stats":
      data = json.dumps(self.server.stats()).encode()
      self.send_response(200)
      self.send_header("Content-Length", str(len(data)))
      self.end_headers()
      self.wfile.write(data)
      return
    self._serve(body=True)

  def _status(self, code: int) -> None:
    self.send_response(code)
    self.send_header("Content-Length", "0")
    self.end_headers()

  def _serve(self, body: bool) -> None:
    s = self.server
    if s.slow:
      time.sleep(s.slow)
    path = self._file()
    name = self.path.split("?")[0].lstrip("/")
    with s.lock:
      queued = s.statuses.get(name)
      status = queued.pop(0) if queued else None
    if status is not None:
      return self._status(status)
    if path is None:
      return self._status(404)
    stat = path.stat()
    size = stat.st_size
    etag = f'"{size:x}-{stat.st_mtime_ns:x}"'
    if s.honor_if_match and self.headers.get("If-Match") not in (None, "*", etag):
      return self._status(412)
    start, end = 0, size
    ranged = False
    match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
    if match and not s.ignore_range:
      start = int(match.group(1))
      end = min(size, int(match.group(2)) + 1) if match.group(2) else size
      ranged = True
    shown = (max(0, start - s.shift), max(0, start - s.shift) + end - start)  # a lying 206
    start, end = shown if ranged and s.shift else (start, end)
    self.send_response(206 if ranged else 200)
    self.send_header("Accept-Ranges", "none" if s.ignore_range else "bytes")
    if s.validators:
      self.send_header("ETag", etag)
      self.send_header(
        "Last-Modified", time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(stat.st_mtime))
      )
    if s.no_length and not ranged:
      self.send_header("Connection", "close")
      self.close_connection = True
    else:
      self.send_header("Content-Length", str(end - start))
    if ranged:
      self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size + s.total_lie}")
    self.end_headers()
    if not body:
      return
    client = self.headers.get("X-Client", "-")
    want = end - start
    with s.lock:
      s.requests.append((client, path.name, start, end))
      s.pushed.append(0)
      request = len(s.pushed) - 1
      drop = s.drop_next > 0 and want > 16
      if drop:
        s.drop_next -= 1
        want //= 2  # half the body, then the connection goes away
    with open(path, "rb") as f:
      if not (s.trickle or drop):  # the kernel copies the file to the socket: a fast server
        self.wfile.flush()
        done = 0
        while done < want:
          step = min(1 << 20, want - done)
          with s.lock:  # counted before it is written, as below
            s.sent[client] = s.sent.get(client, 0) + step
            s.pushed[request] += step
          try:
            done += self.connection.sendfile(f, offset=start + done, count=step)
          except OSError:  # the client hung up
            return
        return
      f.seek(start)
      sent = 0
      while sent < want:
        chunk = f.read(min(1 << 20, want - sent))
        if s.trickle:  # one byte at a time, s.trickle seconds apart
          chunk = chunk[:1]
          f.seek(start + sent + 1)
          time.sleep(s.trickle)
        with s.lock:  # counted before it is written: bytes a client has are always counted
          s.sent[client] = s.sent.get(client, 0) + len(chunk)
          s.pushed[request] += len(chunk)
        try:
          self.wfile.write(chunk)
        except OSError:  # the client hung up (a deadline, a refused document)
          return
        sent += len(chunk)
    if drop:
      self.wfile.flush()
      self.close_connection = True
      self.connection.shutdown(2)


class Server(http.server.ThreadingHTTPServer):
  daemon_threads = True

  def __init__(self, root: str | os.PathLike[str], port: int = 0):
    super().__init__(("127.0.0.1", port), Handler)
    self.root = pathlib.Path(root).resolve()
    self.lock = threading.Lock()
    self.sent: dict[str, int] = {}
    self.requests: list[tuple[str, str, int, int]] = []
    self.pushed: list[int] = []  # body bytes written (or being written) per request
    self.ignore_range = False
    self.drop_next = 0
    self.slow = 0.0
    self.validators = True  # send ETag and Last-Modified
    self.honor_if_match = True  # answer 412 when If-Match names another ETag
    self.shift = 0  # a 206 whose Content-Range (and body) are this many bytes earlier
    self.total_lie = 0  # added to the object size in Content-Range
    self.trickle = 0.0  # seconds between single bytes
    self.no_length = False  # whole-object bodies without Content-Length, until the close
    self.statuses: dict[str, list[int]] = {}  # per path: statuses to answer before serving

  def handle_error(self, request: Any, client_address: Any) -> None:
    pass  # a client that hangs up (a timeout test) is not a server error

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self.server_address[1]}"

  def stats(self) -> dict[str, Any]:
    with self.lock:
      return {"sent": dict(self.sent), "requests": len(self.requests)}

  def start(self) -> Server:
    threading.Thread(target=self.serve_forever, daemon=True).start()
    return self


if __name__ == "__main__":
  server = Server(sys.argv[1])
  print(server.url, flush=True)
  server.serve_forever()
