"""The public surface after the move of 0.1.0.dev0: each name has one home, and every name
that moved still imports from its old place for one release, with a warning naming the new
one (and the same object)."""

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

MOVED = [
  # (old module, name, new module)
  *[
    ("paramreg_jax", n, "paramreg_jax.errors")
    for n in (
      "ExportPlanError",
      "KeyCollisionError",
      "MalformedKeyError",
      "NamedSlotHijackError",
      "OrderingContractError",
      "PatternError",
      "RecipeError",
      "ShapeMismatchError",
      "StoreError",
      "UnknownKeyPrefixError",
    )
  ],
  *[
    ("paramreg_jax", n, "paramreg_jax.sources")
    for n in ("CheckpointLease", "CheckpointSource", "TensorMetadata")
  ],
  *[
    ("paramreg_jax.sources", n, "paramreg_jax")
    for n in ("Full", "Indices", "MemorySource", "OrbaxSource", "Range", "SafetensorsSource")
  ],
  ("paramreg_jax.sources", "UnknownTensorError", "paramreg_jax.errors"),
  ("paramreg_jax.sources", "StoreError", "paramreg_jax.errors"),
  ("paramreg_jax.recipes", "RecipeError", "paramreg_jax.errors"),
  ("paramreg_jax.recipes", "UnknownSourceKeyError", "paramreg_jax.errors"),
]


@pytest.mark.parametrize(("old", "name", "new"), MOVED, ids=lambda x: str(x))
def test_a_moved_name_still_imports_with_a_warning_that_names_its_home(old, name, new):
  with pytest.warns(DeprecationWarning, match=rf"{old}\.{name} moved to {new}\.{name}"):
    value = getattr(importlib.import_module(old), name)
  assert value is getattr(importlib.import_module(new), name)
  assert name not in importlib.import_module(old).__all__


def test_from_import_of_a_moved_name_works():
  with pytest.warns(DeprecationWarning, match="paramreg_jax.sources.MemorySource moved"):
    from paramreg_jax.sources import MemorySource
  assert MemorySource is paramreg_jax.MemorySource


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
