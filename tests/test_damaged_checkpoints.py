"""Damaged, half-written or hostile checkpoints: a clear error naming the tensor, never a crash,
never a silent success, and the caller's tree untouched."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import chex
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from safetensors.numpy import save_file

import paramreg_jax as prj
from paramreg_jax import MemorySource
from paramreg_jax import OrbaxSource
from paramreg_jax import SafetensorsSource
from paramreg_jax import recipes as R
from paramreg_jax.errors import MalformedIndexError
from paramreg_jax.errors import MalformedSafetensorsError
from paramreg_jax.errors import StoreError

TENSORS = {f"w{i}": np.full((64, 32), i, np.float32) for i in range(5)}


def target():
  return {k: jnp.zeros((64, 32)) for k in TENSORS}


def untouched(tree):
  chex.assert_trees_all_equal(tree, target())


# --- safetensors: truncation while reading ---------------------------------------------------------


class TruncatingSource(SafetensorsSource):
  """Truncates its file right after the ``after``-th read, as a crashing writer would."""

  def __init__(self, path, after, keep):
    super().__init__(path)
    self.after, self.keep, self.done = after, keep, 0

  def _read(self, key, region):  # a read of one region (recipes, large tensors)
    out = super()._read(key, region)
    self._count()
    return out

  def _pread(self, f, out, offset, key):  # a read of adjacent small tensors (read_stacked)
    super()._pread(f, out, offset, key)
    self._count()

  def _count(self):
    self.done += 1
    if self.done == self.after:
      os.truncate(self.path, self.keep)


def file_order(path):
  src = SafetensorsSource(path)
  return sorted(src.keys(), key=lambda k: src._where[k].entries[k][1])


@pytest.mark.parametrize(
  "how",
  [
    {"backend": prj.JaxBackend(whole_bytes=0)},  # tensor by tensor
    {"max_inflight_bytes": 8192},  # small tensors read stacked, one per chunk
  ],
  ids=["by-region", "stacked"],
)
def test_a_file_truncated_mid_restore_names_the_tensor_that_is_cut(tmp_path, how):
  path = tmp_path / "m.safetensors"
  save_file(dict(TENSORS), str(path))
  last = file_order(path)[-1]
  tree = target()
  src = TruncatingSource(path, after=1, keep=path.stat().st_size - 100)
  with pytest.raises(prj.MaterializationError) as info:
    prj.restore(tree, src, **how)
  assert info.value.key == f"n:{last}"  # the tensor whose bytes are gone, not the batch's first
  message = str(info.value)
  assert message.startswith(f"n:{last}: ") and f"'{last}' needs bytes up to" in message
  assert "truncated after it was opened?" in message and "the target is untouched" in message
  untouched(tree)


def test_a_run_of_adjacent_tensors_cut_short_names_the_tensor_whose_bytes_are_gone(tmp_path):
  # read stacked, the five tensors are one read; when it comes up short, the error still names
  # the tensor that is cut, not the first of the run
  path = tmp_path / "m.safetensors"
  save_file(dict(TENSORS), str(path))
  last = file_order(path)[-1]
  src = SafetensorsSource(path)
  os.truncate(path, path.stat().st_size - 100)
  tree = target()
  with pytest.raises(prj.MaterializationError) as info:
    prj.restore(tree, src)
  assert info.value.key == f"n:{last}"
  assert str(info.value).startswith(f"n:{last}: ") and f"'{last}' needs bytes up to" in str(
    info.value
  )
  untouched(tree)


RACE = textwrap.dedent(
  """
  import os, sys, threading, time
  import jax, jax.numpy as jnp, numpy as np
  from safetensors.numpy import save_file
  import paramreg_jax as prj
  from paramreg_jax import SafetensorsSource

  path = sys.argv[1]
  tensors = {f"w{i}": np.full((512, 512), i, np.float32) for i in range(16)}
  outcomes = {"error": 0, "restored": 0}
  for race in range(10):
    save_file(tensors, path)
    src = SafetensorsSource(path)
    size = os.path.getsize(path)
    cut = threading.Timer(0.001 * race, os.truncate, (path, size // (race + 2)))
    cut.start()
    try:
      out = prj.restore({k: jax.ShapeDtypeStruct((512, 512), jnp.float32) for k in tensors}, src)
      assert all(np.all(np.asarray(out[k]) == i) for i, k in enumerate(tensors)), "wrong values"
      outcomes["restored"] += 1
    except prj.MaterializationError as e:
      assert "truncated" in str(e) and e.key.startswith("n:w"), e
      outcomes["error"] += 1
    cut.join()
  # and once truncated before the restore: that one must be the error
  save_file(tensors, path)
  src = SafetensorsSource(path)
  os.truncate(path, os.path.getsize(path) // 2)
  try:
    prj.restore({k: jax.ShapeDtypeStruct((512, 512), jnp.float32) for k in tensors}, src)
    outcomes["truncated first"] = "restored"
  except prj.MaterializationError as e:
    outcomes["truncated first"] = "error" if "truncated" in str(e) else str(e)
  import json
  print(json.dumps(outcomes))
  """
)


def test_truncation_racing_the_reads_is_an_error_never_a_crash(tmp_path):
  script = tmp_path / "race.py"
  script.write_text(RACE)
  r = subprocess.run(
    [sys.executable, str(script), str(tmp_path / "m.safetensors")],
    capture_output=True,
    text=True,
    timeout=300,
  )
  # a memory map read after the file shrank is SIGBUS (returncode -7): the process dies
  assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-3000:]}"
  outcomes = json.loads(r.stdout.strip().splitlines()[-1])
  assert outcomes["error"] + outcomes["restored"] == 10, outcomes  # every run: one or the other
  assert outcomes["truncated first"] == "error", outcomes


# --- orbax: paths, metadata, uncommitted steps ------------------------------------------------------


@pytest.fixture
def orbax_dir(tmp_path):
  path = tmp_path / "ckpt"
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(path, {"w": np.arange(6, dtype=np.float32)})
  ckpt.wait_until_finished()
  return path


def test_a_relative_orbax_path_opens_the_same_checkpoint(orbax_dir, monkeypatch):
  monkeypatch.chdir(orbax_dir.parent)
  src = OrbaxSource("ckpt")
  assert src.keys() == ("w",) and src.path == orbax_dir
  np.testing.assert_array_equal(src.lease("w").read(), np.arange(6))


@pytest.mark.parametrize(
  "damage, message",
  [
    (lambda p: (p / "_METADATA").unlink(), "no _METADATA file, so the saved tree is unknown"),
    (lambda p: (p / "_METADATA").write_text("{not json"), "_METADATA: not valid JSON"),
    (lambda p: (p / "_METADATA").write_text("[1, 2]"), "expected a JSON object, got list"),
  ],
)
def test_missing_or_damaged_metadata_fails_loudly(orbax_dir, damage, message):
  damage(orbax_dir)
  with pytest.raises(StoreError, match=re.escape(message)):
    OrbaxSource(orbax_dir)


def manager_root(tmp_path, steps):
  root = tmp_path / "run"
  with ocp.CheckpointManager(root, item_names=("params",)) as manager:
    for step in steps:
      manager.save(
        step,
        args=ocp.args.Composite(params=ocp.args.StandardSave({"w": np.full(3, step, np.float32)})),
      )
      manager.wait_until_finished()
  return root


def crash_during_save(root, step, committed_step):
  """What a crash while saving ``step`` leaves: the step written to a tmp name, never renamed."""
  tmp = root / f"{step}.orbax-checkpoint-tmp-1234"
  shutil.copytree(root / str(committed_step), tmp)
  return tmp


def test_only_uncommitted_steps_are_never_read(tmp_path):
  root = manager_root(tmp_path, [3])
  crash_during_save(root, 10, 3)
  shutil.rmtree(root / "3")
  assert ocp.CheckpointManager(root).all_steps() == []  # orbax sees no steps either
  with pytest.raises(
    StoreError, match=r"every step here \(10\.orbax-checkpoint-tmp-1234\) is not committed"
  ):
    OrbaxSource(root)
  with pytest.raises(StoreError, match="is not committed"):
    OrbaxSource(root / "10.orbax-checkpoint-tmp-1234" / "params")


def test_the_latest_committed_step_wins_over_a_newer_uncommitted_one(tmp_path):
  root = manager_root(tmp_path, [3])
  crash_during_save(root, 10, 3)
  src = OrbaxSource(root)
  assert src.path == root / "3" / "params"
  np.testing.assert_array_equal(src.lease("w").read(), np.full(3, 3.0))
  with pytest.raises(StoreError, match="step 10 is not committed"):
    OrbaxSource(root, step=10)


def test_object_store_steps_need_their_commit_file(tmp_path, monkeypatch):
  """On GCS orbax writes the step in place and commits it with commit_success.txt."""
  from orbax.checkpoint._src.path import gcs_utils

  root = manager_root(tmp_path, [1, 2])
  (root / "2" / "commit_success.txt").unlink(missing_ok=True)
  monkeypatch.setattr(gcs_utils, "is_gcs_path", lambda path: True)
  if not (root / "1" / "commit_success.txt").exists():
    pytest.skip("this orbax version writes no commit file for local steps")
  src = OrbaxSource(root)
  assert src.path == root / "1" / "params"


# --- orbax: a read interrupted or failing names its own parameter --------------------------------------


def saved_tensors(path):
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(path, dict(TENSORS))
  ckpt.wait_until_finished()
  return OrbaxSource(path)


def test_an_interrupted_orbax_read_names_the_tensor_being_read(tmp_path, monkeypatch):
  src = saved_tensors(tmp_path / "c")
  issue = OrbaxSource._issue

  class Interrupted:
    def result(self):
      raise KeyboardInterrupt

  def interrupt_third(self, stores, requests):
    issued = issue(self, stores, requests)
    return [(v, Interrupted() if i == 2 else f) for i, (v, f) in enumerate(issued)]

  monkeypatch.setattr(OrbaxSource, "_issue", interrupt_third)
  tree = target()
  with pytest.raises(KeyboardInterrupt) as info:
    prj.restore(tree, src)
  assert (
    "paramreg_jax: interrupted while materializing n:w2; nothing was kept" in info.value.__notes__
  )
  untouched(tree)


@pytest.mark.parametrize("damage", ["flip bytes", "truncate", "delete"])
def test_structurally_damaged_orbax_data_is_an_error_naming_a_parameter(tmp_path, damage):
  path = tmp_path / "c"
  src = saved_tensors(path)
  for f in sorted(path.rglob("d/*")):
    data = f.read_bytes()
    if damage == "flip bytes":
      f.write_bytes(data[: len(data) // 2] + b"\xff" * 64 + data[len(data) // 2 + 64 :])
    elif damage == "truncate":
      f.write_bytes(data[: len(data) // 3])
    else:
      f.unlink()
  tree = target()
  with pytest.raises(prj.MaterializationError, match=r"^n:w\d: .*the target is untouched"):
    prj.restore(tree, src)
  untouched(tree)


# --- a target JAX cannot hold fails in the plan, before any read ------------------------------------


def test_a_float64_target_without_x64_is_refused_by_the_plan():
  assert not jax.config.jax_enable_x64
  src = MemorySource({"w": np.ones(2, np.float64)})
  with pytest.raises(prj.RestorePlanError) as info:
    prj.restore({"w": jax.ShapeDtypeStruct((2,), np.float64)}, src)
  assert info.value.problems == (
    "n:w: the target is float64, but with jax_enable_x64 off JAX stores it as float32, so it "
    "could never bind; call jax.config.update('jax_enable_x64', True) first, or make the target "
    "float32 (dtype_policy='cast' converts the checkpoint)",
  )
  assert src.stats.reads == 0
  restored = prj.restore({"w": jax.ShapeDtypeStruct((2,), np.float32)}, src, dtype_policy="cast")
  assert restored["w"].dtype == np.float32


# --- a checkpoint that changes under the reader ------------------------------------------------


def test_a_file_replaced_at_the_same_path_after_validation_still_reads_what_was_validated(tmp_path):
  """A training loop saving "latest" renames a newer file over the path: a longer header moves
  every offset. The source keeps the file it validated open, so it reads the old values."""
  path = tmp_path / "latest.safetensors"
  save_file(dict(TENSORS), str(path))
  src = SafetensorsSource(path)
  newer = tmp_path / "latest.safetensors.tmp"
  save_file(
    {**{k: v + 100 for k, v in TENSORS.items()}, "a_much_longer_name_" * 8: np.ones(3, np.float32)},
    str(newer),
    metadata={"step": "2"},
  )
  os.replace(newer, path)  # atomic, as orbax and every "save latest" loop does it
  out = prj.restore(target(), src)
  for k, v in TENSORS.items():
    np.testing.assert_array_equal(np.asarray(out[k]), v, err_msg=k)
  src.close()
  with pytest.raises(StoreError, match="the source was closed"):
    src.lease("w0").read()


def test_a_file_unlinked_mid_restore_still_restores_what_was_validated(tmp_path):
  path = tmp_path / "m.safetensors"
  save_file(dict(TENSORS), str(path))

  class Unlinking(SafetensorsSource):
    def _read(self, key, region):
      if path.exists():
        path.unlink()
        os.chmod(tmp_path, 0o000)  # and the folder is no longer readable
      return super()._read(key, region)

  try:
    out = prj.restore(target(), Unlinking(path))
  finally:
    os.chmod(tmp_path, 0o755)
  for k, v in TENSORS.items():
    np.testing.assert_array_equal(np.asarray(out[k]), v, err_msg=k)


def test_zero_size_tensors_that_plan_also_materialize(tmp_path):
  path = tmp_path / "m.safetensors"
  save_file({"empty": np.zeros((0, 4), np.float32), "w": np.ones(3, np.float32)}, str(path))
  tree = {"empty": jnp.ones((0, 4)), "w": jnp.zeros(3)}
  prj.plan_restore(tree, SafetensorsSource(path))
  out = prj.restore(tree, SafetensorsSource(path))
  assert out["empty"].shape == (0, 4) and np.array_equal(out["w"], np.ones(3))
  sharded = jax.sharding.NamedSharding(
    jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2), ("a", "b")),
    jax.sharding.PartitionSpec(None, "b"),
  )
  abstract = {"empty": jax.ShapeDtypeStruct((0, 4), jnp.float32, sharding=sharded)}
  out = prj.restore(abstract, SafetensorsSource(path), recipes=R.RecipeSet({}, ignore=["w"]))
  assert out["empty"].shape == (0, 4) and out["empty"].sharding == sharded


def test_deeply_nested_json_is_a_store_error_naming_the_file(tmp_path):
  deep = "[" * 100_000 + "]" * 100_000
  header = ('{"a": ' + deep + "}").encode()
  st = tmp_path / "deep.safetensors"
  st.write_bytes(len(header).to_bytes(8, "little") + header)
  with pytest.raises(MalformedSafetensorsError, match=r"deep.safetensors: .*nested"):
    SafetensorsSource(st)
  folder = tmp_path / "sharded"
  folder.mkdir()
  (folder / "model.safetensors.index.json").write_text('{"weight_map": ' + deep + "}")
  with pytest.raises(MalformedIndexError, match=r"model\.safetensors\.index\.json"):
    SafetensorsSource(folder)
  ckpt = tmp_path / "orbax"
  saver = ocp.StandardCheckpointer()
  saver.save(ckpt, {"w": np.ones(2, np.float32)})
  saver.wait_until_finished()
  (ckpt / "_METADATA").write_text('{"tree_metadata": ' + deep + "}")
  with pytest.raises(StoreError, match="_METADATA: not valid JSON"):
    OrbaxSource(ckpt)


@pytest.mark.parametrize("name", ["x" * 5000 + ".safetensors", "a\x00b.safetensors", " "])
def test_an_index_naming_an_unusable_shard_file_is_refused(tmp_path, name):
  (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": name}}))
  with pytest.raises(MalformedIndexError, match="not a usable file name"):
    SafetensorsSource(tmp_path)


@pytest.mark.parametrize(
  "damage, what",
  [
    (lambda d: (d / "manifest.ocdbt").unlink(), "its manifest.ocdbt is missing"),
    (lambda d: (d / "manifest.ocdbt").write_bytes(b"garbage"), "OCDBT manifest or data files"),
    (lambda d: [p.unlink() for p in d.rglob("d/*")], "OCDBT manifest or data files"),
  ],
  ids=["no manifest", "corrupt manifest", "no data files"],
)
def test_a_damaged_orbax_file_is_an_error_never_an_empty_checkpoint(orbax_dir, damage, what):
  damage(orbax_dir)
  with pytest.raises(StoreError) as info:
    OrbaxSource(orbax_dir)
  message = str(info.value)
  assert "_METADATA lists 1 saved arrays, but orbax can read the metadata of 0" in message
  assert what in message and "nothing was read" in message
  r = subprocess.run(
    [sys.executable, "-m", "paramreg_jax", "inspect", str(orbax_dir), "--json"],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert r.returncode == 1 and json.loads(r.stdout)["type"] == "StoreError"


def test_steps_as_strings_and_temporary_item_directories(tmp_path):
  manager = ocp.CheckpointManager(tmp_path / "run")
  for step in (1, 2):
    manager.save(step, args=ocp.args.StandardSave({"w": np.full(2, step, np.float32)}))
  manager.wait_until_finished()
  assert OrbaxSource(tmp_path / "run", step="2").lease("w").read().tolist() == [2.0, 2.0]
  with pytest.raises(TypeError, match="step must be a non-negative int"):
    OrbaxSource(tmp_path / "run", step=1.5)
  # an item whose save did not finish is never read, beside a committed one or alone
  step = tmp_path / "run" / "2"
  shutil.copytree(step / "default", step / "other.orbax-checkpoint-tmp-5")
  assert OrbaxSource(tmp_path / "run").path == step / "default"
  (step / "default").rename(step / "default.orbax-checkpoint-tmp-6")
  with pytest.raises(StoreError, match="is not committed"):
    OrbaxSource(tmp_path / "run", step=2)


def test_a_source_left_open_at_interpreter_exit_closes_quietly(tmp_path):
  """A script that never calls ``close()`` (every notebook) exits without "Exception ignored in
  _File.__del__": at exit, finalizers may run after ``os`` is torn down."""
  path = tmp_path / "m.safetensors"
  save_file(dict(TENSORS), str(path))
  code = textwrap.dedent(f"""
    import paramreg_jax as prj
    import paramreg_jax._src.sources.safetensors as module
    src = prj.SafetensorsSource({str(path)!r})
    module._held = src  # held until the module itself is torn down, as a library cache would
  """)
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr
  assert done.stderr == "", done.stderr
