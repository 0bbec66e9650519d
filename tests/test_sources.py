"""Sources: orbax, safetensors and memory agree; malformed inputs fail before any read."""

import json
import re
import struct

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from safetensors.numpy import save_file

import paramreg_jax as prj
from paramreg_jax import Indices
from paramreg_jax import MemorySource
from paramreg_jax import OrbaxSource
from paramreg_jax import Range
from paramreg_jax import SafetensorsSource
from paramreg_jax import recipes as R
from paramreg_jax.errors import ContradictoryIndexMappingError
from paramreg_jax.errors import InvalidRegionError
from paramreg_jax.errors import MalformedIndexError
from paramreg_jax.errors import MalformedSafetensorsError
from paramreg_jax.errors import MissingShardError
from paramreg_jax.errors import StoreError
from paramreg_jax.errors import UnknownTensorError
from paramreg_jax.errors import UnsafeShardPathError
from paramreg_jax.sources import CheckpointSource
from paramreg_jax.sources import SourceStats
from paramreg_jax.sources import TensorMetadata

DTYPES = [
  np.float32,
  np.float16,
  ml_dtypes.bfloat16,
  np.int32,
  np.int8,
  np.uint8,
  np.int64,
  np.float64,
]


def sample_tensors():
  out = {}
  for i, dt in enumerate(DTYPES):
    out[f"t{i}_{np.dtype(dt).name}"] = (np.arange(24) - 7).astype(dt).reshape(4, 6)
  out["scalar"] = np.array(2.5, np.float32)
  out["bool"] = np.array([True, False, True])
  return out


@pytest.fixture(scope="module")
def tensors():
  return sample_tensors()


@pytest.fixture(scope="module")
def st_path(tmp_path_factory, tensors):
  path = tmp_path_factory.mktemp("st") / "model.safetensors"
  save_file(dict(tensors), str(path))
  return path


@pytest.fixture(scope="module")
def orbax_path(tmp_path_factory, tensors):
  path = tmp_path_factory.mktemp("ob") / "ckpt"
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(path, dict(tensors))  # numpy arrays: int64/float64 survive without x64
  ckpt.wait_until_finished()
  return path


def sources(tensors, st_path, orbax_path):
  return [MemorySource(tensors), SafetensorsSource(st_path), OrbaxSource(orbax_path)]


def test_all_sources_agree(tensors, st_path, orbax_path):
  srcs = sources(tensors, st_path, orbax_path)
  for src in srcs:
    assert isinstance(src, CheckpointSource)
    assert src.keys() == tuple(sorted(tensors))
  for key, value in tensors.items():
    metas = {src.metadata(key) for src in srcs}
    assert metas == {TensorMetadata(value.shape, value.dtype)}, key
    for src in srcs:
      np.testing.assert_array_equal(src.lease(key).read(), value, err_msg=f"{src!r} {key}")
      assert src.lease(key).read().dtype == value.dtype
      if value.ndim == 2:
        lease = src.lease(key, Range(1, 2, 5))
        np.testing.assert_array_equal(lease.read((slice(1, 3), slice(0, 2))), value[1:3, 2:4])
        np.testing.assert_array_equal(
          src.lease(key, Indices(0, (3, 0, 3))).read(), value[[3, 0, 3]]
        )


def test_metadata_reads_no_payload(tensors, st_path, orbax_path):
  for src in sources(tensors, st_path, orbax_path):
    for k in src.keys():
      src.metadata(k)
      src.lease(k)
    assert src.stats == SourceStats(0, 0)


def test_region_reads_count_only_their_bytes(tensors, st_path):
  src = SafetensorsSource(st_path)
  src.lease("t0_float32").read((slice(1, 2),))
  assert src.stats == SourceStats(1, 6 * 4)


