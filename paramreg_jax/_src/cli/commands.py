"""The ``paramreg-jax`` commands, one function each (``cmd_<name>(args) -> exit status``)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pathlib
import re
import sys
from collections.abc import Mapping
from typing import Any

from paramreg_jax._src import errors
from paramreg_jax._src.cli.output import problems
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource
from paramreg_jax._src.sources.opening import open_source


def _human(n: float) -> str:
  for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
    if n < 1024 or unit == "TiB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
    n /= 1024
  return f"{n:.2f} TiB"


def cmd_inspect(args: argparse.Namespace) -> int:
  src = open_source(args.path, step=args.step, item=args.item)
  rows = []
  for key in src.keys():
    meta = src.metadata(key)
    rows.append(
      {"key": key, "shape": list(meta.shape), "dtype": meta.dtype.name, "nbytes": meta.nbytes}
    )
  total = sum(r["nbytes"] for r in rows)
  assert src.stats.reads == 0  # inspecting never reads payload
  if args.json:
    print(
      json.dumps(
        {"source": repr(src), "count": len(rows), "total_bytes": total, "tensors": rows}, indent=1
      )
    )
    return 0
  width = max((len(r["key"]) for r in rows), default=3)
  print(f"{src!r}: {len(rows)} tensors, {_human(total)}")
  print(f"  {'key':<{width}}  {'shape':<16} {'dtype':<9} {'bytes':>10}")
  for r in rows:
    print(
      f"  {r['key']:<{width}}  {tuple(r['shape'])!s:<16} {r['dtype']:<9} {_human(r['nbytes']):>10}"
    )
  return 0


def _load_target(spec: str) -> tuple[Any, dict[str, Any]]:
  if ":" not in spec:
    raise ValueError(
      f"--target must be MODULE:FUNCTION (e.g. mymodel:abstract_params), got {spec!r}"
    )
  module_name, func_name = spec.split(":", 1)
  sys.path.insert(0, os.getcwd())
  try:
    module = importlib.import_module(module_name)
  finally:
    sys.path.pop(0)
  func = getattr(module, func_name, None)
  if not callable(func):
    raise ValueError(f"--target {spec}: {module_name} has no function {func_name!r}")
  try:
    result = func()
  except SystemExit as e:  # a script's main guard, argparse in the user's module, ...
    raise ValueError(
      f"--target {spec} called sys.exit({e.code!r}) instead of returning the target tree"
    ) from None
  extra: dict[str, Any] = {}
  if isinstance(result, Mapping) and "target" in result:
    extra = {k: v for k, v in result.items() if k != "target"}
    unknown = set(extra) - {"recipes", "aliases", "rename", "exclude", "dtype_policy"}
    if unknown:
      raise ValueError(f"--target {spec} returned unknown plan options {sorted(unknown)}")
    result = result["target"]
  _check_target(spec, result)
  return result, extra


def _check_target(spec: str, target: Any) -> None:
  """A target is a tree of arrays / ``jax.ShapeDtypeStruct`` objects (or an NNX module)."""
  import jax

  from paramreg_jax._src.registry import keys as keys_lib
  from paramreg_jax._src.restore import target as target_lib

  flat = jax.tree_util.tree_flatten_with_path(target_lib.as_state(target))[0]
  bad = [(p, x) for p, x in flat if not target_lib.is_slot(x)]
  if flat and not bad:
    return
  if not flat:
    found = f"{type(target).__name__} holding no arrays"
  elif not bad[0][0]:  # the whole result is one leaf
    found = f"{type(target).__name__} {target!r:.60}"
  else:
    found = "; ".join(f"{keys_lib.path_to_name(p)} is a {type(x).__name__}" for p, x in bad[:3])
  raise ValueError(
    f"--target {spec} must return a tree of arrays or jax.ShapeDtypeStructs (e.g. from "
    f"jax.eval_shape), or a dict with 'target' and plan options; got {found}"
  )


def cmd_plan(args: argparse.Namespace) -> int:
  from paramreg_jax._src.restore.planning import plan_restore

  src = open_source(args.path, step=args.step, item=args.item)
  target, options = _load_target(args.target)
  try:
    plan = plan_restore(target, src, **options)
  except errors.RestorePlanError as e:
    return problems(args, "the plan cannot bind", e)
  if args.json:
    print(json.dumps({"ok": True, **plan.to_json()}, indent=1))
  else:
    print(plan)
  return 0


def cmd_match(args: argparse.Namespace) -> int:
  from paramreg_jax._src.match import match

  src = open_source(args.path, step=args.step, item=args.item)
  target, options = _load_target(args.target)
  unused = sorted(set(options) - {"recipes"})
  if unused:
    raise ValueError(
      f"--target {args.target}: match takes only 'recipes' (as hints) besides 'target'; "
      f"{unused} are plan options: drop them here, pass them to plan_restore or restore"
    )
  hints = _hints(args, dict(options.get("recipes") or {}))
  config = _config(args)
  try:
    mapping = match(target, src, hints=hints, config=config)
  except errors.MatchError as e:
    return problems(args, "no complete mapping", e)
  if args.json:
    rows = [{"target": t, "checkpoint": c, "reason": r} for t, c, r in mapping.rows()]
    print(
      json.dumps(
        {
          "ok": True,
          "rows": rows,
          "config": dict(mapping.facts),
          "unused": list(mapping.ignored_keys),
          "python": mapping.to_python(),
        },
        indent=1,
      )
    )
  else:
    print(mapping)
    print()
    print(mapping.to_python())
  return 0


def _hints(args: argparse.Namespace, hints: dict[str, Any]) -> dict[str, Any]:
  for text in args.hint or ():
    name, sep, key = text.partition("=")
    if not sep or not name.strip() or not key.strip():
      raise ValueError(
        f"--hint {text!r}: expected TARGET_NAME=CHECKPOINT_NAME, e.g. "
        "--hint layers/attn_norm/scale=input_layernorm"
      )
    hints[name.strip()] = _share(key.strip()) or key.strip()
  return hints


_RANGE = re.compile(r"^range\(\s*(\d+)\s*,\s*(\d+)\s*(?:,\s*([1-9]\d*)\s*)?\)$")
_NUMBERS = re.compile(r"^[\[(]\s*\d+(?:\s*,\s*\d+)*\s*,?\s*[\])]$")


def _share(text: str) -> range | tuple[int, ...] | None:
  """A stack's checkpoint layers as ``--hint`` writes them (``range(1, 61)``, ``(0, 2)``), as
  ``match`` takes them; None for any other hint."""
  if m := _RANGE.match(text):
    return range(int(m.group(1)), int(m.group(2)), int(m.group(3) or 1))
  if _NUMBERS.match(text):
    return tuple(int(n) for n in re.findall(r"\d+", text))
  return None


def _config(args: argparse.Namespace) -> dict[str, Any] | None:
  if not getattr(args, "config", None):
    return None
  try:
    config = json.loads(pathlib.Path(args.config).read_text())
  except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
    raise ValueError(f"--config {args.config}: cannot read the model config: {e}") from None
  if not isinstance(config, dict):
    raise ValueError(f"--config {args.config}: the model config is not a JSON object")
  return config


def _mapping(
  args: argparse.Namespace, target: Any, options: dict[str, Any], src: CheckpointSource
) -> Any:
  """``options`` from --target when they hold recipes or renames, else ``match`` with hints."""
  from paramreg_jax._src.match import match

  if "recipes" in options or "rename" in options:
    if args.hint or getattr(args, "config", None):
      raise ValueError(
        f"--target {args.target} returns recipes or rename rules: --hint and --config are for "
        "match; drop them"
      )
    return options
  return {**options, "recipes": match(target, src, hints=_hints(args, {}), config=_config(args))}


def _show_progress(args: argparse.Namespace) -> bool:
  return not args.json and sys.stderr.isatty()


def cmd_convert(args: argparse.Namespace) -> int:
  """A foreign checkpoint -> an orbax checkpoint in the target's own layout (recipes once)."""
  from paramreg_jax._src.export.convert import convert

  src = open_source(args.path, step=args.step, item=args.item)
  target, options = _load_target(args.target)
  try:
    options = _mapping(args, target, options, src)
    plan = convert(
      src, args.dst, target, **options, overwrite=args.overwrite, progress=_show_progress(args)
    )
  except (errors.MatchError, errors.RestorePlanError) as e:
    return problems(args, "no complete mapping", e)
  summary = {
    "ok": True,
    "path": str(pathlib.Path(args.dst).absolute()),
    "parameters": len(plan.entries),
    "bytes": plan.nbytes,
  }
  if args.json:
    print(json.dumps(summary, indent=1))
  else:
    print(
      f"wrote an orbax checkpoint of {len(plan.entries)} parameters ({_human(plan.nbytes)}) to "
      f"{summary['path']}; restore it with ocp.StandardCheckpointer().restore(path, target)"
    )
  return 0


