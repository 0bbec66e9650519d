"""``stack(xs, axis)``: joins inputs along a new axis (unstacked layers → one scanned array)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from collections.abc import Sequence

import numpy as np

from paramreg_jax._src.recipes.ops import base
from paramreg_jax._src.recipes.ops import shared
from paramreg_jax._src.sources import selection as sel_lib
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource

TAKE = base.InverseStep(
  "take",
  lambda value, axis, i: np.take(value, i, axis=axis),
  lambda axis, i: f"[{i} on axis {axis}]",
)


@dataclasses.dataclass(frozen=True)
class Stack(base.Recipe):
  inputs: tuple[base.Recipe, ...]
  axis: int

  inverse_steps = (TAKE,)

  def children(self) -> tuple[base.Recipe, ...]:
    return self.inputs

  def __str__(self) -> str:
    return f"stack({base.listing(self.inputs)}, axis={self.axis})"

  def infer(self, inputs: list[base.Meta], src: CheckpointSource) -> base.Meta:
    shared.check_join_inputs(self, inputs, self.axis, stacking=True)
    first = inputs[0].shape
    return base.Meta.of((*first[: self.axis], len(inputs), *first[self.axis :]), inputs[0].dtype)

  def program(self, region: sel_lib.Region, build: base.Building) -> base.Run:
    """Only the inputs ``region`` covers, each on ``region`` without the stacked axis."""
    a, b = region[self.axis]
    rest = region[: self.axis] + region[self.axis + 1 :]
    layers = [build.child(self.inputs[i], rest) for i in range(a, b)]
    return lambda fetch: np.stack([f(fetch) for f in layers], axis=self.axis)

  def invert(self, region: base.InverseRegion, steps: base.Steps, walk: base.Walking) -> None:
    base.require_whole(self, region)
    for i, child in enumerate(self.inputs):
      rank = len(walk.meta(child).shape)
      walk.walk(child, base.whole(rank), (*steps, (TAKE, self.axis, i)))

  def code(self, code_of: Callable[[base.Recipe], str]) -> str:
    codes = [code_of(x) for x in self.inputs]
    inner = _layer_loop(codes) or "[" + ", ".join(codes) + "]"
    return f"R.stack({inner}, axis={self.axis})"


def _layer_loop(codes: list[str]) -> str | None:
  """``[<code of layer i> for i in range(n)]`` when the codes differ only in the layer number
  of their checkpoint keys (``.3.``, ``/3/``, ``_3.``), else None."""
  for sep_l, sep_r in ((".", "."), ("/", "/"), ("_", "."), ("_", "/")):
    template = codes[0].replace(f"{sep_l}0{sep_r}", f"{sep_l}{{i}}{sep_r}")
    if template == codes[0]:
      continue
    if all(template.replace("{i}", str(i)) == c for i, c in enumerate(codes)):
      in_keys = sum(k.count("{i}") for k in re.findall(r"R\.source\('([^']*)'", template))
      if in_keys == template.count("{i}"):  # the number only ever varies inside the keys
        loop = template.replace("R.source('", "R.source(f'")
        return f"[{loop} for i in range({len(codes)})]"
  return None


def stack(xs: Sequence[base.Recipe], axis: int = 0) -> Stack:
  """Joins ``xs`` along a new ``axis`` (unstacked layers → one scanned array).

  Args:
    xs: the recipes to stack, in order (layer 0 first).
    axis: where the new axis goes (``0`` for ``nnx.scan``'s layer axis).

  Returns:
    A recipe with one more axis than its inputs, of length ``len(xs)``.

  Raises:
    TypeError: an input is not a recipe, or ``axis`` is not a non-negative int.
    EmptyInputsError: (against a source) ``xs`` is empty.
    InvalidJoinAxisError: (against a source) ``axis`` is beyond the inputs' rank.
    RecipeShapeMismatchError: (against a source) the inputs' shapes differ.
    DtypeMismatchError: (against a source) the inputs' dtypes differ.

  Errors found against a source's metadata are raised by :func:`infer` and listed by
  :func:`~paramreg_jax.plan_restore` in its ``RestorePlanError``.

  Examples:
    >>> from paramreg_jax import recipes
    >>> print(recipes.stack([recipes.source(f"layer{i}/w") for i in range(2)]))
    stack([source('layer0/w'), source('layer1/w')], axis=0)
  """
  inputs = tuple(base.check_recipe(x, "each input") for x in xs)
  return Stack(inputs, base.check_axis(axis, "axis"))
