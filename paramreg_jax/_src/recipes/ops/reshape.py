"""``reshape(x, shape)``: row-major, the element count unchanged."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from collections.abc import Sequence

import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.recipes.ops import base
from paramreg_jax._src.recipes.ops import shared
from paramreg_jax._src.sources import selection as sel_lib
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource

RESHAPE = base.InverseStep("reshape", np.reshape, lambda shape: f"reshape {shape}")


@dataclasses.dataclass(frozen=True)
class Reshape(base.Unary):
  input: base.Recipe
  shape: tuple[int, ...]

  inverse_steps = (RESHAPE,)

  def __str__(self) -> str:
    return f"reshape({self.input}, {self.shape})"

  def infer(self, inputs: list[base.Meta], src: CheckpointSource) -> base.Meta:
    (m,) = inputs
    if math.prod(self.shape) != math.prod(m.shape):
      raise errors.ElementCountMismatchError(
        f"{self}: input {m.shape} has {math.prod(m.shape)} elements, {self.shape} has "
        f"{math.prod(self.shape)}"
      )
    return base.Meta.of(tuple(self.shape), m.dtype)

  def program(self, region: sel_lib.Region, build: base.Building) -> base.Run:
    return shared.flat_span_program(self, region, build)

  def invert(self, region: base.InverseRegion, steps: base.Steps, walk: base.Walking) -> None:
    base.require_whole(self, region)
    shape = tuple(walk.meta(self.input).shape)
    walk.walk(self.input, base.whole(len(shape)), (*steps, (RESHAPE, shape)))

  def code(self, code_of: Callable[[base.Recipe], str]) -> str:
    return f"R.reshape({code_of(self.input)}, {self.shape})"


def reshape(x: base.Recipe, shape: Sequence[int]) -> Reshape:
  """Row-major reshape; the element count must not change.

  Args:
    x: the recipe to reshape.
    shape: the new shape (non-negative ints; no ``-1``).

  Returns:
    A recipe of shape ``shape``.

  Raises:
    TypeError: ``x`` is not a recipe, or ``shape`` is not a sequence of non-negative ints.
    ElementCountMismatchError: (against a source) ``shape`` holds a different number of
      elements than ``x``.

  Errors found against a source's metadata are raised by :func:`infer` and listed by
  :func:`~paramreg_jax.plan_restore` in its ``RestorePlanError``.

  Examples:
    >>> from paramreg_jax import recipes
    >>> print(recipes.reshape(recipes.source("w"), (2, 8)))
    reshape(source('w'), (2, 8))
  """
  return Reshape(base.check_recipe(x, "reshape's input"), base.check_ints(shape, "shape"))
