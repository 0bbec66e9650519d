"""``s3://``, ``gs://`` and ``hf://`` against real protocol servers on 127.0.0.1: moto's S3
server, gcp-storage-emulator, and a small Hugging Face Hub of ours (``tests/store_servers.py``).

Each store serves the same sharded safetensors index behind a front that counts the payload it
sends and answers 503 on demand. A store whose server cannot start is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
import store_servers as ss
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from safetensors.numpy import save_file

import paramreg_jax as prj
from paramreg_jax import recipes as R
from paramreg_jax.errors import MissingShardError
from paramreg_jax.errors import SourceIOError

pytestmark = pytest.mark.emulators  # moto's S3 and gcp-storage-emulator on 127.0.0.1

ROWS, COLS, COUNT = 256, 512, 8  # 4 MiB: an HTTP open reads 64 KiB of each shard
PAYLOAD = COUNT * ROWS * COLS * 4


def checkpoint(folder: pathlib.Path, seed: int = 0) -> dict[str, np.ndarray]:
  """Two shards and their index, and a config.json; the tensors, by key."""
  rng = np.random.default_rng(seed)
  tensors = {
    f"layers.{i}.weight": rng.standard_normal((ROWS, COLS), dtype=np.float32) for i in range(COUNT)
  }
  folder.mkdir(parents=True, exist_ok=True)
  weight_map = {}
  for shard in range(2):
    name = f"model-0000{shard + 1}-of-00002.safetensors"
    part = {k: v for i, (k, v) in enumerate(tensors.items()) if i % 2 == shard}
    save_file(part, folder / name)
    weight_map |= dict.fromkeys(part, name)
  index = {"metadata": {"total_size": PAYLOAD}, "weight_map": weight_map}
  (folder / "model.safetensors.index.json").write_text(json.dumps(index))
  (folder / "config.json").write_text(json.dumps({"model_type": "toy", "seed": seed}))
  return tensors


class Store:
  """One store with the checkpoint in it: ``url`` (its folder), ``options``, ``front``."""

  def __init__(self, kind, url, options, front, upload, hub=None):
    self.kind, self.url, self.options, self.front = kind, url, options, front
    self.upload, self.hub = upload, hub

  def source(self, name: str = "", **kwargs):
    url = f"{self.url}/{name}" if name else self.url
    return prj.SafetensorsSource(url, storage_options=self.options, **kwargs)


def _bucket(kind, endpoint, front, tmp_path):
  import fsspec

  direct = ss.s3_options(endpoint) if kind == "s3" else ss.gcs_options(endpoint)
  fs = fsspec.filesystem(kind, **direct, skip_instance_cache=True)
  if kind == "s3":
    import boto3

    boto3.client(
      "s3",
      endpoint_url=endpoint,
      region_name="us-east-1",
      aws_access_key_id="testing",
      aws_secret_access_key="testing",
    ).create_bucket(Bucket="bucket")
  else:
    fs.mkdir("bucket")
  via_front = ss.s3_options(front.url) if kind == "s3" else ss.gcs_options(front.url)

  def upload(folder):
    for path in sorted(folder.iterdir()):
      if kind == "gs":  # not gcsfs's multipart upload: the emulator drops a trailing "\r"
        ss.gcs_put(endpoint, "bucket", f"ckpt/{path.name}", path.read_bytes())
      else:
        fs.pipe_file(f"bucket/ckpt/{path.name}", path.read_bytes())
    fs.invalidate_cache()

  upload(tmp_path / "ckpt")
  return Store(kind, f"{kind}://bucket/ckpt", via_front, front, upload)


def _hub(tmp_path):
  hub = ss.Hub().start()
  hub.push("org/model", tmp_path / "ckpt")
  return Store("hf", "hf://org/model", {"endpoint": hub.url}, hub, None, hub)


@pytest.fixture
def hf(tmp_path):
  """The Hub alone (for what only a Hub has: revisions)."""
  checkpoint(tmp_path / "ckpt")
  store = _hub(tmp_path)
  yield store
  store.hub.shutdown()


@pytest.fixture(params=["s3", "gs", "hf"])
def store(request, tmp_path):
  kind = request.param
  checkpoint(tmp_path / "ckpt")
  if kind == "hf":
    hub = _hub(tmp_path)
    yield hub
    hub.hub.shutdown()
    return
  try:
    server = ss.s3_store() if kind == "s3" else ss.gcs_store()
    endpoint, front = server.__enter__()
  except Exception as e:  # the reason is printed
    print(f"{kind} emulator did not start: {type(e).__name__}: {e}")
    pytest.skip(f"the {kind} emulator could not start: {e}")
  try:
    yield _bucket(kind, endpoint, front, tmp_path)
  finally:
    import fsspec

    fsspec.get_filesystem_class(kind).clear_instance_cache()  # no client outlives its store
    server.__exit__(None, None, None)


def grid_target():
  grid = NamedSharding(jax.make_mesh((4, 2), ("x", "y")), P("x", "y"))
  target = {
    "layers": {
      str(i): {"kernel": jax.ShapeDtypeStruct((COLS, ROWS), np.float32, sharding=grid)}
      for i in range(COUNT)
    }
  }
  recipes = {
    f"layers/{i}/kernel": R.transpose(R.source(f"layers.{i}.weight"), (1, 0)) for i in range(COUNT)
  }
  return target, recipes


def test_a_sharded_index_restores_into_a_4x2_mesh_reading_what_the_shards_need(
  store, tmp_path, devices
):
  written = checkpoint(tmp_path / "again")  # the same seed: the same values
  src = store.source()
  assert src.config == {"model_type": "toy", "seed": 0}
  target, recipes = grid_target()
  params = prj.restore(target, src, recipes=recipes)
  for i in range(COUNT):
    got = params["layers"][str(i)]["kernel"]
    np.testing.assert_array_equal(np.asarray(got), written[f"layers.{i}.weight"].T)
    assert got.sharding == target["layers"][str(i)]["kernel"].sharding
  assert PAYLOAD <= store.front.payload <= 1.05 * PAYLOAD, store.front.payload


def test_a_503_is_retried_and_the_restore_succeeds(store, devices):
  store.front.fail_next = 2
  target, recipes = grid_target()
  prj.restore(target, store.source(retries=3), recipes=recipes)
  assert store.front.fail_next == 0


def test_a_missing_object_names_its_url(store):
  with pytest.raises(MissingShardError, match=r"nothing\.safetensors"):
    store.source("nothing.safetensors")


def test_an_object_replaced_after_open_is_never_read_as_good(store, tmp_path, devices):
  src = store.source()
  target, recipes = grid_target()
  replaced = checkpoint(tmp_path / "v2", seed=1)  # same names and sizes, other values
  if store.kind == "hf":
    store.hub.push("org/model", tmp_path / "v2")  # main moves; the source reads its commit
    params = prj.restore(target, src, recipes=recipes)
    first = checkpoint(tmp_path / "v1", seed=0)
    got = np.asarray(params["layers"]["0"]["kernel"])
    np.testing.assert_array_equal(got, first["layers.0.weight"].T)
    assert store.source().config["seed"] == 1  # a new source sees the new commit
    return
  if store.kind == "gs":
    # gcp-storage-emulator ignores the generation a read asks for (real GCS answers 404 for a
    # replaced one): only a replacement of another size shows here (the same-size case is in
    # test_a_gcs_answer_of_another_generation_is_never_used)
    (tmp_path / "v2" / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 1024)
  store.upload(tmp_path / "v2")
  with pytest.raises(prj.MaterializationError, match="changed after it was opened"):
    prj.restore(target, src, recipes=recipes)
  src.close()  # waits for the reads still in flight (none is started after the failure)
  del replaced


def test_a_denied_request_names_the_url(store):
  if store.kind == "hf":
    store.hub.gated.add("org/model")
    with pytest.raises(SourceIOError, match=r"hf://org/model: the Hub denied access \(HTTP 401"):
      store.source()
    src = prj.SafetensorsSource(store.url, storage_options={**store.options, "token": "good-token"})
    assert src.config["seed"] == 0  # the same repository, with a token that has access
    return
  store.front.deny = True
  hint = "AWS_ACCESS_KEY_ID" if store.kind == "s3" else "GOOGLE_APPLICATION_CREDENTIALS"
  with pytest.raises(
    SourceIOError, match=rf"{store.kind}://bucket/ckpt/\S+: the store denied"
  ) as e:
    store.source()
  assert "not retried" in str(e.value) and hint in str(e.value)


def test_a_wrong_revision_names_the_url(hf):
  store = hf
  with pytest.raises(MissingShardError, match=r"hf://org/model@v9: .* no revision 'v9'"):
    prj.SafetensorsSource("hf://org/model@v9", storage_options=store.options)
  with pytest.raises(MissingShardError, match=r"hf://org/nothing: no such repository"):
    prj.SafetensorsSource("hf://org/nothing", storage_options=store.options)


def test_an_hf_revision_pins_its_commit_and_its_config(hf, tmp_path):
  store = hf
  first = store.hub.repos["org/model"]["branches"]["main"]
  checkpoint(tmp_path / "v2", seed=2)
  second = store.hub.push("org/model", tmp_path / "v2")
  assert (
    prj.SafetensorsSource(f"hf://org/model@{first}", storage_options=store.options).commit == first
  )
  pinned = prj.SafetensorsSource("hf://org/model", storage_options=store.options)
  assert pinned.commit == second and pinned.config["seed"] == 2
  checkpoint(tmp_path / "v3", seed=3)
  store.hub.push("org/model", tmp_path / "v3")  # a push while it is open changes nothing
  assert pinned.companion("config.json") == (tmp_path / "v2" / "config.json").read_bytes()
  assert all(revision == second for _, revision, _ in store.hub.resolved[-3:])


def test_a_gcs_answer_of_another_generation_is_never_used():
  from paramreg_jax._src.sources.storage import answers
  from paramreg_jax._src.sources.storage import pinning

  class FakeGcs:  # what GCS answers when the object was replaced by one of the same size
    protocol = ("gs", "gcs")
    loop = None

    def url(self, path, generation=None):
      return f"https://storage/{path}?generation={generation}"

  def call(method, url, headers):
    return {"Content-Range": "bytes 0-9/100", "x-goog-generation": "2"}, b"0123456789"

  import fsspec.asyn

  fs = FakeGcs()
  fs._call = call
  original = fsspec.asyn.sync
  fsspec.asyn.sync = lambda loop, f, *a, **k: f(*a, **k)
  try:
    with pytest.raises(answers.Changed, match="generation is now 2, it was 1"):
      pinning.read(fs, "bucket/w", pinning.Pinned(100, None, "1"), 0, 10)
  finally:
    fsspec.asyn.sync = original


def test_two_processes_each_fetch_their_half(store, tmp_path):
  """Two ``jax.distributed`` processes (4 CPU devices each, gloo): each reads its own rows."""
  worker = pathlib.Path(__file__).parent / "multihost_http_worker.py"
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PJRT_NPROC")}
  env["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
  env["NO_GCE_CHECK"] = "true"
  if store.kind == "hf":  # the Hub counts the bytes it sends to each X-Client
    options = [{**store.options, "headers": {"X-Client": f"p{i}"}} for i in range(2)]
    fronts = None
  else:  # a front each, before the same store
    fronts = [store.front, ss.Front(store.front.backend, store.kind).start()]
    make = ss.s3_options if store.kind == "s3" else ss.gcs_options
    options = [make(front.url) for front in fronts]
  port = ss.free_port()
  procs = [
    subprocess.Popen(
      [
        sys.executable,
        str(worker),
        str(i),
        str(port),
        store.url,
        str(tmp_path / f"out{i}.json"),
        json.dumps(options[i]),
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
  if fronts:
    fronts[1].shutdown()
  half = PAYLOAD // 2
  for i in range(2):
    result = json.loads((tmp_path / f"out{i}.json").read_text())
    assert result["checked"] == COUNT * 4  # 8 tensors, 4 local shards each
    sent = store.hub.sent[f"p{i}"] if fronts is None else fronts[i].payload
    opened = 2 * (64 << 10) if store.kind == "hf" else 0  # an HTTP open reads 64 KiB a shard
    assert half <= sent <= 1.05 * (half + opened), (store.kind, i, sent, half)


def test_the_howto_urls_open_as_written_with_the_endpoints_from_the_environment(
  tmp_path, monkeypatch
):
  """docs/howto/remote.md's URLs, with no storage_options: credentials and endpoints come from
  the environment, as the page says (HF_ENDPOINT, AWS_*, STORAGE_EMULATOR_HOST)."""
  import re

  import fsspec

  page = (pathlib.Path(__file__).parent.parent / "docs" / "howto" / "remote.md").read_text()
  urls = re.findall(r'prj\.(?:load\(target, |SafetensorsSource\()"((?:hf|s3|gs)://[^"]+)"', page)
  assert sorted({u.split("://")[0] for u in urls}) == ["gs", "hf", "s3"], urls
  checkpoint(tmp_path / "ckpt")
  hub = ss.Hub().start()
  hub.push("my-org/llama", tmp_path / "ckpt")
  hub.push("my-org/llama", tmp_path / "ckpt", branch="v1.0")
  with ss.s3_store() as (s3, _), ss.gcs_store() as (gcs, _):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs)
    monkeypatch.setenv("NO_GCE_CHECK", "true")  # no credential lookup beyond 127.0.0.1
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    for kind, options in (("s3", ss.s3_options(s3)), ("gs", ss.gcs_options(gcs))):
      _bucket_at(kind, options, "my-bucket/llama", tmp_path / "ckpt")
    for url in urls:
      src = prj.open_source(url)  # what prj.load opens it with
      assert isinstance(src, prj.SafetensorsSource), url
      assert len(src.keys()) == COUNT and src.config["seed"] == 0, url
    for kind in ("s3", "gs"):
      fsspec.get_filesystem_class(kind).clear_instance_cache()
  hub.shutdown()


def _bucket_at(kind, options, prefix, folder):
  import fsspec

  fs = fsspec.filesystem(kind, **options, skip_instance_cache=True)
  bucket = prefix.split("/")[0]
  if kind == "s3":
    import boto3

    client = options["client_kwargs"]
    boto3.client(
      "s3", aws_access_key_id="testing", aws_secret_access_key="testing", **client
    ).create_bucket(Bucket=bucket)
  else:
    fs.mkdir(bucket)
  for path in sorted(folder.iterdir()):
    if kind == "gs":  # not gcsfs's multipart upload: the emulator drops a trailing "\r"
      name = f"{prefix}/{path.name}".split("/", 1)
      ss.gcs_put(options["endpoint_url"], name[0], name[1], path.read_bytes())
    else:
      fs.pipe_file(f"{prefix}/{path.name}", path.read_bytes())
