"""Quantized checkpoints: every dequantizing op equals its reference bit for bit (the ``gguf``
package's dequantizers; the FP8 block-scale and gpt-oss MXFP4 formulas), for any box of the
output and restored into every sharding; ``GGUFSource`` reads what ``gguf`` wrote; bad input is
a library error naming the tensor, and nothing binds."""

import os

import gguf
import jax
import ml_dtypes
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import paramreg_jax as prj
from paramreg_jax import errors
from paramreg_jax import recipes as R
from paramreg_jax._src.recipes.quant.formats import FORMATS

SETTINGS = settings(
  max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _random_blocks(rng, name, rows, blocks_per_row):
  """Random valid blocks: any bytes, with finite float16 scales (the writer's own never hold
  NaN or infinity)."""
  with np.errstate(invalid="ignore", over="ignore"):
    return _draw_blocks(rng, name, rows, blocks_per_row)


def _draw_blocks(rng, name, rows, blocks_per_row):
  block, nbytes = gguf.GGML_QUANT_SIZES[T[name]]
  raw = rng.integers(0, 256, (rows * blocks_per_row, nbytes), dtype=np.uint8)
  ref = gguf.quants.dequantize(raw.reshape(-1), T[name])
  bad = ~np.isfinite(ref.reshape(rows * blocks_per_row, block)).all(axis=1)
  while bad.any():  # redraw the blocks whose scales are not finite numbers
    raw[bad] = rng.integers(0, 256, (int(bad.sum()), nbytes), dtype=np.uint8)
    ref = gguf.quants.dequantize(raw.reshape(-1), T[name])
    bad = ~np.isfinite(ref.reshape(rows * blocks_per_row, block)).all(axis=1)
  return raw.reshape(rows, blocks_per_row * nbytes), ref.reshape(rows, blocks_per_row * block)


def _bits(a):
  return np.ascontiguousarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("name", sorted(FORMATS))
@SETTINGS
@given(data=st.data())
def test_every_box_of_a_dequantized_tensor_equals_gguf_bit_for_bit(name, data):
  rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
  rows, per_row = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 3))
  raw, ref = _random_blocks(rng, name, rows, per_row)
  src = prj.MemorySource({"w": raw})
  r = R.dequantize(R.source("w"), name)
  cols = ref.shape[1]
  r0 = data.draw(st.integers(0, rows - 1))
  r1 = data.draw(st.integers(r0 + 1, rows))
  c0 = data.draw(st.integers(0, cols - 1))
  c1 = data.draw(st.integers(c0 + 1, cols))
  got = R.evaluate(r, src, (slice(r0, r1), slice(c0, c1)))
  np.testing.assert_array_equal(_bits(got), _bits(ref[r0:r1, c0:c1]))
  assert R.infer(r, src).shape == ref.shape


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K", "Q6_K", "MXFP4"])
@pytest.mark.parametrize(
  "spec", [P(), P("a"), P(None, "b"), P("a", "b"), P("b", "a")], ids=lambda s: str(tuple(s))
)
@pytest.mark.parametrize("whole_bytes", [0, 1 << 18], ids=["per-shard", "small-whole"])
def test_a_restore_into_every_sharding_equals_gguf(name, spec, whole_bytes):
  """Rows over 4 devices, blocks over 2 (a box starts inside a block when it must); each
  shard built on its own, or the small tensor built whole and split."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("a", "b"))
  rng = np.random.default_rng(7)
  block = gguf.GGML_QUANT_SIZES[T[name]][0]
  raw, ref = _random_blocks(rng, name, 8, 3 if block == 256 else 6)
  src = prj.MemorySource({"w": raw})
  sharding = NamedSharding(mesh, spec)
  if ref.shape[1] % 2 and "b" in tuple(spec):
    pytest.skip("the columns do not split evenly")
  target = {"w": jax.ShapeDtypeStruct(ref.shape, np.float32, sharding=sharding)}
  backend = prj.JaxBackend(whole_bytes=whole_bytes)
  out = prj.restore(target, src, recipes={"w": R.dequantize(R.source("w"), name)}, backend=backend)
  assert out["w"].sharding == sharding
  np.testing.assert_array_equal(_bits(np.asarray(out["w"])), _bits(ref))
  # then transposed, as a flax kernel holds it
  target = {"k": jax.ShapeDtypeStruct(ref.shape[::-1], np.float32, sharding=sharding)}
  recipe = R.transpose(R.dequantize(R.source("w"), name), (1, 0))
  out = prj.restore(target, src, recipes={"k": recipe}, backend=backend)
  np.testing.assert_array_equal(_bits(np.asarray(out["k"])), _bits(ref.T))


def _fp8_reference(x, scale, bs):
  """DeepSeek-V3's ``weight_dequant``: each ``bs`` block times its scale, in float32."""
  x = x.astype(np.float32)
  if scale.size == 1:
    return x * scale.astype(np.float32).reshape(())
  out = np.empty_like(x)
  for i in range(scale.shape[0]):
    for j in range(scale.shape[1]):
      block = (slice(i * bs[0], (i + 1) * bs[0]), slice(j * bs[1], (j + 1) * bs[1]))
      out[block] = x[block] * np.float32(scale[i, j])
  return out


