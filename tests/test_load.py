"""``prj.load``: a checkpoint opened by what it is, matched and restored in one call; every
format checked by value against the lower-level calls or PyTorch's outputs, every bad input a
library error that names what was found."""

from __future__ import annotations

import json
import pathlib
import shutil

import hf_models as hf
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
import store_servers as ss
from flax import nnx
from safetensors.numpy import save_file

import paramreg_jax as prj
from paramreg_jax import errors

QUANTIZED = pathlib.Path(__file__).parent / "data" / "quantized"


def _llama():
  arch, sizes, _, ref = hf.case("llama")
  shapes = hf.with_head(hf.canonical_shapes(arch, sizes), arch, sizes)
  return arch, sizes, ref, shapes, hf.target(hf.STYLES["flax"], shapes, arch, sizes)


def _logits(arch, sizes, shapes, params, ref):
  weights = hf.to_canonical(hf.STYLES["flax"], shapes, arch, sizes, params)
  return np.asarray(hf.forward(arch, sizes, weights, ref["input_ids"]))


@pytest.mark.parametrize("how", ["folder", "file", "index"])
def test_a_hugging_face_folder_file_or_index_loads_as_pytorch_runs_it(how, tmp_path):
  arch, sizes, ref, shapes, target = _llama()
  folder = hf.DATA / "llama"
  if how == "index":  # a sharded checkpoint's index, beside its config
    shutil.copy(folder / "model.safetensors", tmp_path / "model-00001-of-00001.safetensors")
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    keys = prj.SafetensorsSource(folder / "model.safetensors").keys()
    index = {"weight_map": dict.fromkeys(keys, "model-00001-of-00001.safetensors")}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
  where = {
    "folder": folder,
    "file": str(folder / "model.safetensors"),
    "index": tmp_path / "model.safetensors.index.json",
  }[how]
  params, report = prj.load(target, where, progress=False)
  assert isinstance(report, prj.Match) and report.facts[0] == ("model_type", "llama")
  got = _logits(arch, sizes, shapes, params, ref)
  np.testing.assert_allclose(got, ref["output"], atol=1e-5, rtol=1e-5)


def test_a_gguf_file_loads_as_gguf_source_match_and_restore_do():
  target = {"token_embd": {"embedding": jax.ShapeDtypeStruct((64, 32), np.float32)}}
  src = prj.GGUFSource(QUANTIZED / "gemma2-f32.gguf")
  target = {
    prj.path_to_name(p): leaf
    for p, leaf in jax.tree_util.tree_flatten_with_path(
      jax.tree.map(lambda k: src.metadata(k), {k: k for k in src.keys()})
    )[0]
  }
  target = {k: jax.ShapeDtypeStruct(m.shape, np.float32) for k, m in target.items()}
  want = prj.restore(target, src, recipes=prj.match(target, src))
  params, report = prj.load(target, QUANTIZED / "gemma2-f32.gguf", progress=False)
  assert report.facts_from == "the GGUF metadata"
  for k in target:
    np.testing.assert_array_equal(params[k], want[k], err_msg=k)


def test_an_orbax_manager_root_loads_its_latest_step_or_the_one_asked(tmp_path):
  target = {"w": jax.ShapeDtypeStruct((3,), np.float32)}
  with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
    for step in (1, 2):
      manager.save(step, args=ocp.args.StandardSave({"w": np.full(3, step, np.float32)}))
    manager.wait_until_finished()
  assert prj.load(target, tmp_path / "ckpt", progress=False).params["w"].tolist() == [2, 2, 2]
  assert prj.load(target, tmp_path / "ckpt", step=1, progress=False).params["w"][0] == 1


