"""``subtract_one(x)``: elementwise ``x - 1`` (offset-normalised norm weights)."""

from __future__ import annotations

import dataclasses

import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.recipes.ops import base

# exact up to float rounding
ADD_ONE = base.InverseStep(
  "add_one", lambda value: value + np.ones((), value.dtype), lambda: "add_one"
)


@dataclasses.dataclass(frozen=True)
class SubtractOne(base.Elementwise):
  input: base.Recipe

  name = "subtract_one"
  inverse_steps = (ADD_ONE,)

  def check(self, m: base.Meta) -> None:
    if m.dtype == np.bool_:
      raise errors.UnsupportedDtypeError(f"{self}: cannot subtract one from bool; cast first")

  def apply(self, x: np.ndarray) -> np.ndarray:
    return (x - np.asarray(1, x.dtype)).astype(x.dtype)


def subtract_one(x: base.Recipe) -> SubtractOne:
  """Elementwise ``x - 1`` (offset-normalised norm weights).

  Args:
    x: the recipe, of a numeric dtype.

  Returns:
    A recipe with ``x``'s shape and dtype.

  Raises:
    TypeError: ``x`` is not a recipe.
    UnsupportedDtypeError: (against a source) ``x`` is bool (cast it first).

  Errors found against a source's metadata are raised by :func:`infer` and listed by
  :func:`~paramreg_jax.plan_restore` in its ``RestorePlanError``.

  Examples:
    >>> from paramreg_jax import recipes
    >>> print(recipes.subtract_one(recipes.source("norm")))
    subtract_one(source('norm'))
  """
  return SubtractOne(base.check_recipe(x, "subtract_one's input"))
