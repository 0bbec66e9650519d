"""``OrbaxSource`` opens arrays with orbax's own (private) spec builders while they exist, and
with specs built from tensorstore's documented format where they do not: both read the same
values, for OCDBT and plain layouts, zarr and zarr3."""

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorstore as ts

import paramreg_jax as prj
from paramreg_jax._src.sources import ts_specs

TREE = {
  "dense": {"kernel": np.arange(24, dtype=np.float32).reshape(4, 6), "bias": np.ones(6, np.int32)},
  "scale": np.full((3,), 0.5, np.float16),
}


def _save(path, use_ocdbt, use_zarr3):
  handler = ocp.PyTreeCheckpointHandler(use_ocdbt=use_ocdbt, use_zarr3=use_zarr3)
  with ocp.Checkpointer(handler) as ckptr:
    ckptr.save(path, args=ocp.args.PyTreeSave(TREE))
  return path


@pytest.mark.parametrize("use_zarr3", [False, True], ids=["zarr", "zarr3"])
@pytest.mark.parametrize("use_ocdbt", [True, False], ids=["ocdbt", "plain"])
def test_the_documented_specs_read_what_orbaxs_own_read(tmp_path, use_ocdbt, use_zarr3):
  path = _save(tmp_path / "ckpt", use_ocdbt, use_zarr3)
  names = {"dense.kernel": TREE["dense"]["kernel"], "dense.bias": TREE["dense"]["bias"]}
  for name, want in names.items():
    read = []
    for tools in (ts_specs._orbax_tools(), None):
      spec = ts_specs.read_spec(str(path), name, use_zarr3, use_ocdbt, tools=tools)
      store = ts.open(spec, context=ts_specs.context(use_ocdbt, tools=tools), open=True).result()
      read.append(store.read().result())
    np.testing.assert_array_equal(read[0], want)
    np.testing.assert_array_equal(read[1], want)
    assert read[0].dtype == read[1].dtype == want.dtype


def test_a_restore_works_without_orbaxs_private_module(tmp_path, monkeypatch):
  path = _save(tmp_path / "ckpt", use_ocdbt=True, use_zarr3=False)
  monkeypatch.setattr(ts_specs, "_orbax_tools", lambda: None)
  target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), TREE)
  out = prj.restore(target, prj.OrbaxSource(path))
  for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(TREE)):
    np.testing.assert_array_equal(np.asarray(got), want)


def test_a_changed_orbax_signature_falls_back(tmp_path):
  path = _save(tmp_path / "ckpt", use_ocdbt=True, use_zarr3=False)

  class Changed:  # what a future orbax might have: same names, other arguments
    @staticmethod
    def get_ts_context(*, concurrency):
      raise AssertionError("not called with these arguments")

    class ArrayReadSpec:
      def __init__(self, *, path):
        raise AssertionError("not called with these arguments")

  spec = ts_specs.read_spec(str(path), "scale", False, True, tools=Changed)
  store = ts.open(spec, context=ts_specs.context(True, tools=Changed), open=True).result()
  np.testing.assert_array_equal(store.read().result(), TREE["scale"])


def test_a_bucket_kvstore_takes_its_endpoint_from_the_environment(monkeypatch):
  from paramreg_jax._src.sources import orbax_remote

  for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION"):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
  assert orbax_remote.kvstore("s3://b/run/ckpt/") == {
    "driver": "s3",
    "bucket": "b",
    "path": "run/ckpt/",
  }
  monkeypatch.setenv("AWS_ENDPOINT_URL", "127.0.0.1:9000")
  monkeypatch.setenv("AWS_REGION", "eu-west-1")
  monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
  assert orbax_remote.kvstore("s3://b") == {
    "driver": "s3",
    "bucket": "b",
    "path": "",
    "endpoint": "http://127.0.0.1:9000",
    "aws_region": "eu-west-1",
    "aws_credentials": {"type": "environment"},
  }
  ts.KvStore.Spec(orbax_remote.kvstore("s3://bucket/x"))  # tensorstore accepts it


def test_a_gcs_emulator_for_the_listing_only_is_refused_with_the_fix(monkeypatch):
  """gcsfs reads STORAGE_EMULATOR_HOST, tensorstore TENSORSTORE_GCS_HTTP_URL: one without the
  other would read the listing and the arrays from two servers."""
  from paramreg_jax._src.sources import orbax_remote
  from paramreg_jax.errors import StoreError

  monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:4443")
  monkeypatch.delenv("TENSORSTORE_GCS_HTTP_URL", raising=False)
  with pytest.raises(StoreError) as info:
    orbax_remote.kvstore("gs://b/ckpt")
  assert str(info.value) == (
    "gs://b/ckpt: STORAGE_EMULATOR_HOST=127.0.0.1:4443 sends the listing to another server, "
    "but tensorstore, which reads the arrays, reads TENSORSTORE_GCS_HTTP_URL (now unset: "
    "storage.googleapis.com). Nothing was read: set "
    "TENSORSTORE_GCS_HTTP_URL=http://127.0.0.1:4443 as well"
  )
  fix = str(info.value).rsplit("set ", 1)[1].removesuffix(" as well")
  monkeypatch.setenv(*fix.split("=", 1))  # the fix, as the message gives it
  assert orbax_remote.kvstore("gs://b/ckpt") == {"driver": "gcs", "bucket": "b", "path": "ckpt/"}