def test_orbax_counts_the_chunks_a_region_touches(tmp_path):
  mesh = jax.make_mesh((8,), ("x",))
  arr = jax.device_put(
    jnp.arange(64 * 4, dtype=jnp.float32).reshape(64, 4), NamedSharding(mesh, P("x", None))
  )
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(tmp_path / "c", {"w": arr})
  ckpt.wait_until_finished()
  src = OrbaxSource(tmp_path / "c")
  assert src.chunk_shape("w") == (8, 4)
  np.testing.assert_array_equal(src.lease("w").read((slice(8, 16),)), np.asarray(arr)[8:16])
  assert src.stats.bytes_read == 8 * 4 * 4  # exactly one shard's chunk
  src.lease("w").read((slice(7, 9),))  # straddles two chunks
  assert (src.stats.bytes_read - 8 * 16) == 2 * 8 * 4 * 4


def test_orbax_layouts(tmp_path):
  tree = {"params": {"dense": {"kernel": jnp.ones((2, 3)), "bias": jnp.zeros(3)}}}
  mgr = ocp.CheckpointManager(tmp_path / "mgr", item_names=("params", "extra"))
  for step in (1, 5):
    mgr.save(
      step,
      args=ocp.args.Composite(
        params=ocp.args.StandardSave(tree), extra=ocp.args.StandardSave({"x": jnp.ones(1) * step})
      ),
    )
  mgr.wait_until_finished()
  src = OrbaxSource(tmp_path / "mgr", item="params")
  assert src.keys() == ("params/dense/bias", "params/dense/kernel")
  assert str(src.path).endswith("5/params")
  assert OrbaxSource(tmp_path / "mgr", step=1, item="extra").lease("x").read().tolist() == [1.0]
  with pytest.raises(StoreError, match=re.escape("holds items ['extra', 'params']; pass item=")):
    OrbaxSource(tmp_path / "mgr")
  with pytest.raises(StoreError, match="no step 3"):
    OrbaxSource(tmp_path / "mgr", step=3, item="params")
  with pytest.raises(StoreError, match="no such orbax checkpoint"):
    OrbaxSource(tmp_path / "nope")
  # PyTreeCheckpointer layout
  ocp.PyTreeCheckpointer().save(tmp_path / "pt", {"a": {"b": jnp.arange(3)}})
  assert OrbaxSource(tmp_path / "pt").keys() == ("a/b",)


def test_orbax_keys_are_canonical_names(tmp_path):
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(
    tmp_path / "c", {"layers": [{"w": jnp.ones(1)}, {"w": jnp.ones(2)}], "a/b": jnp.ones(3)}
  )
  ckpt.wait_until_finished()
  assert OrbaxSource(tmp_path / "c").keys() == ("a~1b", "layers/0/w", "layers/1/w")


def test_unknown_key(tensors):
  src = MemorySource(tensors)
  with pytest.raises(
    UnknownTensorError, match=re.escape("'t0' is not in MemorySource(10 tensors)")
  ):
    src.metadata("t0")
  with pytest.raises(UnknownTensorError, match=re.escape("'nope' is not in MemorySource")):
    src.lease("nope")  # the library's error (a KeyError too), not a bare KeyError


def test_bad_regions(tensors):
  src = MemorySource(tensors)
  with pytest.raises(InvalidRegionError, match="step 1"):
    src.lease("t0_float32").read((slice(0, 4, 2),))
  with pytest.raises(InvalidRegionError, match="rank 2"):
    src.lease("t0_float32").read((slice(0, 1),) * 3)


# --- malformed safetensors: clear errors, nothing read ---------------------------------------


