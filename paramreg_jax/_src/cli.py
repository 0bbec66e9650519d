"""The ``paramreg-jax`` command line: ``demo`` (more commands join as capabilities land).

Errors are one clear line and a non-zero exit status; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence


def _ensure_virtual_devices(count: int = 8) -> None:
  """Asks XLA for ``count`` CPU devices; effective until jax first initialises a backend."""
  flag = f"--xla_force_host_platform_device_count={count}"
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")


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
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  """Entry point of ``paramreg-jax`` / ``python -m paramreg_jax``; returns the exit status."""
  args = _parser().parse_args(argv)
  try:
    if args.command == "demo":
      _ensure_virtual_devices()
      from paramreg_jax._src import demo

      demo.run(workdir=args.workdir)
    return 0
  except KeyboardInterrupt:
    print("paramreg-jax: interrupted", file=sys.stderr)
    return 130
  except Exception as e:  # one clear line unless --debug
    if args.debug:
      raise
    print(f"paramreg-jax: error: {type(e).__name__}: {e}", file=sys.stderr)
    return 1
