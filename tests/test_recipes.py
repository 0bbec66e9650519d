"""Recipes: seed inference/pushdown tests, numpy equivalence under hypothesis, error taxonomy."""

import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from paramreg_jax import Full
from paramreg_jax import Indices
from paramreg_jax import MemorySource
from paramreg_jax import Range
from paramreg_jax import errors
from paramreg_jax import recipes as R


def seed_source():
  return MemorySource(
    {
      "left": np.arange(6, dtype=np.float16).reshape(2, 3),
      "right": np.arange(100, 112, dtype=np.float16).reshape(4, 3),
    }
  )


# --- ported seed tests ---------------------------------------------------------------------


def test_nested_recipe_inference_is_backend_independent():
  src = seed_source()
  r = R.transpose(R.concatenate([R.source("left"), R.source("right", Range(0, 0, 1))], 0), (1, 0))
  meta = R.infer(r, src)
  assert (meta.shape, meta.dtype, meta.nbytes) == ((3, 3), np.float16, 18)
  assert R.source_keys(r) == ("left", "right")
  assert src.stats.reads == 0 and src.stats.bytes_read == 0  # preflight reads nothing


def test_bounded_selection_pushdown_is_backend_independent():
  src = seed_source()
  r = R.concatenate([R.source("left"), R.source("right")], 0)
  out = R.evaluate(r, src, (slice(1, 3),))
  np.testing.assert_array_equal(
    out, np.concatenate([src._arrays["left"][1:2], src._arrays["right"][0:1]])
  )
  # exactly left[1:2] and right[0:1]: two reads of 3 float16 each
  assert src.stats.reads == 2 and src.stats.bytes_read == 2 * 3 * 2


def test_transpose_pushdown_reads_exactly_the_region():
  src = MemorySource({"w": np.arange(64, dtype=np.float32).reshape(8, 8)})
  r = R.transpose(R.source("w"), (1, 0))
  out = R.evaluate(r, src, (slice(0, 8), slice(2, 4)))
  np.testing.assert_array_equal(out, src._arrays["w"].T[:, 2:4])
  assert src.stats.bytes_read == 2 * 8 * 4  # rows 2:4 of the stored [out, in] kernel


def test_stack_reads_only_covered_inputs():
  src = MemorySource({f"l{i}": np.full((2, 2), i, np.float32) for i in range(4)})
  r = R.stack([R.source(f"l{i}") for i in range(4)], 0)
  out = R.evaluate(r, src, (slice(1, 3), slice(0, 1)))
  np.testing.assert_array_equal(out, np.stack([src._arrays[f"l{i}"] for i in range(4)])[1:3, 0:1])
  assert src.stats.reads == 2 and src.stats.bytes_read == 2 * 2 * 4


def test_indices_read_each_distinct_index_once():
  src = MemorySource({"w": np.arange(10, dtype=np.int32)})
  out = R.evaluate(R.source("w", Indices(0, (7, 1, 7, 2))), src)
  assert out.tolist() == [7, 1, 7, 2]
  assert src.stats.bytes_read == 3 * 4 and src.stats.reads == 2  # runs [1:3] and [7:8]


def test_unary_ops_and_cast_and_view():
  a = -np.arange(1, 7, dtype=np.float32).reshape(2, 3)
  src = MemorySource({"a": a})
  np.testing.assert_array_equal(R.evaluate(R.neg_log(R.source("a")), src), np.log(-a))
  np.testing.assert_array_equal(R.evaluate(R.subtract_one(R.source("a")), src), a - 1)
  bf = R.evaluate(R.cast(R.source("a"), ml_dtypes.bfloat16), src)
  assert bf.dtype == ml_dtypes.bfloat16
  v = R.evaluate(R.view(R.source("a"), np.uint8, (24,)), src)
  np.testing.assert_array_equal(v, a.view(np.uint8).reshape(24))
  np.testing.assert_array_equal(
    R.evaluate(R.view(R.source("a"), np.uint8, (24,)), src, (slice(5, 9),)), v[5:9]
  )


def test_scalar_recipes():
  src = MemorySource({"s": np.float32(3.0)})
  assert R.infer(R.source("s"), src).shape == ()
  assert R.evaluate(R.reshape(R.source("s"), (1, 1)), src).tolist() == [[3.0]]


# --- error taxonomy (each a distinct class naming the node) --------------------------------


