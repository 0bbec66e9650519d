"""``transpose(x, axes)``: output axis ``i`` is input axis ``axes[i]``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.recipes.ops import base
from paramreg_jax._src.sources import selection as sel_lib
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource

TRANSPOSE = base.InverseStep("transpose", np.transpose, lambda axes: f"transpose {axes}")


@dataclasses.dataclass(frozen=True)
class Transpose(base.Unary):
  input: base.Recipe
  axes: tuple[int, ...]

  inverse_steps = (TRANSPOSE,)

  def __str__(self) -> str:
    return f"transpose({self.input}, {self.axes})"

  def infer(self, inputs: list[base.Meta], src: CheckpointSource) -> base.Meta:
    (m,) = inputs
    if sorted(self.axes) != list(range(len(m.shape))):
      raise errors.InvalidPermutationError(
        f"{self}: axes {self.axes} are not a permutation of 0..{len(m.shape) - 1} (input {m.shape})"
      )
    return base.Meta.of(tuple(m.shape[a] for a in self.axes), m.dtype)

  def program(self, region: sel_lib.Region, build: base.Building) -> base.Run:
    """Exactly ``region``, permuted back; the result is a view (copied once, later)."""
    inner: list[Any] = [None] * len(region)
    for out_axis, in_axis in enumerate(self.axes):
      inner[in_axis] = region[out_axis]
    permuted = build.child(self.input, tuple(inner))
    return lambda fetch: np.transpose(permuted(fetch), self.axes)

  def invert(self, region: base.InverseRegion, steps: base.Steps, walk: base.Walking) -> None:
    back = tuple(int(i) for i in np.argsort(self.axes))
    moved: list[Any] = [None] * len(region)
    for i, axis in enumerate(self.axes):
      moved[axis] = region[i]
    walk.walk(self.input, tuple(moved), (*steps, (TRANSPOSE, back)))

  def code(self, code_of: Callable[[base.Recipe], str]) -> str:
    return f"R.transpose({code_of(self.input)}, {self.axes})"


def transpose(x: base.Recipe, axes: Sequence[int]) -> Transpose:
  """Permutes axes: output axis ``i`` is input axis ``axes[i]`` (``[out, in]`` → ``[in, out]``).

  Args:
    x: the recipe to transpose.
    axes: a permutation of ``range(x.ndim)``, as in ``numpy.transpose``.

  Returns:
    A recipe of shape ``[x.shape[a] for a in axes]``.

  Raises:
    TypeError: ``x`` is not a recipe, or ``axes`` is not a sequence of non-negative ints.
    InvalidPermutationError: (against a source) ``axes`` is not a permutation of ``x``'s
      axes.

  Errors found against a source's metadata are raised by :func:`infer` and listed by
  :func:`~paramreg_jax.plan_restore` in its ``RestorePlanError``.

  Examples:
    >>> from paramreg_jax import recipes
    >>> print(recipes.transpose(recipes.source("w"), (1, 0)))
    transpose(source('w'), (1, 0))
  """
  return Transpose(base.check_recipe(x, "transpose's input"), base.check_ints(axes, "axes"))
