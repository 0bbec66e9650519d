"""``cast(x, dtype)``: numeric conversion."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from paramreg_jax._src.recipes.ops import base
from paramreg_jax._src.sources import selection as sel_lib
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource

ASTYPE = base.InverseStep(
  "astype", lambda value, dtype: value.astype(dtype, copy=False), lambda dtype: f"cast {dtype}"
)


@dataclasses.dataclass(frozen=True)
class Cast(base.Unary):
  input: base.Recipe
  dtype: np.dtype

  inverse_steps = (ASTYPE,)

  def __str__(self) -> str:
    return f"cast({self.input}, {self.dtype.name})"

  def infer(self, inputs: list[base.Meta], src: CheckpointSource) -> base.Meta:
    (m,) = inputs
    return base.Meta.of(m.shape, base.check_dtype(self.dtype, self))

  def program(self, region: sel_lib.Region, build: base.Building) -> base.Run:
    operand = build.child(self.input, region)
    return lambda fetch: operand(fetch).astype(self.dtype)

  def invert(self, region: base.InverseRegion, steps: base.Steps, walk: base.Walking) -> None:
    stored = np.dtype(walk.meta(self.input).dtype)
    walk.walk(self.input, region, (*steps, (ASTYPE, stored)))

  def code(self, code_of: Callable[[base.Recipe], str]) -> str:
    return f"R.cast({code_of(self.input)}, {self.dtype.name!r})"


def cast(x: base.Recipe, dtype: Any) -> Cast:
  """Numeric conversion to ``dtype``.

  Args:
    x: the recipe to convert.
    dtype: a numpy or ml_dtypes dtype (``jnp.bfloat16``, ``"float32"``).

  Returns:
    A recipe with ``x``'s shape and dtype ``dtype``.

  Raises:
    TypeError: ``x`` is not a recipe.
    UnsupportedDtypeError: ``dtype`` is not a dtype recipes support.

  Examples:
    >>> import jax.numpy as jnp
    >>> from paramreg_jax import recipes
    >>> print(recipes.cast(recipes.source("w"), jnp.bfloat16))
    cast(source('w'), bfloat16)
  """
  return Cast(base.check_recipe(x, "cast's input"), base.check_dtype(dtype, "cast"))
