"""The command line: the demo runs end to end; errors are one line."""

import subprocess
import sys


def test_demo_runs(tmp_path):
  r = subprocess.run(
    [sys.executable, "-m", "paramreg_jax", "demo", "--workdir", str(tmp_path)],
    capture_output=True,
    text=True,
    timeout=300,
    check=True,
  )
  out = r.stdout
  assert r.stderr == "", f"stray output on stderr: {r.stderr[:2000]}"
  assert "on 8 cpu devices" in out
  assert "OrderingContractError" in out
  assert "SurgeryReport: 6 kept, 2 added, 0 dropped, 0 re-initialised" in out
  assert "readout/kernel equals the trained head/kernel: True" in out
  assert "payload bytes read while planning: 0" in out
  assert "== done" in out


def test_unknown_command_is_a_usage_error():
  r = subprocess.run(
    [sys.executable, "-m", "paramreg_jax", "nope"], capture_output=True, text=True, timeout=120
  )
  assert r.returncode == 2 and "invalid choice" in r.stderr


import json  # noqa: E402
import textwrap  # noqa: E402

import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
import pytest  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

import paramreg_jax as prj  # noqa: E402


def run_cli(*args, cwd=None):
  return subprocess.run(
    [sys.executable, "-m", "paramreg_jax", *args],
    capture_output=True,
    text=True,
    timeout=300,
    cwd=cwd,
  )


TARGETS = textwrap.dedent(
  """
  import jax, numpy as np
  from paramreg_jax import recipes as R

  def good():
    return {
      "target": {"fc": {"kernel": jax.ShapeDtypeStruct((2, 3), np.float32), "bias": jax.ShapeDtypeStruct((3,), np.float32)}},
      "recipes": {"fc/kernel": R.transpose(R.source("fc.weight"), (1, 0))},
      "rename": {r"fc\\.bias": "fc/bias"},
    }

  def bad():
    return {"w": jax.ShapeDtypeStruct((3,), np.float32)}

  def not_a_tree():
    return "params.msgpack"

  def mixed():
    return {"w": jax.ShapeDtypeStruct((3,), np.float32), "lr": "0.1"}

  def empty():
    return {}

  def plain():
    return {"fc": {"kernel": jax.ShapeDtypeStruct((2, 3), np.float32), "bias": jax.ShapeDtypeStruct((3,), np.float32)}}

  def square():
    return {"fc": {"kernel": jax.ShapeDtypeStruct((3, 3), np.float32)}}

  def odd():
    return {"ln": {"scale": jax.ShapeDtypeStruct((3,), np.float32)}}

  def fused():
    sds = lambda *s: jax.ShapeDtypeStruct(s, np.float32)
    return {"attn": {n: {"kernel": sds(4, 4)} for n in "qkv"}, "up": {"kernel": sds(4, 8)}}

  def exits():
    import sys
    sys.exit(3)
  """
)


def make_files(tmp_path):
  save_file(
    {"fc.weight": np.ones((3, 2), np.float32), "fc.bias": np.zeros(3, np.float32)},
    str(tmp_path / "m.safetensors"),
  )
  (tmp_path / "cli_targets.py").write_text(TARGETS)


def test_inspect_safetensors_and_orbax(tmp_path):
  make_files(tmp_path)
  r = run_cli("inspect", str(tmp_path / "m.safetensors"))
  assert r.returncode == 0 and "2 tensors, 36 B" in r.stdout and "fc.weight  (3, 2)" in r.stdout
  data = json.loads(run_cli("inspect", str(tmp_path / "m.safetensors"), "--json").stdout)
  assert data["count"] == 2 and data["total_bytes"] == 36
  assert data["tensors"][1] == {
    "key": "fc.weight",
    "shape": [3, 2],
    "dtype": "float32",
    "nbytes": 24,
  }
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(tmp_path / "ob", {"dense": {"kernel": np.ones((4, 2), np.float32)}})
  ckpt.wait_until_finished()
  data = json.loads(run_cli("inspect", str(tmp_path / "ob"), "--json").stdout)
  assert data["tensors"] == [
    {"key": "dense/kernel", "shape": [4, 2], "dtype": "float32", "nbytes": 32}
  ]


