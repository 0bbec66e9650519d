"""Credentials stay with their origin and every remote read is bounded, against scripted
servers on 127.0.0.1 (``tests/raw_server.py``; one of them speaks TLS and plain HTTP on one
port). Each test asserts the library's error type, that the message names the URL, and, for
credentials, what the servers actually received."""

from __future__ import annotations

import json
import re
import ssl
import time
import tracemalloc

import numpy as np
import pytest
from raw_server import RawServer
from raw_server import response
from raw_server import self_signed
from safetensors.numpy import save

import paramreg_jax as prj
from paramreg_jax import errors
from paramreg_jax._src.sources.storage import http_ranges

TENSORS = {"a": np.arange(1024, dtype=np.float32), "b": -np.arange(64, dtype=np.float32)}
DATA = save(TENSORS)
SECRET = "Bearer s3cret"
SHA = "0123456789abcdef0123456789abcdef01234567"
CLIENTS = {
  "stdlib": lambda headers: {"headers": headers},
  "fsspec": lambda headers: {"headers": headers, "client_kwargs": {"trust_env": False}},
}


def serve(data: bytes = DATA):
  """A script answering ``GET``/``HEAD`` ranges of ``data`` as a file server does."""

  def script(request, send):
    m = re.fullmatch(r"bytes=(\d+)-(\d+)", request.headers.get("range", ""))
    if m is None:
      send(response(200, b"" if request.method == "HEAD" else data))
      return
    start, end = int(m.group(1)), min(int(m.group(2)) + 1, len(data))
    body = data[start:end]
    headers = {"Content-Range": f"bytes {start}-{end - 1}/{len(data)}", "ETag": '"v1"'}
    send(response(206, body if request.method != "HEAD" else b"", headers))

  return script


@pytest.fixture
def tls(tmp_path, monkeypatch):
  """A certificate for 127.0.0.1 that both clients trust."""
  cert, key = self_signed(tmp_path)
  context = ssl.create_default_context(cafile=cert)
  monkeypatch.setattr(http_ranges, "_tls", context)  # the standard-library reader's
  return cert, key, context  # fsspec's: storage_options={"ssl": context}


@pytest.fixture
def servers():
  opened = []

  def make(script, tls=None):
    opened.append(RawServer(script, tls))
    return opened[-1]

  yield make
  for s in opened:
    s.close()


# --- 1, 3: https never downgraded to plain http ---------------------------------------------


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_an_https_redirect_to_plain_http_on_the_same_port_is_refused_in_clear_text(
  tls, servers, client
):
  def script(request, send):
    if request.tls:
      send(response(302, headers={"Location": f"http://127.0.0.1:{server.port}{request.path}"}))
    else:
      send(response(404))

  server = servers(script, tls[:2])
  url = f"{server.url('https')}/m.safetensors"
  options = CLIENTS[client]({"Authorization": SECRET})
  if client == "fsspec":
    options["ssl"] = tls[2]
  with pytest.raises(errors.SourceIOError) as info:
    prj.SafetensorsSource(url, storage_options=options, retries=0)
  message = str(info.value)
  assert url in message and "a redirect from https to http is refused" in message
  assert f"http://127.0.0.1:{server.port}/m.safetensors" in message
  assert [r.tls for r in server.requests] == [True]  # nothing was sent in clear text
  assert server.requests[0].headers["authorization"] == SECRET


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_redirect_to_another_origin_carries_no_credential_of_any_name(servers, client):
  """Another port is another origin: ``Authorization`` and any header of the user's are
  credentials and stay behind; the file is read all the same."""
  storage = servers(serve())
  front = servers(
    lambda r, send: send(response(302, headers={"Location": f"{storage.url()}{r.path}"}))
  )
  headers = {"Authorization": SECRET, "X-Api-Key": "k3y"}
  src = prj.SafetensorsSource(
    f"{front.url()}/m.safetensors", storage_options=CLIENTS[client](headers)
  )
  np.testing.assert_array_equal(src.lease("a").read(), TENSORS["a"])
  assert front.requests and all(r.headers.get("x-api-key") == "k3y" for r in front.requests)
  assert storage.requests
  for r in storage.requests:
    assert "authorization" not in r.headers and "x-api-key" not in r.headers
    assert "range" in r.headers


