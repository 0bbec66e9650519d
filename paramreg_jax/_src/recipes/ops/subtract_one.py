"""``subtract_one(x)``: elementwise ``x - 1`` (offset-normalised norm weights)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.recipes.ops import base
from paramreg_jax._src.sources import selection as sel_lib
from paramreg_jax._src.sources.base import CheckpointSource

# exact up to float rounding
ADD_ONE = base.InverseStep(
  "add_one", lambda value: value + np.ones((), value.dtype), lambda: "add_one"
)


def _subtract_one(x: np.ndarray) -> np.ndarray:
  return (x - np.asarray(1, x.dtype)).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class SubtractOne(base.Unary):
  input: base.Recipe

  inverse_steps = (ADD_ONE,)

  def __str__(self) -> str:
    return f"subtract_one({self.input})"

  def infer(self, inputs: list[base.Meta], src: CheckpointSource) -> base.Meta:
    (m,) = inputs
    if m.dtype == np.bool_:
      raise errors.UnsupportedDtypeError(f"{self}: cannot subtract one from bool; cast first")
    return m

  def program(self, region: sel_lib.Region, build: base.Building) -> base.Run:
    operand = build.child(self.input, region)
    return lambda fetch: _subtract_one(operand(fetch))

  def invert(self, region: base.InverseRegion, steps: base.Steps, walk: base.Walking) -> None:
    walk.walk(self.input, region, (*steps, ("add_one",)))

  def code(self, code_of: Callable[[base.Recipe], str]) -> str:
    return f"R.subtract_one({code_of(self.input)})"


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