@pytest.mark.parametrize(
  "make, error, message",
  [
    (
      lambda: R.source("nope"),
      errors.UnknownSourceKeyError,
      "source('nope'): the checkpoint has no tensor 'nope'",
    ),
    (
      lambda: R.source("left", Indices(2, (0,))),
      errors.InvalidSelectionAxisError,
      "selects axis 2, but the tensor has rank 2",
    ),
    (
      lambda: R.source("left", Range(0, 1, 3)),
      errors.InvalidRangeError,
      "runs past the end of axis 0 (length 2)",
    ),
    (
      lambda: R.source("left", Indices(1, (0, 3))),
      errors.InvalidIndicesError,
      "has indices [3] out of range for axis 1",
    ),
    (lambda: R.concatenate([]), errors.EmptyInputsError, "needs at least one input"),
    (
      lambda: R.concatenate([R.source("left"), R.cast(R.source("right"), np.float32)]),
      errors.DtypeMismatchError,
      "inputs have dtypes ['float16', 'float32']",
    ),
    (
      lambda: R.concatenate([R.source("left"), R.source("right")], 1),
      errors.RecipeShapeMismatchError,
      "cannot be concatenated along axis 1",
    ),
    (
      lambda: R.stack([R.source("left"), R.source("right")]),
      errors.RecipeShapeMismatchError,
      "cannot be stacked",
    ),
    (
      lambda: R.concatenate([R.source("left")], 2),
      errors.InvalidJoinAxisError,
      "axis 2 is out of range for inputs of rank 2",
    ),
    (lambda: R.stack([R.source("left")], 3), errors.InvalidJoinAxisError, "stack allows 0..rank"),
    (
      lambda: R.reshape(R.source("left"), (4,)),
      errors.ElementCountMismatchError,
      "input (2, 3) has 6 elements, (4,) has 4",
    ),
    (
      lambda: R.transpose(R.source("left"), (0, 0)),
      errors.InvalidPermutationError,
      "axes (0, 0) are not a permutation of 0..1",
    ),
    (
      lambda: R.view(R.source("left"), np.float32, (6,)),
      errors.ByteCountMismatchError,
      "is 12 bytes, (6,) float32 is 24",
    ),
    (lambda: R.reshape(R.source("left"), (6, 0)), errors.ElementCountMismatchError, "has 0"),
    (
      lambda: R.neg_log(R.source("ints")),
      errors.UnsupportedDtypeError,
      "log needs a floating dtype, got int32",
    ),
  ],
)
def test_infer_errors_golden(make, error, message):
  src = MemorySource(
    {**seed_source()._arrays, "ints": np.zeros(2, np.int32), "empty": np.zeros((0, 2), np.float32)}
  )
  with pytest.raises(error, match=re.escape(message)):
    R.infer(make(), src)
  assert issubclass(error, errors.RecipeError)
  assert src.stats.reads == 0


@pytest.mark.parametrize(
  "make, text",
  [
    (
      lambda: R.stack([R.transpose(R.source(f"l.{i}.w"), (1, 0)) for i in range(4)], 0),
      "stack(4 × transpose(source('l.{i}.w'), (1, 0)), axis=0)",
    ),
    (
      lambda: R.concatenate([R.source(f"h{i}.w{i}") for i in range(2, 5)], 1),
      "concatenate(3 × source('h{i}.w{i}') for i in 2..4, axis=1)",
    ),
    # only an exact count is summarized; anything else is listed in full
    (
      lambda: R.stack([R.source(f"l{i}.w") for i in (0, 2, 1)], 0),
      "stack([source('l0.w'), source('l2.w'), source('l1.w')], axis=0)",
    ),
    (
      lambda: R.stack([R.source(f"l0{i}.w") for i in range(3)], 0),
      "stack([source('l00.w'), source('l01.w'), source('l02.w')], axis=0)",
    ),
    (
      lambda: R.concatenate([R.source(f"{p}.w") for p in "qkv"], 0),
      "concatenate([source('q.w'), source('k.w'), source('v.w')], axis=0)",
    ),
    (
      lambda: R.stack([R.source("l0.w"), R.source("l1.w")], 0),
      "stack([source('l0.w'), source('l1.w')], axis=0)",
    ),
  ],
)
def test_joined_recipes_print_repeated_layers_once(make, text):
  assert str(make()) == text


