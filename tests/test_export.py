"""``export``: parameters back into the checkpoint's own layout, bit for bit, or refused.

The round trips use the ``match`` suite's checkpoints (tests/data/hf, saved by transformers):
checkpoint -> ``match`` -> ``restore`` -> ``export`` must reproduce every original tensor byte
for byte (names, shapes, dtypes, values), and fine-tuned parameters must come back as they
were when the export is restored again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import hf_models as hf
import jax
import numpy as np
import pytest
import test_match_t5 as t5
import test_match_whisper as whisper
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from safetensors import safe_open
from safetensors.numpy import load_file
from safetensors.numpy import save_file

import paramreg_jax as prj
from paramreg_jax import MemorySource
from paramreg_jax import Range
from paramreg_jax import SafetensorsSource
from paramreg_jax import recipes as R


def case_target(name, style_name):
  arch, sizes, config, _ = hf.case(name)
  shapes = hf.canonical_shapes(arch, sizes)
  if arch.head and not config.get("tie_word_embeddings", True):
    shapes = hf.with_head(shapes, arch, sizes)
  return hf.target(hf.STYLES[style_name], shapes, arch, sizes)


def assert_same_tensors(original, exported):
  a, b = load_file(original), load_file(exported)
  assert sorted(a) == sorted(b)
  for k in a:
    assert (a[k].dtype, a[k].shape) == (b[k].dtype, b[k].shape), k
    assert a[k].tobytes() == b[k].tobytes(), k


@pytest.mark.parametrize("style", sorted(hf.STYLES))
@pytest.mark.parametrize("name", sorted(hf.ARCHS))
def test_checkpoint_match_restore_export_is_bit_exact(name, style, tmp_path):
  path = hf.DATA / name / "model.safetensors"
  src = SafetensorsSource(path)
  target = case_target(name, style)
  m = prj.match(target, src)
  restored = prj.restore(target, src, recipes=m)
  plan = prj.export(restored, m, tmp_path / "out")
  assert_same_tensors(path, tmp_path / "out" / "model.safetensors")
  # only what no parameter reads is copied: everything else went through the parameters
  assert {t.key for t in plan.tensors if t.copied} == set(m.ignored_keys)
  with safe_open(str(tmp_path / "out" / "model.safetensors"), "np") as f:
    assert f.metadata() == {"format": "pt"}
  config = json.loads((hf.DATA / name / "config.json").read_text())
  assert json.loads((tmp_path / "out" / "config.json").read_text()) == config


@pytest.mark.parametrize("stacked", [False, True], ids=["flax", "nnx"])
@pytest.mark.parametrize("module, name", [(t5, "t5"), (t5, "t5_gated"), (whisper, "whisper")])
def test_encoder_decoders_round_trip_bit_exact(module, name, stacked, tmp_path):
  c = json.loads((hf.DATA / name / "config.json").read_text())
  path = hf.DATA / name / "model.safetensors"
  src = SafetensorsSource(path)
  tree = module.target(c, stacked)
  m = prj.match(tree, src)
  prj.export(prj.restore(tree, src, recipes=m), m, tmp_path / "out")
  assert_same_tensors(path, tmp_path / "out" / "model.safetensors")


def noisy(tree, seed=0):
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: x + rng.standard_normal(x.shape).astype(x.dtype), tree)


@pytest.mark.parametrize(
  "name, style",
  [
    ("gpt2", "nnx"),  # Conv1D, contiguous fused c_attn, tied head
    ("gpt_neox", "flax"),  # fused qkv per head (gathered rows), embed_out head
    ("falcon_grouped", "nnx"),  # fused qkv per kv group
    ("mixtral", "nnx"),  # per-expert tensors stacked into [L, E, ...]
    ("phi3", "meta"),  # fused qkv and gate_up
    ("vit", "flax"),  # conv kernel OIHW -> HWIO
  ],
)
def test_fine_tuned_params_from_a_sharded_tree_come_back_exactly(name, style, tmp_path, devices):
  """Changed values on a (4, 2) mesh: export, then restore the export through a new ``match``."""
  src = SafetensorsSource(hf.DATA / name / "model.safetensors")
  target = case_target(name, style)
  m = prj.match(target, src)
  mesh = jax.make_mesh((4, 2), ("data", "model"))

  def shard(x):
    spec = [None] * x.ndim
    for axis in range(x.ndim - 1, -1, -1):
      if x.shape[axis] % 2 == 0:
        spec[axis] = "model"
        break
    if x.ndim >= 2 and x.shape[0] % 4 == 0 and spec[0] is None:
      spec[0] = "data"
    return jax.device_put(x, NamedSharding(mesh, P(*spec)))

  tuned = jax.tree.map(shard, noisy(prj.restore(target, src, recipes=m)))
  prj.export(tuned, m, tmp_path / "out", max_inflight_bytes=1024)
  again = SafetensorsSource(tmp_path / "out")
  back = prj.restore(target, again, recipes=prj.match(target, again))
  jax.tree.map(
    lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
    jax.tree.map(np.asarray, tuned),
    back,
  )


def test_a_tied_weight_is_written_once_from_its_owner(tmp_path):
  src = MemorySource({"wte": np.ones((4, 2), np.float32)})
  target = {n: jax.ShapeDtypeStruct((4, 2), np.float32) for n in ("embed", "head")}
  plan = prj.plan_restore(target, src, rename={"wte": "embed"}, aliases={"head": "embed"})
  params = prj.bind(target, prj.materialize(plan))
  params = {"embed": params["embed"] * 3, "head": params["head"] * 3}
  written = prj.export(params, plan, tmp_path / "out")
  assert [t.key for t in written.tensors] == ["wte"]
  np.testing.assert_array_equal(load_file(tmp_path / "out" / "model.safetensors")["wte"], 3)


def test_shards_and_the_index_are_what_transformers_writes(tmp_path):
  tensors = {f"layers.{i}.weight": np.full((64, 32), i, np.float32) for i in range(10)}
  save_file(tensors, tmp_path / "src.safetensors")
  src = SafetensorsSource(tmp_path / "src.safetensors")
  target = {
    "layers": {str(i): {"weight": jax.ShapeDtypeStruct((32, 64), np.float32)} for i in range(10)}
  }
  recipes = {k.replace(".", "/"): R.transpose(R.source(k), (1, 0)) for k in tensors}
  params = prj.restore(target, src, recipes=recipes)
  prj.export(params, recipes, tmp_path / "out", source=src, max_shard_bytes=3 * 64 * 32 * 4)
  files = sorted(p.name for p in (tmp_path / "out").iterdir())
  assert files == [
    *(f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5)),
    "model.safetensors.index.json",
  ]
  index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
  assert index["metadata"]["total_size"] == 10 * 64 * 32 * 4
  assert index["weight_map"]["layers.9.weight"] == "model-00004-of-00004.safetensors"
  again = SafetensorsSource(tmp_path / "out" / "model.safetensors.index.json")
  for k, v in tensors.items():
    np.testing.assert_array_equal(again.lease(k).read(), v)


def test_tensors_no_parameter_reads_are_copied_or_left_out(tmp_path):
  src = MemorySource(
    {"w": np.ones((2, 2), np.float32), "inv_freq": np.arange(3.0, dtype=np.float32)}
  )
  target = {"w": jax.ShapeDtypeStruct((2, 2), np.float32)}
  params = prj.restore(target, src, exclude=["inv_freq"])
  plan = prj.export(params, None, tmp_path / "a", source=src, exclude=["inv_freq"])
  assert [(t.key, t.copied) for t in plan.tensors] == [("inv_freq", True), ("w", False)]
  assert sorted(load_file(tmp_path / "a" / "model.safetensors")) == ["inv_freq", "w"]
  plan = prj.export(
    params, None, tmp_path / "b", source=src, exclude=["inv_freq"], copy_unmapped=False
  )
  assert plan.skipped == ("inv_freq",)
  assert sorted(load_file(tmp_path / "b" / "model.safetensors")) == ["w"]


# --- refusals, before anything is written -------------------------------------------------------


def test_a_tensor_kept_only_in_part_is_refused_naming_it(tmp_path):
  src = MemorySource({"qkv": np.zeros((6, 2), np.float32)})
  target = {n: jax.ShapeDtypeStruct((2, 2), np.float32) for n in "qk"}
  split = R.fused_split("qkv", 0, {"q": 2, "k": 2, "v": 2})
  recipes = {"q": split["q"], "k": split["k"]}
  params = prj.restore(target, src, recipes=recipes)
  with pytest.raises(prj.errors.ExportPlanError) as e:
    prj.export(params, recipes, tmp_path / "out", source=src)
  assert e.value.problems == (
    "checkpoint tensor 'qkv' (6, 2): rows 4:6 of axis 0 come from no parameter (the restore "
    "kept only part of it), so it cannot be rebuilt; map every part to a parameter, or export "
    "with copy_unmapped=False and drop it from the mapping",
  )
  assert not (tmp_path / "out").exists()
  assert list(tmp_path.iterdir()) == []  # no temporary directory either


def test_a_selection_below_a_reshape_is_refused_naming_the_parameter(tmp_path):
  src = MemorySource({"w": np.zeros((4, 4), np.float32), "v": np.zeros((2, 8), np.float32)})
  target = {
    "a": jax.ShapeDtypeStruct((8,), np.float32),
    "b": jax.ShapeDtypeStruct((8,), np.float32),
    "v": jax.ShapeDtypeStruct((2, 8), np.float32),
  }
  recipes = {
    "a": R.reshape(R.source("w", Range(0, 0, 2)), (8,)),
    "b": R.select(R.reshape(R.source("w"), (16,)), Range(0, 8, 16)),
  }
  params = prj.restore(target, src, recipes=recipes)
  with pytest.raises(prj.errors.ExportPlanError) as e:
    prj.export(params, recipes, tmp_path / "out", source=src)
  assert e.value.problems[0] == (
    "n:b: reshape(source('w'), (16,)): a select above it keeps part of its output, and part of "
    "a reshape has no place in the stored tensor (select the stored tensor before reshaping or "
    "joining instead); it cannot be written back to the checkpoint's layout"
  )
  assert e.value.problems[1].startswith("checkpoint tensor 'w' (4, 4): rows 2:4 of axis 0 come")


def test_two_parameters_that_disagree_about_one_tensor_are_refused(tmp_path):
  src = MemorySource({"w": np.ones((2, 2), np.float32)})
  target = {n: jax.ShapeDtypeStruct((2, 2), np.float32) for n in "ab"}
  recipes = {"a": R.source("w"), "b": R.source("w")}
  params = prj.restore(target, src, recipes=recipes)
  prj.export(params, recipes, tmp_path / "same", source=src)  # equal values: written once
  params = {"a": params["a"], "b": params["b"] + 1}
  with pytest.raises(prj.ExportError, match="n:a and n:b both write it and their values differ"):
    prj.export(params, recipes, tmp_path / "out", source=src)
  assert not (tmp_path / "out").exists()
  assert sorted(p.name for p in tmp_path.iterdir()) == ["same"]


def test_params_that_do_not_fit_the_mapping_are_refused_all_at_once(tmp_path):
  src = MemorySource({"w": np.ones((2, 2), np.float32), "b": np.ones(2, np.float32)})
  target = {
    "w": jax.ShapeDtypeStruct((2, 2), np.float32),
    "b": jax.ShapeDtypeStruct((2,), np.float32),
  }
  plan = prj.plan_restore(target, src)
  with pytest.raises(prj.ExportError) as e:
    prj.export({"w": np.ones((3, 2), np.float32)}, plan, tmp_path / "out")
  message = str(e.value)
  assert "n:b: the mapping writes it, but params has no such parameter" in message
  assert "n:w: params has (3, 2) float32, the mapping was planned for (2, 2) float32" in message


def test_an_existing_directory_is_replaced_only_when_asked(tmp_path):
  src = MemorySource({"w": np.ones((2, 2), np.float32)})
  target = {"w": jax.ShapeDtypeStruct((2, 2), np.float32)}
  plan = prj.plan_restore(target, src)
  (tmp_path / "out").mkdir()
  (tmp_path / "out" / "old.txt").write_text("x")
  with pytest.raises(
    prj.ExportError, match=r"already exists; export writes a new directory \(overwrite=True"
  ):
    prj.export({"w": np.zeros((2, 2), np.float32)}, plan, tmp_path / "out")
  prj.export({"w": np.zeros((2, 2), np.float32)}, plan, tmp_path / "out", overwrite=True)
  assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["model.safetensors"]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_killed_export_leaves_nothing_under_the_final_name(tmp_path):
  """The process dies (SIGKILL) while the second shard is being written."""
  script = textwrap.dedent(f"""
    import os, signal, numpy as np, jax
    import paramreg_jax as prj
    from paramreg_jax._src.export import driver as export_lib
    src = prj.MemorySource({{f"w{{i}}": np.full((256, 256), i, np.float32) for i in range(8)}})
    target = {{f"w{{i}}": jax.ShapeDtypeStruct((256, 256), np.float32) for i in range(8)}}
    plan = prj.plan_restore(target, src)
    params = prj.bind(target, prj.materialize(plan))
    real, calls = export_lib.write_tensor, []
    def dying(*args):
      calls.append(1)
      if len(calls) == 3:
        os.kill(os.getpid(), signal.SIGKILL)
      return real(*args)
    export_lib.write_tensor = dying
    prj.export(params, plan, {str(tmp_path / "out")!r}, max_shard_bytes=2 * 256 * 256 * 4)
  """)
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
  assert done.returncode == -9, done.stderr
  assert not (tmp_path / "out").exists()
  leftovers = [p.name for p in tmp_path.iterdir()]
  assert len(leftovers) == 1 and leftovers[0].startswith(".out.tmp-")  # never a final name


def test_an_interrupted_export_cleans_up(tmp_path, monkeypatch):
  from paramreg_jax._src.export import driver as export_lib

  src = MemorySource({f"w{i}": np.ones((4, 4), np.float32) for i in range(3)})
  target = {f"w{i}": jax.ShapeDtypeStruct((4, 4), np.float32) for i in range(3)}
  plan = prj.plan_restore(target, src)
  params = prj.bind(target, prj.materialize(plan))

  def interrupted(*args):
    raise KeyboardInterrupt

  monkeypatch.setattr(export_lib, "write_tensor", interrupted)
  with pytest.raises(KeyboardInterrupt):
    prj.export(params, plan, tmp_path / "out")
  assert list(tmp_path.iterdir()) == []


# --- what the rest of the world loads -----------------------------------------------------------


def test_the_export_loads_with_safe_open_with_the_tuned_values(tmp_path):
  """The files as the safetensors package reads them. (transformers loading and generating
  from an export is checked by ``python tests/make_hf_fixtures.py --check-export``, where torch
  and transformers are installed; the suite has neither.)"""
  name = "llama"
  path = hf.DATA / name / "model.safetensors"
  src = SafetensorsSource(path)
  target = case_target(name, "nnx")
  m = prj.match(target, src)
  tuned = noisy(prj.restore(target, src, recipes=m), seed=1)
  prj.export(tuned, m, tmp_path / "out")
  with safe_open(str(tmp_path / "out" / "model.safetensors"), "np") as f:
    names = set(f.keys())
    q = f.get_tensor("model.layers.0.self_attn.q_proj.weight")
  assert names == set(load_file(path))
  want = np.asarray(tuned["layers"]["attn"]["q"]["kernel"][0])  # [in, heads, head_dim]
  np.testing.assert_array_equal(q, want.reshape(want.shape[0], -1).T)


def test_export_plan_reads_nothing_and_prints_what_goes_where():
  src = MemorySource({"qkv.weight": np.zeros((6, 2), np.float32)})
  target = {n: jax.ShapeDtypeStruct((2, 2), np.float32) for n in "qkv"}
  split = R.fused_split("qkv.weight", 0, {"q": 2, "k": 2, "v": 2})
  plan = prj.plan_export(
    prj.plan_restore(target, src, recipes={n: R.transpose(split[n], (1, 0)) for n in "qkv"})
  )
  assert src.stats.reads == 0
  assert str(plan) == (
    "ExportPlan: 1 tensors (0.00 MiB) from 3 parameters, 0 copied from the source\n"
    "  qkv.weight  (6, 2)  float32\n"  # too wide for one line: where from goes under it
    "    <- n:k  transpose (1, 0), -> 2:4 on axis 0; n:q  transpose (1, 0), -> 0:2 on axis 0;\n"
    "       n:v  transpose (1, 0), -> 4:6 on axis 0"
  )
  assert max(len(line) for line in str(plan).splitlines()) <= 88
  assert "<table" in plan._repr_html_()


def test_no_temporary_directory_survives_a_successful_export(tmp_path):
  src = MemorySource({"w": np.ones((2, 2), np.float32)})
  plan = prj.plan_restore({"w": jax.ShapeDtypeStruct((2, 2), np.float32)}, src)
  prj.export({"w": np.ones((2, 2), np.float32)}, plan, tmp_path / "out")
  assert [p.name for p in tmp_path.iterdir()] == ["out"]
  assert os.listdir(tmp_path / "out") == ["model.safetensors"]


# --- convert: the recipes once, then plain orbax -------------------------------------------------


def test_convert_then_a_plain_orbax_restore_gives_the_recipe_restore(tmp_path, devices):
  import orbax.checkpoint as ocp

  src = SafetensorsSource(hf.DATA / "gpt_neox" / "model.safetensors")
  mesh = jax.make_mesh((4, 2), ("data", "model"))
  cols = NamedSharding(mesh, P(*([None] * 1), "model"))
  target = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=cols if x.ndim == 2 and x.shape[1] % 2 == 0 else None
    ),
    case_target("gpt_neox", "flax"),
  )
  by_recipes = prj.restore(target, src, recipes=prj.match(target, src))
  plan = prj.convert(src, tmp_path / "orbax", target)
  plain = ocp.StandardCheckpointer().restore(tmp_path / "orbax", target)
  jax.tree.map(
    lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), by_recipes, plain
  )
  jax.tree.map(lambda a, b: a.sharding == b.sharding or pytest.fail("sharding"), by_recipes, plain)
  # and back: the converted checkpoint exported in the original layout, bit for bit
  prj.export(plain, plan, tmp_path / "hf")
  assert_same_tensors(
    hf.DATA / "gpt_neox" / "model.safetensors", tmp_path / "hf" / "model.safetensors"
  )
  with pytest.raises(prj.ExportError, match="already exists"):
    prj.convert(src, tmp_path / "orbax", target)


def test_the_command_line_converts_and_exports(tmp_path, monkeypatch, capsys):
  from paramreg_jax._src import cli

  (tmp_path / "model_def.py").write_text(
    "import test_export\ndef abstract():\n  return test_export.case_target('phi3', 'nnx')\n"
  )
  monkeypatch.chdir(tmp_path)
  original = hf.DATA / "phi3"
  assert cli.main(["convert", str(original), "conv", "--target", "model_def:abstract"]) == 0
  assert "wrote an orbax checkpoint of" in capsys.readouterr().out
  code = cli.main(
    ["export", "conv", "back", "--like", str(original), "--target", "model_def:abstract", "--json"]
  )
  out = json.loads(capsys.readouterr().out)
  assert code == 0 and out["ok"] and out["files"] == ["config.json", "model.safetensors"]
  assert out["companions"] == [] and out["replaced"] == []
  assert_same_tensors(original / "model.safetensors", tmp_path / "back" / "model.safetensors")
  code = cli.main(
    ["export", "conv", "back", "--like", str(original), "--target", "model_def:abstract", "--json"]
  )
  out = json.loads(capsys.readouterr().out)
  assert code == 1 and out["type"] == "ExportError" and "--overwrite" in out["error"]
  code = cli.main(
    [
      *["export", "conv", "back", "--like", str(original)],
      "--target",
      "model_def:abstract",
      "--json",
      "--overwrite",
    ]
  )
  out = json.loads(capsys.readouterr().out)
  assert code == 0 and out["replaced"] == ["config.json", "model.safetensors"]


# --- every op backwards, against the forward recipe (property: export(restore(x)) == x) --------


def _round_trip(tmp_path, tensors, target, recipes, **kwargs):
  src = MemorySource(tensors)
  params = prj.restore(target, src, recipes=recipes, **kwargs)
  out = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
  prj.export(params, recipes, out, source=src, **kwargs)
  back = load_file(out / "model.safetensors")
  assert sorted(back) == sorted(tensors)
  for k, v in tensors.items():
    assert back[k].dtype == v.dtype and back[k].tobytes() == v.tobytes(), k
  return params


def test_casts_views_and_value_transforms_invert(tmp_path):
  import ml_dtypes

  rng = np.random.default_rng(3)
  bf16 = rng.standard_normal((4, 6)).astype(ml_dtypes.bfloat16)
  a_log = np.log(rng.uniform(0.5, 2.0, (8,))).astype(np.float32)
  raw = rng.integers(0, 255, (4, 8), dtype=np.uint8)
  tensors = {"w_bf16": bf16, "neg": -np.exp(a_log).astype(np.float32), "raw": raw}
  target = {
    "w": jax.ShapeDtypeStruct((6, 4), np.float32),
    "a_log": jax.ShapeDtypeStruct((8,), np.float32),
    "bits": jax.ShapeDtypeStruct((4, 2), np.float32),
  }
  recipes = {
    "w": R.transpose(R.cast(R.source("w_bf16"), np.float32), (1, 0)),  # bf16 -> f32 -> back
    "a_log": R.neg_log(R.source("neg")),  # Mamba's A_log: -exp inverts it
    "bits": R.view(R.source("raw"), np.float32, (4, 2)),
  }
  src = MemorySource(tensors)
  params = prj.restore(target, src, recipes=recipes)
  prj.export(params, recipes, tmp_path / "out", source=src)
  back = load_file(tmp_path / "out" / "model.safetensors")
  assert back["w_bf16"].dtype == ml_dtypes.bfloat16 and back["w_bf16"].tobytes() == bf16.tobytes()
  assert back["raw"].tobytes() == raw.tobytes()
  np.testing.assert_allclose(back["neg"], tensors["neg"], rtol=1e-6)  # exp(log(x)): rounding


def test_selections_of_selections_and_gathers_compose(tmp_path):
  w = np.arange(12 * 6, dtype=np.float32).reshape(12, 6)
  order = (5, 1, 3, 0, 4, 2)
  recipes = {
    # rows 0:6 of the tensor, gathered out of order and split between two parameters
    "a": R.select(R.source("w", prj.Range(0, 0, 6)), prj.Indices(0, order[:2])),
    "b": R.select(R.source("w", prj.Range(0, 0, 6)), prj.Indices(0, order[2:])),
    # rows 6:12, transposed
    "c": R.transpose(R.source("w", prj.Range(0, 6, 12)), (1, 0)),
  }
  target = {
    "a": jax.ShapeDtypeStruct((2, 6), np.float32),
    "b": jax.ShapeDtypeStruct((4, 6), np.float32),
    "c": jax.ShapeDtypeStruct((6, 6), np.float32),
  }
  _round_trip(tmp_path, {"w": w}, target, recipes)


def test_stacks_and_concatenations_nest(tmp_path):
  rng = np.random.default_rng(4)
  tensors = {
    f"l{i}.e{e}.{n}": rng.standard_normal((3, 2)).astype(np.float32)
    for i in range(2)
    for e in range(3)
    for n in "ab"
  }
  recipes = {
    "ab": R.stack(
      [
        R.stack(
          [
            R.concatenate([R.source(f"l{i}.e{e}.a"), R.source(f"l{i}.e{e}.b")], 1) for e in range(3)
          ],
          0,
        )
        for i in range(2)
      ],
      1,
    ),
  }
  target = {"ab": jax.ShapeDtypeStruct((3, 2, 3, 4), np.float32)}
  _round_trip(tmp_path, tensors, target, recipes)


def test_an_nnx_module_exports_like_its_state(tmp_path):
  from flax import nnx

  src = MemorySource(
    {"fc.weight": np.arange(12, dtype=np.float32).reshape(4, 3), "fc.bias": np.ones(4, np.float32)}
  )
  model = nnx.Linear(3, 4, rngs=nnx.Rngs(0))
  recipes = {"kernel": R.transpose(R.source("fc.weight"), (1, 0)), "bias": R.source("fc.bias")}
  nnx.update(model, prj.restore(model, src, recipes=recipes))
  prj.export(model, recipes, tmp_path / "out", source=src)
  back = load_file(tmp_path / "out" / "model.safetensors")
  np.testing.assert_array_equal(back["fc.weight"], np.arange(12, dtype=np.float32).reshape(4, 3))