def cmd_export(args: argparse.Namespace) -> int:
  """Parameters (an orbax checkpoint in the target's layout) -> the layout of ``--like``."""
  from paramreg_jax._src.export.driver import export
  from paramreg_jax._src.restore.pipeline import restore

  target, options = _load_target(args.target)
  like = open_source(args.like)
  params = restore(target, open_source(args.path, step=args.step, item=args.item))
  try:
    options = _mapping(args, target, options, like)
    plan = export(
      params,
      options.pop("recipes", None),
      args.dst,
      source=like,
      rename=options.get("rename"),
      aliases=options.get("aliases"),
      exclude=options.get("exclude"),
      max_shard_bytes=args.max_shard_bytes,
      overwrite=args.overwrite,
      progress=_show_progress(args),
    )
  except (errors.MatchError, errors.RestorePlanError, errors.ExportPlanError) as e:
    return problems(args, "cannot export", e)
  files = sorted(p.name for p in pathlib.Path(args.dst).iterdir())
  if args.json:
    out = {"ok": True, "path": str(pathlib.Path(args.dst).absolute()), "files": files}
    out |= {"tensors": len(plan.tensors), "bytes": plan.nbytes}
    out |= {"companions": list(plan.companions), "replaced": list(plan.replaced)}
    print(json.dumps(out, indent=1))
  else:
    print(plan)
    print(f"wrote {', '.join(files)} to {pathlib.Path(args.dst).absolute()}")
  return 0


def cmd_demo(args: argparse.Namespace) -> int:
  from paramreg_jax._src import demo

  demo.run(workdir=args.workdir)
  return 0
