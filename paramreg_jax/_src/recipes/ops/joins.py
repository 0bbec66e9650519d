"""What ``concatenate`` and ``stack`` share: their inputs' checks."""

from __future__ import annotations

from paramreg_jax._src import errors
from paramreg_jax._src.recipes.ops import base


def check_inputs(node: base.Recipe, inputs: list[base.Meta], axis: int, stacking: bool) -> None:
  """One dtype, an axis in range, and shapes that join (equal, or equal off ``axis``)."""
  if not inputs:
    raise errors.EmptyInputsError(f"{node}: needs at least one input")
  if len({m.dtype for m in inputs}) > 1:
    raise errors.DtypeMismatchError(
      f"{node}: inputs have dtypes {[m.dtype.name for m in inputs]}; cast them to one dtype first"
    )
  rank = len(inputs[0].shape)
  if axis > rank or (not stacking and axis >= rank):
    raise errors.InvalidJoinAxisError(
      f"{node}: axis {axis} is out of range for inputs of rank {rank} "
      f"({'stack allows 0..rank' if stacking else 'concatenate allows 0..rank-1'})"
    )
  first = inputs[0].shape
  for m in inputs[1:]:
    if stacking:
      same = m.shape == first
    else:
      same = len(m.shape) == rank and all(
        a == b for i, (a, b) in enumerate(zip(m.shape, first)) if i != axis
      )
    if not same:
      how = "stacked (all must be equal)" if stacking else f"concatenated along axis {axis}"
      raise errors.RecipeShapeMismatchError(
        f"{node}: input shapes {[m.shape for m in inputs]} cannot be {how}"
      )
