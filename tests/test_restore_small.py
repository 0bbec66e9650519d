"""Many small tensors: the direct path (read stacked, built in grid order, one transfer per
weight) must give exactly what the general path and ``jax.device_put`` give."""

import os
import tempfile

import jax
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from safetensors.numpy import save_file

import paramreg_jax as prj
from paramreg_jax import MemorySource
from paramreg_jax import SafetensorsSource
from paramreg_jax import recipes as R
from paramreg_jax._src.restore import contract as backend_lib
from paramreg_jax._src.restore.jax_backend import transfer
from paramreg_jax.errors import UnknownTensorError

MESH = jax.make_mesh((4, 2), ("x", "y"))
SPECS = [P(), P("x"), P("y"), P(None, "y"), P("x", "y"), P("y", "x"), P(("x", "y"))]
DTYPES = [np.float32, ml_dtypes.bfloat16, np.int8, np.bool_, np.float16, np.uint16]


def assert_same_array(got, want):
  """Same values, sharding, abstract value, and every device holds exactly its box."""
  assert got.shape == want.shape and got.dtype == want.dtype
  assert got.aval == want.aval
  assert got.sharding == want.sharding and got.committed == want.committed
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  for a, b in zip(
    sorted(got.addressable_shards, key=lambda s: s.device.id),
    sorted(want.addressable_shards, key=lambda s: s.device.id),
  ):
    assert a.device == b.device and a.index == b.index
    np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))


def random_tensor(rng, shape, dtype):
  if dtype == np.bool_:
    return rng.integers(0, 2, shape).astype(bool)
  if np.issubdtype(dtype, np.integer):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)
  return rng.standard_normal(shape).astype(dtype)


def sharding_for(spec, shape):
  """``spec`` on the mesh when the shape divides, else None."""
  if len(spec) > len(shape):
    return None
  s = NamedSharding(MESH, spec)
  try:
    s.shard_shape(shape)
  except ValueError:
    return None
  return s


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
  st.lists(
    st.tuples(
      st.lists(st.sampled_from([1, 2, 3, 4, 8, 12, 16]), min_size=1, max_size=3),
      st.sampled_from(DTYPES),
      st.sampled_from([*SPECS, None]),  # None: one device
    ),
    min_size=1,
    max_size=12,
  ),
  st.integers(0, 2**31 - 1),
)
def test_small_tensors_restore_exactly_as_device_put_places_them(specs, seed):
  rng = np.random.default_rng(seed)
  tensors, target = {}, {}
  for i, (shape, dtype, spec) in enumerate(specs):
    shape = tuple(shape)
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    if spec is not None:
      sharding = sharding_for(spec, shape) or sharding
    tensors[f"t{i:02d}"] = random_tensor(rng, shape, dtype)
    target[f"t{i:02d}"] = jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "m.safetensors")
    save_file(tensors, path)
    with SafetensorsSource(path) as src:
      direct = prj.restore(target, src)
      general = prj.restore(target, src, backend=prj.JaxBackend(whole_bytes=0))
  for key, value in tensors.items():
    want = jax.device_put(value, target[key].sharding)
    assert_same_array(direct[key], want)
    assert_same_array(general[key], want)


