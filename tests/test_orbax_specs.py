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