def test_plan_ok_and_failing(tmp_path):
  make_files(tmp_path)
  r = run_cli("plan", str(tmp_path / "m.safetensors"), "--target", "cli_targets:good", cwd=tmp_path)
  assert r.returncode == 0, r.stderr
  assert "n:fc/kernel  (2, 3)" in r.stdout and "transpose(source('fc.weight'), (1, 0))" in r.stdout
  r = run_cli(
    "plan", str(tmp_path / "m.safetensors"), "--target", "cli_targets:bad", "--json", cwd=tmp_path
  )
  assert r.returncode == 1
  data = json.loads(r.stdout)
  assert data["ok"] is False and "n:w: missing from the checkpoint" in data["problems"][0]
  ok = json.loads(
    run_cli(
      "plan",
      str(tmp_path / "m.safetensors"),
      "--target",
      "cli_targets:good",
      "--json",
      cwd=tmp_path,
    ).stdout
  )
  assert ok["ok"] is True and [e["key"] for e in ok["entries"]] == ["n:fc/bias", "n:fc/kernel"]


def test_match_prints_the_table_and_the_code(tmp_path):
  make_files(tmp_path)
  save_file({"fc.weight": np.ones((3, 3), np.float32)}, str(tmp_path / "sq.safetensors"))
  r = run_cli(
    "match", str(tmp_path / "m.safetensors"), "--target", "cli_targets:plain", cwd=tmp_path
  )
  assert r.returncode == 0, r.stderr
  assert "fc/kernel  <- transpose(source('fc.weight'), (1, 0))   [name + transpose]" in r.stdout
  assert "\"fc/kernel\": R.transpose(R.source('fc.weight'), (1, 0))," in r.stdout
  data = json.loads(
    run_cli(
      "match",
      str(tmp_path / "m.safetensors"),
      "--target",
      "cli_targets:plain",
      "--json",
      cwd=tmp_path,
    ).stdout
  )
  assert data["ok"] and data["rows"][0] == {
    "target": "fc/bias",
    "checkpoint": "source('fc.bias')",
    "reason": "name",
  }
  r = run_cli(
    "match", str(tmp_path / "sq.safetensors"), "--target", "cli_targets:square", cwd=tmp_path
  )
  assert r.returncode == 1 and "fc/kernel: ambiguous" in r.stderr and r.stdout == ""
  r = run_cli(
    "match", str(tmp_path / "m.safetensors"), "--target", "cli_targets:good", cwd=tmp_path
  )
  assert r.returncode == 1 and "match takes only 'recipes' (as hints)" in r.stderr
  assert "['rename'] are plan options" in r.stderr


