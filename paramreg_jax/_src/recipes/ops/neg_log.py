"""``neg_log(x)``: elementwise ``log(-x)`` (a stored ``A`` to the ``A_log`` a model expects)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import ml_dtypes
import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.recipes.ops import base
from paramreg_jax._src.sources import selection as sel_lib
from paramreg_jax._src.sources.base import CheckpointSource

# exact up to float rounding
NEG_EXP = base.InverseStep("neg_exp", lambda value: -np.exp(value), lambda: "neg_exp")


def _neg_log(x: np.ndarray, node: NegLog) -> np.ndarray:
  """``log(-x)``, refused where it is undefined: a value at or above zero would load as NaN
  or -inf without an error (the tensor is then not an ``A``, often already its log)."""
  bad = np.flatnonzero(~(x < 0) & ~np.isnan(x))
  if bad.size:
    first = np.unravel_index(int(bad[0]), x.shape)
    raise errors.UndefinedValueError(
      f"{node}: {bad.size} of {x.size} values are >= 0, where log(-x) is undefined (the "
      f"first, {x[first].item()!r}, at {tuple(int(i) for i in first)} of the box read); "
      "the stored tensor is not a negative A: if it already holds A_log, read it without "
      "neg_log"
    )
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.log(-x).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class NegLog(base.Unary):
  input: base.Recipe

  inverse_steps = (NEG_EXP,)

  def __str__(self) -> str:
    return f"neg_log({self.input})"

  def infer(self, inputs: list[base.Meta], src: CheckpointSource) -> base.Meta:
    (m,) = inputs
    if not np.issubdtype(m.dtype, np.floating) and m.dtype != np.dtype(ml_dtypes.bfloat16):
      raise errors.UnsupportedDtypeError(
        f"{self}: log needs a floating dtype, got {m.dtype.name}; cast first"
      )
    return m

  def program(self, region: sel_lib.Region, build: base.Building) -> base.Run:
    operand = build.child(self.input, region)
    return lambda fetch: _neg_log(operand(fetch), self)

  def invert(self, region: base.InverseRegion, steps: base.Steps, walk: base.Walking) -> None:
    walk.walk(self.input, region, (*steps, ("neg_exp",)))

  def code(self, code_of: Callable[[base.Recipe], str]) -> str:
    return f"R.neg_log({code_of(self.input)})"


def neg_log(x: base.Recipe) -> NegLog:
  """Elementwise ``log(-x)`` (e.g. a stored ``A`` to the ``A_log`` a model expects).

  Args:
    x: the recipe, of a float dtype.

  Returns:
    A recipe with ``x``'s shape and dtype.

  Raises:
    TypeError: ``x`` is not a recipe.
    UnsupportedDtypeError: (against a source) ``x`` is not a float (cast it first).

  Errors found against a source's metadata are raised by :func:`infer` and listed by
  :func:`~paramreg_jax.plan_restore` in its ``RestorePlanError``.

  Examples:
    >>> from paramreg_jax import recipes
    >>> print(recipes.neg_log(recipes.source("A")))
    neg_log(source('A'))
  """
  return NegLog(base.check_recipe(x, "neg_log's input"))
