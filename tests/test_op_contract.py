"""Every recipe op keeps the contract between its rules, checked over all of ``ops.OPS``: what
``infer`` says is what evaluating produces; a box of the output is that box of the whole
output (the compiler reads only the box); the printed code builds the same recipe; a sharded
restore equals the evaluation; and export either writes the stored tensors back as they were
or refuses, naming the op. A new op without a sample here fails the first test."""

import itertools
import re

import jax
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import paramreg_jax as prj
from paramreg_jax import recipes as R
from paramreg_jax._src.match.proposal import code as code_of
from paramreg_jax._src.recipes.ops.op_table import OPS

RNG = np.random.default_rng(0)


def _q8_rows(rows: int) -> np.ndarray:
  """Q8_0 blocks: a float16 scale, then 32 int8 values, per row."""
  out = np.zeros((rows, 34), np.uint8)
  out[:, :2] = (RNG.uniform(0.5, 2, (rows, 1)).astype(np.float16)).view(np.uint8)
  out[:, 2:] = RNG.integers(-127, 127, (rows, 32), dtype=np.int8).view(np.uint8)
  return out


STORED = {
  "w": RNG.normal(size=(8, 6)).astype(np.float32),
  "u": RNG.normal(size=(8, 6)).astype(np.float32),
  "neg": -RNG.uniform(0.5, 2.0, size=(8, 6)).astype(np.float32),  # Mamba's A: below zero
  "b": RNG.normal(size=(8, 6)).astype(ml_dtypes.bfloat16),
  "q8": _q8_rows(8),
  "fp8": RNG.normal(size=(8, 8)).astype(ml_dtypes.float8_e4m3fn),
  "fp8_scale": RNG.uniform(0.5, 2, size=(2, 2)).astype(np.float32),
  "mx_blocks": RNG.integers(0, 256, (8, 1, 16), dtype=np.uint8),
  "mx_scales": RNG.integers(120, 136, (8, 1), dtype=np.uint8),
}
SRC = prj.MemorySource(STORED)

SAMPLES = {
  "source": R.source("w"),
  "source Range": R.source("w", prj.Range(0, 2, 6)),
  "source Indices": R.source("w", prj.Indices(1, (5, 0, 2))),
  "select": R.select(R.transpose(R.source("w"), (1, 0)), prj.Range(1, 0, 4)),
  "concatenate": R.concatenate([R.source("w"), R.source("u")], axis=1),
  "stack": R.stack([R.source("w"), R.source("u")], axis=1),
  "reshape": R.reshape(R.source("w"), (2, 4, 6)),
  "transpose": R.transpose(R.source("w"), (1, 0)),
  "cast": R.cast(R.source("b"), np.float32),
  "view": R.view(R.source("w"), np.uint8, (8, 24)),
  "neg_log": R.neg_log(R.source("neg")),
  "subtract_one": R.subtract_one(R.source("w")),
  "dequantize": R.dequantize(R.source("q8"), "Q8_0"),
  "scale_blocks": R.scale_blocks(R.source("fp8"), R.source("fp8_scale")),
  "mxfp4": R.mxfp4(R.source("mx_blocks"), R.source("mx_scales")),
  "block_values": R.block_values(R.source("q8"), "Q8_0"),
  "block_scales": R.block_scales(R.source("q8"), "Q8_0"),
  "nested": R.transpose(R.concatenate([R.cast(R.source("b"), np.float32), R.source("w")]), (1, 0)),
}


def _only(recipe):
  """A source of the tensors ``recipe`` reads (a restore refuses tensors nothing reads)."""
  return prj.MemorySource({k: STORED[k] for k in R.source_keys(recipe)})


def _nodes(recipe):
  yield recipe
  for child in recipe.children():
    yield from _nodes(child)


def test_every_op_has_a_sample():
  covered = {type(n) for r in SAMPLES.values() for n in _nodes(r)}
  missing = [op.__name__ for op in OPS if op not in covered]
  assert not missing, f"add a sample of {missing} to SAMPLES in tests/test_op_contract.py"


@pytest.mark.parametrize("name", SAMPLES)
def test_infer_says_what_evaluate_produces(name):
  recipe = SAMPLES[name]
  out = R.evaluate(recipe, SRC)
  meta = R.infer(recipe, SRC)
  assert (tuple(meta.shape), np.dtype(meta.dtype)) == (out.shape, out.dtype)
  assert meta.nbytes == out.nbytes


def _boxes(shape, n=12):
  rng = np.random.default_rng(len(shape))
  for _ in range(n):
    box = []
    for d in shape:
      a = int(rng.integers(0, d))
      box.append(slice(a, int(rng.integers(a + 1, d + 1))))
    yield tuple(box)


@pytest.mark.parametrize("name", SAMPLES)
def test_a_box_of_the_output_is_that_box_of_the_whole(name):
  recipe = SAMPLES[name]
  whole = R.evaluate(recipe, SRC)
  for box in _boxes(whole.shape):
    np.testing.assert_array_equal(R.evaluate(recipe, SRC, box), whole[box], err_msg=str(box))


