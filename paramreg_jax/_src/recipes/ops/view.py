"""``view(x, dtype, shape)``: the same bytes reinterpreted (no numeric conversion)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.recipes.ops import base
from paramreg_jax._src.recipes.ops import shared
from paramreg_jax._src.sources import selection as sel_lib
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource

VIEW = base.InverseStep(
  "view",
  lambda value, dtype, shape: np.ascontiguousarray(value).view(dtype).reshape(shape),
  lambda dtype, shape: f"view {dtype}",
)


@dataclasses.dataclass(frozen=True)
class View(base.Unary):
  input: base.Recipe
  dtype: np.dtype
  shape: tuple[int, ...]

  inverse_steps = (VIEW,)

  def __str__(self) -> str:
    return f"view({self.input}, {self.dtype.name}, {self.shape})"

  def infer(self, inputs: list[base.Meta], src: CheckpointSource) -> base.Meta:
    (m,) = inputs
    out = base.Meta(self.shape, base.check_dtype(self.dtype, str(self)))
    if out.nbytes != m.nbytes:
      raise errors.ByteCountMismatchError(
        f"{self}: input {m} is {m.nbytes} bytes, {self.shape} {out.dtype.name} is {out.nbytes}"
      )
    return out

  def program(self, region: sel_lib.Region, build: base.Building) -> base.Run:
    return shared.flat_span_program(self, region, build)

  def invert(self, region: base.InverseRegion, steps: base.Steps, walk: base.Walking) -> None:
    base.require_whole(self, region)
    inner = walk.meta(self.input)
    shape = tuple(inner.shape)
    step = (VIEW, np.dtype(inner.dtype), shape)
    walk.walk(self.input, base.whole(len(shape)), (*steps, step))

  def code(self, code_of: Callable[[base.Recipe], str]) -> str:
    return f"R.view({code_of(self.input)}, {self.dtype.name!r}, {self.shape})"


def view(x: base.Recipe, dtype: Any, shape: Sequence[int]) -> View:
  """Reinterprets the bytes as ``dtype`` with ``shape`` (no numeric conversion).

  Args:
    x: the recipe whose bytes are reinterpreted.
    dtype: the dtype to read the bytes as.
    shape: the output shape; it must hold exactly ``x``'s bytes.

  Returns:
    A recipe of ``shape`` and ``dtype``.

  Raises:
    TypeError: ``x`` is not a recipe, or ``shape`` is not a sequence of non-negative ints.
    UnsupportedDtypeError: ``dtype`` is not a dtype recipes support.
    ByteCountMismatchError: (against a source) ``shape`` and ``dtype`` hold a different
      number of bytes than ``x``.

  Errors found against a source's metadata are raised by :func:`infer` and listed by
  :func:`~paramreg_jax.plan_restore` in its ``RestorePlanError``.

  Examples:
    >>> import numpy as np
    >>> from paramreg_jax import recipes
    >>> print(recipes.view(recipes.source("packed"), np.uint8, (16,)))
    view(source('packed'), uint8, (16,))
  """
  x = base.check_recipe(x, "view's input")
  return View(x, base.check_dtype(dtype, "view"), base.check_ints(shape, "shape"))
