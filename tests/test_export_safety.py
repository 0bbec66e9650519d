"""Export and convert you can hand to others: no dropped update, no lost copy, library errors.

``export/staging.py`` publishes a directory atomically (``renameat2``: exchange to replace,
no-replace otherwise); ``export/driver.py`` refuses tied parameters that diverged and copies a
Hugging Face folder's companion files. Every case compares against a copy taken before the
call: the other writer's directory, the old checkpoint, the bytes written.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import threading

import hf_models as hf
import numpy as np
import orbax.checkpoint as ocp
import pytest
from abstract import sds
from safetensors.numpy import load_file
from safetensors.numpy import save_file

import paramreg_jax as prj
from paramreg_jax import SafetensorsSource
from paramreg_jax import recipes as R
from paramreg_jax._src.export import staging as staging_lib

ROOT = pathlib.Path(__file__).parent.parent


def tied(tmp_path):
  """A checkpoint with one embedding that a target reads twice (``head`` tied to ``embed``)."""
  ck = tmp_path / "ck"
  ck.mkdir()
  save_file({"wte": np.arange(12, dtype=np.float32).reshape(4, 3)}, str(ck / "model.safetensors"))
  src = SafetensorsSource(ck / "model.safetensors")
  target = {"embed": sds(4, 3), "head": sds(4, 3)}
  kwargs = dict(rename={"wte": "embed"}, aliases={"head": "embed"})
  return src, target, kwargs, prj.restore(target, src, **kwargs)


def snapshot(folder):
  return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


# --- an update is never dropped --------------------------------------------------------------------


def test_tied_parameters_that_diverged_are_refused_naming_both_and_the_fix_works(tmp_path):
  src, _, kwargs, params = tied(tmp_path)
  trained = {"embed": params["embed"] + 1, "head": params["head"] * 2}  # two leaves to optax
  with pytest.raises(prj.ExportError) as info:
    prj.export(trained, None, tmp_path / "out", source=src, **kwargs)
  text = str(info.value)
  assert "n:head and n:embed were restored tied" in text
  assert "export would drop n:head's update" in text and "exclude=['head']" in text
  assert not (tmp_path / "out").exists()
  # the suggested fix, pasted: the owner's value is written
  prj.export(trained, None, tmp_path / "out", source=src, **kwargs, exclude=["head"])
  written = load_file(tmp_path / "out" / "model.safetensors")["wte"]
  np.testing.assert_array_equal(written, np.asarray(trained["embed"]))
  # agreeing aliases are written once, as before
  prj.export(params, None, tmp_path / "same", source=src, **kwargs)
  assert list(load_file(tmp_path / "same" / "model.safetensors")) == ["wte"]


def test_a_deleted_or_donated_array_is_named(tmp_path):
  src, _, kwargs, params = tied(tmp_path)
  embed = params["embed"] + 0
  embed.delete()
  with pytest.raises(prj.ExportError, match=r"n:embed: its array was deleted \(donated"):
    prj.export({"embed": embed, "head": params["head"]}, None, tmp_path / "o", source=src, **kwargs)


# --- the old copy is never lost --------------------------------------------------------------------


def exported(tmp_path):
  src, _, kwargs, params = tied(tmp_path)
  return lambda path, **kw: prj.export(params, None, path, source=src, **kwargs, **kw)


@pytest.mark.parametrize("theirs", [{}, {"theirs.txt": b"keep me"}], ids=["empty", "full"])
def test_a_directory_that_appears_meanwhile_is_never_replaced(tmp_path, monkeypatch, theirs):
  run = exported(tmp_path)
  final = tmp_path / "out"
  commit = staging_lib.Staging.commit

  def other_writer_first(self):
    final.mkdir()  # another writer creates the destination (empty: rename(2) would replace it)
    for name, data in theirs.items():
      (final / name).write_bytes(data)
    commit(self)

  monkeypatch.setattr(staging_lib.Staging, "commit", other_writer_first)
  with pytest.raises(prj.ExportError, match="appeared while this export was being written"):
    run(final)
  assert final.is_dir() and snapshot(final) == theirs
  assert not list(tmp_path.glob(".out.tmp-*"))  # nothing of ours left behind


def test_concurrent_exports_one_wins_whole_and_the_others_are_refused(tmp_path):
  run = exported(tmp_path)
  outcomes = []

  def one():
    try:
      run(tmp_path / "out")
      outcomes.append("ok")
    except prj.ExportError as e:
      outcomes.append(str(e))

  threads = [threading.Thread(target=one) for _ in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert outcomes.count("ok") == 1, outcomes
  assert all("exists" in o or "appeared" in o for o in outcomes if o != "ok")
  assert sorted(snapshot(tmp_path / "out")) == ["model.safetensors"]


def test_overwrite_swaps_in_one_step_and_lists_what_it_removed(tmp_path):
  run = exported(tmp_path)
  final = tmp_path / "out"
  final.mkdir()
  (final / "notes.txt").write_text("old")
  plan = run(final, overwrite=True)
  assert plan.replaced == ("notes.txt",)
  assert "replaced (removed from the destination): notes.txt" in str(plan)
  assert sorted(snapshot(final)) == ["model.safetensors"]


def test_a_dangling_link_is_refused_before_anything_is_written(tmp_path, monkeypatch):
  run = exported(tmp_path)
  final = tmp_path / "out"
  final.symlink_to(tmp_path / "gone")
  written = []
  monkeypatch.setattr(staging_lib.Staging, "commit", lambda self: written.append(self))
  with pytest.raises(prj.ExportError, match=r"out is a symbolic link to .*gone, which does not"):
    run(final, overwrite=True)
  assert (
    written == [] and final.is_symlink() and sorted(os.listdir(tmp_path)) == sorted(["out", "ck"])
  )


@pytest.mark.parametrize("fallback", [False, True], ids=["renameat2", "two-renames"])
def test_overwriting_a_link_leaves_no_hidden_copy_of_it(tmp_path, monkeypatch, fallback):
  if fallback:
    monkeypatch.setattr(staging_lib, "renameat2", lambda *a: False)
  run = exported(tmp_path)
  real = tmp_path / "real"
  real.mkdir()
  (real / "notes.txt").write_text("theirs")
  final = tmp_path / "out"
  final.symlink_to(real)
  run(final, overwrite=True)
  assert final.is_dir() and not final.is_symlink()
  assert sorted(snapshot(final)) == ["model.safetensors"]
  assert snapshot(real) == {"notes.txt": b"theirs"}  # what the link pointed to is not touched
  assert sorted(os.listdir(tmp_path)) == ["ck", "out", "real"]


_KILLED_MID_REPLACE = """
import os, pathlib, signal, sys
sys.path.insert(0, {tests!r})
import numpy as np, jax
import paramreg_jax as prj
from paramreg_jax._src.export import staging
from paramreg_jax import SafetensorsSource
src = SafetensorsSource({ck!r})
params = {{"embed": np.full((4, 3), 7, np.float32)}}
if {fallback!r}:
  staging.renameat2 = lambda *a: False  # a system without renameat2: two renames
  real = os.rename
  calls = []
  def rename(a, b):
    calls.append(b)
    real(a, b)
    if len(calls) == 1:
      os.kill(os.getpid(), signal.SIGKILL)  # between the two renames
  staging.os.rename = rename
