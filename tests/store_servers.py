"""Object stores on loopback for the remote tests (not collected by pytest): S3 (moto's
server), GCS (gcp-storage-emulator) and a small Hugging Face Hub of our own, each behind a
front that counts the payload bytes it sends and answers 503 on demand. 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import http.server
import json
import os
import pathlib
import re
import socket
import threading
import urllib.parse
from typing import Any

# gcsfs >= 2026.10 routes buckets through its gRPC "zonal/HNS" file system by default, which
# talks TLS to Google itself; an emulator speaks the JSON API only
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
# google-auth would otherwise ask the GCE metadata server (169.254.169.254) for credentials:
# these tests never leave 127.0.0.1
os.environ["NO_GCE_CHECK"] = "true"

HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection"}


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class _Front(http.server.BaseHTTPRequestHandler):
  """Forwards each request to the store behind it, counting ranged GET bodies."""

  server: Front
  protocol_version = "HTTP/1.1"

  def log_message(self, *args: Any) -> None:
    pass

  def _forward(self) -> None:
    s = self.server
    length = int(self.headers.get("Content-Length") or 0)
    body = self.rfile.read(length) if length else None
    ranged = self.command == "GET" and "Range" in self.headers
    if s.deny:  # what a store answers a request its credentials do not allow
      body = DENIED[s.kind]
      self.send_response(403)
      self.send_header("Content-Type", "application/xml" if s.kind == "s3" else "application/json")
      self.send_header("Content-Length", str(len(body)))
      self.end_headers()
      if self.command != "HEAD":
        self.wfile.write(body)
      return
    with s.lock:
      fail = s.fail_next > 0 and ranged
      if fail:
        s.fail_next -= 1
      part, count = s.fail_paths
      if not fail and count and self.command == "GET" and part in self.path:
        fail, s.fail_paths = True, (part, count - 1)
    if fail:
      self.send_response(503)
      self.send_header("Content-Length", "0")
      self.end_headers()
      return
    headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
    conn = http.client.HTTPConnection("127.0.0.1", s.backend, timeout=60)
    conn.request(self.command, self.path, body=body, headers=headers)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    self.send_response(r.status, r.reason)
    for k, v in r.getheaders():
      if k.lower() not in HOP:
        self.send_header(k, v)
    length = r.getheader("Content-Length") if self.command == "HEAD" else None
    self.send_header("Content-Length", length or str(len(data)))
    self.end_headers()
    if self.command != "HEAD":
      self.wfile.write(data)
    if self.command == "GET" and 200 <= r.status < 300:
      with s.lock:
        s.sent += len(data)
        if ranged:
          s.payload += len(data)
          s.ranged_requests += 1

  do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward


DENIED = {
  "s3": b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>AccessDenied</Code>"
  b"<Message>Access Denied</Message></Error>",
  "gs": b'{"error": {"code": 403, "message": "Permission denied", "errors": []}}',
}


class Front(http.server.ThreadingHTTPServer):
  daemon_threads = True

  def __init__(self, backend: int, kind: str):
    super().__init__(("127.0.0.1", 0), _Front)
    self.backend, self.kind = backend, kind
    self.deny = False  # answer every request with 403
    self.lock = threading.Lock()
    self.payload = 0  # body bytes of successful ranged GETs
    self.ranged_requests = 0
    self.sent = 0  # body bytes of every successful GET, ranged or not
    self.fail_next = 0  # ranged GETs to answer with 503
    self.fail_paths = ("", 0)  # (a path part, how many GETs of such paths to answer with 503)

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self.server_address[1]}"

  def handle_error(self, request: Any, client_address: Any) -> None:
    pass  # a client that hung up (a HEAD, a deadline) is not a failure of the store

  def start(self) -> Front:
    threading.Thread(target=self.serve_forever, daemon=True).start()
    return self


@contextlib.contextmanager
def object_store(kind: str):
  """``(endpoint, front)`` of moto's S3 server (``"s3"``) or gcp-storage-emulator (``"gs"``)."""
  port = free_port()
  if kind == "s3":
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
  else:
    from gcp_storage_emulator.server import create_server

    server = create_server("127.0.0.1", port, in_memory=True)
  server.start()
  front = Front(port, kind).start()
  try:
    yield f"http://127.0.0.1:{port}", front
  finally:
    front.shutdown()
    if kind == "s3":  # moto keeps its buckets for the process, not for the server
      conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
      conn.request("POST", "/moto-api/reset")
      conn.getresponse().read()
      conn.close()
    server.stop()


def s3_store():
  return object_store("s3")


def gcs_store():
  return object_store("gs")


def gcs_put(endpoint: str, bucket: str, name: str, data: bytes) -> None:
  """Writes an object to gcp-storage-emulator by a media upload: its multipart uploads (what
  gcsfs sends) drop a trailing carriage return byte, which breaks an OCDBT manifest."""
  conn = http.client.HTTPConnection(*endpoint.split("://", 1)[1].split(":"), timeout=60)
  target = (
    f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name={urllib.parse.quote(name, safe='')}"
  )
  conn.request("POST", target, body=data, headers={"Content-Type": "application/octet-stream"})
  r = conn.getresponse()
  r.read()
  conn.close()
  assert r.status == 200, (r.status, name)


def s3_options(endpoint: str) -> dict[str, Any]:
  return {
    "key": "testing",
    "secret": "testing",
    "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
  }