def test_hf_urls_load_pinned_as_local_ones(tmp_path):
  arch, sizes, ref, shapes, target = _llama()
  shutil.copytree(hf.DATA / "llama", tmp_path / "ckpt")
  hub = ss.Hub().start()
  try:
    hub.push("org/llama", tmp_path / "ckpt")
    options = {"storage_options": {"endpoint": hub.url}}
    params, _ = prj.load(target, "hf://org/llama", source_options=options, progress=False)
  finally:
    hub.shutdown()
  np.testing.assert_allclose(
    _logits(arch, sizes, shapes, params, ref), ref["output"], atol=1e-5, rtol=1e-5
  )


def test_an_nnx_model_and_a_bfloat16_target_take_the_models_own_dtype(tmp_path):
  up = np.arange(24, dtype=np.float32).reshape(8, 3)
  save_file({"mlp.up_proj.weight": up}, str(tmp_path / "model.safetensors"))

  class Mlp(nnx.Module):
    def __init__(self):
      self.up = nnx.Linear(3, 8, use_bias=False, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))

  model = Mlp()
  params, report = prj.load(model, tmp_path, progress=False)
  nnx.update(model, params)
  assert model.up.kernel.value.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(model.up.kernel.value, np.float32), up.T)
  assert "cast to bfloat16" in str(report)  # said, not silent


def test_a_refusal_is_matchs_own_with_its_hints_literal(tmp_path):
  save_file(
    {f"h.0.{n}.weight": np.ones(4, np.float32) for n in ("a_norm", "b_norm")},
    str(tmp_path / "model.safetensors"),
  )
  target = {"x": {"scale": jax.ShapeDtypeStruct((4,), np.float32)}}
  with pytest.raises(prj.MatchError) as info:
    prj.load(target, tmp_path, progress=False)
  assert "hints = {" in str(info.value) and info.value.hints_code


# --- what it cannot open -------------------------------------------------------------------------


def test_a_folder_of_something_else_says_what_it_holds(tmp_path):
  (tmp_path / "weights.bin").write_bytes(b"\0" * 8)
  (tmp_path / "README.md").write_text("hi")
  with pytest.raises(errors.StoreError) as info:
    prj.load({}, tmp_path)
  assert str(info.value) == (
    f"{tmp_path}: a directory holding README.md, weights.bin; load and open_source open a "
    ".safetensors file, a sharded *.index.json or a directory of either; a .gguf file; or an "
    "orbax checkpoint (an item directory with _METADATA, or a CheckpointManager root of "
    "numbered steps)"
  )
  with pytest.raises(
    errors.StoreError, match=r"weights.bin: a file that is none of these \(suffix '.bin'\)"
  ):
    prj.load({}, tmp_path / "weights.bin")
  with pytest.raises(errors.MissingShardError, match="no such file or directory"):
    prj.load({}, tmp_path / "absent")


def test_a_gguf_url_and_misplaced_options_are_refused_before_anything_is_read(tmp_path):
  save_file({"w": np.ones(2, np.float32)}, str(tmp_path / "model.safetensors"))
  target = {"w": jax.ShapeDtypeStruct((2,), np.float32)}
  with pytest.raises(errors.StoreError, match="GGUFSource reads a local file; download it first"):
    prj.load(target, "https://127.0.0.1:1/model.gguf")
  with pytest.raises(errors.StoreError, match=r"step=3 select a step/item of an orbax"):
    prj.load(target, tmp_path, step=3)
  with pytest.raises(
    errors.StoreError, match=r"source options \['retries'\] are for a safetensors"
  ):
    prj.load(target, QUANTIZED / "gemma2-f32.gguf", source_options={"retries": 2})
  with pytest.raises(TypeError, match=r"load: step open a checkpoint at a path"):
    prj.load(target, prj.SafetensorsSource(tmp_path), step=0)  # 0 is a step too
  with pytest.raises(TypeError, match=r"load\(\) got unexpected keyword arguments: rename=: "):
    prj.load(target, tmp_path, rename={"a": "b"})
  with pytest.raises(TypeError, match="where must be a path or a URL, got int"):
    prj.load(target, 3)
