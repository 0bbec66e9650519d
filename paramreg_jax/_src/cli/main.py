"""The ``paramreg-jax`` command line: ``demo``, ``inspect``, ``plan``, ``match``, ``convert``, ``export``.

Errors are one clear line on stderr and a non-zero exit status; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from paramreg_jax._src import errors
from paramreg_jax._src.cli import commands
from paramreg_jax._src.cli.output import fail


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
  for add in (_add_demo, _add_inspect, _add_convert, _add_export, _add_plan, _add_match):
    add(sub)
  return parser


def _add_demo(sub: Any) -> None:
  p = sub.add_parser("demo", help="run the end-to-end demo on 8 virtual CPU devices")
  p.add_argument("--workdir", default=None, help="where to write checkpoints (default: a temp dir)")
  p.set_defaults(run=commands.cmd_demo)


def _add_inspect(sub: Any) -> None:
  p = _checkpoint_command(
    sub, "inspect", "keys, shapes, dtypes and bytes of a checkpoint (reads no payload)"
  )
  _add_source_options(p)
  p.set_defaults(run=commands.cmd_inspect)


def _add_convert(sub: Any) -> None:
  p = _checkpoint_command(
    sub,
    "convert",
    "restore a foreign checkpoint through its recipes (or match) once and save it as an "
    "orbax checkpoint in the target's own layout",
  )
  _add_destination(p)
  _add_source_options(p)
  _add_target(p)
  _add_match_options(p)
  p.set_defaults(run=commands.cmd_convert)


def _add_export(sub: Any) -> None:
  p = _checkpoint_command(
    sub,
    "export",
    "write parameters (an orbax checkpoint in the target's layout) back in the layout of "
    "another checkpoint (--like), as Hugging Face safetensors shards",
  )
  _add_destination(p)
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
  _add_source_options(p)
  _add_target(p)
  _add_match_options(p)
  p.set_defaults(run=commands.cmd_export)


def _add_plan(sub: Any) -> None:
  p = _checkpoint_command(
    sub, "plan", "the restore plan of a checkpoint against a target tree; exit 1 if it cannot bind"
  )
  _add_source_options(p)
  _add_target(p)
  p.set_defaults(run=commands.cmd_plan)


def _add_match(sub: Any) -> None:
  p = _checkpoint_command(
    sub,
    "match",
    "propose the recipes that restore a target from a foreign checkpoint, as a table "
    "and as code; exit 1 if something is unmatched or ambiguous",
  )
  _add_source_options(p)
  _add_target(p)
  _add_match_options(p)
  p.set_defaults(run=commands.cmd_match)


def _checkpoint_command(sub: Any, name: str, text: str) -> argparse.ArgumentParser:
  """A command whose first argument is a checkpoint."""
  p = sub.add_parser(name, help=text)
  p.add_argument(
    "path",
    help="an orbax checkpoint directory or a safetensors file/directory/index (a path or a "
    "URL: https://, gs://, s3://, hf://)",
  )
  return p


def _add_destination(p: argparse.ArgumentParser) -> None:
  p.add_argument("dst", help="the directory to write")
  p.add_argument("--overwrite", action="store_true", help="replace dst if it exists")


def _add_source_options(p: argparse.ArgumentParser) -> None:
  p.add_argument("--json", action="store_true", help="machine-readable output")
  p.add_argument("--step", type=int, default=None, help="CheckpointManager step (default: latest)")
  p.add_argument("--item", default=None, help="CheckpointManager item name")


def _add_target(p: argparse.ArgumentParser) -> None:
  p.add_argument(
    "--target",
    required=True,
    help="MODULE:FUNCTION returning the abstract target tree, or a dict with 'target' and "
    "plan_restore options (recipes, aliases, rename, exclude, dtype_policy)",
  )


def _add_match_options(p: argparse.ArgumentParser) -> None:
  p.add_argument(
    "--hint",
    action="append",
    metavar="TARGET=CHECKPOINT",
    help="settle a parameter by a checkpoint name or part of one, in every layer "
    "(e.g. layers/attn_norm/scale=input_layernorm), a fused tensor's layout "
    "(e.g. blocks.{i}.attn.qkv=contiguous), or the checkpoint layers a stack holds "
    "(e.g. decoder/moe_layers='range(1, 61)'); repeatable",
  )
  p.add_argument(
    "--config",
    default=None,
    help="the model's config.json, when it is not beside the weights",
  )


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
    return args.run(args)
  except KeyboardInterrupt:
    fail(args, "interrupted", "KeyboardInterrupt")
    return 130
  except Exception as e:  # one clear line unless --debug
    if args.debug:
      raise
    if isinstance(e, errors.ParamRegError):
      fail(args, " ".join(str(e).split()), type(e).__name__)
    else:  # not one of ours: the root type, the cause named beside it
      message = f"{type(e).__name__}: {' '.join(str(e).split())}"
      fail(args, message, "ParamRegError", cause=type(e).__name__)
    return 1
