"""A source written outside the package, implementing only the three documented methods
(``keys``, ``metadata``, ``read``), restores sharded through recipes, is matched and exported
like a built-in one. Its code is the how-to's (docs/howto/own_source.md), run here."""

import pathlib
import re

import jax
import numpy as np
import pytest
from runtime_only import page_code
from safetensors.numpy import load_file

import paramreg_jax as prj
from paramreg_jax import recipes as R
from paramreg_jax._src.sources import host_memory
from paramreg_jax.sources import CheckpointSource
from paramreg_jax.sources import TensorMetadata

PAGE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "howto" / "own_source.md"


@pytest.fixture(scope="module")
def page():
  """The how-to's namespace after its code ran (it restores and asserts by value itself)."""
  namespace: dict = {"__name__": "own_source_page"}
  exec(compile(page_code(PAGE), str(PAGE), "exec"), namespace)
  return namespace


def test_the_how_to_restores_every_weight_by_value_sharded(page):
  stored, params, target = page["stored"], page["params"], page["target"]
  qkv = stored["attn.qkv.weight"]
  want = {
    "embed": stored["embed.weight"],
    "attn": {
      "q": qkv[:16].T,
      "k": qkv[16:32].T,
      "v": qkv[32:].T,
      "out": stored["attn.out.weight"].T,
    },
  }
  leaves = jax.tree_util.tree_leaves_with_path(params)
  assert len(leaves) == 5
  for path, leaf in leaves:
    expected = want
    for p in path:
      expected = expected[p.key]
    np.testing.assert_array_equal(np.asarray(leaf), expected, err_msg=jax.tree_util.keystr(path))
    assert leaf.sharding == target_leaf(target, path).sharding
    assert len(leaf.sharding.device_set) == 8
    assert {s.data.shape for s in leaf.addressable_shards} == {(leaf.shape[0], 8)}


def target_leaf(target, path):
  for p in path:
    target = target[p.key]
  return target


def test_the_how_to_source_reads_every_stored_byte_once(page):
  src = page["NpyFolder"](page["folder"])
  prj.restore(page["target"], src, recipes=page["recipes"])
  total = sum(v.nbytes for v in page["stored"].values())
  assert src.stats == prj.sources.SourceStats(reads=5, bytes_read=total)


