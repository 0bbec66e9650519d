"""``OrbaxSource`` on ``s3://`` and ``gs://``: orbax checkpoints in moto's S3 server and in
gcp-storage-emulator, on 127.0.0.1, read as orbax would read them from local disk.

The listing and ``_METADATA`` go through s3fs/gcsfs (via ``epath``), the arrays through
tensorstore's ``s3`` and ``gcs`` drivers; both find the store from the environment, which each
test points at a front that counts the bytes it sends (``tests/store_servers.py``).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
import store_servers as ss
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import paramreg_jax as prj
from paramreg_jax.errors import MaterializationError
from paramreg_jax.errors import StoreError

pytestmark = pytest.mark.emulators  # moto's S3 and gcp-storage-emulator on 127.0.0.1

ROWS, COLS, COUNT = 256, 256, 4
LISTINGS = 32 << 10  # what listings, _METADATA and manifests add to the data's bytes


def _environment(kind: str, endpoint: str) -> dict[str, str]:
  """What a user sets to reach the store at ``endpoint`` (docs/howto/remote.md)."""
  if kind == "s3":
    return {
      "AWS_ENDPOINT_URL": endpoint,
      "AWS_ACCESS_KEY_ID": "testing",
      "AWS_SECRET_ACCESS_KEY": "testing",
      "AWS_DEFAULT_REGION": "us-east-1",
    }
  return {
    "STORAGE_EMULATOR_HOST": endpoint,
    "TENSORSTORE_GCS_HTTP_URL": endpoint,
    # tensorstore's credentials for a test server: without them it would ask the GCE
    # metadata server, which these tests never do
    "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test-token",
  }


def _forget_clients(kind: str) -> None:
  """epath keeps one fsspec client per protocol for the process: forget the one bound to a
  store that is going away."""
  import fsspec
  from etils.epath import backend

  fsspec.get_filesystem_class(kind).clear_instance_cache()
  backend.fsspec_backend._get_filesystem.cache_clear()


class Bucket:
  def __init__(self, kind, fs, front, monkeypatch, endpoint):
    self.kind, self.fs, self.front, self.monkeypatch = kind, fs, front, monkeypatch
    self.endpoint = endpoint

  def upload(self, folder: pathlib.Path, prefix: str, bucket: str = "bucket") -> str:
    """Copies ``folder`` to ``<bucket>/<prefix>``, as orbax would have saved it there; its URL.

    On GCS, orbax marks every finished save with a ``commit_success.txt`` (it cannot rename a
    directory there); orbax before 0.12 does not write it for a local save, so it is added."""
    files = {
      p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }
    saves = [p for p in [folder, *folder.rglob("*")] if (p / "_CHECKPOINT_METADATA").exists()]
    for save in saves if self.kind == "gs" else ():
      done = (save / "commit_success.txt").relative_to(folder).as_posix()
      files.setdefault(done, b"Checkpoint successfully committed.")
    for name, data in sorted(files.items()):
      if self.kind == "gs":
        ss.gcs_put(self.endpoint, bucket, f"{prefix}/{name}", data)
      else:
        self.fs.pipe_file(f"{bucket}/{prefix}/{name}", data)
    self.fs.invalidate_cache()
    _forget_clients(self.kind)
    return f"{self.kind}://{bucket}/{prefix}"

  def size(self, prefix: str) -> int:
    return sum(self.fs.du(f"bucket/{prefix}", total=False).values())


@pytest.fixture(params=["s3", "gs"])
def bucket(request, monkeypatch):
  kind = request.param
  try:
    server = ss.object_store(kind)
    endpoint, front = server.__enter__()
  except Exception as e:  # the reason is printed
    print(f"{kind} emulator did not start: {type(e).__name__}: {e}")
    pytest.skip(f"the {kind} emulator could not start: {e}")
  try:
    import fsspec

    direct = ss.s3_options(endpoint) if kind == "s3" else ss.gcs_options(endpoint)
    fs = fsspec.filesystem(kind, **direct, skip_instance_cache=True)
    if kind == "s3":
      fs.call_s3("create_bucket", Bucket="bucket")
    else:
      fs.mkdir("bucket")
    for name, value in _environment(kind, front.url).items():
      monkeypatch.setenv(name, value)
    _forget_clients(kind)
    yield Bucket(kind, fs, front, monkeypatch, endpoint)
  finally:
    _forget_clients(kind)
    server.__exit__(None, None, None)


def _save(path: pathlib.Path, tree, **handler) -> pathlib.Path:
  with ocp.Checkpointer(ocp.PyTreeCheckpointHandler(**handler)) as ckpt:
    ckpt.save(path, tree)
  return path


def _layouts(tmp_path: pathlib.Path) -> dict[str, tuple[pathlib.Path, dict]]:
  """Checkpoints of every layout orbax writes: ``{name: (directory, OrbaxSource kwargs)}``."""
  rng = np.random.default_rng(0)
  tree = {
    "layers": [{"w": rng.standard_normal((3, 4), dtype=np.float32)}, {"w": jnp.ones(2)}],
    "bf16": jnp.arange(6, dtype=jnp.bfloat16).reshape(2, 3),
    "ints": np.arange(5, dtype=np.int32),
    "scalar": np.float32(2.5),
    "a/b": jnp.ones(3),
  }
  model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
  mgr = ocp.CheckpointManager(tmp_path / "mgr", item_names=("params", "extra"))
  for step in (1, 5):
    items = {"params": {"w": jnp.full((2, 2), step)}, "extra": {"x": jnp.ones(1) * step}}
    mgr.save(
      step, args=ocp.args.Composite(**{k: ocp.args.StandardSave(v) for k, v in items.items()})
    )
  mgr.wait_until_finished()
  return {
    "ocdbt": (_save(tmp_path / "ocdbt", tree), {}),
    "zarr": (_save(tmp_path / "zarr", tree, use_ocdbt=False), {}),
    "zarr3": (_save(tmp_path / "zarr3", tree, use_zarr3=True), {}),
    "nnx": (_save(tmp_path / "nnx", nnx.state(model)), {}),
    "manager": (tmp_path / "mgr", {"item": "params"}),
    "step": (tmp_path / "mgr", {"step": 1, "item": "extra"}),
  }


def test_every_layout_reads_as_orbax_reads_it_from_disk(bucket, tmp_path):
  """The bucket's source has the local source's keys, metadata, chunks and values (orbax's
  own metadata reader describes the local copy)."""
  for name, (folder, kwargs) in _layouts(tmp_path).items():
    url = bucket.upload(folder, name)
    local, remote = prj.OrbaxSource(folder, **kwargs), prj.OrbaxSource(url, **kwargs)
    assert remote.keys() == local.keys() and remote.keys(), name
    assert str(remote.path).startswith(url) and str(remote.path).endswith(
      str(local.path)[len(str(folder)) :]
    )
    for key in local.keys():
      assert remote.metadata(key) == local.metadata(key), (name, key)
      assert remote.chunk_shape(key) == local.chunk_shape(key), (name, key)
      want = local.lease(key).read()
      got = remote.lease(key).read()
      assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (name, key)


def _grid_checkpoint(tmp_path: pathlib.Path) -> tuple[pathlib.Path, dict[str, np.ndarray]]:
  """A checkpoint saved from a (4, 2) mesh: one storage chunk per shard."""
  grid = NamedSharding(jax.make_mesh((4, 2), ("x", "y")), P("x", "y"))
  rng = np.random.default_rng(1)
  values = {f"w{i}": rng.standard_normal((ROWS, COLS), dtype=np.float32) for i in range(COUNT)}
  with ocp.StandardCheckpointer() as ckpt:
    ckpt.save(tmp_path / "grid", {k: jax.device_put(v, grid) for k, v in values.items()})
  return tmp_path / "grid", values


def test_a_checkpoint_restores_into_a_4x2_mesh_fetching_each_byte_once(bucket, tmp_path, devices):
  folder, values = _grid_checkpoint(tmp_path)
  url = bucket.upload(folder, "grid")
  grid = NamedSharding(jax.make_mesh((4, 2), ("x", "y")), P("x", "y"))
  target = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=grid) for k, v in values.items()}
  before = bucket.front.sent
  params = prj.restore(target, prj.OrbaxSource(url))
  for key, value in values.items():
    np.testing.assert_array_equal(np.asarray(params[key]), value)
    assert params[key].sharding == grid
  stored = bucket.size("grid")
  assert 0.8 * COUNT * ROWS * COLS * 4 <= stored  # random floats barely compress
  sent = bucket.front.sent - before
  assert 0.95 * stored <= sent <= 1.02 * stored + LISTINGS, (sent, stored)


def test_a_503_is_retried_and_the_restore_succeeds(bucket, tmp_path, devices):
  folder, values = _grid_checkpoint(tmp_path)
  src = prj.OrbaxSource(bucket.upload(folder, "grid"))
  bucket.front.fail_paths = ("d%2F" if bucket.kind == "gs" else "/d/", 2)
  params = prj.restore({k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in values.items()}, src)
  assert bucket.front.fail_paths[1] == 0  # both 503s were answered, and retried
  np.testing.assert_array_equal(np.asarray(params["w0"]), values["w0"])


def test_a_missing_checkpoint_names_its_url(bucket):
  url = f"{bucket.kind}://bucket/nothing"
  with pytest.raises(StoreError, match=f"{url}: no such orbax checkpoint directory"):
    prj.OrbaxSource(url)


def test_a_missing_data_file_names_the_key_and_the_url(bucket, tmp_path, devices):
  folder, values = _grid_checkpoint(tmp_path)
  url = bucket.upload(folder, "grid")
  src = prj.OrbaxSource(url)
  for data in bucket.fs.find("bucket/grid"):
    if "/d/" in data:
      bucket.fs.rm(data)
  target = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in values.items()}
  with pytest.raises(
    MaterializationError, match=rf"n:w\d: w\d: reading .* of {url} failed: NOT_FOUND"
  ):
    prj.restore(target, src)


def test_a_denied_request_names_the_url_and_the_credentials(bucket, tmp_path):
  folder, _ = _grid_checkpoint(tmp_path)
  url = bucket.upload(folder, "grid")
  bucket.front.deny = True
  with pytest.raises(StoreError) as info:
    prj.OrbaxSource(url)
  message = str(info.value)
  assert url in message and "denied" in message
  assert (
    "AWS_ACCESS_KEY_ID" if bucket.kind == "s3" else "GOOGLE_APPLICATION_CREDENTIALS"
  ) in message


@pytest.mark.parametrize("use_ocdbt", [True, False])
def test_a_checkpoint_saved_again_after_open_is_never_read_mixed(
  bucket, tmp_path, devices, use_ocdbt
):
  """A re-save at the same URL after open (new values; OCDBT's old data files gone, zarr's
  chunks overwritten in place) fails the restore: nothing of either save is kept."""
  folder, values = _grid_checkpoint(tmp_path)
  if not use_ocdbt:
    folder = _save(tmp_path / "zarr", values, use_ocdbt=False)
  url = bucket.upload(folder, "grid")
  src = prj.OrbaxSource(url)
  bucket.fs.rm("bucket/grid", recursive=True)
  again = _save(tmp_path / "again", {k: -v for k, v in values.items()}, use_ocdbt=use_ocdbt)
  bucket.upload(again, "grid")
  target = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in values.items()}
  # OCDBT's old data files are gone (the manifest read at open names them); zarr's chunks
  # were overwritten in place, and only the listing after the reads can tell
  changed = "NOT_FOUND" if use_ocdbt else f"{url}: the checkpoint changed while it was read"
  with pytest.raises(MaterializationError, match=changed):
    prj.restore(target, src)


def test_two_processes_each_fetch_their_half(bucket, tmp_path):
  """Two ``jax.distributed`` processes (4 CPU devices each, gloo), each through its own front
  to the same store: each fetches the chunks of its own rows."""
  folder, values = _grid_checkpoint(tmp_path)
  url = bucket.upload(folder, "grid")
  np.savez(tmp_path / "values.npz", **values)
  fronts = [bucket.front, ss.Front(bucket.front.backend, bucket.kind).start()]
  worker = pathlib.Path(__file__).parent / "multihost_http_worker.py"
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PJRT_NPROC")}
  port = ss.free_port()
  procs = []
  for i, front in enumerate(fronts):
    front.sent = 0
    options = {
      "orbax": {"env": _environment(bucket.kind, front.url), "values": str(tmp_path / "values.npz")}
    }
    argv = [str(i), str(port), url, str(tmp_path / f"out{i}.json"), json.dumps(options)]
    procs.append(
      subprocess.Popen(
        [sys.executable, str(worker), *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
      )
    )
  for p in procs:
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
  fronts[1].shutdown()
  half = bucket.size("grid") / 2
  for i, front in enumerate(fronts):
    assert json.loads((tmp_path / f"out{i}.json").read_text())["checked"] == COUNT * 4
    assert 0.95 * half <= front.sent <= 1.02 * half + LISTINGS, (bucket.kind, i, front.sent, half)


def test_the_howto_orbax_urls_open_as_written(bucket, tmp_path):
  """docs/howto/remote.md's OrbaxSource lines, run as written against the emulator, with the
  endpoints and credentials from the environment the page names."""
  import re

  page = (pathlib.Path(__file__).parent.parent / "docs" / "howto" / "remote.md").read_text()
  calls = re.findall(r'prj\.OrbaxSource\("((?:s3|gs)://[^"]+)"((?:, \w+=[^,)]+)*)\)', page)
  assert sorted(url.split("://")[0] for url, _ in calls) == ["gs", "s3"], calls
  mgr = ocp.CheckpointManager(tmp_path / "mgr", item_names=("params", "opt"))
  for step in (500, 1000, 1500):
    items = {"params": {"w": jnp.full((2, 2), step)}, "opt": {"mu": jnp.ones(1) * step}}
    mgr.save(
      step, args=ocp.args.Composite(**{k: ocp.args.StandardSave(v) for k, v in items.items()})
    )
  mgr.wait_until_finished()
  if bucket.kind == "s3":
    bucket.fs.call_s3("create_bucket", Bucket="my-bucket")
  else:
    bucket.fs.mkdir("my-bucket")
  bucket.upload(tmp_path / "mgr", "run-7/checkpoints", bucket="my-bucket")
  for url, args in calls:
    if url.startswith(bucket.kind):
      kwargs = eval(f"dict({args.lstrip(', ')})")  # the page's own keyword arguments
      src = prj.OrbaxSource(url, **kwargs)
      step = kwargs.get("step", 1500)
      assert str(src.path) == f"{url}/{step}/params" and src.keys() == ("w",)
      assert src.lease("w").read().tolist() == [[step, step], [step, step]]
