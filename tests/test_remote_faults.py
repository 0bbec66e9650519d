"""A changed object, a lying server or a closed source never yields a wrong value.

Against the loopback server of ``tests/http_server.py`` (127.0.0.1 only; every request loop
bounded): objects replaced after they were opened, ``Content-Range`` that lies about the total
or names other bytes, a server that trickles, documents that never end, statuses that are not
ours; and a local source closed while another thread reads it.
"""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest
from http_server import Server
from safetensors.numpy import save_file

import paramreg_jax as prj
from paramreg_jax import SafetensorsSource
from paramreg_jax.errors import SourceIOError


@pytest.fixture
def server(tmp_path):
  (tmp_path / "ckpt").mkdir()
  tensors = {
    "a": np.arange(4096, dtype=np.float32).reshape(64, 64),
    "b": -np.arange(4096, dtype=np.float32).reshape(64, 64),
  }
  save_file(tensors, tmp_path / "ckpt" / "model.safetensors")
  s = Server(tmp_path).start()
  s.tensors, s.folder = tensors, tmp_path / "ckpt"
  yield s
  s.shutdown()
  s.server_close()


def url(server, name="ckpt/model.safetensors"):
  return f"{server.url}/{name}"


def replace_same_size(path, swapped):
  """Writes other bytes of the same size (a new ETag and Last-Modified)."""
  time.sleep(0.01)
  save_file(swapped, path)
  os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))


# --- the object is pinned when it is opened ------------------------------------------------------


@pytest.mark.parametrize("if_match", [True, False], ids=["server-checks", "client-checks"])
def test_an_object_replaced_after_it_was_opened_is_an_error_never_its_bytes(server, if_match):
  server.honor_if_match = if_match
  src = SafetensorsSource(url(server), retries=0)
  swapped = {"a": server.tensors["b"], "b": server.tensors["a"]}  # same size, other bytes
  replace_same_size(server.folder / "model.safetensors", swapped)
  with pytest.raises(SourceIOError, match=r"the object changed after it was opened") as info:
    src.lease("a").read()
  assert url(server) in str(info.value) and "open the source again" in str(info.value)
  assert "ETag" in str(info.value)


def test_without_an_etag_last_modified_is_the_validator(server):
  server.honor_if_match = False
  src = SafetensorsSource(url(server), retries=0)
  server.validators = False  # as if the server stopped sending them: no ETag to compare
  np.testing.assert_array_equal(src.lease("a").read(), server.tensors["a"])  # nothing changed
  server.validators = True
  src = SafetensorsSource(url(server), retries=0)
  assert src._folder is not None
  replace_same_size(
    server.folder / "model.safetensors", {"a": server.tensors["b"], "b": server.tensors["a"]}
  )
  with pytest.raises(SourceIOError, match="the object changed after it was opened"):
    src.lease("a").read()


def test_a_content_range_total_that_changes_is_an_error(server):
  src = SafetensorsSource(url(server), retries=0)
  server.total_lie = 1000
  with pytest.raises(SourceIOError, match=r"its size is now \d+ bytes, it was \d+ when opened"):
    src.lease("a").read()


def test_a_206_that_names_other_bytes_is_never_used(server):
  src = SafetensorsSource(url(server), retries=0)
  server.shift = 64
  with pytest.raises(SourceIOError, match=r"asked for bytes \d+-\d+, the server answered bytes"):
    src.lease("b").read()


# --- a closed source ------------------------------------------------------------------------------