def _hub(answer_revision, answer_resolve=None):
  """A Hub: the revision API answered by ``answer_revision``, ``resolve`` by the other."""

  def script(request, send):
    if request.path.startswith("/api/"):
      return answer_revision(request, send)
    if answer_resolve is not None:
      return answer_resolve(request, send)
    send(response(404))

  return script


def test_the_hubs_revision_lookup_drops_the_token_on_a_redirect_to_another_host(servers):
  elsewhere = servers(lambda r, send: send(response(404)))
  hub = servers(
    _hub(lambda r, send: send(response(302, headers={"Location": f"{elsewhere.url()}/x"})))
  )
  with pytest.raises(errors.ParamRegError, match=r"hf://org/model"):
    prj.SafetensorsSource(
      "hf://org/model", storage_options={"endpoint": hub.url(), "token": "s3cret"}, retries=0
    )
  assert hub.requests[0].headers["authorization"] == SECRET
  assert elsewhere.requests and all("authorization" not in r.headers for r in elsewhere.requests)


@pytest.mark.parametrize("where", ["revision", "resolve"])
def test_an_https_hub_that_downgrades_to_http_never_gets_the_token_in_clear(
  tls, servers, monkeypatch, where
):
  def downgrade(request, send):
    send(response(302, headers={"Location": f"http://127.0.0.1:{hub.port}{request.path}"}))

  def revision(request, send):
    if not request.tls:
      return send(response(404))
    if where == "revision":
      return downgrade(request, send)
    send(response(200, json.dumps({"sha": SHA}).encode()))

  def resolve(request, send):
    return downgrade(request, send) if request.tls else send(response(404))

  hub = servers(_hub(revision, resolve), tls[:2])
  monkeypatch.setenv("HF_ENDPOINT", hub.url("https"))
  monkeypatch.setenv("HF_TOKEN", "s3cret")
  with pytest.raises(errors.SourceIOError, match=r"a redirect from https to http is refused"):
    prj.SafetensorsSource("hf://org/model/model.safetensors", retries=0)
  assert hub.requests and all(r.tls for r in hub.requests)
  assert all(r.headers.get("authorization") == SECRET for r in hub.requests)


# --- 4: Hub ids checked before any request --------------------------------------------------


@pytest.mark.parametrize(
  "url",
  [
    "hf://org/model/../../../../evil/repo/resolve/main/model.safetensors",
    "hf://org/model/weights/%2e%2e/%2e%2e/x.safetensors",
    "hf://org/model/a/%252e%252e/b.safetensors",
    "hf://org/model/./model.safetensors",
    "hf://org/../evil/repo",
    "hf://../org/model",
    "hf://org/model@..",
    "hf://org/model@refs/../../x",
    "hf://org/mo del",
    "hf://org/-model",
  ],
)
def test_a_hub_url_that_would_leave_its_repository_is_refused_before_any_request(servers, url):
  hub = servers(_hub(lambda r, send: send(response(200, json.dumps({"sha": SHA}).encode()))))
  with pytest.raises(errors.StoreError, match=re.escape(url) + r".*nothing was requested"):
    prj.SafetensorsSource(url, storage_options={"endpoint": hub.url()}, retries=0)
  assert hub.requests == []


def test_a_hub_answer_that_names_no_commit_is_refused(servers):
  hub = servers(_hub(lambda r, send: send(response(200, b'{"sha": "../../evil"}'))))
  with pytest.raises(errors.SourceIOError, match=r"names no commit \(a 40-hex sha\)"):
    prj.SafetensorsSource("hf://org/model", storage_options={"endpoint": hub.url()}, retries=0)


# --- 5, 7: every byte count known before it is read ------------------------------------------


_MIB = b"\0" * (1 << 20)  # what the servers send, allocated before any measurement
_BIG_BODY = b"x" * (2 << 20)


