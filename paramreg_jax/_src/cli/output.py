"""What the command line prints: one error line on stderr, and JSON on stdout with ``--json``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def problems(args: argparse.Namespace, headline: str, error: Any) -> int:
  """Every problem of ``error`` (its ``.problems``): listed on stderr, or as JSON on stdout
  (with the one-line error on stderr); exit status 1."""
  message = f"{headline} ({len(error.problems)} problem(s))"
  literal = getattr(error, "hints_code", None)  # a refusal's choices, one line each
  if args.json:
    extra = {"hints_code": literal} if literal else {}
    fail(args, message, type(error).__name__, problems=list(error.problems), **extra)
  else:
    print(f"paramreg-jax: error: {type(error).__name__}: {message}:", file=sys.stderr)
    for p in error.problems:
      print(f"  - {p}", file=sys.stderr)
    if literal and literal != "hints = {\n}":
      print(
        "Choose one line per entry: a name, a layout or a stack's layers as --hint "
        "KEY=VALUE, a recipe in the "
        "--target function's 'recipes':\n" + literal,
        file=sys.stderr,
      )
  return 1


def fail(args: argparse.Namespace, message: str, kind: str, **extra: Any) -> None:
  """One line on stderr; with ``--json`` also ``{"error", "type", ...}`` on stdout."""
  if getattr(args, "json", False):
    print(json.dumps({"ok": False, "error": message, "type": kind, **extra}, indent=1))
  print(f"paramreg-jax: error: {kind}: {message}", file=sys.stderr)