def test_match_takes_hints_and_a_config(tmp_path):
  make_files(tmp_path)
  save_file({"fc.weight": np.ones((3, 3), np.float32)}, str(tmp_path / "sq.safetensors"))
  save_file({"enc.odd_name.weight": np.ones(3, np.float32)}, str(tmp_path / "odd.safetensors"))
  odd = str(tmp_path / "odd.safetensors")
  r = run_cli("match", odd, "--target", "cli_targets:odd", cwd=tmp_path)
  assert r.returncode == 1 and "ln/scale (3,): unmatched" in r.stderr
  r = run_cli(
    "match", odd, "--target", "cli_targets:odd", "--hint", "ln/scale=odd_name", cwd=tmp_path
  )
  assert r.returncode == 0, r.stderr
  assert "ln/scale  <- source('enc.odd_name.weight')   [hint, name]" in r.stdout
  r = run_cli(
    "match", odd, "--target", "cli_targets:odd", "--hint", "ln/scale=od_name", cwd=tmp_path
  )
  assert r.returncode == 1 and "did you mean 'odd_name'" in r.stderr
  r = run_cli("match", odd, "--target", "cli_targets:odd", "--hint", "ln/scale", cwd=tmp_path)
  assert r.returncode == 1 and "expected TARGET_NAME=CHECKPOINT_NAME" in r.stderr
  # a square kernel's orientation: the config says torch.nn.Linear
  (tmp_path / "cfg.json").write_text(json.dumps({"model_type": "bert"}))
  sq = str(tmp_path / "sq.safetensors")
  r = run_cli(
    "match", sq, "--target", "cli_targets:square", "--config", "cfg.json", "--json", cwd=tmp_path
  )
  data = json.loads(r.stdout)
  assert data["ok"] and data["config"]["linear weights"] == "[out, in]"
  assert data["rows"][0]["checkpoint"] == "transpose(source('fc.weight'), (1, 0))"
  r = run_cli("match", sq, "--target", "cli_targets:square", "--config", "nope.json", cwd=tmp_path)
  assert r.returncode == 1 and "--config nope.json: cannot read the model config" in r.stderr
  # a fused tensor's layout, said once as a hint keyed by the tensor
  qkv = np.arange(48, dtype=np.float32).reshape(12, 4)
  up = np.ones((8, 4), np.float32)  # [out, in]: its shape says so
  save_file({"attn.qkv.weight": qkv, "up.weight": up}, str(tmp_path / "qkv.safetensors"))
  fused = str(tmp_path / "qkv.safetensors")
  r = run_cli("match", fused, "--target", "cli_targets:fused", cwd=tmp_path)
  assert r.returncode == 1 and '# "attn.qkv": "contiguous",' in r.stderr
  assert "a name, a layout or a stack's layers as --hint KEY=VALUE" in r.stderr
  r = run_cli(
    "match", fused, "--target", "cli_targets:fused", "--hint", "attn.qkv=contiguous", cwd=tmp_path
  )
  assert r.returncode == 0, r.stderr
  assert "<- transpose(source('attn.qkv.weight', Range(axis=0, 4:8)), (1, 0))" in r.stdout
  assert "as the layout hint says" in r.stdout


def test_errors_are_one_line_unless_debug(tmp_path):
  r = run_cli("inspect", str(tmp_path / "nope"))
  assert r.returncode == 1 and r.stdout == ""
  assert (
    r.stderr.strip()
    == f"paramreg-jax: error: MissingShardError: {tmp_path / 'nope'}: no such file or directory"
  )
  (tmp_path / "bad.safetensors").write_bytes(b"\x01")
  r = run_cli("inspect", str(tmp_path / "bad.safetensors"))
  assert (
    r.returncode == 1
    and len(r.stderr.strip().splitlines()) == 1
    and "MalformedSafetensorsError" in r.stderr
  )
  r = run_cli("--debug", "inspect", str(tmp_path / "bad.safetensors"))
  assert r.returncode == 1 and "Traceback" in r.stderr
  r = run_cli("plan", str(tmp_path / "bad.safetensors"), "--target", "nocolon")
  assert r.returncode == 1


def test_console_script_is_installed():
  import pathlib

  script = pathlib.Path(sys.executable).parent / "paramreg-jax"
  assert script.exists(), "pip install -e . installs the paramreg-jax command"
  r = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0 and "inspect" in r.stdout and "plan" in r.stdout and "demo" in r.stdout


def test_json_failures_are_objects_on_stdout(tmp_path):
  make_files(tmp_path)
  r = run_cli("inspect", str(tmp_path / "nope"), "--json")
  assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
  assert json.loads(r.stdout) == {
    "ok": False,
    "error": f"{tmp_path / 'nope'}: no such file or directory",
    "type": "MissingShardError",
  }
  r = run_cli(
    "plan", str(tmp_path / "m.safetensors"), "--target", "cli_targets:bad", "--json", cwd=tmp_path
  )
  data = json.loads(r.stdout)
  assert r.returncode == 1 and data["type"] == "RestorePlanError"
  assert data["error"] == "the plan cannot bind (3 problem(s))" and len(data["problems"]) == 3


@pytest.mark.parametrize(
  "flags", [("--step", "3"), ("--item", "params"), ("--step", "1", "--item", "x")]
)
def test_step_and_item_are_refused_for_safetensors(tmp_path, flags):
  make_files(tmp_path)
  r = run_cli("inspect", str(tmp_path / "m.safetensors"), *flags, "--json")
  assert r.returncode == 1
  data = json.loads(r.stdout)
  assert data["type"] == "StoreError"
  assert "select a step/item of an orbax CheckpointManager" in data["error"]
  assert "is a safetensors checkpoint; drop them" in data["error"]


