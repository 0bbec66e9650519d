"""Every mutation CI runs (``.ci/mutations.py``) still applies to the code: its text occurs
exactly once in its file. A refactor that moves or rewrites mutated code fails here, naming
where the code is now, instead of in CI's mutation stage after the suite."""

import importlib.util
import pathlib
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / ".ci" / "mutations.py"


def _script():
  if not SCRIPT.is_file():  # a copy of the package and tests only (the mutation runs' own)
    pytest.skip(f"{SCRIPT} is not beside the tests")
  spec = importlib.util.spec_from_file_location("ci_mutations", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  sys.modules.setdefault(spec.name, module)  # dataclasses look their module up
  spec.loader.exec_module(module)
  return module


def test_every_mutation_applies_exactly_once():
  script = _script()
  problems = [f"{m.name}: {why}" for m in script.MUTATIONS if (why := script.misplaced(m))]
  assert not problems, "\n".join(problems)


def test_a_moved_mutation_is_reported_with_where_it_went(tmp_path):
  script = _script()
  (tmp_path / "paramreg_jax" / "a").mkdir(parents=True)
  (tmp_path / "paramreg_jax" / "a" / "old.py").write_text("x = 1\n")
  (tmp_path / "paramreg_jax" / "a" / "new.py").write_text("y = 2\n")
  moved = script.Mutation("m", "paramreg_jax/a/old.py", "y = 2\n", "y = 3\n", ())
  assert script.misplaced(moved, tmp_path) == (
    "the code to mutate occurs 0 times in paramreg_jax/a/old.py, not once: it is now in "
    "['paramreg_jax/a/new.py']; update its path or text in .ci/mutations.py (and check its "
    "tests still target it)"
  )
  assert (
    script.misplaced(script.Mutation("m", "paramreg_jax/a/new.py", "y = 2\n", "", ()), tmp_path)
    is None
  )