def test_ten_thousand_tiny_tensors_are_read_in_a_few_reads(tmp_path):
  tensors = {f"e{i:05d}": np.full((8, 8), i, np.float32) for i in range(10_000)}
  save_file(tensors, str(tmp_path / "m.safetensors"))
  src = SafetensorsSource(tmp_path / "m.safetensors")
  sharding = NamedSharding(MESH, P("x", "y"))
  target = {k: jax.ShapeDtypeStruct((8, 8), np.float32, sharding=sharding) for k in tensors}
  out = prj.restore(target, src, max_inflight_bytes=64 << 10)
  # chunks of half the budget: 32 KiB = 128 tensors, each chunk one read
  assert src.stats.reads == -(-10_000 // 128)
  assert src.stats.bytes_read == 10_000 * 256
  for k in ("e00000", "e01234", "e09999"):
    assert_same_array(out[k], jax.device_put(tensors[k], sharding))


def test_direct_and_general_weights_mix_in_one_restore_in_target_order():
  w = np.arange(48, dtype=np.float32).reshape(6, 8)
  src = MemorySource({"w": w, "b": np.ones(8, np.float32), "big": np.zeros((256, 512), np.float32)})
  s = NamedSharding(MESH, P(None, "y"))
  target = {
    "a_kernel_t": jax.ShapeDtypeStruct((8, 6), np.float32, sharding=s),  # a recipe
    "b": jax.ShapeDtypeStruct((8,), np.float32, sharding=NamedSharding(MESH, P("x"))),  # direct
    "big": jax.ShapeDtypeStruct((256, 512), np.float32, sharding=s),  # above whole_bytes
    "w": jax.ShapeDtypeStruct((6, 8), np.float32, sharding=s),  # direct
  }
  out = prj.restore(target, src, recipes={"a_kernel_t": R.transpose(R.source("w"), (1, 0))})
  np.testing.assert_array_equal(out["a_kernel_t"], w.T)
  np.testing.assert_array_equal(out["w"], w)
  np.testing.assert_array_equal(out["b"], np.ones(8))
  assert out["big"].shape == (256, 512)
  for k in target:
    assert out[k].sharding == target[k].sharding


def test_small_weights_on_cpu_adopt_their_buffers_and_are_ready():
  src = MemorySource({f"t{i}": np.full((16, 16), i, np.float32) for i in range(10)})
  sharding = NamedSharding(MESH, P("x", "y"))
  target = {k: jax.ShapeDtypeStruct((16, 16), np.float32, sharding=sharding) for k in src.keys()}
  plan = prj.plan_restore(target, src)
  built = prj.JaxBackend().materialize_all(
    src,
    [
      (
        R.source(e.source_key),
        backend_lib.MaterializationContext(e.key, e.shape, e.dtype, sharding),
      )
      for e in plan.entries
    ],
  )
  assert all(m.adopted for m in built)
  assert all(m.weight.is_ready() for m in built)
  # rows of a 16x16 float32 split 4x2 are 128-byte blocks: each device holds its block as built
  for m in built:
    assert all(s.data.unsafe_buffer_pointer() % 64 == 0 for s in m.weight.addressable_shards)


def test_rows_that_are_not_a_multiple_of_64_bytes_are_padded_not_misplaced():
  # 3 x 5 float32 = 60 bytes: stacked weights would start unaligned, so each is padded to 64
  tensors = {f"t{i}": np.arange(15, dtype=np.float32).reshape(3, 5) + 100 * i for i in range(7)}
  src = MemorySource(tensors)
  one = jax.sharding.SingleDeviceSharding(jax.devices()[1])
  target = {k: jax.ShapeDtypeStruct((3, 5), np.float32, sharding=one) for k in tensors}
  out = prj.restore(target, src)
  for k, v in tensors.items():
    assert_same_array(out[k], jax.device_put(v, one))


# --- the transfer: JAX's batched transfer against the public API ----------------------------------


@pytest.mark.parametrize("spec", [*SPECS, None])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.bool_])
def test_the_batched_transfer_builds_the_array_the_public_api_builds(spec, dtype):
  shape = (8, 4)
  sharding = (
    jax.sharding.SingleDeviceSharding(jax.devices()[3])
    if spec is None
    else NamedSharding(MESH, spec)
  )
  value = random_tensor(np.random.default_rng(0), shape, dtype)
  lay = transfer.layout(sharding, shape)
  built = np.empty(lay.grid_shape, dtype)
  np.copyto(built, lay.to_grid(value))
  fast = transfer.assembler(shape, dtype, sharding)(lay.devices, lay.shards(built))
  public = transfer.public_assembler(shape, np.dtype(dtype), sharding)(
    lay.devices, lay.shards(built)
  )
  assert_same_array(fast, jax.device_put(value, sharding))
  assert_same_array(public, jax.device_put(value, sharding))