else:
  staging.shutil.rmtree = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)  # after the swap
prj.export(params, None, {out!r}, source=src, rename={{"wte": "embed"}}, overwrite=True)
"""


@pytest.mark.parametrize("fallback", [False, True], ids=["renameat2", "two-renames"])
def test_a_kill_during_a_replace_leaves_a_complete_copy_and_the_next_export_cleans_up(
  tmp_path, fallback
):
  src, _, _, params = tied(tmp_path)
  final = tmp_path / "out"
  prj.export({"embed": params["embed"]}, None, final, source=src, rename={"wte": "embed"})
  old = snapshot(final)
  script = _KILLED_MID_REPLACE.format(
    tests=str(ROOT / "tests"),
    ck=str(tmp_path / "ck" / "model.safetensors"),
    out=str(final),
    fallback=fallback,
  )
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
  assert proc.returncode == -9, proc.stderr.decode()[-2000:]
  leftovers = list(tmp_path.glob(".out.*"))
  assert leftovers  # the hidden sibling of the dead export
  if fallback:
    assert not final.exists()  # killed between the renames: the old copy is parked
    staging_lib.Staging(final, overwrite=True).abort()  # the next export (or open) recovers it
    assert snapshot(final) == old
  else:
    new = load_file(final / "model.safetensors")["wte"]
    np.testing.assert_array_equal(new, np.full((4, 3), 7, np.float32))  # the new copy, whole
    prj.export(
      {"embed": params["embed"]}, None, tmp_path / "other", source=src, rename={"wte": "embed"}
    )
    staging_lib.Staging(final, overwrite=True).abort()
  assert not list(tmp_path.glob(".out.*"))


def test_temporary_directories_of_dead_exports_are_removed_live_ones_kept(tmp_path):
  run = exported(tmp_path)
  host = staging_lib.Staging.__init__.__globals__["socket"].gethostname().replace("-", "_")
  dead = tmp_path / f".out.tmp-{host}-{2**22 + 12345}-abc"
  live = tmp_path / f".out.tmp-{host}-{os.getpid()}-def"
  for d in (dead, live):
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"x" * 1000)
  run(tmp_path / "out")
  assert not dead.exists() and live.exists()


# --- errors are the library's, with the path and the fix --------------------------------------------


def test_bad_destinations_and_arguments_are_library_errors(tmp_path):
  src, target, kwargs, params = tied(tmp_path)
  run = lambda path, **kw: prj.export(params, None, path, source=src, **kwargs, **kw)  # noqa: E731
  (tmp_path / "file").write_text("x")
  with pytest.raises(prj.ExportError, match=r"file is a file, so nothing can be written under it"):
    run(tmp_path / "file" / "out")
  with pytest.raises(prj.ExportError, match=r"cannot create its parent directory|not writable"):
    run(pathlib.Path("/proc/paramreg-test/out"))
  for bad in (0, "1", -5, True):
    with pytest.raises(prj.ExportError, match="max_shard_bytes must be a positive number of bytes"):
      run(tmp_path / "a", max_shard_bytes=bad)
  with pytest.raises(prj.ExportError, match="max_inflight_bytes must be a positive number"):
    run(tmp_path / "a", max_inflight_bytes=0)
  plan = prj.plan_restore(target, src, **kwargs)
  with pytest.raises(prj.ExportError, match="a RestorePlan already holds its source"):
    prj.export(params, plan, tmp_path / "a", source=src)
  with pytest.raises(prj.ExportError, match="pass source="):
    prj.export(params, None, tmp_path / "a", **kwargs)
  with pytest.raises(prj.ExportError, match="convert: hints are for match"):
    prj.convert(src, tmp_path / "c", target, recipes={}, hints={"embed": "wte"})
  assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists()


_CONVERT_UNDER_A_FILE = """
import sys
sys.path.insert(0, {tests!r})
import jax, numpy as np
import paramreg_jax as prj
src = prj.MemorySource({{"w": np.ones((2, 2), np.float32)}})
try:
  prj.convert(src, {out!r}, {{"w": jax.ShapeDtypeStruct((2, 2), np.float32)}})