def _endless(total):
  """A 206 naming the bytes asked for (of an object of ``total`` bytes) with no
  Content-Length, then 128 MiB until the client hangs up."""

  def script(request, send):
    first, last = re.fullmatch(r"bytes=(\d+)-(\d+)", request.headers["range"]).groups()
    send(b"HTTP/1.1 206 X\r\nContent-Range: bytes %s-%s/%d\r\n\r\n" % (
      first.encode(), last.encode(), total))  # fmt: skip
    for _ in range(128):
      send(_MIB)
    return False

  return script


def _peak(call):
  tracemalloc.start()
  try:
    call()
  finally:
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
  return peak


def test_an_opening_read_without_a_length_is_refused_after_at_most_its_size(servers):
  server = servers(_endless(1 << 27))

  def call():
    with pytest.raises(errors.SourceIOError, match=r"more than the 65536 bytes asked for"):
      prj.SafetensorsSource(f"{server.url()}/m.safetensors", retries=0)

  assert _peak(call) < (64 << 10) + (1 << 20)


def test_a_range_without_a_length_is_refused_after_at_most_its_size_and_nothing_binds(servers):
  honest = serve()
  state = {"evil": False}
  endless = _endless(len(DATA))
  server = servers(lambda r, send: (endless if state["evil"] else honest)(r, send))
  src = prj.SafetensorsSource(f"{server.url()}/m.safetensors", retries=0)
  state["evil"] = True
  target = {"a": np.zeros(1024, np.float32), "b": np.zeros(64, np.float32)}
  before = target["a"].copy()

  def call():
    with pytest.raises(errors.ParamRegError, match=r"more than the 4096 bytes asked for"):
      prj.restore(target, src)

  assert _peak(call) < (4 << 10) + (1 << 20)
  np.testing.assert_array_equal(target["a"], before)


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_redirect_with_a_large_body_is_followed_without_reading_it(servers, client):
  real = serve()

  def script(request, send):
    if request.path == "/real.safetensors":
      return real(request, send)
    length = {"Content-Length": len(_BIG_BODY), "Location": "/real.safetensors"}
    send(response(302, headers=length))
    send(_BIG_BODY)

  server = servers(script)

  def call():
    src = prj.SafetensorsSource(
      f"{server.url()}/m.safetensors", storage_options=CLIENTS[client]({}), retries=0
    )
    out = prj.restore({"a": np.zeros(1024, np.float32), "b": np.zeros(64, np.float32)}, src)
    np.testing.assert_array_equal(out["a"], TENSORS["a"])

  peak = _peak(call)
  if client == "stdlib":  # aiohttp reads a redirect's body into its own buffers
    assert peak < 1 << 20


# --- 6: one deadline per request, from the status line on -----------------------------------


def _trickle(request, send):
  for byte in b"HTTP/1.1 206 X\r\nContent-Range: bytes 0-65535/100000\r\n":
    send(bytes([byte]))
    time.sleep(0.5)
  return False


def test_a_trickled_status_line_and_headers_end_within_the_timeout(servers):
  server = servers(_trickle)
  start = time.monotonic()
  with pytest.raises(errors.SourceIOError, match=r"timed out") as info:
    prj.SafetensorsSource(f"{server.url()}/m.safetensors", timeout=2, retries=0)
  assert time.monotonic() - start < 3.0 + 0.1
  assert server.url() in str(info.value)


def test_a_trickled_hub_answer_ends_within_the_timeout(servers):
  hub = servers(_hub(_trickle))
  start = time.monotonic()
  with pytest.raises(errors.SourceIOError, match=r"hf://org/model: .*timed out"):
    prj.SafetensorsSource(
      "hf://org/model", storage_options={"endpoint": hub.url()}, timeout=2, retries=0
    )
  assert time.monotonic() - start < 3.0


def test_a_garbled_hub_answer_is_a_library_error_naming_the_url(servers):
  hub = servers(lambda r, send: (send(b"garbage\r\n\r\n"), False)[1])
  with pytest.raises(errors.SourceIOError, match=r"hf://org/model: asking the Hub for the commit"):
    prj.SafetensorsSource("hf://org/model", storage_options={"endpoint": hub.url()}, retries=0)