def test_without_its_storage_box_the_defaults_still_restore_exactly(page):
  class Plain(page["NpyFolder"]):
    storage_box = CheckpointSource.storage_box  # the default: any box as it is

  fresh = prj.restore(page["target"], Plain(page["folder"]), recipes=page["recipes"])
  for a, b in zip(jax.tree.leaves(fresh), jax.tree.leaves(page["params"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_read_of_the_wrong_box_refuses_the_whole_restore(page):
  target, recipes = page["target"], page["recipes"]
  calls = []

  class LateOffByOne(page["NpyFolder"]):
    def read(self, key, index):
      calls.append(key)
      out = self.arrays[key][index]
      return out[1:] if key == "attn.out.weight" else out

  with pytest.raises(prj.MaterializationError) as info:
    prj.restore(target, LateOffByOne(page["folder"]), recipes=recipes)
  assert str(info.value) == (
    "n:attn/out: attn.out.weight: LateOffByOne.read('attn.out.weight', (slice(0, 16, None), "
    "slice(0, 16, None))) returned (15, 16) float32, expected (16, 16) float32 (that box of "
    "the stored (16, 16) float32 tensor); read(key, index) must return the stored values at "
    "index, as metadata(key) describes them; nothing was kept, the target is untouched"
  )
  assert "attn.out.weight" in calls


def test_a_read_of_the_wrong_dtype_is_refused(page):
  class Doubles(page["NpyFolder"]):
    def read(self, key, index):
      return self.arrays[key][index].astype(np.float64)

  with pytest.raises(prj.MaterializationError, match=r"returned \(32, 16\) float64, expected"):
    prj.restore(page["target"], Doubles(page["folder"]), recipes=page["recipes"])


def test_an_unknown_key_names_the_nearest(page):
  src = page["NpyFolder"](page["folder"])
  with pytest.raises(prj.errors.UnknownTensorError, match=re.escape("did you mean 'embed.weight'")):
    src.metadata("embed.weights")


class Arrays(CheckpointSource):
  """The smallest source: a dict of arrays, nothing but the three methods (no __init__ of the
  base called, no storage_box)."""

  def __init__(self, arrays, config=None):
    self.arrays = arrays
    self._config = config

  def keys(self):
    return tuple(sorted(self.arrays))

  def metadata(self, key):
    return TensorMetadata(self.arrays[key].shape, self.arrays[key].dtype)

  def read(self, key, index):
    return self.arrays[key][index]

  @property
  def config(self):
    return self._config


def _llama_like():
  rng = np.random.default_rng(1)
  arrays = {
    "model.embed_tokens.weight": rng.normal(size=(32, 8)).astype(np.float32),
    "model.layers.0.self_attn.q_proj.weight": rng.normal(size=(8, 8)).astype(np.float32),
    "model.layers.0.mlp.up_proj.weight": rng.normal(size=(24, 8)).astype(np.float32),
    "model.norm.weight": rng.normal(size=(8,)).astype(np.float32),
  }
  sds = lambda *s: jax.ShapeDtypeStruct(s, np.float32)  # noqa: E731
  target = {
    "embed": {"embedding": sds(32, 8)},
    "layers_0": {"attn": {"q": {"kernel": sds(8, 8)}}, "mlp": {"up": {"kernel": sds(8, 24)}}},
    "final_norm": {"scale": sds(8)},
  }
  return arrays, target


def test_match_and_load_read_a_source_of_ones_own():
  arrays, target = _llama_like()
  src = Arrays(arrays)
  mapping = prj.match(target, src)
  params = prj.restore(target, src, recipes=mapping)
  np.testing.assert_array_equal(
    params["layers_0"]["mlp"]["up"]["kernel"], arrays["model.layers.0.mlp.up_proj.weight"].T
  )
  np.testing.assert_array_equal(params["final_norm"]["scale"], arrays["model.norm.weight"])


def test_export_writes_back_through_a_source_of_ones_own(tmp_path):
  arrays, target = _llama_like()
  src = Arrays(arrays)
  recipes = {
    "embed/embedding": R.source("model.embed_tokens.weight"),
    "layers_0/attn/q/kernel": R.transpose(
      R.source("model.layers.0.self_attn.q_proj.weight"), (1, 0)
    ),
    "layers_0/mlp/up/kernel": R.transpose(R.source("model.layers.0.mlp.up_proj.weight"), (1, 0)),
    "final_norm/scale": R.source("model.norm.weight"),
  }
  params = prj.restore(target, src, recipes=recipes)
  prj.export(jax.tree.map(lambda w: w + 1, params), recipes, tmp_path / "out", source=src)
  written = load_file(tmp_path / "out" / "model.safetensors")
  assert sorted(written) == sorted(arrays)
  for key, value in arrays.items():
    np.testing.assert_array_equal(written[key], value + 1, err_msg=key)


@pytest.mark.parametrize("dtype", [np.float32, jax.numpy.bfloat16])
def test_restored_weights_never_share_memory_with_what_read_returned(dtype):
  """``read`` may hand out views of the source's own memory: restoring (casts included) leaves
  them as they were, and changing them afterwards changes no restored weight."""
  arrays, target = _llama_like()
  for k, v in arrays.items():  # 64-byte aligned, as device_put adopts without a copy
    arrays[k] = host_memory.read_into_aligned(v, v.dtype)
  before = {k: v.copy() for k, v in arrays.items()}
  target = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, dtype), target)
  src = Arrays(arrays)
  params = prj.restore(target, src, recipes=prj.match(target, src), dtype_policy="cast")
  for key, value in arrays.items():
    np.testing.assert_array_equal(value, before[key], err_msg=key)
    value += 1  # the source's memory changes after the restore
  np.testing.assert_array_equal(
    params["final_norm"]["scale"], before["model.norm.weight"].astype(dtype)
  )
  np.testing.assert_array_equal(
    params["embed"]["embedding"], before["model.embed_tokens.weight"].astype(dtype)
  )


@pytest.mark.parametrize("sharded", [False, True])
def test_a_large_weight_never_shares_memory_with_what_read_returned(sharded):
  """Past the small-tensor path (256 KiB) a read box can be a whole shard, handed to the
  device as it is: it must be the engine's copy, not the source's memory."""
  big = host_memory.read_into_aligned(
    np.arange(512 * 256, dtype=np.float32).reshape(512, 256), np.float32
  )
  before = big.copy()
  sharding = None
  if sharded:
    mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x", None))
  target = {"big": jax.ShapeDtypeStruct(big.shape, np.float32, sharding=sharding)}
  params = prj.restore(target, Arrays({"big": big}), recipes={"big": R.source("big")})
  big += 1
  np.testing.assert_array_equal(params["big"], before)


def test_a_source_of_ones_own_is_named_in_reports():
  arrays, target = _llama_like()
  mapping = prj.match(target, Arrays(arrays))
  assert str(mapping).startswith("Match: 4 parameters from Arrays(4 tensors)\n")
