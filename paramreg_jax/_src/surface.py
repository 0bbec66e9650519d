"""The public modules' ``__getattr__``: a name a module does not export is an
``AttributeError`` that says which public module does (``prj.RecipeError`` is
``paramreg_jax.errors.RecipeError``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

PUBLIC = (
  "paramreg_jax",
  "paramreg_jax.errors",
  "paramreg_jax.recipes",
  "paramreg_jax.sources",
  "paramreg_jax.typing",
)


def elsewhere(module: str) -> Callable[[str], Any]:
  """A module ``__getattr__`` for ``module``: always an ``AttributeError``, naming the public
  module that exports the name when one does."""

  def __getattr__(name: str) -> Any:
    homes = (
      []
      if name.startswith("__")
      else [  # dunders: asked for by tools, often mid-import
        other
        for other in PUBLIC
        if other != module and name in getattr(importlib.import_module(other), "__all__", ())
      ]
    )
    where = f"; it is {homes[0]}.{name}" if homes else ""
    raise AttributeError(f"module {module!r} has no attribute {name!r}{where}")

  return __getattr__