def F32x2(begin, end):
  return {"dtype": "F32", "shape": [(end - begin) // 4], "data_offsets": [begin, end]}


ENTRY = json.dumps(F32x2(0, 0)).encode()
TWICE = b'{"a": ' + ENTRY + b', "a": ' + ENTRY + b"}"  # one name twice (json.loads keeps the last)


def write_raw(path, header, data=b"", length=None):
  raw = json.dumps(header).encode()
  n = len(raw) if length is None else length
  path.write_bytes(struct.pack("<Q", n) + raw + data)
  return path


@pytest.mark.parametrize(
  "make, message",
  [
    (
      lambda p: p.write_bytes(b"\x01\x00") and p,
      "truncated: 2 bytes, shorter than the 8-byte header length",
    ),
    (
      lambda p: write_raw(p, {"w": {}}, length=10_000),
      "header length 10000 runs past the end of the file",
    ),
    (
      lambda p: write_raw(
        p, {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4
      ),
      "data_offsets [0, 8] fall outside the data section (0..4 bytes)",
    ),
    (
      lambda p: write_raw(
        p, {"w": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8
      ),
      "tensor 'w': unknown dtype 'Q7'",
    ),
    (
      lambda p: write_raw(
        p, {"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8
      ),
      "data_offsets span 8 bytes, but (3,) F32 needs 12",
    ),
    (
      lambda p: (p.write_bytes(struct.pack("<Q", 3) + b"{x}"), p)[1],
      "the header is not valid JSON",
    ),
    (
      lambda p: write_raw(p, {"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}),
      "must be a list of non-negative ints",
    ),
    # offsets must tile the data section, as the safetensors package requires
    (
      lambda p: write_raw(p, {"a": F32x2(0, 8), "b": F32x2(4, 12)}, b"\0" * 12),
      "tensor 'b': data_offsets [4, 12] overlaps tensor 'a', which ends at byte 8",
    ),
    (
      lambda p: write_raw(p, {"a": F32x2(0, 8), "b": F32x2(0, 8)}, b"\0" * 8),
      "tensor 'b': data_offsets [0, 8] overlaps tensor 'a', which ends at byte 8",
    ),
    (
      lambda p: write_raw(p, {"a": F32x2(0, 8), "b": F32x2(12, 20)}, b"\0" * 20),
      "tensor 'b': data_offsets [12, 20] leaves a gap of 4 bytes after tensor 'a'",
    ),
    (
      lambda p: write_raw(p, {"a": F32x2(4, 12)}, b"\0" * 12),
      "tensor 'a': data_offsets [4, 12] leaves a gap of 4 bytes after the start of the data",
    ),
    (
      lambda p: write_raw(p, {"a": F32x2(0, 8)}, b"\0" * 12),
      "4 bytes after the last tensor are covered by no tensor (data section is 12 bytes)",
    ),
    (
      lambda p: (p.write_bytes(struct.pack("<Q", len(TWICE)) + TWICE), p)[1],
      "tensor 'a' appears twice in the header",
    ),
  ],
)
def test_malformed_safetensors(tmp_path, make, message):
  path = tmp_path / "bad.safetensors"
  make(path)
  with pytest.raises(MalformedSafetensorsError, match=re.escape(message)):
    SafetensorsSource(path)


def test_sharded_index(tmp_path, tensors):
  names = sorted(tensors)
  save_file({k: tensors[k] for k in names[:4]}, str(tmp_path / "a.safetensors"))
  save_file({k: tensors[k] for k in names[4:]}, str(tmp_path / "b.safetensors"))
  index = {
    "weight_map": {k: ("a.safetensors" if i < 4 else "b.safetensors") for i, k in enumerate(names)}
  }
  (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
  src = SafetensorsSource(tmp_path)
  assert src.keys() == tuple(names)
  assert src.shard_of(names[5]).name == "b.safetensors"
  np.testing.assert_array_equal(src.lease(names[5]).read(), tensors[names[5]])
  assert SafetensorsSource(tmp_path / "model.safetensors.index.json").keys() == tuple(names)


@pytest.mark.parametrize(
  "weight_map, error, message",
  [
    ({"w": "../outside.safetensors"}, UnsafeShardPathError, "outside"),
    ({"w": "/etc/passwd"}, UnsafeShardPathError, "shard paths must be relative names"),
    ({"w": "missing.safetensors"}, MissingShardError, "shard file(s) missing: missing.safetensors"),
    (
      {"nothere": "a.safetensors"},
      ContradictoryIndexMappingError,
      "maps nothere to a.safetensors, which does not hold them",
    ),
  ],
)
def test_bad_index(tmp_path, weight_map, error, message):
  d = tmp_path / "ck"
  d.mkdir()
  save_file({"w": np.ones(2, np.float32)}, str(d / "a.safetensors"))
  save_file({"w": np.ones(2, np.float32)}, str(tmp_path / "outside.safetensors"))
  (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
  with pytest.raises(error, match=re.escape(message)):
    SafetensorsSource(d)


def test_malformed_index_and_duplicates(tmp_path):
  (tmp_path / "model.safetensors.index.json").write_text("[1, 2]")
  with pytest.raises(MalformedIndexError):
    SafetensorsSource(tmp_path)
  d = tmp_path / "dup"
  d.mkdir()
  save_file({"w": np.ones(2, np.float32)}, str(d / "a.safetensors"))
  save_file({"w": np.ones(2, np.float32)}, str(d / "b.safetensors"))
  with pytest.raises(
    ContradictoryIndexMappingError,
    match=re.escape("stored in both a.safetensors and b.safetensors"),
  ):
    SafetensorsSource(d)


def test_recipes_over_real_files(tensors, st_path, orbax_path):
  r = R.transpose(
    R.concatenate([R.source("t2_bfloat16"), R.source("t2_bfloat16", Range(0, 0, 1))], 0), (1, 0)
  )
  for src in sources(tensors, st_path, orbax_path):
    out = R.evaluate(r, src, (slice(2, 4),))
    ref = np.concatenate([tensors["t2_bfloat16"], tensors["t2_bfloat16"][0:1]], 0).T[2:4]
    np.testing.assert_array_equal(out, ref)


def test_read_many_matches_single_reads(tensors, st_path, orbax_path):
  for src in sources(tensors, st_path, orbax_path):
    reqs = [("t0_float32", ((1, 3), (0, 6))), ("t2_bfloat16", ((0, 4), (2, 3))), ("scalar", ())]
    before = src.stats
    many = src.read_many(reqs)
    assert (src.stats - before).reads == 3
    for (key, region), got in zip(reqs, many):
      np.testing.assert_array_equal(got, tensors[key][tuple(slice(a, b) for a, b in region)])


def test_fp8_and_bf16_from_a_hand_written_safetensors_file(tmp_path):
  f8 = np.array([0.5, -1.0, 2.0, 448.0], dtype=ml_dtypes.float8_e4m3fn)
  bf = np.array([1.5, -2.25], dtype=ml_dtypes.bfloat16)
  header = {
    "f8": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]},
    "bf": {"dtype": "BF16", "shape": [2], "data_offsets": [4, 8]},
  }
  write_raw(tmp_path / "q.safetensors", header, f8.tobytes() + bf.tobytes())
  src = SafetensorsSource(tmp_path / "q.safetensors")
  assert src.metadata("f8").dtype == ml_dtypes.float8_e4m3fn
  np.testing.assert_array_equal(src.lease("f8").read().view(np.uint8), f8.view(np.uint8))
  np.testing.assert_array_equal(src.lease("bf").read(), bf)
  # packed data stays packed: a view reinterprets the bits, no silent dequantize
  assert (
    R.evaluate(R.view(R.source("f8"), np.uint8, (4,)), src).tolist() == f8.view(np.uint8).tolist()
  )


@pytest.mark.parametrize("opener", ["SafetensorsSource", "open_source", "load"])
def test_a_hub_id_given_as_a_path_suggests_hf(opener, tmp_path, monkeypatch):
  """``owner/name`` that is no local path reads as the Hub id it is: the message gives the
  call that opens it, ready to paste (``prj.load`` opens through ``prj.open_source``, which
  also takes a source); a path that is not Hub-shaped gets no such advice."""
  monkeypatch.chdir(tmp_path)
  call = {"load": "open_source"}.get(opener, opener)
  args = ({"w": jax.ShapeDtypeStruct((2,), np.float32)},) if opener == "load" else ()
  with pytest.raises(prj.errors.ParamRegError) as e:
    getattr(prj, opener)(*args, "sentence-transformers/all-MiniLM-L6-v2")
  assert str(e.value).endswith(
    f"; a Hugging Face Hub id? prj.{call}('hf://sentence-transformers/"
    "all-MiniLM-L6-v2') reads it from the Hub"
  )
  with pytest.raises(prj.errors.ParamRegError) as e:
    getattr(prj, opener)(*args, "models/tiny/model.safetensors")
  assert "Hub id" not in str(e.value)
