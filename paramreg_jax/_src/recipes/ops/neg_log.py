"""``neg_log(x)``: elementwise ``log(-x)`` (a stored ``A`` to the ``A_log`` a model expects)."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.recipes.ops import base

# exact up to float rounding
NEG_EXP = base.InverseStep("neg_exp", lambda value: -np.exp(value), lambda: "neg_exp")


@dataclasses.dataclass(frozen=True)
class NegLog(base.Elementwise):
  input: base.Recipe

  name = "neg_log"
  inverse_steps = (NEG_EXP,)

  def check(self, m: base.Meta) -> None:
    if not np.issubdtype(m.dtype, np.floating) and m.dtype != np.dtype(ml_dtypes.bfloat16):
      raise errors.UnsupportedDtypeError(
        f"{self}: log needs a floating dtype, got {m.dtype.name}; cast first"
      )

  def apply(self, x: np.ndarray) -> np.ndarray:
    """``log(-x)``, refused where it is undefined: a value at or above zero would load as NaN
    or -inf without an error (the tensor is then not an ``A``, often already its log)."""
    bad = np.flatnonzero(~(x < 0) & ~np.isnan(x))
    if bad.size:
      first = np.unravel_index(int(bad[0]), x.shape)
      raise errors.UndefinedValueError(
        f"{self}: {bad.size} of {x.size} values are >= 0, where log(-x) is undefined (the "
        f"first, {x[first].item()!r}, at {tuple(int(i) for i in first)} of the box read); "
        "the stored tensor is not a negative A: if it already holds A_log, read it without "
        "neg_log"
      )
    with np.errstate(invalid="ignore", divide="ignore"):
      return np.log(-x).astype(x.dtype)


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