@pytest.mark.parametrize(
  "function, found",
  [
    ("not_a_tree", "got str 'params.msgpack'"),
    ("mixed", "got lr is a str"),
    ("empty", "got dict holding no arrays"),
  ],
)
def test_a_target_that_is_not_a_tree_of_arrays_is_refused(tmp_path, function, found):
  make_files(tmp_path)
  r = run_cli(
    "plan", str(tmp_path / "m.safetensors"), "--target", f"cli_targets:{function}", cwd=tmp_path
  )
  assert r.returncode == 1 and r.stdout == ""
  assert "must return a tree of arrays or jax.ShapeDtypeStructs" in r.stderr and found in r.stderr


def test_usage_errors_with_json_are_json_and_version(tmp_path):
  make_files(tmp_path)
  r = run_cli("inspect", str(tmp_path / "m.safetensors"), "--step", "abc", "--json")
  assert r.returncode == 2
  data = json.loads(r.stdout)
  assert data["ok"] is False and data["type"] == "UsageError" and "--step" in data["error"]
  assert "paramreg-jax: error: UsageError:" in r.stderr
  r = run_cli("plan", str(tmp_path / "m.safetensors"), "--json")
  assert r.returncode == 2 and "--target" in json.loads(r.stdout)["error"]
  r = run_cli("--version")
  assert r.returncode == 0 and r.stdout.startswith("paramreg-jax ")


def test_a_target_that_exits_and_problems_on_stderr(tmp_path):
  make_files(tmp_path)
  r = run_cli(
    "plan", str(tmp_path / "m.safetensors"), "--target", "cli_targets:exits", cwd=tmp_path
  )
  assert r.returncode == 1 and r.stdout == ""
  assert "--target cli_targets:exits called sys.exit(3) instead of returning the target tree" in (
    r.stderr
  )
  r = run_cli("plan", str(tmp_path / "m.safetensors"), "--target", "cli_targets:bad", cwd=tmp_path)
  assert r.returncode == 1 and r.stdout == ""
  assert "RestorePlanError: the plan cannot bind (3 problem(s)):" in r.stderr
  assert "n:w: missing from the checkpoint" in r.stderr


def test_a_name_that_is_not_valid_utf8_is_refused_in_one_printable_line(tmp_path):
  header = json.dumps({"w\udc80x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
  (tmp_path / "odd.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(4))
  r = run_cli("inspect", str(tmp_path / "odd.safetensors"))
  assert r.returncode == 1 and r.stdout == "" and "UnicodeEncodeError" not in r.stderr
  assert "MalformedSafetensorsError" in r.stderr and "is not valid UTF-8" in r.stderr
  assert len(r.stderr.strip().splitlines()) == 1


def test_the_json_type_is_always_ours_and_a_foreign_cause_is_named(tmp_path):
  make_files(tmp_path)
  (tmp_path / "raising.py").write_text("def target():\n  raise RuntimeError('the model broke')\n")
  r = run_cli(
    "plan", str(tmp_path / "m.safetensors"), "--target", "raising:target", "--json", cwd=tmp_path
  )
  data = json.loads(r.stdout)
  assert r.returncode == 1 and data["type"] == "ParamRegError" and data["cause"] == "RuntimeError"
  assert "RuntimeError: the model broke" in data["error"]
  assert issubclass(getattr(prj, data["type"]), Exception)


@pytest.mark.parametrize(
  "text, hint",
  [
    ("decoder/moe_layers=range(1, 61)", range(1, 61)),
    ("moe_layers=range(1,48,2)", range(1, 48, 2)),
    ("moe_layers=(0, 2, 5)", (0, 2, 5)),
    ("moe_layers=[3]", (3,)),
    ("layers/attn_norm/scale=input_layernorm", "input_layernorm"),
    ("blocks.{i}.attn.qkv=contiguous", "contiguous"),
    ("x=range(1, 2, 0)", "range(1, 2, 0)"),  # no step 0: a name, refused as one
  ],
)
def test_a_hint_on_the_command_line_is_what_match_takes(text, hint):
  import argparse

  from paramreg_jax._src.cli import commands

  (got,) = commands._hints(argparse.Namespace(hint=[text]), {}).values()
  assert got == hint and type(got) is type(hint)
