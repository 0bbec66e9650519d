"""Hostile and damaged GGUF files: every count bounded by the file before anything is
allocated, tensors aligned and never sharing bytes, the file validated the file read, and a
block format other than the one the file records refused. Each is a ``MalformedGGUFError``
(or a plan error) naming the file and the tensor or key, and nothing binds."""

import os
import resource
import struct
import time

import gguf
import jax
import numpy as np
import pytest

import paramreg_jax as prj
from paramreg_jax import errors
from paramreg_jax import recipes as R


def _string(text: bytes) -> bytes:
  return struct.pack("<Q", len(text)) + text


def _kv_u32(key: bytes, value: int) -> bytes:
  return _string(key) + struct.pack("<II", 4, value)


def _file(kvs=(), tensors=(), data=b"", *, counts=None, version=3, alignment=32):
  """A GGUF file written byte by byte: ``tensors`` are ``(name, dims, type id, offset)``."""
  n_tensors, n_kv = counts or (len(tensors), len(kvs))
  out = b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + b"".join(kvs)
  for name, dims, type_id, offset in tensors:
    out += _string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
    out += struct.pack("<IQ", type_id, offset)
  out += b"\0" * (-len(out) % alignment)
  return out + data


def _two_f32(offset_b: int) -> bytes:
  """``a``: 16 float32 (64 bytes) at 0; ``b``: 8 at ``offset_b``."""
  data = np.arange(32, dtype=np.float32).tobytes()
  return _file((), [(b"a", (16,), 0, 0), (b"b", (8,), 0, offset_b)], data)


def test_a_hand_written_file_reads_as_written(tmp_path):
  path = tmp_path / "ok.gguf"
  path.write_bytes(_two_f32(64))
  src = prj.GGUFSource(path)
  assert src.lease("b").read().tolist() == list(range(16, 24))


@pytest.mark.parametrize("offset_b", [0, 32])
def test_tensors_sharing_bytes_are_refused(tmp_path, offset_b):
  path = tmp_path / "overlap.gguf"
  path.write_bytes(_two_f32(offset_b))
  with pytest.raises(
    errors.MalformedGGUFError, match=r"overlap\.gguf: tensors '[ab]' and '[ab]' overlap"
  ):
    prj.GGUFSource(path)


def test_an_offset_off_the_alignment_is_refused(tmp_path):
  path = tmp_path / "misaligned.gguf"
  data = np.zeros(16, np.float32).tobytes()
  path.write_bytes(_file((), [(b"a", (8,), 0, 4)], data))
  with pytest.raises(
    errors.MalformedGGUFError,
    match=r"misaligned\.gguf: tensor 'a' starts at data offset 4, not a multiple of "
    r"general\.alignment \(32\)",
  ):
    prj.GGUFSource(path)
  bad = tmp_path / "alignment.gguf"
  bad.write_bytes(_file([_kv_u32(b"general.alignment", 24)], [(b"a", (8,), 0, 0)], data))
  with pytest.raises(errors.MalformedGGUFError, match=r"general\.alignment is 24, not a power"):
    prj.GGUFSource(bad)


def _array_claim(count: int, item_type: int = 0) -> bytes:
  return _string(b"llama.junk") + struct.pack("<IIQ", 9, item_type, count)


