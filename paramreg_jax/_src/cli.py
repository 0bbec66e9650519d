"""The ``paramreg-jax`` command line: ``demo``, ``inspect`` and ``plan``.

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


def _ensure_virtual_devices(count: int = 8) -> None:
  """Asks XLA for ``count`` CPU devices; effective until jax first initialises a backend."""
  flag = f"--xla_force_host_platform_device_count={count}"
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")


def open_source(path: str, *, step: int | None = None, item: str | None = None) -> Any:
  """A source for ``path``: safetensors (file, directory, index) or orbax (anything else)."""
  from paramreg_jax._src.sources.orbax import OrbaxSource
  from paramreg_jax._src.sources.safetensors import SafetensorsSource

  p = pathlib.Path(path)
  if not p.exists():
    raise FileNotFoundError(f"{path}: no such file or directory")
  if p.is_file() and (p.suffix == ".safetensors" or p.name.endswith(".index.json")):
    return SafetensorsSource(p)
  if p.is_dir() and (any(p.glob("*.safetensors")) or (p / "model.safetensors.index.json").exists()):
    return SafetensorsSource(p)
  return OrbaxSource(p, step=step, item=item)


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
  result = func()
  if isinstance(result, Mapping) and "target" in result:
    extra = {k: v for k, v in result.items() if k != "target"}
    unknown = set(extra) - {"recipes", "aliases", "rename", "exclude", "dtype_policy"}
    if unknown:
      raise ValueError(f"--target {spec} returned unknown plan options {sorted(unknown)}")
    return result["target"], extra
  return result, {}


def cmd_plan(args: argparse.Namespace) -> int:
  from paramreg_jax._src import errors
  from paramreg_jax._src.plan import plan_restore

  src = open_source(args.path, step=args.step, item=args.item)
  target, options = _load_target(args.target)
  try:
    plan = plan_restore(target, src, **options)
  except errors.RestorePlanError as e:
    if args.json:
      print(json.dumps({"ok": False, "problems": list(e.problems)}, indent=1))
    else:
      print(f"the plan cannot bind ({len(e.problems)} problem(s)):")
      for p in e.problems:
        print(f"  - {p}")
    return 1
  if args.json:
    print(json.dumps({"ok": True, **plan.to_json()}, indent=1))
  else:
    print(plan)
  return 0


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
    prog="paramreg-jax",
    description="Stable parameter identities for JAX: keyed optax state, checkpoint restore.",
  )
  parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
  sub = parser.add_subparsers(dest="command", required=True)
  demo = sub.add_parser("demo", help="run the end-to-end demo on 8 virtual CPU devices")
  demo.add_argument(
    "--workdir", default=None, help="where to write checkpoints (default: a temp dir)"
  )
  for name, text in (
    ("inspect", "keys, shapes, dtypes and bytes of a checkpoint (reads no payload)"),
    ("plan", "the restore plan of a checkpoint against a target tree; exit 1 if it cannot bind"),
  ):
    p = sub.add_parser(name, help=text)
    p.add_argument(
      "path", help="an orbax checkpoint directory or a safetensors file/directory/index"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
      "--step", type=int, default=None, help="CheckpointManager step (default: latest)"
    )
    p.add_argument("--item", default=None, help="CheckpointManager item name")
    if name == "plan":
      p.add_argument(
        "--target",
        required=True,
        help="MODULE:FUNCTION returning the abstract target tree, or a dict with 'target' and "
        "plan_restore options (recipes, aliases, rename, exclude, dtype_policy)",
      )
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  """Entry point of ``paramreg-jax`` / ``python -m paramreg_jax``; returns the exit status."""
  args = _parser().parse_args(argv)
  _ensure_virtual_devices()
  try:
    if args.command == "demo":
      from paramreg_jax._src import demo

      demo.run(workdir=args.workdir)
      return 0
    if args.command == "inspect":
      return cmd_inspect(args)
    return cmd_plan(args)
  except KeyboardInterrupt:
    print("paramreg-jax: interrupted", file=sys.stderr)
    return 130
  except Exception as e:  # one clear line unless --debug
    if args.debug:
      raise
    message = " ".join(str(e).split())
    print(f"paramreg-jax: error: {type(e).__name__}: {message}", file=sys.stderr)
    return 1