def test_zero_sized_and_unsupported_and_empty_key():
  src = MemorySource({"empty": np.zeros((0, 2), np.float32), "obj": np.array(["x"])})
  with pytest.raises(
    errors.ZeroSizedOutputError, match=re.escape("source('empty'): produces (0, 2), zero bytes")
  ):
    R.infer(R.source("empty"), src)
  with pytest.raises(errors.UnsupportedDtypeError):
    R.infer(R.source("obj"), src)
  with pytest.raises(errors.UnsupportedDtypeError):
    R.cast(R.source("a"), object)
  with pytest.raises(errors.EmptySourceKeyError):
    R.source("  ")
  with pytest.raises(TypeError, match="must be a recipe"):
    R.transpose("w", (1, 0))


def test_bad_selections_at_construction():
  with pytest.raises(errors.InvalidRangeError, match="is empty"):
    Range(0, 3, 3)
  with pytest.raises(errors.InvalidIndicesError, match="selects nothing"):
    Indices(0, ())
  with pytest.raises(errors.SelectionError, match=">= 0"):
    Range(-1, 0, 1)
  with pytest.raises(errors.SelectionError, match="a selection must be"):
    R.source("w", (0, 1))


def test_recipes_are_hashable_values():
  a = R.transpose(R.source("w", Range(0, 0, 2)), (1, 0))
  b = R.transpose(R.source("w", Range(0, 0, 2)), (1, 0))
  assert a == b and hash(a) == hash(b) and len({a, b}) == 1
  assert str(a) == "transpose(source('w', Range(axis=0, 0:2)), (1, 0))"
  assert R.source("w").selection == Full()


# --- fused split, rename, recipe sets --------------------------------------------------------


def test_fused_split():
  src = MemorySource({"qkv": np.arange(24, dtype=np.float32).reshape(2, 12)})
  split = R.fused_split("qkv", 1, {"q": 4, "k": 4, "v": 4}, source=src)
  np.testing.assert_array_equal(R.evaluate(split["v"], src), src._arrays["qkv"][:, 8:12])
  with pytest.raises(
    errors.RecipeSetError,
    match=re.escape("widths {'q': 4, 'k': 4} sum to 8, but the axis has length 12"),
  ):
    R.fused_split("qkv", 1, {"q": 4, "k": 4}, source=src)
  with pytest.raises(errors.RecipeSetError, match="positive int"):
    R.fused_split("qkv", 1, {"q": 0})
  with pytest.raises(errors.RecipeSetError, match="no outputs"):
    R.fused_split("qkv", 1, {})
  with pytest.raises(errors.InvalidSelectionAxisError):
    R.fused_split("qkv", 2, {"q": 1}, source=src)


def test_rename_rules():
  r = R.rename([(r"h\.(\d+)\.w", r"layers/\1/kernel"), (r"opt\..*", None)])
  assert r.apply(["h.0.w", "h.1.w", "opt.m"]) == {
    "layers/0/kernel": "h.0.w",
    "layers/1/kernel": "h.1.w",
  }
  with pytest.raises(errors.RecipeSetError) as info:
    R.rename([(r"h\.(\d+)\.w", "same"), (r"never", "x")]).apply(["h.0.w", "h.1.w", "other"])
  msg = str(info.value)
  assert "'h.0.w' and 'h.1.w' both rename to 'same'" in msg
  assert "'other': no rule covers it" in msg and "rule 'never': matches no checkpoint key" in msg
  assert R.rename([("a", "b")], require_all=False).apply(["a", "c"]) == {"b": "a", "c": "c"}
  with pytest.raises(errors.RecipeSetError, match="not a valid regex"):
    R.rename([("(", "x")])


def test_recipe_set_aliases():
  rs = R.RecipeSet([("a", R.source("x")), ("b", R.source("y"))], aliases={"c": "d", "d": "a"})
  assert rs.aliases == {"c": "a", "d": "a"} and rs.owner("c") == "a" and rs.owner("b") == "b"
  with pytest.raises(errors.RecipeSetError, match="two recipes"):
    R.RecipeSet([("a", R.source("x")), ("a", R.source("y"))])
  with pytest.raises(errors.RecipeSetError, match="non-empty"):
    R.RecipeSet({"": R.source("x")})
  with pytest.raises(errors.AliasError, match="alias cycle: c -> d -> c"):
    R.RecipeSet({"a": R.source("x")}, aliases={"c": "d", "d": "c"})
  with pytest.raises(errors.AliasError, match="not a known target"):
    R.RecipeSet({"a": R.source("x")}, aliases={"c": "missing"})
  with pytest.raises(errors.AliasError, match="is also a target"):
    R.RecipeSet({"a": R.source("x")}, aliases={"a": "a"})
  with pytest.raises(errors.AliasError, match="non-empty"):
    R.RecipeSet({"a": R.source("x")}, aliases={"": "a"})


