"""Checkpoints at URLs: a real HTTP server on loopback (``tests/http_server.py``) that honours
``Range``, counts the bytes it sends, and misbehaves on demand. No test leaves the machine."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import hf_models as hf
import jax
import numpy as np
import pytest
from http_server import Server
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from safetensors.numpy import save_file

import paramreg_jax as prj
from paramreg_jax import SafetensorsSource
from paramreg_jax import recipes as R
from paramreg_jax.errors import MissingShardError
from paramreg_jax.errors import SourceIOError

ROWS, COLS, COUNT = 256, 512, 8


@pytest.fixture
def served(tmp_path):
  rng = np.random.default_rng(0)
  tensors = {
    f"layers.{i}.weight": rng.standard_normal((ROWS, COLS), dtype=np.float32) for i in range(COUNT)
  }
  (tmp_path / "ckpt").mkdir()
  save_file(tensors, tmp_path / "ckpt" / "model.safetensors")
  server = Server(tmp_path).start()
  yield server, tensors, tmp_path / "ckpt"
  server.shutdown()
  server.server_close()


def transposed_target(devices, *, keys=None):
  grid = NamedSharding(jax.make_mesh((4, 2), ("x", "y")), P("x", "y"))
  keys = keys or range(COUNT)
  target = {
    "layers": {
      str(i): {"kernel": jax.ShapeDtypeStruct((COLS, ROWS), np.float32, sharding=grid)}
      for i in keys
    }
  }
  recipes = {
    f"layers/{i}/kernel": R.transpose(R.source(f"layers.{i}.weight"), (1, 0)) for i in keys
  }
  return target, recipes


def remote(server, path="ckpt", client="test", **kwargs):
  return SafetensorsSource(
    f"{server.url}/{path}", storage_options={"headers": {"X-Client": client}}, **kwargs
  )


def test_a_sharded_restore_over_http_reads_only_what_it_needs(served, devices):
  server, tensors, _ = served
  target, recipes = transposed_target(devices)
  src = remote(server)
  header = server.stats()["sent"]["test"]
  params = prj.restore(target, src, recipes=recipes)
  for i in range(COUNT):
    np.testing.assert_array_equal(
      np.asarray(params["layers"][str(i)]["kernel"]), tensors[f"layers.{i}.weight"].T
    )
  needed = COUNT * ROWS * COLS * 4
  sent = server.stats()["sent"]["test"] - header
  assert needed <= sent <= 1.1 * needed, (sent, needed)
  assert src.stats.bytes_read == sent  # the source counts what the server sent


def test_tensors_the_target_does_not_need_are_never_fetched(served, devices):
  server, _, _ = served
  target, recipes = transposed_target(devices, keys=[1, 5])
  src = remote(server)
  before = server.stats()["sent"]["test"]
  prj.restore(
    target,
    src,
    recipes=recipes,
    exclude=[f"layers.{i}.weight" for i in range(COUNT) if i not in (1, 5)],
  )
  sent = server.stats()["sent"]["test"] - before
  assert 2 * ROWS * COLS * 4 <= sent <= 1.1 * 2 * ROWS * COLS * 4


def test_opening_a_file_at_a_url_is_one_request_when_its_header_is_small(tmp_path):
  (tmp_path / "ckpt").mkdir()
  small = {f"w{i}": np.full((4, 4), i, np.float32) for i in range(8)}
  save_file(small, tmp_path / "ckpt" / "model.safetensors")
  (tmp_path / "wide").mkdir()  # a header of about 150 KB: more than the first 64 KiB
  wide = {f"layer.{i:05d}.w": np.zeros(1, np.float32) for i in range(2000)}
  save_file(wide, tmp_path / "wide" / "model.safetensors")
  server = Server(tmp_path).start()
  try:
    n = len(server.requests)
    src = remote(server, "ckpt")
    opened = [r for r in server.requests[n:] if r[1] == "model.safetensors"]
    assert len(opened) == 1  # the length, the header and the size from one range request
    np.testing.assert_array_equal(src.read_stacked(["w3", "w4"])[:, 0, 0], [3, 4])
    n = len(server.requests)
    wide_src = remote(server, "wide")
    opened = [r for r in server.requests[n:] if r[1] == "model.safetensors"]
    assert len(opened) == 2  # the first 64 KiB, then the rest of the header
    assert wide_src.metadata("layer.01999.w").shape == (1,)
    np.testing.assert_array_equal(wide_src.read_stacked(["layer.00007.w"]), [[0.0]])
  finally:
    server.shutdown()
    server.server_close()


def test_many_small_tensors_at_a_url_are_fetched_in_a_few_range_requests(tmp_path, devices):
  tensors = {f"experts.{i:04d}.w": np.full((16, 16), i, np.float32) for i in range(600)}
  (tmp_path / "moe").mkdir()
  save_file(tensors, tmp_path / "moe" / "model.safetensors")
  server = Server(tmp_path).start()
  try:
    src = remote(server, "moe")
    assert src.remote
    # (the log of requests, not the bytes-sent counter: the server adds to that after the body
    # went out, so the header's bytes may land after the client moved on)
    opened = len(server.requests)
    grid = NamedSharding(jax.make_mesh((4, 2), ("x", "y")), P("x", "y"))
    target = {k: jax.ShapeDtypeStruct((16, 16), np.float32, sharding=grid) for k in tensors}
    # read ahead by a thread, in chunks of a quarter of the budget: 16 KiB = 16 tensors
    out = prj.restore(target, src, max_inflight_bytes=64 << 10)
    fetched = server.requests[opened:]
  finally:
    server.shutdown()
    server.server_close()
  for k in ("experts.0000.w", "experts.0321.w", "experts.0599.w"):
    np.testing.assert_array_equal(np.asarray(out[k]), tensors[k])
    assert out[k].sharding == grid
  assert len(fetched) == 600 // 16 + 1  # one range request per chunk of adjacent tensors
  assert sum(end - start for _, _, start, end in fetched) == 600 * 16 * 16 * 4


def test_the_index_the_config_and_match_work_at_a_url(tmp_path, devices):
  server = Server(hf.DATA).start()
  try:
    src = remote(server, "mixtral")
    local = SafetensorsSource(hf.DATA / "mixtral")
    assert src.keys() == local.keys() and src.config == local.config
    arch, sizes, _, _ = hf.case("mixtral")
    target = hf.target(
      hf.STYLES["nnx"], hf.with_head(hf.canonical_shapes(arch, sizes), arch, sizes), arch, sizes
    )
    m = prj.match(target, src)
    got = prj.restore(target, src, recipes=m)
    want = prj.restore(target, local, recipes=prj.match(target, local))
    jax.tree.map(
      lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), got, want
    )
  finally:
    server.shutdown()
    server.server_close()


def test_a_sharded_index_at_a_url(tmp_path):
  tensors = {f"w{i}": np.full((4, 4), i, np.float32) for i in range(4)}
  (tmp_path / "ck").mkdir()
  save_file({k: tensors[k] for k in ("w0", "w1")}, tmp_path / "ck" / "a.safetensors")
  save_file({k: tensors[k] for k in ("w2", "w3")}, tmp_path / "ck" / "b.safetensors")
  weight_map = {
    "w0": "a.safetensors",
    "w1": "a.safetensors",
    "w2": "b.safetensors",
    "w3": "b.safetensors",
  }
  (tmp_path / "ck" / "model.safetensors.index.json").write_text(
    json.dumps({"weight_map": weight_map})
  )
  server = Server(tmp_path).start()
  try:
    for url in (f"{server.url}/ck", f"{server.url}/ck/model.safetensors.index.json"):
      src = SafetensorsSource(url)
      assert src.keys() == ("w0", "w1", "w2", "w3")
      np.testing.assert_array_equal(src.lease("w3").read(), 3)
    bad = {"w0": "../outside.safetensors"}
    (tmp_path / "ck" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": bad}))
    with pytest.raises(prj.errors.StoreError, match="outside"):
      SafetensorsSource(f"{server.url}/ck")
  finally:
    server.shutdown()
    server.server_close()


# --- faults ----------------------------------------------------------------------------------------


def test_a_connection_dropped_mid_body_is_retried_and_succeeds(served, devices):
  server, tensors, _ = served
  target, recipes = transposed_target(devices)
  src = remote(server)
  server.drop_next = 3
  params = prj.restore(target, src, recipes=recipes)
  assert server.drop_next == 0  # three bodies were cut short, and read again
  for i in range(COUNT):
    np.testing.assert_array_equal(
      np.asarray(params["layers"][str(i)]["kernel"]), tensors[f"layers.{i}.weight"].T
    )


def test_a_closed_remote_source_refuses_to_read(served):
  server, tensors, _ = served
  with remote(server) as src:
    np.testing.assert_array_equal(src.lease("layers.0.weight").read(), tensors["layers.0.weight"])
  with pytest.raises(SourceIOError, match="the source was closed"):
    src.lease("layers.0.weight").read()


def test_a_404_names_the_url(served):
  server, _, _ = served
  url = f"{server.url}/nowhere/model.safetensors"
  with pytest.raises(MissingShardError, match=f"{url}: not found"):
    SafetensorsSource(url)


def test_a_server_that_ignores_range_is_refused_before_it_sends_the_object(tmp_path, devices):
  """64 MiB behind a server that answers every Range request with the whole object: the
  refusal comes from the status line; the body is never read (the server only manages to push
  what fits in the socket buffers before the client hangs up)."""
  (tmp_path / "big").mkdir()
  save_file(
    {f"w{i}": np.ones((1024, 1024), np.float32) for i in range(16)},
    tmp_path / "big" / "model.safetensors",
  )
  size = (tmp_path / "big" / "model.safetensors").stat().st_size
  server = Server(tmp_path).start()
  try:
    src = remote(server, "big")
    target = {f"w{i}": jax.ShapeDtypeStruct((1024, 1024), np.float32) for i in range(16)}
    server.ignore_range = True
    before = len(server.requests)
    with pytest.raises(prj.MaterializationError, match="the server ignores Range") as e:
      prj.restore(target, src)
    assert "not retried" in str(e.value) and f"{server.url}/big/model.safetensors" in str(e.value)
    time.sleep(0.5)
    # no request streamed the object: each pushed what fits in the socket buffers, then failed
    pushed = server.pushed[before:]
    assert pushed and max(pushed) < size / 2, pushed
    with pytest.raises(SourceIOError, match="ignores Range"):
      remote(server, "big")  # opening is refused the same way, at the header
  finally:
    server.shutdown()
    server.server_close()


def test_a_slow_server_hits_the_timeout_with_a_clear_error(served, devices):
  server, _, _ = served
  target, recipes = transposed_target(devices)
  src = remote(server, timeout=0.3, retries=1)
  server.slow = 1.0
  t0 = time.perf_counter()
  with pytest.raises(prj.MaterializationError) as e:
    prj.restore(target, src, recipes=recipes)
  message = str(e.value)
  assert "timed out after 2 attempt(s) (timeout 0.3 s, retries=1)" in message, message
  assert f"{server.url}/ckpt/model.safetensors" in message
  assert time.perf_counter() - t0 < 30


def test_missing_fsspec_or_protocol_packages_are_named():
  with pytest.raises(
    prj.errors.StoreError, match=r"nosuchproto:// is not a protocol read here; use one"
  ):
    SafetensorsSource("nosuchproto://bucket/model.safetensors")
  pytest.importorskip("fsspec")
  if importlib.util.find_spec("gcsfs") is None:  # the remote extra does not install it
    with pytest.raises(SourceIOError, match="gcsfs for gs://"):
      SafetensorsSource("gs://bucket/model.safetensors")


def test_an_orbax_checkpoint_at_an_http_url_is_refused_clearly():
  with pytest.raises(prj.errors.StoreError, match=r"http:// has no directory listing"):
    prj.OrbaxSource("http://127.0.0.1:9/ckpt")


def test_the_command_line_reads_urls(served, capsys):
  from paramreg_jax._src import cli

  server, _, _ = served
  assert cli.main(["inspect", f"{server.url}/ckpt", "--json"]) == 0
  out = json.loads(capsys.readouterr().out)
  assert len(out["tensors"]) == COUNT


# --- two processes, one server ---------------------------------------------------------------------


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_processes_each_fetch_about_half(served, tmp_path):
  server, _, _ = served
  port = _free_port()
  worker = pathlib.Path(__file__).parent / "multihost_http_worker.py"
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PJRT_NPROC")}
  procs = [
    subprocess.Popen(
      [
        sys.executable,
        str(worker),
        str(i),
        str(port),
        f"{server.url}/ckpt",
        str(tmp_path / f"out{i}.json"),
      ],
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(2)
  ]
  for p in procs:
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
  sent = server.stats()["sent"]
  total = COUNT * ROWS * COLS * 4
  for i in range(2):
    result = json.loads((tmp_path / f"out{i}.json").read_text())
    assert result["checked"] == COUNT * 4
    payload = sent[f"process-{i}"] - result["header_bytes"]
    assert 0.5 * total <= payload <= 1.1 * 0.5 * total, (i, payload, total)


def test_the_progress_bar_shows_the_bytes_fetched_over_the_network(served, devices, capsys):
  """Beside the bytes the weights need, the bytes the server sent (whole rows around the
  shards' columns, and the header the open read)."""
  server, _, _ = served
  target, recipes = transposed_target(devices)
  src = remote(server, "ckpt/model.safetensors")
  before = server.sent["test"]  # what opening it read
  prj.restore(target, src, recipes=recipes, progress=True)
  err = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
  fetched = re.search(r"([0-9.]+)([kMG]?)B over the network", err)
  assert "restoring" in err and fetched, err
  scale = {"": 1, "k": 1 << 10, "M": 1 << 20, "G": 1 << 30}[fetched.group(2)]
  sent = server.sent["test"] - before
  assert float(fetched.group(1)) * scale == pytest.approx(sent, rel=0.02), (err, sent)
