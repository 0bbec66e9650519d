"""The ``paramreg-jax`` command line: ``demo``, ``inspect``, ``plan``, ``match``, ``convert``, ``export``.

Errors are one clear line on stderr and a non-zero exit status; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pathlib
import sys
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from paramreg_jax._src import errors


def _ensure_virtual_devices(count: int = 8) -> None:
  """``count`` CPU devices (unless ``XLA_FLAGS`` already asks for a number) and a thread pool
  that cannot deadlock on collectives; effective until jax first initialises a backend."""
  import re

  from paramreg_jax._src import devices as devices_lib

  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  asked = re.search(
    r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", "")
  )
  devices_lib.use_cpu_devices(int(asked.group(1)) if asked else count)


def open_source(path: str, *, step: int | None = None, item: str | None = None) -> Any:
  """A source for ``path``: safetensors (file, directory, index) or orbax (anything else)."""
  from paramreg_jax._src.sources import remote
  from paramreg_jax._src.sources import stores
  from paramreg_jax._src.sources.orbax import OrbaxSource
  from paramreg_jax._src.sources.safetensors import SafetensorsSource

  if stores.is_url(path):  # safetensors at a URL; an orbax checkpoint on gs:// or s3://
    orbax_store = path.split("://", 1)[0] in ("gs", "s3") and not path.endswith(
      (".safetensors", ".json")
    )
    if orbax_store and not remote.RemoteFolder(path, options=None, retries=3, timeout=30.0).exists(
      "model.safetensors.index.json"
    ):
      return OrbaxSource(path, step=step, item=item)
    return SafetensorsSource(path)
  p = pathlib.Path(path)
  if not p.exists():
    raise errors.MissingShardError(f"{path}: no such file or directory")
  safetensors = (
    p.is_file() and (p.suffix == ".safetensors" or p.name.endswith(".index.json"))
  ) or (
    p.is_dir() and (any(p.glob("*.safetensors")) or (p / "model.safetensors.index.json").exists())
  )
  if not safetensors:
    return OrbaxSource(p, step=step, item=item)
  given = [flag for flag, value in (("--step", step), ("--item", item)) if value is not None]
  if given:
    raise errors.StoreError(
      f"{' and '.join(given)} select a step/item of an orbax CheckpointManager, but {path} is a "
      "safetensors checkpoint; drop them"
    )
  return SafetensorsSource(p)


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
    return _problems(args, "the plan cannot bind", e)
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
    return _problems(args, "no complete mapping", e)
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
    hints[name.strip()] = key.strip()
  return hints


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


def _mapping(args: argparse.Namespace, target: Any, options: dict[str, Any], src: Any) -> Any:
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
    return _problems(args, "no complete mapping", e)
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
    return _problems(args, "cannot export", e)
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


class _Parser(argparse.ArgumentParser):
  """Usage errors as the other errors: one line on stderr, and JSON on stdout with --json."""

  json_output = False

  def error(self, message: str) -> Any:
    if _Parser.json_output:
      print(json.dumps({"ok": False, "error": message, "type": "UsageError"}, indent=1))
    self.print_usage(sys.stderr)
    print(f"paramreg-jax: error: UsageError: {message}", file=sys.stderr)
    raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
  from paramreg_jax import __version__

  parser = _Parser(
    prog="paramreg-jax",
    description="Stable parameter identities for JAX: keyed optax state, checkpoint restore.",
  )
  parser.add_argument("--version", action="version", version=f"paramreg-jax {__version__}")
  parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
  sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
  demo = sub.add_parser("demo", help="run the end-to-end demo on 8 virtual CPU devices")
  demo.add_argument(
    "--workdir", default=None, help="where to write checkpoints (default: a temp dir)"
  )
  for name, text in (
    ("inspect", "keys, shapes, dtypes and bytes of a checkpoint (reads no payload)"),
    (
      "convert",
      "restore a foreign checkpoint through its recipes (or match) once and save it as an "
      "orbax checkpoint in the target's own layout",
    ),
    (
      "export",
      "write parameters (an orbax checkpoint in the target's layout) back in the layout of "
      "another checkpoint (--like), as Hugging Face safetensors shards",
    ),
    ("plan", "the restore plan of a checkpoint against a target tree; exit 1 if it cannot bind"),
    (
      "match",
      "propose the recipes that restore a target from a foreign checkpoint, as a table "
      "and as code; exit 1 if something is unmatched or ambiguous",
    ),
  ):
    p = sub.add_parser(name, help=text)
    p.add_argument(
      "path",
      help="an orbax checkpoint directory or a safetensors file/directory/index (a path or a "
      "URL: https://, gs://, s3://, hf://)",
    )
    if name in ("convert", "export"):
      p.add_argument("dst", help="the directory to write")
      p.add_argument("--overwrite", action="store_true", help="replace dst if it exists")
    if name == "export":
      p.add_argument(
        "--like",
        required=True,
        help="the checkpoint whose layout to write (the one the parameters came from)",
      )
      p.add_argument(
        "--max-shard-bytes",
        type=int,
        default=5_000_000_000,
        help="the largest shard file (default 5 GB, as transformers)",
      )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
      "--step", type=int, default=None, help="CheckpointManager step (default: latest)"
    )
    p.add_argument("--item", default=None, help="CheckpointManager item name")
    if name in ("plan", "match", "convert", "export"):
      p.add_argument(
        "--target",
        required=True,
        help="MODULE:FUNCTION returning the abstract target tree, or a dict with 'target' and "
        "plan_restore options (recipes, aliases, rename, exclude, dtype_policy)",
      )
    if name in ("match", "convert", "export"):
      p.add_argument(
        "--hint",
        action="append",
        metavar="TARGET=CHECKPOINT",
        help="settle a parameter by a checkpoint name or part of one, in every layer "
        "(e.g. layers/attn_norm/scale=input_layernorm); repeatable",
      )
      p.add_argument(
        "--config",
        default=None,
        help="the model's config.json, when it is not beside the weights",
      )
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  """Entry point of ``paramreg-jax`` / ``python -m paramreg_jax``; returns the exit status."""
  for stream in (sys.stdout, sys.stderr):  # names that are not valid UTF-8 print escaped
    reconfigure = getattr(stream, "reconfigure", None)
    if reconfigure is not None:
      reconfigure(errors="backslashreplace")
  _Parser.json_output = "--json" in (sys.argv[1:] if argv is None else list(argv))
  args = _parser().parse_args(argv)
  _ensure_virtual_devices()
  try:
    if args.command == "demo":
      from paramreg_jax._src import demo

      demo.run(workdir=args.workdir)
      return 0
    if args.command == "inspect":
      return cmd_inspect(args)
    if args.command == "match":
      return cmd_match(args)
    if args.command == "convert":
      return cmd_convert(args)
    if args.command == "export":
      return cmd_export(args)
    return cmd_plan(args)
  except KeyboardInterrupt:
    _fail(args, "interrupted", "KeyboardInterrupt")
    return 130
  except Exception as e:  # one clear line unless --debug
    if args.debug:
      raise
    if isinstance(e, errors.ParamRegError):
      _fail(args, " ".join(str(e).split()), type(e).__name__)
    else:  # not one of ours: the root type, the cause named beside it
      message = f"{type(e).__name__}: {' '.join(str(e).split())}"
      _fail(args, message, "ParamRegError", cause=type(e).__name__)
    return 1


def _problems(args: argparse.Namespace, headline: str, error: Any) -> int:
  """Every problem of ``error`` (its ``.problems``): listed on stderr, or as JSON on stdout
  (with the one-line error on stderr); exit status 1."""
  message = f"{headline} ({len(error.problems)} problem(s))"
  if args.json:
    _fail(args, message, type(error).__name__, problems=list(error.problems))
  else:
    print(f"paramreg-jax: error: {type(error).__name__}: {message}:", file=sys.stderr)
    for p in error.problems:
      print(f"  - {p}", file=sys.stderr)
  return 1


def _fail(args: argparse.Namespace, message: str, kind: str, **extra: Any) -> None:
  """One line on stderr; with ``--json`` also ``{"error", "type", ...}`` on stdout."""
  if getattr(args, "json", False):
    print(json.dumps({"ok": False, "error": message, "type": kind, **extra}, indent=1))
  print(f"paramreg-jax: error: {kind}: {message}", file=sys.stderr)
