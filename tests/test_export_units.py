"""``export/writer.py`` and ``export/invert.py`` on their own: the bytes a header is, how
tensors split into shards, and that every placement puts a parameter's value back exactly where
the forward recipe read it."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from safetensors import safe_open

import paramreg_jax as prj
from paramreg_jax import MemorySource
from paramreg_jax import Range
from paramreg_jax import recipes as R
from paramreg_jax._src.export import invert as inv
from paramreg_jax._src.export import writer


def test_a_header_is_what_the_safetensors_package_reads(tmp_path):
  arrays = {
    "w": np.arange(12, dtype=np.float32).reshape(3, 4),
    "b": np.ones(5, ml_dtypes.bfloat16),
    "s": np.array(7, np.int64),
  }
  entries = [(k, v.shape, v.dtype, v.nbytes) for k, v in arrays.items()]
  head, offsets = writer.header(entries, {"format": "pt"})
  assert len(head) % 8 == 0 and int.from_bytes(head[:8], "little") == len(head) - 8
  assert offsets == [0, 48, 58]
  with open(tmp_path / "m.safetensors", "wb") as f:
    f.write(head)
    for v in arrays.values():
      f.write(v.tobytes())
  with safe_open(str(tmp_path / "m.safetensors"), "np") as f:
    assert f.metadata() == {"format": "pt"}
    for k in ("w", "s"):
      np.testing.assert_array_equal(f.get_tensor(k), arrays[k])
    assert f.get_slice("b").get_dtype() == "BF16"
  odd = np.dtype([("re", "f4"), ("im", "f4")])  # a record: no safetensors dtype
  with pytest.raises(prj.ExportError, match="z: safetensors has no dtype for"):
    writer.dtype_name(odd, "z")


def test_tensors_split_into_shards_in_order_and_a_large_one_gets_its_own():
  tensors = [(f"t{i}", (n,), np.dtype(np.uint8), n) for i, n in enumerate([4, 4, 10, 3, 3])]
  assert writer.layout(tensors, 100) == [("model.safetensors", [0, 1, 2, 3, 4])]
  assert writer.layout(tensors, 8) == [
    ("model-00001-of-00003.safetensors", [0, 1]),
    ("model-00002-of-00003.safetensors", [2]),  # larger than a shard: alone
    ("model-00003-of-00003.safetensors", [3, 4]),
  ]


def check_round_trip(recipe, src):
  """Every placement applied to the forward value gives back its region of the source."""
  value = np.asarray(prj.recipes.evaluate(recipe, src))
  placements = inv.invert(recipe, src)
  assert placements
  for p in placements:
    stored = src.lease(p.key).read()
    index = tuple(
      slice(None) if r is None else slice(r[1], r[2]) if r[0] == "range" else list(r[1])
      for r in p.region
    )
    np.testing.assert_array_equal(inv.apply(p.ops, value), stored[index])


def test_placements_put_each_piece_back_where_it_was_read():
  rng = np.random.default_rng(0)
  src = MemorySource(
    {
      "qkv": rng.standard_normal((6, 4)).astype(np.float32),
      "a": rng.standard_normal((2, 3)).astype(np.float32),
      "b": rng.standard_normal((2, 3)).astype(np.float32),
    }
  )
  for recipe in (
    R.transpose(R.source("qkv", Range(0, 2, 4)), (1, 0)),
    R.reshape(R.source("qkv"), (3, 8)),
    R.concatenate([R.source("a"), R.source("b")], axis=1),
    R.stack([R.transpose(R.source("a"), (1, 0)), R.transpose(R.source("b"), (1, 0))], axis=0),
    R.cast(R.source("a"), np.float64),
  ):
    check_round_trip(recipe, src)


@settings(max_examples=40, deadline=None)
@given(
  st.permutations([0, 1, 2]),
  st.integers(1, 3),
  st.sampled_from(["transpose", "split", "stack"]),
)
def test_inverting_random_layout_changes_is_exact(axes, parts, kind):
  rng = np.random.default_rng(len(axes) + parts)
  shape = (2 * parts, 3, 4)
  src = MemorySource({f"t{i}": rng.standard_normal(shape).astype(np.float32) for i in range(parts)})
  if kind == "transpose":
    recipe = R.transpose(R.source("t0"), tuple(axes))
  elif kind == "split":
    tail = [R.source("t0", Range(0, 2, 2 * parts))] if parts > 1 else []
    recipe = R.concatenate([R.source(f"t{i}", Range(0, 0, 2)) for i in range(parts)] + tail, axis=0)
  else:
    recipe = R.stack([R.transpose(R.source(f"t{i}"), tuple(axes)) for i in range(parts)], axis=0)
  check_round_trip(recipe, src)


def test_a_select_of_a_reshape_has_no_place_in_the_stored_tensor():
  src = MemorySource({"w": np.zeros((4, 4), np.float32)})
  with pytest.raises(inv.NotInvertible):
    inv.invert(R.select(R.reshape(R.source("w"), (2, 8)), Range(1, 0, 4)), src)
  (whole,) = inv.invert(R.source("w"), src)
  assert whole.ops == () and whole.region == (None, None)
