"""``concatenate(xs, axis)``: joins inputs along an existing axis."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence

import numpy as np

from paramreg_jax._src.recipes.ops import base
from paramreg_jax._src.recipes.ops import shared
from paramreg_jax._src.sources import selection as sel_lib
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource


def _slice(value: np.ndarray, axis: int, start: int, stop: int) -> np.ndarray:
  index = [slice(None)] * value.ndim
  index[axis] = slice(start, stop)
  return value[tuple(index)]


SLICE = base.InverseStep(
  "slice", _slice, lambda axis, start, stop: f"[{start}:{stop} on axis {axis}]"
)


@dataclasses.dataclass(frozen=True)
class Concatenate(base.Recipe):
  inputs: tuple[base.Recipe, ...]
  axis: int

  inverse_steps = (SLICE,)

  def children(self) -> tuple[base.Recipe, ...]:
    return self.inputs

  def __str__(self) -> str:
    return f"concatenate({base.listing(self.inputs)}, axis={self.axis})"

  def infer(self, inputs: list[base.Meta], src: CheckpointSource) -> base.Meta:
    shared.check_join_inputs(self, inputs, self.axis, stacking=False)
    shape = tuple(
      sum(m.shape[self.axis] for m in inputs) if i == self.axis else d
      for i, d in enumerate(inputs[0].shape)
    )
    return base.Meta.of(shape, inputs[0].dtype)

  def program(self, region: sel_lib.Region, build: base.Building) -> base.Run:
    """Each input compiles only its part of ``region``; inputs outside it are not read."""
    parts, offset, (a, b) = [], 0, region[self.axis]
    for child in self.inputs:
      length = build.meta(child).shape[self.axis]
      lo, hi = max(a, offset), min(b, offset + length)
      if lo < hi:
        sub = list(region)
        sub[self.axis] = (lo - offset, hi - offset)
        parts.append(build.child(child, tuple(sub)))
      offset += length
    if len(parts) == 1:
      return parts[0]
    return lambda fetch: np.concatenate([p(fetch) for p in parts], axis=self.axis)

  def invert(self, region: base.InverseRegion, steps: base.Steps, walk: base.Walking) -> None:
    base.require_whole(self, region)
    offset = 0
    for child in self.inputs:
      meta = walk.meta(child)
      n = meta.shape[self.axis]
      step = (SLICE, self.axis, offset, offset + n)
      walk.walk(child, base.whole(len(meta.shape)), (*steps, step))
      offset += n

  def code(self, code_of: Callable[[base.Recipe], str]) -> str:
    return "R.concatenate([" + ", ".join(code_of(x) for x in self.inputs) + f"], axis={self.axis})"


def concatenate(xs: Sequence[base.Recipe], axis: int = 0) -> Concatenate:
  """Joins ``xs`` along an existing ``axis``.

  Args:
    xs: the recipes to join, in order.
    axis: the axis they are joined along; the other axes must agree.

  Returns:
    A recipe whose ``axis`` has the sum of the inputs' lengths.

  Raises:
    TypeError: an input is not a recipe, or ``axis`` is not a non-negative int.
    EmptyInputsError: (against a source) ``xs`` is empty.
    InvalidJoinAxisError: (against a source) ``axis`` is beyond the inputs' rank.
    RecipeShapeMismatchError: (against a source) the inputs differ off ``axis``.
    DtypeMismatchError: (against a source) the inputs' dtypes differ.

  Errors found against a source's metadata are raised by :func:`infer` and listed by
  :func:`~paramreg_jax.plan_restore` in its ``RestorePlanError``.

  Examples:
    >>> from paramreg_jax import recipes
    >>> print(recipes.concatenate([recipes.source("a"), recipes.source("b")], axis=1))
    concatenate([source('a'), source('b')], axis=1)
  """
  inputs = tuple(base.check_recipe(x, "each input") for x in xs)
  return Concatenate(inputs, base.check_axis(axis, "axis"))