except prj.ExportError as e:
  print("ExportError:", e)
"""


def test_convert_under_a_file_is_refused_and_the_interpreter_exits(tmp_path):
  (tmp_path / "file").write_text("x")
  script = _CONVERT_UNDER_A_FILE.format(tests=str(ROOT / "tests"), out=str(tmp_path / "file" / "c"))
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
  assert proc.returncode == 0 and b"ExportError:" in proc.stdout, proc.stderr.decode()[-2000:]
  (tmp_path / "model_def.py").write_text(
    "import jax, numpy as np\ndef abstract():\n  return {'w': jax.ShapeDtypeStruct((2, 2), np.float32)}\n"
  )
  cli = [
    sys.executable,
    "-m",
    "paramreg_jax",
    "convert",
    str(tmp_path / "file"),
    str(tmp_path / "file" / "c"),
  ]
  proc = subprocess.run(
    [*cli, "--target", "model_def:abstract", "--json"],
    capture_output=True,
    timeout=60,
    cwd=tmp_path,
  )
  assert proc.returncode != 0 and b'"ok": false' in proc.stdout, proc.stdout + proc.stderr


_CONVERT_UNDER_A_SIZE_LIMIT = """
import resource, signal, sys
import jax, numpy as np
import paramreg_jax as prj
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
src = prj.MemorySource({{"w": np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)}})
try:
  prj.convert(src, {out!r}, {{"w": jax.ShapeDtypeStruct((256, 256), np.float32)}}, overwrite=True)