def test_the_public_transfer_is_used_when_asked(tmp_path):
  import subprocess
  import sys

  code = (
    "import paramreg_jax as prj; prj.use_cpu_devices(8)\n"
    "from paramreg_jax._src.restore.jax_backend import transfer; import numpy as np, jax\n"
    "assert transfer._TRANSFER is None\n"
    "from paramreg_jax import MemorySource\n"
    "from jax.sharding import NamedSharding, PartitionSpec as P\n"
    "s = NamedSharding(jax.make_mesh((4, 2), ('x', 'y')), P('x', 'y'))\n"
    "src = MemorySource({'w': np.arange(64, dtype=np.float32).reshape(8, 8)})\n"
    "out = prj.restore({'w': jax.ShapeDtypeStruct((8, 8), np.float32, sharding=s)}, src)\n"
    "assert (np.asarray(out['w']) == np.arange(64).reshape(8, 8)).all()\n"
    "assert out['w'].sharding == s\n"
  )
  env = {**os.environ, "PARAMREG_PUBLIC_TRANSFER": "1"}
  proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize(
  "spec, shape, grid",
  [
    (P("x", "y"), (8, 4), (4, 2)),
    (P(None, "x"), (2, 8), (1, 4)),
    (P(), (3, 5), (1, 1)),
    (P(("x", "y")), (16,), (8,)),
  ],
)
def test_layouts_of_named_shardings_are_regular_grids(spec, shape, grid):
  lay = transfer.layout(NamedSharding(MESH, spec), shape)
  assert lay.grid == grid
  value = np.arange(np.prod(shape)).reshape(shape)
  built = np.ascontiguousarray(lay.to_grid(value))
  for block, view in zip(lay.shards(built), lay.views(value)):
    np.testing.assert_array_equal(block, view)
    assert block.flags.c_contiguous


# --- read_stacked -------------------------------------------------------------------------------


@pytest.fixture
def six(tmp_path):
  tensors = {f"e{i}": np.full((2, 3), i, np.float32) for i in range(6)}
  save_file(tensors, str(tmp_path / "m.safetensors"))
  return SafetensorsSource(tmp_path / "m.safetensors")


def test_read_stacked_reads_each_run_of_adjacent_tensors_once(six):
  np.testing.assert_array_equal(six.read_stacked(["e0", "e1", "e2"])[:, 0, 0], [0, 1, 2])
  assert six.stats.reads == 1 and six.stats.bytes_read == 72
  # asked out of file order: one read per run that is adjacent in the order asked
  np.testing.assert_array_equal(six.read_stacked(["e4", "e5", "e0", "e3"])[:, 1, 2], [4, 5, 0, 3])
  assert six.stats.reads == 1 + 3


def test_read_stacked_fills_out_and_checks_it(six):
  out = np.zeros((2, 2, 3), np.float32)
  assert six.read_stacked(["e1", "e2"], out) is out
  np.testing.assert_array_equal(out[:, 0, 0], [1, 2])
  with pytest.raises(ValueError, match=r"needs a C-contiguous \(2, 2, 3\) float32 array, got"):
    six.read_stacked(["e1", "e2"], np.zeros((2, 3, 2), np.float32))


def test_read_stacked_refuses_mixed_shapes_and_no_keys():
  src = MemorySource({"a": np.zeros(2, np.float32), "b": np.zeros(3, np.float32)})
  with pytest.raises(ValueError, match=r"one shape and dtype: 'a' is \(2,\) float32, 'b' is"):
    src.read_stacked(["a", "b"])
  with pytest.raises(ValueError, match="at least one key"):
    src.read_stacked([])
  with pytest.raises(UnknownTensorError):
    src.read_stacked(["a", "nope"])


def test_read_stacked_across_the_files_of_a_sharded_checkpoint(tmp_path):
  import json

  save_file(
    {"a": np.full(4, 1, np.float32), "b": np.full(4, 2, np.float32)},
    str(tmp_path / "1.safetensors"),
  )
  save_file({"c": np.full(4, 3, np.float32)}, str(tmp_path / "2.safetensors"))
  index = {"weight_map": {"a": "1.safetensors", "b": "1.safetensors", "c": "2.safetensors"}}
  (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
  src = SafetensorsSource(tmp_path)
  np.testing.assert_array_equal(src.read_stacked(["a", "b", "c"])[:, 0], [1, 2, 3])
  assert src.stats.reads == 2  # a and b together, c from its own file
