"""The public surface: each name has one home, and a name asked for in a module that does not
export it is an AttributeError that says which module does."""

import importlib
import warnings

import pytest

import paramreg_jax
import paramreg_jax.errors
import paramreg_jax.recipes
import paramreg_jax.sources

TOP_ERRORS = {
  "BindError",
  "ExportError",
  "MatchError",
  "MaterializationError",
  "ParamRegError",
  "ReconcileError",
  "RestorePlanError",
  "StateMismatchError",
}

ELSEWHERE = [
  # (asked for in, name, its home)
  ("paramreg_jax", "RecipeError", "paramreg_jax.errors"),
  ("paramreg_jax", "CheckpointSource", "paramreg_jax.sources"),
  ("paramreg_jax", "TensorMetadata", "paramreg_jax.sources"),
  ("paramreg_jax.sources", "MemorySource", "paramreg_jax"),
  ("paramreg_jax.sources", "UnknownTensorError", "paramreg_jax.errors"),
  ("paramreg_jax.recipes", "UnknownSourceKeyError", "paramreg_jax.errors"),
  ("paramreg_jax.recipes", "Hints", "paramreg_jax.typing"),
]


@pytest.mark.parametrize(("module", "name", "home"), ELSEWHERE, ids=lambda x: str(x))
def test_a_name_asked_for_in_the_wrong_module_says_where_it_is(module, name, home):
  assert name in importlib.import_module(home).__all__  # the example is still true
  with pytest.raises(AttributeError) as info:
    getattr(importlib.import_module(module), name)
  assert str(info.value) == (f"module {module!r} has no attribute {name!r}; it is {home}.{name}")


def test_nothing_moved_is_left_behind_with_a_warning():
  """0.1 was never released: the names that moved in its development are gone from their old
  places, without a DeprecationWarning anywhere in the package."""
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    with pytest.raises(ImportError):
      from paramreg_jax.sources import MemorySource  # noqa: F401
  backend = paramreg_jax.JaxBackend()
  for old in ("materialize", "materialize_recipe", "materialized_weight", "finish_materialization"):
    assert not hasattr(backend, old), old


def test_an_unknown_name_is_still_an_attribute_error():
  with pytest.raises(AttributeError, match="has no attribute 'NoSuchName'"):
    paramreg_jax.NoSuchName  # noqa: B018


def test_each_name_is_exported_once():
  """Besides the top-level aliases of the most-caught errors, no name is in two ``__all__``."""
  homes = {}
  modules = [
    paramreg_jax,
    paramreg_jax.sources,
    paramreg_jax.recipes,
    paramreg_jax.errors,
    paramreg_jax.typing,
  ]
  for module in modules:
    for name in module.__all__:
      homes.setdefault(name, []).append(module.__name__)
  twice = {n: m for n, m in homes.items() if len(m) > 1}
  assert set(twice) == TOP_ERRORS, twice
  for name in TOP_ERRORS:
    assert getattr(paramreg_jax, name) is getattr(paramreg_jax.errors, name)


def test_every_error_is_in_errors_and_is_named_by_it():
  import inspect

  from paramreg_jax._src import errors as src_errors

  defined = {
    n
    for n, c in vars(src_errors).items()
    if inspect.isclass(c) and issubclass(c, src_errors.ParamRegError)
  }
  assert defined == set(paramreg_jax.errors.__all__)
  for name in defined:
    assert getattr(paramreg_jax.errors, name).__module__ == "paramreg_jax.errors"


def test_current_names_import_without_warnings():
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    for module in (
      paramreg_jax,
      paramreg_jax.sources,
      paramreg_jax.recipes,
      paramreg_jax.errors,
      paramreg_jax.typing,
    ):
      for name in module.__all__:
        getattr(module, name)