except prj.ExportError as e:
  print("ExportError:", e)
"""


def test_convert_overwrite_under_a_file_size_limit_keeps_the_old_checkpoint(tmp_path):
  target = {"w": sds(8, 8)}
  final = tmp_path / "conv"
  prj.convert(prj.MemorySource({"w": np.ones((8, 8), np.float32)}), final, target)
  before = snapshot(final)
  script = _CONVERT_UNDER_A_SIZE_LIMIT.format(out=str(final))
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
  assert b"ExportError:" in proc.stdout, (proc.stdout + proc.stderr)[-3000:]
  assert b"the old one there is untouched" in proc.stdout
  assert snapshot(final) == before
  assert sorted(os.listdir(tmp_path)) == ["conv"]  # orbax's own staging removed too
  restored = ocp.StandardCheckpointer().restore(final, target)
  np.testing.assert_array_equal(restored["w"], np.ones((8, 8), np.float32))


# --- a folder others can load ------------------------------------------------------------------


def test_companion_files_are_copied_as_they_are(tmp_path):
  folder = tmp_path / "llama"
  folder.mkdir()
  for name in ("model.safetensors", "config.json"):
    (folder / name).write_bytes((hf.DATA / "llama" / name).read_bytes())
  companions = {
    "generation_config.json": b'{"do_sample": false, "max_length": 20}\n',
    "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}',
    "tokenizer_config.json": b'{"model_max_length": 64}',
    "special_tokens_map.json": b'{"bos_token": "<s>"}',
    "chat_template.jinja": b"{% for m in messages %}{{ m.content }}{% endfor %}",
  }
  for name, data in companions.items():
    (folder / name).write_bytes(data)
  src = SafetensorsSource(folder)
  arch, sizes, _, _ = hf.case("llama")
  target = hf.target(
    hf.STYLES["nnx"], hf.with_head(hf.canonical_shapes(arch, sizes), arch, sizes), arch, sizes
  )
  m = prj.match(target, src)
  plan = prj.export(prj.restore(target, src, recipes=m), m, tmp_path / "out")
  assert set(plan.companions) == set(companions)
  for name, data in companions.items():
    assert (tmp_path / "out" / name).read_bytes() == data
  assert "copied beside the weights: generation_config.json" in str(plan)


def test_a_recipe_tied_head_that_diverged_gets_advice_that_can_be_followed(tmp_path):
  """A transposed tied head (``lm_head`` = embed.T) is a recipe reading the embedding again;
  after training the two write one tensor and differ: the refusal's fix is exclude=."""
  ck = tmp_path / "ck"
  ck.mkdir()
  save_file({"wte": np.arange(12, dtype=np.float32).reshape(4, 3)}, str(ck / "model.safetensors"))
  src = SafetensorsSource(ck / "model.safetensors")
  recipes = {"embed": R.source("wte"), "lm_head": R.transpose(R.source("wte"), (1, 0))}
  target = {"embed": sds(4, 3), "lm_head": sds(3, 4)}
  params = prj.restore(target, src, recipes=recipes)
  trained = {"embed": params["embed"] + 1, "lm_head": params["lm_head"]}
  with pytest.raises(prj.ExportError) as info:
    prj.export(trained, recipes, tmp_path / "out", source=src)
  text = str(info.value)
  assert "n:embed and n:lm_head both write it and their values differ" in text
  assert "exclude=['lm_head']" in text
  prj.export(trained, recipes, tmp_path / "out", source=src, exclude=["lm_head"])
  np.testing.assert_array_equal(
    load_file(tmp_path / "out" / "model.safetensors")["wte"], np.asarray(trained["embed"])
  )