@pytest.mark.parametrize("fp8", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2])
@SETTINGS
@given(data=st.data())
def test_fp8_with_its_scales_equals_the_reference_formula(fp8, data):
  rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
  rows, cols = data.draw(st.integers(1, 300)), data.draw(st.integers(1, 300))
  x = rng.standard_normal((rows, cols)).astype(fp8)
  kind = data.draw(st.sampled_from(["tensor", "channel", "block"]))
  if kind == "tensor":
    scale = np.array([rng.random() + 0.5], np.float32)
  elif kind == "channel":
    scale = (rng.random((rows, 1)) + 0.5).astype(np.float32)
  else:
    scale = (rng.random((-(-rows // 128), -(-cols // 128))) + 0.5).astype(np.float32)
  src = prj.MemorySource({"w": x, "s": scale})
  r = R.scale_blocks(R.source("w"), R.source("s"), block=(128, 128) if kind == "block" else None)
  r0 = data.draw(st.integers(0, rows - 1))
  c0 = data.draw(st.integers(0, cols - 1))
  index = (slice(r0, rows), slice(c0, cols))
  block = (128, 128) if kind == "block" else (1, cols)
  want = _fp8_reference(x, scale, block)[index]
  np.testing.assert_array_equal(_bits(R.evaluate(r, src, index)), _bits(want))


def _gpt_oss_reference(blocks, scales):
  """transformers' ``convert_moe_packed_tensors``, in numpy."""
  lut = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    np.float32,
  )
  *prefix, g, b = blocks.shape
  flat = blocks.reshape(-1, b)
  exp = scales.reshape(-1, 1).astype(np.int32) - 127
  out = np.empty((flat.shape[0], b * 2), np.float32)
  out[:, 0::2] = lut[flat & 0x0F]
  out[:, 1::2] = lut[flat >> 4]
  out = np.ldexp(out, exp)
  return out.reshape(*prefix, g * b * 2)


@SETTINGS
@given(data=st.data())
def test_gpt_oss_mxfp4_equals_transformers_formula(data):
  rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
  experts, rows, groups = (data.draw(st.integers(1, 3)) for _ in range(3))
  blocks = rng.integers(0, 256, (experts, rows, groups, 16), dtype=np.uint8)
  scales = rng.integers(100, 140, (experts, rows, groups), dtype=np.uint8)
  src = prj.MemorySource({"b": blocks, "s": scales.view(ml_dtypes.float8_e8m0fnu)})
  r = R.mxfp4(R.source("b"), R.source("s"))
  c0 = data.draw(st.integers(0, groups * 32 - 1))
  index = (slice(None), slice(None), slice(c0, groups * 32))
  want = _gpt_oss_reference(blocks, scales)[index]
  np.testing.assert_array_equal(_bits(R.evaluate(r, src, index)), _bits(want))


# --- GGUFSource ----------------------------------------------------------------------------


def _write_gguf(path, tensors, arch="llama", **meta):
  w = gguf.GGUFWriter(str(path), arch)
  w.add_block_count(meta.get("blocks", 1))
  for name, (value, kind) in tensors.items():
    if kind in ("F32", "F16"):
      w.add_tensor(name, value)
    else:
      w.add_tensor(name, value, raw_dtype=T[kind])
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


def test_gguf_source_reads_what_gguf_wrote(tmp_path):
  rng = np.random.default_rng(0)
  q4k, q4k_ref = _random_blocks(rng, "Q4_K", 4, 2)
  q8 = gguf.quants.quantize(rng.standard_normal((3, 64)).astype(np.float32), T.Q8_0)
  f32 = rng.standard_normal((5, 7)).astype(np.float32)
  f16 = rng.standard_normal((6,)).astype(np.float16)
  path = _write_gguf(
    tmp_path / "m.gguf",
    {"a.weight": (q4k, "Q4_K"), "b.weight": (q8, "Q8_0"), "c": (f32, "F32"), "d": (f16, "F16")},
  )
  src = prj.GGUFSource(path)
  assert src.quantization("a.weight") == "Q4_K" and src.quantization("c") is None
  assert src.logical_shape("a.weight") == (4, 512) and src.metadata("a.weight").shape == (4, 288)
  np.testing.assert_array_equal(src.lease("c").read(), f32)
  np.testing.assert_array_equal(src.lease("d").read(), f16)
  r = R.dequantize(R.source("a.weight"), "Q4_K")
  np.testing.assert_array_equal(_bits(R.evaluate(r, src)), _bits(q4k_ref))
  before = src.stats.bytes_read
  R.evaluate(r, src, (slice(1, 2), slice(0, 10)))  # a row range reads only its rows' blocks
  assert src.stats.bytes_read - before == 288  # one row of two blocks (of four rows)
  want = gguf.quants.dequantize(q8, T.Q8_0)
  got = R.evaluate(R.dequantize(R.source("b.weight"), "Q8_0"), src)
  np.testing.assert_array_equal(_bits(got), _bits(want))
  assert src.config["model_type"] == "llama" and src.config["num_hidden_layers"] == 1


def test_a_truncated_or_foreign_file_is_refused_naming_it(tmp_path):
  rng = np.random.default_rng(1)
  q8 = gguf.quants.quantize(rng.standard_normal((64, 64)).astype(np.float32), T.Q8_0)
  path = _write_gguf(tmp_path / "m.gguf", {"blk.0.w": (q8, "Q8_0")})
  size = os.path.getsize(path)
  os.truncate(path, size - 100)
  with pytest.raises(errors.MalformedGGUFError, match=r"m\.gguf.*(blk\.0\.w|not a readable)"):
    prj.GGUFSource(path)
  other = tmp_path / "x.gguf"
  other.write_bytes(b"PK\x03\x04" + b"\0" * 64)
  with pytest.raises(errors.MalformedGGUFError, match=r"x\.gguf: not a readable GGUF file"):
    prj.GGUFSource(other)
  assert issubclass(errors.MalformedGGUFError, errors.StoreError)


def test_bad_quantized_recipes_are_errors_naming_the_tensor_and_nothing_binds(tmp_path):
  rng = np.random.default_rng(2)
  raw, _ = _random_blocks(rng, "Q4_K", 2, 1)
  src = prj.MemorySource({"w": raw, "odd": raw[:, :100], "x": np.ones((4, 4), np.float32)})
  with pytest.raises(errors.UnknownQuantizationError, match=r"source\('w'\).*'Q9_K'.*Q4_K"):
    R.dequantize(R.source("w"), "Q9_K")
  before = np.zeros((2, 256), np.float32)
  target = {"w": before}
  with pytest.raises(prj.RestorePlanError, match=r"n:w: dequantize\(source\('odd'\), 'Q4_K'\)"):
    prj.restore(target, src, recipes={"w": R.dequantize(R.source("odd"), "Q4_K")})
  bad_scale = prj.MemorySource({"w": np.ones((4, 4), np.float32), "s": np.ones((3, 3), np.float32)})
  with pytest.raises(prj.RestorePlanError, match=r"do not divide values of shape \(4, 4\)"):
    prj.restore(
      {"w": before[:, :4][:1].repeat(4, 0)},
      bad_scale,
      recipes={"w": R.scale_blocks(R.source("w"), R.source("s"))},
    )
  assert not before.any() and src.stats.reads == 0


def test_export_refuses_a_quantized_mapping():
  rng = np.random.default_rng(3)
  raw, ref = _random_blocks(rng, "Q8_0", 2, 1)
  src = prj.MemorySource({"w": raw})
  target = {"w": jax.ShapeDtypeStruct(ref.shape, np.float32)}
  plan = prj.plan_restore(target, src, recipes={"w": R.dequantize(R.source("w"), "Q8_0")})
  with pytest.raises(errors.ExportPlanError, match=r"Q8_0 blocks.*export to a float checkpoint"):
    prj.plan_export(plan)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K"])
def test_a_tensor_of_many_chunks_equals_gguf(name):
  """Blocks are dequantized a chunk at a time: a tensor of several chunks, cut off-block."""
  rng = np.random.default_rng(4)
  raw, ref = _random_blocks(rng, name, 3, 1500 if name == "Q8_0" else 400)
  src = prj.MemorySource({"w": raw})
  got = R.evaluate(R.dequantize(R.source("w"), name), src, (slice(None), slice(5, None)))
  np.testing.assert_array_equal(_bits(got), _bits(ref[:, 5:]))


KEPT = {  # format: (values dtype, values per scale, has minimums)
  "Q8_0": (np.int8, 32, False),
  "Q4_0": (ml_dtypes.int4, 32, False),
  "Q2_K": (ml_dtypes.uint4, 16, True),
  "Q3_K": (ml_dtypes.int4, 16, False),
  "Q4_K": (ml_dtypes.uint4, 32, True),
  "Q5_K": (np.uint8, 32, True),
  "Q6_K": (np.int8, 16, False),
}


@pytest.mark.parametrize("name", sorted(KEPT))
def test_a_quantized_target_keeps_the_blocks_as_values_and_scales(name):
  """A quantized model's leaves (values, a scale and for some formats a minimum per group,
  [in, out] as flax kernels) restore as stored, sharded, with no dequantization; scales times
  values (less the minimums) is gguf's dequantized tensor, bit for bit."""
  values_dtype, group, has_mins = KEPT[name]
  block = gguf.GGML_QUANT_SIZES[T[name]][0]
  rng = np.random.default_rng(6)
  raw, ref = _random_blocks(rng, name, 8, 512 // block)  # [out=8, in=512]
  src = prj.MemorySource({"w": raw})
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("a", "b"))
  scales_dtype = np.float16 if block == 32 else np.float32
  groups = 512 // group
  target = {
    "qvalue": jax.ShapeDtypeStruct(
      (512, 8), values_dtype, sharding=NamedSharding(mesh, P("a", "b"))
    ),
    "scale": jax.ShapeDtypeStruct(
      (groups, 8), scales_dtype, sharding=NamedSharding(mesh, P("a", "b"))
    ),
  }
  recipes = {
    "qvalue": R.transpose(R.block_values(R.source("w"), name), (1, 0)),
    "scale": R.transpose(R.block_scales(R.source("w"), name), (1, 0)),
  }
  if has_mins:
    target["min"] = target["scale"]
    recipes["min"] = R.transpose(R.block_mins(R.source("w"), name), (1, 0))
  out = prj.restore(target, src, recipes=recipes)
  values = np.asarray(out["qvalue"]).astype(np.float32)
  x = np.repeat(np.asarray(out["scale"]).astype(np.float32), group, axis=0) * values
  if has_mins:
    x = x - np.repeat(np.asarray(out["min"]), group, axis=0)
  np.testing.assert_array_equal(_bits(x), _bits(ref.T))
  if not has_mins:
    with pytest.raises(errors.UnknownQuantizationError, match=rf"{name!r} has no minimums"):
      R.block_mins(R.source("w"), name)


def test_a_format_that_cannot_be_kept_is_refused_naming_those_that_can():
  for name in ("MXFP4", "Q4_1"):
    with pytest.raises(
      errors.UnknownQuantizationError, match=rf"{name!r} blocks cannot be kept.*Q4_K"
    ):
      R.block_values(R.source("w"), name)


def test_an_unknown_gguf_type_is_named_and_nothing_binds(tmp_path):
  """A type the library cannot dequantize (IQ4_NL here) is read as its raw rows; asking for its
  values is an error naming the tensor and the formats it knows."""
  rng = np.random.default_rng(8)
  _, nbytes = gguf.GGML_QUANT_SIZES[T.IQ4_NL]
  raw = rng.integers(0, 256, (4, 2 * nbytes), dtype=np.uint8)
  path = _write_gguf(tmp_path / "iq.gguf", {"blk.0.ffn_up.weight": (raw, "IQ4_NL")})
  src = prj.GGUFSource(path)
  assert src.quantization("blk.0.ffn_up.weight") == "IQ4_NL"
  target = {"layers_0": {"mlp": {"up": {"kernel": jax.ShapeDtypeStruct((64, 4), np.float32)}}}}
  with pytest.raises(errors.UnknownQuantizationError, match=r"blk\.0\.ffn_up\.weight.*'IQ4_NL'"):
    prj.match(target, src)
  assert src.stats.reads == 0


def test_gguf_metadata_leaves_the_token_lists_unread(tmp_path):
  w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
  w.add_block_count(2)
  w.add_token_list([f"tok{i}" for i in range(1000)])
  w.add_tensor("output_norm.weight", np.ones(4, np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  meta = prj.GGUFSource(tmp_path / "t.gguf").gguf_metadata
  assert meta["general.architecture"] == "llama" and meta["llama.block_count"] == 2
  assert not any(k.startswith(("tokenizer.ggml.", "GGUF.")) for k in meta)