# --- property: recipes agree with numpy; regions read no more than needed ------------------


@st.composite
def recipe_and_reference(draw):
  shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
  dtype = draw(st.sampled_from([np.float32, np.int32, np.float16, ml_dtypes.bfloat16]))
  base = (np.arange(np.prod(shape)) * 0.5 - 3).astype(dtype).reshape(shape)
  arrays = {"x": base}
  sel = draw(st.sampled_from(["full", "range", "indices"]))
  axis = draw(st.integers(0, len(shape) - 1))
  n = shape[axis]
  if sel == "range":
    a = draw(st.integers(0, n - 1))
    b = draw(st.integers(a + 1, n))
    recipe, ref = R.source("x", Range(axis, a, b)), np.take(base, range(a, b), axis=axis)
  elif sel == "indices":
    idx = tuple(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=4)))
    recipe, ref = R.source("x", Indices(axis, idx)), np.take(base, idx, axis=axis)
  else:
    recipe, ref = R.source("x"), base
  exact = True
  for op in draw(
    st.lists(
      st.sampled_from(
        ["transpose", "cast", "concat", "stack", "select", "reshape", "sub1", "view"]
      ),
      max_size=3,
    )
  ):
    if op == "transpose":
      perm = tuple(draw(st.permutations(range(ref.ndim))))
      recipe, ref = R.transpose(recipe, perm), np.transpose(ref, perm)
    elif op == "cast":
      recipe, ref = R.cast(recipe, np.float64), ref.astype(np.float64)
    elif op == "concat":
      ax = draw(st.integers(0, ref.ndim - 1))
      recipe, ref = R.concatenate([recipe, recipe], ax), np.concatenate([ref, ref], ax)
    elif op == "stack" and ref.ndim < 4:
      ax = draw(st.integers(0, ref.ndim))
      recipe, ref = R.stack([recipe, recipe], ax), np.stack([ref, ref], ax)
    elif op == "select":
      ax = draw(st.integers(0, ref.ndim - 1))
      a = draw(st.integers(0, ref.shape[ax] - 1))
      recipe, ref = (
        R.select(recipe, Range(ax, a, ref.shape[ax])),
        np.take(ref, range(a, ref.shape[ax]), axis=ax),
      )
    elif op == "reshape":
      recipe, ref = R.reshape(recipe, (ref.size,)), ref.reshape(ref.size)
      exact = False
    elif op == "sub1" and ref.dtype != np.bool_:
      recipe, ref = R.subtract_one(recipe), ref - np.asarray(1, ref.dtype)
    elif op == "view":
      recipe, ref = (
        R.view(recipe, np.uint8, (ref.nbytes,)),
        np.ascontiguousarray(ref).view(np.uint8).reshape(-1),
      )
      exact = False
  region = tuple(
    slice(lo, draw(st.integers(lo + 1, d)))
    for d in ref.shape
    for lo in [draw(st.integers(0, d - 1))]
  )
  return arrays, recipe, ref, region, exact


@settings(max_examples=150, deadline=None)
@given(recipe_and_reference())
def test_recipes_match_numpy_and_regions_are_bounded(case):
  arrays, recipe, ref, region, exact = case
  src = MemorySource(arrays)
  meta = R.infer(recipe, src)
  assert meta.shape == ref.shape and meta.dtype == ref.dtype
  full = R.evaluate(recipe, src)
  np.testing.assert_array_equal(full, ref)
  full_bytes = src.stats.bytes_read
  src2 = MemorySource(arrays)
  part = R.evaluate(recipe, src2, region)
  np.testing.assert_array_equal(part, ref[region])
  assert src2.stats.bytes_read <= full_bytes
  if exact and "Indices" not in str(recipe):
    # the region read exactly the source elements it depends on: never more than its output
    # size times the number of times a source is repeated by concat/stack
    repeats = str(recipe).count("source(")
    assert src2.stats.bytes_read <= part.size * arrays["x"].dtype.itemsize * repeats