@pytest.mark.parametrize("name", SAMPLES)
def test_the_printed_code_builds_the_same_recipe(name):
  recipe = SAMPLES[name]
  rebuilt = eval(code_of(recipe), {"R": R, "prj": prj, "np": np, "ml_dtypes": ml_dtypes})
  assert rebuilt == recipe
  np.testing.assert_array_equal(R.evaluate(rebuilt, SRC), R.evaluate(recipe, SRC))


@pytest.mark.parametrize("name", SAMPLES)
def test_a_sharded_restore_equals_the_evaluation(name, devices):
  recipe = SAMPLES[name]
  whole = R.evaluate(recipe, SRC)
  mesh = jax.sharding.Mesh(np.array(devices).reshape(4, 2), ("a", "b"))
  specs = [P(), P(*[("a", "b")] + [None] * (whole.ndim - 1))]  # 8 ways along the first axis
  for axis_name, size in (("a", 4), ("b", 2)):  # and 4 or 2 ways along another
    axis = next((i for i, d in enumerate(whole.shape) if i and d % size == 0), None)
    if axis is not None:
      specs.append(P(*[axis_name if i == axis else None for i in range(whole.ndim)]))
  for spec in specs:
    if whole.shape[0] % 8 and spec == specs[1]:
      continue
    sharding = NamedSharding(mesh, spec)
    target = {"x": jax.ShapeDtypeStruct(whole.shape, whole.dtype, sharding=sharding)}
    got = prj.restore(target, _only(recipe), recipes={"x": recipe})["x"]
    assert got.sharding == sharding
    np.testing.assert_array_equal(np.asarray(got), whole, err_msg=str(spec))


# What export refuses, and why: the rest write the stored tensors back.
EXPORT_REFUSES = {
  "source Range": "come from no parameter (the restore kept only part of it)",
  "source Indices": "come from no parameter (the restore kept only part of it)",
  "select": "come from no parameter (the restore kept only part of it)",
  "dequantize": "writing quantized tensors is not supported",
  "scale_blocks": "writing them is not supported",
  "mxfp4": "writing quantized tensors is not supported",
  "block_values": "writing Q8_0 blocks is not supported",
  "block_scales": "writing Q8_0 blocks is not supported",
}
ARITHMETIC = {"neg_log", "subtract_one"}  # written back exactly up to float rounding


@pytest.mark.parametrize("name", SAMPLES)
def test_export_writes_the_stored_tensors_back_or_refuses_saying_why(name, tmp_path):
  recipe = SAMPLES[name]
  whole = R.evaluate(recipe, SRC)
  target = {"x": jax.ShapeDtypeStruct(whole.shape, whole.dtype)}
  src = _only(recipe)
  params = prj.restore(target, src, recipes={"x": recipe})
  if name in EXPORT_REFUSES:
    with pytest.raises(prj.errors.ExportPlanError, match=re.escape(EXPORT_REFUSES[name])):
      prj.export(params, {"x": recipe}, tmp_path / "out", source=src)
    assert not (tmp_path / "out").exists()
    return
  prj.export(params, {"x": recipe}, tmp_path / "out", source=src)
  written = prj.SafetensorsSource(tmp_path / "out")
  for key in R.source_keys(recipe):
    got, want = written.lease(key).read(), STORED[key]
    assert (got.shape, got.dtype) == (want.shape, want.dtype), key
    if name in ARITHMETIC:
      np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=key)
    else:
      np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"{name}: {key}")


def _bits(a):
  return a.view(f"u{a.dtype.itemsize}")


def test_no_two_boxes_of_a_sample_are_alike():
  """The box test could pass with a rule that ignores its box on a constant input: the
  stored tensors are random, so two different boxes of a sample differ."""
  for name, recipe in SAMPLES.items():
    whole = R.evaluate(recipe, SRC)
    boxes = list(_boxes(whole.shape, 6))
    for a, b in itertools.combinations(boxes, 2):
      if whole[a].shape == whole[b].shape and a != b:
        assert not np.array_equal(whole[a], whole[b]), (name, a, b)


@pytest.mark.parametrize("value", [0.0, -0.0, 1.5, np.inf])
def test_neg_log_of_a_value_where_it_is_undefined_is_refused_not_nan(value):
  stored = np.full((4, 2), -1.0, np.float32)
  stored[2, 1] = value
  src = prj.MemorySource({"A": stored})
  target = {"A_log": jax.ShapeDtypeStruct((4, 2), np.float32)}
  with pytest.raises(prj.MaterializationError) as info:
    prj.restore(target, src, recipes={"A_log": R.neg_log(R.source("A"))})
  assert str(info.value) == (
    f"n:A_log: neg_log(source('A')): 1 of 8 values are >= 0, where log(-x) is undefined (the "
    f"first, {float(np.float32(value))!r}, at (2, 1) of the box read); the stored tensor is not "
    "a negative A: if it already holds A_log, read it without neg_log; nothing was kept, the "
    "target is untouched"
  )
  with pytest.raises(prj.errors.UndefinedValueError):
    R.evaluate(R.neg_log(R.source("A")), src)