def test_closing_while_another_thread_reads_never_returns_another_files_bytes(
  tmp_path, monkeypatch
):
  # Deterministic: the reader holds the descriptor (it is inside ``preadv``) when ``close``
  # runs and the decoy is opened; a close that does not wait for it frees the number, the
  # decoy takes it, and the read returns the decoy's bytes.
  want = np.arange(64 * 1024, dtype=np.float32)
  save_file({"w": want}, tmp_path / "m.safetensors")
  decoy = tmp_path / "decoy"
  decoy.write_bytes(np.full(want.size + 1024, 7, np.float32).tobytes())
  src = SafetensorsSource(tmp_path / "m.safetensors")
  lease = src.lease("w")
  inside, closed = threading.Event(), threading.Event()
  real = os.preadv

  def preadv(fd, buffers, offset):
    if not inside.is_set():
      inside.set()
      assert closed.wait(30)
    return real(fd, buffers, offset)

  monkeypatch.setattr(os, "preadv", preadv)
  got = []

  def read():
    try:
      got.append(lease.read())
    except prj.ParamRegError as e:
      got.append(e)

  t = threading.Thread(target=read)
  t.start()
  assert inside.wait(30)
  src.close()
  fd = os.open(decoy, os.O_RDONLY)  # the number a closed descriptor had, reused
  closed.set()
  t.join(30)
  os.close(fd)
  assert isinstance(got[0], np.ndarray), got[0]
  np.testing.assert_array_equal(got[0], want)
  with pytest.raises(SourceIOError, match="closed"):
    lease.read()


def test_closing_races_with_reads_and_never_returns_another_files_bytes(tmp_path):
  want = np.arange(64 * 1024, dtype=np.float32)
  save_file({"w": want}, tmp_path / "m.safetensors")
  decoy = tmp_path / "decoy"
  decoy.write_bytes(np.full(want.size + 1024, 7, np.float32).tobytes())
  wrong = 0
  for _ in range(300):
    src = SafetensorsSource(tmp_path / "m.safetensors")
    lease = src.lease("w")
    got = []

    def read(lease=lease, got=got):
      try:
        got.append(lease.read())
      except prj.ParamRegError:
        got.append(None)

    t = threading.Thread(target=read)
    t.start()
    src.close()
    fd = os.open(decoy, os.O_RDONLY)  # the number the closed descriptor had, reused
    t.join()
    os.close(fd)
    if got[0] is not None and not np.array_equal(got[0], want):
      wrong += 1
  assert wrong == 0, f"{wrong} reads returned another file's bytes"


# --- outside the folder, hangs, memory ---------------------------------------------------------


@pytest.mark.parametrize(
  "name", ["%2e%2e/s2.safetensors", "%252e%252e/s2.safetensors", "..%2fs2.safetensors"]
)
def test_an_encoded_parent_path_in_a_remote_index_is_refused(server, name):
  index = {"metadata": {}, "weight_map": {"a": name}}
  (server.folder / "model.safetensors.index.json").write_text(json.dumps(index))
  with pytest.raises(prj.errors.StoreError, match="outside"):
    SafetensorsSource(url(server, "ckpt/model.safetensors.index.json"))
  assert not any(r[1] == "s2.safetensors" for r in server.requests)


def test_a_trickling_server_fails_within_the_deadline(server):
  server.trickle = 0.5  # one byte every half second: the 64 KiB header would take 9 hours
  t0 = time.perf_counter()
  with pytest.raises(SourceIOError, match="timed out") as info:
    SafetensorsSource(url(server), retries=0, timeout=2)
  assert time.perf_counter() - t0 < 15
  assert url(server) in str(info.value)


def test_an_index_larger_than_the_cap_is_refused_while_it_streams(server):
  big = server.folder / "model.safetensors.index.json"
  with open(big, "wb") as f:
    f.write(b'{"weight_map": {"' + b"x" * (160 << 20) + b'": "model.safetensors"}}')
  server.no_length = True  # no Content-Length: only streaming can tell
  with pytest.raises(SourceIOError, match=r"larger than 67108864 bytes"):
    SafetensorsSource(url(server, "ckpt/model.safetensors.index.json"), retries=0)
  # stopped at the cap, far from the whole 160 MiB (what the server had already pushed into
  # the socket when the client hung up is counted too)
  assert sum(server.sent.values()) < 128 << 20
  server.no_length = False
  with pytest.raises(SourceIOError, match=r"larger than 67108864 bytes"):  # said up front
    SafetensorsSource(url(server, "ckpt/model.safetensors.index.json"), retries=0)


