"""The linter and the type checker are part of the test suite, so CI runs them."""

import pathlib
import shutil
import subprocess
import sys
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _run(*cmd: str) -> subprocess.CompletedProcess:
  return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_check():
  if shutil.which("ruff") is None and not (pathlib.Path(sys.executable).parent / "ruff").exists():
    pytest.fail("ruff is not installed: pip install -e '.[test]'")
  ruff = str(pathlib.Path(sys.executable).parent / "ruff")
  ruff = ruff if pathlib.Path(ruff).exists() else "ruff"
  result = _run(ruff, "check", "paramreg_jax", "tests", "benchmarks", "docs", "conftest.py")
  assert result.returncode == 0, result.stdout + result.stderr
  result = _run(
    ruff, "format", "--check", "paramreg_jax", "tests", "benchmarks", "docs", "conftest.py"
  )
  assert result.returncode == 0, result.stdout + result.stderr


def test_mypy():
  result = _run(sys.executable, "-m", "mypy")
  assert result.returncode == 0, result.stdout + result.stderr


def test_a_deprecation_our_own_code_meets_fails_the_suite_and_a_third_partys_does_not():
  """pyproject's ``filterwarnings``: a ``DeprecationWarning`` attributed to a paramreg_jax
  module (our code calling a deprecated API) is an error; one attributed elsewhere is not."""
  with pytest.raises(DeprecationWarning, match="renamed"):
    warnings.warn_explicit("x is renamed", DeprecationWarning, "m.py", 1, "paramreg_jax._src.m")
  warnings.warn_explicit("x is renamed", DeprecationWarning, "m.py", 1, "orbax.checkpoint.m")