@pytest.mark.parametrize(
  "body, message",
  [
    (_file([_array_claim(2**62)]), r"metadata 'llama\.junk' claims 4611686018427387904 items"),
    (_file([_array_claim(2**62, 8)]), r"metadata 'llama\.junk' claims 4611686018427387904"),
    (_file([_array_claim(3, 9)]), r"'llama\.junk' is an array of arrays"),
    (_file(counts=(2**40, 0)), r"the tensor count claims 1099511627776 items"),
    (_file(counts=(0, 2**61)), r"the metadata count claims 2305843009213693952 items"),
    (_file([struct.pack("<Q", 2**60)]), r"a metadata key claims 1152921504606846976"),
    (_file([_string(b"general.name") + struct.pack("<IQ", 8, 2**50)]), r"general\.name"),
    (_file((), [(b"a", (8, 2**40), 0, 0)]), r"tensor 'a' \(F32, .*\) needs bytes|tensor 'a'"),
    (_file((), [(b"a", (1, 1, 1, 1, 1), 0, 0)]), r"tensor 'a' has 5 dimensions"),
    (_file((), [(b"a", (8,), 4242, 0)]), r"tensor 'a' has GGUF type 4242"),
    (_file((), [(b"a", (8,), 0, 0), (b"a", (8,), 0, 32)]), r"tensor 'a' appears twice"),
    (_file([_kv_u32(b"x", 1), _kv_u32(b"x", 2)]), r"metadata key 'x' appears twice"),
    (_file(version=1), r"version 1, which is not supported"),
    (_file(version=3 << 24), r"a big-endian file"),
  ],
)
def test_a_header_that_claims_more_than_the_file_holds_is_refused_at_once(tmp_path, body, message):
  """A count is checked against the bytes left before anything is read or allocated for it:
  a 2**62-element array in a 100-byte file is refused in well under a second."""
  path = tmp_path / "hostile.gguf"
  path.write_bytes(body + b"\0" * 64)
  before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  start = time.perf_counter()
  with pytest.raises(errors.MalformedGGUFError, match=r"hostile\.gguf: .*" + message):
    prj.GGUFSource(path)
  assert time.perf_counter() - start < 1.0
  assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024  # KiB


def _write(path, values, kind="F32"):
  w = gguf.GGUFWriter(str(path), "llama")
  w.add_block_count(1)
  qtype = gguf.GGMLQuantizationType[kind]
  if kind == "F32":
    w.add_tensor("blk.0.ffn_up.weight", values)
  else:
    w.add_tensor("blk.0.ffn_up.weight", gguf.quants.quantize(values, qtype), raw_dtype=qtype)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def test_a_file_renamed_over_the_path_after_opening_is_not_read(tmp_path):
  """The header is parsed from the descriptor the data are read from: what was validated is
  what is read, whatever now lies at the path."""
  path, other = tmp_path / "m.gguf", tmp_path / "other.gguf"
  first = np.arange(64, dtype=np.float32).reshape(2, 32)
  _write(path, first)
  _write(other, np.full((4, 32), 7, np.float32))  # another shape, other bytes
  src = prj.GGUFSource(path)
  os.replace(other, path)
  assert src.metadata("blk.0.ffn_up.weight").shape == (2, 32)
  np.testing.assert_array_equal(src.lease("blk.0.ffn_up.weight").read(), first)


def test_a_block_format_other_than_the_recorded_one_is_refused_and_nothing_binds(tmp_path):
  path = tmp_path / "q8.gguf"
  _write(path, np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32), "Q8_0")
  src = prj.GGUFSource(path)
  key = "blk.0.ffn_up.weight"
  target = {"w": np.zeros((2, 32), np.float32)}
  before = target["w"].copy()
  with pytest.raises(
    prj.RestorePlanError,
    match=r"n:w: .*the checkpoint records 'blk\.0\.ffn_up\.weight' as Q8_0 blocks, not Q4_1; "
    r"read it with 'Q8_0'",
  ):
    prj.restore(target, src, recipes={"w": R.dequantize(R.source(key), "Q4_1")})
  with pytest.raises(prj.RestorePlanError, match=r"records 'blk\.0\.ffn_up\.weight' as Q8_0"):
    prj.plan_restore(
      {"w": jax.ShapeDtypeStruct((2, 32), np.int8)},
      src,
      recipes={"w": R.block_values(R.source(key), "Q4_0")},
    )
  np.testing.assert_array_equal(target["w"], before)
  assert src.stats.reads == 0