# --- errors are ours --------------------------------------------------------------------------


@pytest.mark.parametrize("status", [500, 503, 403])
def test_an_index_answered_with_an_error_status_is_our_error(server, status):
  index = {"metadata": {}, "weight_map": {"a": "model.safetensors", "b": "model.safetensors"}}
  (server.folder / "model.safetensors.index.json").write_text(json.dumps(index))
  server.statuses["ckpt/model.safetensors.index.json"] = [status] * 10
  with pytest.raises(SourceIOError) as info:
    SafetensorsSource(url(server, "ckpt/model.safetensors.index.json"), retries=1)
  assert f"HTTP {status}" in str(info.value) and "model.safetensors.index.json" in str(info.value)


def test_one_transient_error_on_the_index_is_retried(server):
  index = {"metadata": {}, "weight_map": {"a": "model.safetensors", "b": "model.safetensors"}}
  (server.folder / "model.safetensors.index.json").write_text(json.dumps(index))
  server.statuses["ckpt/model.safetensors.index.json"] = [500]
  src = SafetensorsSource(url(server, "ckpt/model.safetensors.index.json"))
  np.testing.assert_array_equal(src.lease("b").read(), server.tensors["b"])


@pytest.mark.parametrize(
  "kwargs, message",
  [
    (dict(retries=-1), "retries must be an int >= 0, got -1"),
    (dict(retries=1.5), "retries must be an int >= 0, got 1.5"),
    (dict(timeout="x"), "timeout must be a positive number, got 'x'"),
    (dict(timeout=-1), "timeout must be a positive number, got -1"),
    (dict(min_throughput=0), "min_throughput must be a positive number, got 0"),
    (dict(storage_options=[1]), "storage_options must be a dict"),
    (dict(storage_options={"client_kwargs": 5}), "storage_options['client_kwargs'] must be a dict"),
  ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, message):
  with pytest.raises(prj.errors.StoreError, match=__import__("re").escape(message)):
    SafetensorsSource("http://127.0.0.1:9/ckpt/model.safetensors", **kwargs)


def test_an_unknown_protocol_is_our_error():
  with pytest.raises(prj.errors.StoreError, match=r"ftp:// is not a protocol read here"):
    SafetensorsSource("ftp://127.0.0.1/ckpt/model.safetensors")


# --- the two HTTP clients ----------------------------------------------------------------------

CLIENTS = pytest.mark.parametrize(
  "options", [None, {"client_kwargs": {}}], ids=["stdlib", "aiohttp"]
)


@CLIENTS
def test_both_http_clients_read_the_same_bytes_and_refuse_a_replaced_object(server, options):
  """Storage options beyond ``headers`` keep fsspec's aiohttp client; both read the same bytes
  and pin the object the same way."""
  src = SafetensorsSource(url(server), retries=0, storage_options=options)
  assert src._where["a"].store.plain is (options is None)
  for key in ("a", "b"):
    np.testing.assert_array_equal(src.lease(key).read(), server.tensors[key])
  np.testing.assert_array_equal(src.lease("a").read((slice(3, 9),)), server.tensors["a"][3:9])
  replace_same_size(
    server.folder / "model.safetensors", {"a": server.tensors["b"], "b": server.tensors["a"]}
  )
  with pytest.raises(SourceIOError, match="the object changed after it was opened"):
    src.lease("a").read()


@CLIENTS
def test_both_http_clients_fail_a_trickling_body_within_its_deadline(server, options):
  src = SafetensorsSource(
    url(server), retries=0, timeout=1, min_throughput=1 << 20, storage_options=options
  )
  server.trickle = 0.2  # each byte arrives within the timeout: only the deadline can end it
  t0 = time.perf_counter()
  with pytest.raises(SourceIOError, match=r"timed out|deadline"):
    src.lease("a").read()
  assert time.perf_counter() - t0 < 10