def gcs_options(endpoint: str) -> dict[str, Any]:
  return {"endpoint_url": endpoint, "token": "anon", "project": "test"}


# --- a Hugging Face Hub ------------------------------------------------------------------------


class _Hub(http.server.BaseHTTPRequestHandler):
  """The endpoints a restore uses: the revision API, ``resolve`` (a redirect to the storage,
  as the Hub answers for LFS files) and the storage itself (ranges, ETags)."""

  server: Hub
  protocol_version = "HTTP/1.1"

  def log_message(self, *args: Any) -> None:
    pass

  def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
    self.send_response(status)
    for k, v in (headers or {}).items():
      self.send_header(k, v)
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    if self.command != "HEAD":
      self.wfile.write(body)

  def _denied(self, repo: str) -> bool:
    if repo in self.server.gated and self.headers.get("Authorization") != "Bearer good-token":
      self._reply(401, b"gated", {"X-Error-Code": "GatedRepo"})
      return True
    return False

  def do_GET(self) -> None:
    path = urllib.parse.unquote(self.path.split("?")[0])
    hub = self.server
    with hub.lock:
      fail = hub.fail_next > 0 and path.startswith("/storage/")
      if fail:
        hub.fail_next -= 1
    if fail:
      return self._reply(503)
    if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/(.+)", path):
      return self._revision(m.group(1), m.group(2))
    if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
      return self._resolve(m.group(1), m.group(2), m.group(3))
    if m := re.fullmatch(r"/storage/([0-9a-f]{64})", path):
      return self._storage(m.group(1))
    self._reply(404, b"", {"X-Error-Code": "EntryNotFound"})

  do_HEAD = do_GET

  def _commit(self, repo: str, revision: str) -> str | None:
    """The commit ``revision`` names; ``None`` once the refusal is answered."""
    hub = self.server
    if repo not in hub.repos:
      self._reply(401, b"", {"X-Error-Code": "RepoNotFound"})
      return None
    if self._denied(repo):
      return None
    commit = hub.commit_of(repo, revision)
    if commit is None:
      self._reply(404, b"", {"X-Error-Code": "RevisionNotFound"})
    return commit

  def _revision(self, repo: str, revision: str) -> None:
    hub = self.server
    commit = self._commit(repo, revision)
    if commit is None:
      return
    files = [{"rfilename": f} for f in hub.repos[repo]["commits"][commit]]
    body = json.dumps({"id": repo, "sha": commit, "siblings": files}).encode()
    self._reply(200, body, {"Content-Type": "application/json"})

  def _resolve(self, repo: str, revision: str, name: str) -> None:
    hub = self.server
    commit = self._commit(repo, revision)
    if commit is None:
      return
    blob = hub.repos[repo]["commits"][commit].get(name)
    if blob is None:
      return self._reply(404, b"", {"X-Error-Code": "EntryNotFound"})
    with hub.lock:
      hub.resolved.append((repo, revision, name))
    headers = {"Location": f"/storage/{blob}", "X-Repo-Commit": commit, "ETag": f'"{blob}"'}
    self._reply(302, b"", headers)

  def _storage(self, blob: str) -> None:
    data = self.server.blobs.get(blob)
    if data is None:
      return self._reply(404)
    headers = {"ETag": f'"{blob}"', "Accept-Ranges": "bytes"}
    m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
    if not m:
      return self._reply(200, data, headers)
    start = int(m.group(1))
    end = min(len(data), int(m.group(2)) + 1) if m.group(2) else len(data)
    headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
    body = data[start:end]
    client = self.headers.get("X-Client", "-")
    with self.server.lock:
      if self.command == "GET":
        self.server.payload += len(body)
        self.server.sent[client] = self.server.sent.get(client, 0) + len(body)
    self._reply(206, body, headers)


class Hub(http.server.ThreadingHTTPServer):
  daemon_threads = True

  def __init__(self):
    super().__init__(("127.0.0.1", 0), _Hub)
    self.lock = threading.Lock()
    self.repos: dict[str, dict[str, Any]] = {}
    self.blobs: dict[str, bytes] = {}
    self.gated: set[str] = set()
    self.payload = 0
    self.sent: dict[str, int] = {}  # payload bytes per X-Client header
    self.fail_next = 0
    self.resolved: list[tuple[str, str, str]] = []

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self.server_address[1]}"

  def start(self) -> Hub:
    threading.Thread(target=self.serve_forever, daemon=True).start()
    return self

  def push(self, repo: str, folder: pathlib.Path, branch: str = "main") -> str:
    """Commits every file of ``folder`` to ``repo``'s ``branch``; returns the commit."""
    files = {}
    for path in sorted(folder.rglob("*")):
      if path.is_file():
        data = path.read_bytes()
        blob = hashlib.sha256(data).hexdigest()
        self.blobs[blob] = data
        files[str(path.relative_to(folder))] = blob
    commit = hashlib.sha1(json.dumps(files, sort_keys=True).encode()).hexdigest()
    entry = self.repos.setdefault(repo, {"branches": {}, "commits": {}})
    with self.lock:
      entry["commits"][commit] = files
      entry["branches"][branch] = commit
    return commit

  def commit_of(self, repo: str, revision: str) -> str | None:
    entry = self.repos[repo]
    if revision in entry["branches"]:
      return entry["branches"][revision]
    return revision if revision in entry["commits"] else None
