"""The public surface: __all__ sorted, unique, importable, documented with Examples."""

import inspect

import pytest

import paramreg_jax
import paramreg_jax.errors
import paramreg_jax.recipes
import paramreg_jax.sources


@pytest.mark.parametrize("module", [paramreg_jax], ids=lambda m: m.__name__)
def test_all_is_sorted_and_unique(module):
  names = list(module.__all__)

  # isort-style (what ruff's RUF022 enforces): CONSTANTS, then Classes, then functions.
  def kind(name):
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

  assert names == sorted(names, key=kind)
  assert len(names) == len(set(names))


MODULES = [paramreg_jax, paramreg_jax.recipes, paramreg_jax.sources, paramreg_jax.errors]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_every_name_is_importable_and_documented(module):
  undocumented, no_examples = [], []
  for name in module.__all__:
    obj = getattr(module, name)
    if isinstance(obj, str):
      continue  # constants
    doc = inspect.getdoc(obj) or ""
    if not doc:
      undocumented.append(name)
    is_error = inspect.isclass(obj) and issubclass(obj, BaseException)
    if not is_error and "Examples:" not in doc:
      no_examples.append(name)
  assert not undocumented, undocumented
  assert not no_examples, no_examples


def test_version():
  assert isinstance(paramreg_jax.__version__, str) and paramreg_jax.__version__


def test_import_does_no_work(tmp_path):
  import subprocess
  import sys

  code = "import sys, paramreg_jax; assert 'orbax.checkpoint' not in sys.modules, 'orbax imported eagerly'"
  subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
