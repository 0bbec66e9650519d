"""``select(x, selection)``: a further ``Range``/``Indices`` of a derived value."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from paramreg_jax._src.recipes.ops import base
from paramreg_jax._src.sources import selection as sel_lib
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource


@dataclasses.dataclass(frozen=True)
class Select(base.Unary):
  input: base.Recipe
  selection: sel_lib.Selection

  def __str__(self) -> str:
    return f"select({self.input}, {self.selection})"

  def infer(self, inputs: list[base.Meta], src: CheckpointSource) -> base.Meta:
    (m,) = inputs
    return base.Meta.of(self.selection.apply_shape(m.shape, where=self), m.dtype)

  def program(self, region: sel_lib.Region, build: base.Building) -> base.Run:
    return base.selected(lambda r: build.child(self.input, r), self.selection, region)

  def invert(self, region: base.InverseRegion, steps: base.Steps, walk: base.Walking) -> None:
    shape = tuple(walk.meta(self.input).shape)
    walk.walk(self.input, walk.compose(region, self.selection, shape), steps)

  def code(self, code_of: Callable[[base.Recipe], str]) -> str:
    return f"R.select({code_of(self.input)}, {base.selection_code(self.selection)})"


def select(x: base.Recipe, selection: Any) -> Select:
  """A further ``Range``/``Indices`` selection of a derived value.

  Args:
    x: the recipe whose output is selected from.
    selection: a :class:`~paramreg_jax.Range` or :class:`~paramreg_jax.Indices` along one
      axis of ``x``'s output.

  Returns:
    A recipe; only the blocks of ``x`` the selection needs are read.

  Raises:
    TypeError: ``x`` is not a recipe.
    SelectionError: ``selection`` is not a selection, or (against a source) does not fit
      ``x``'s shape.

  Errors found against a source's metadata are raised by :func:`infer` and listed by
  :func:`~paramreg_jax.plan_restore` in its ``RestorePlanError``.

  Examples:
    >>> from paramreg_jax import recipes
    >>> from paramreg_jax import Indices
    >>> print(recipes.select(recipes.source("w"), Indices(0, [2, 0])))
    select(source('w'), Indices(axis=0, [2, 0]))
  """
  return Select(base.check_recipe(x, "select's input"), sel_lib.check_selection(selection))
