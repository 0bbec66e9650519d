"""Helpers two ops share (not ops: an op is a module with a ``Recipe`` and its rules).

- ``flat_span_program``: what ``reshape`` and ``view`` share, a box of the output built from
  the input's rows that span its flat (byte) range, at most that span plus two input rows;
- ``check_join_inputs``: what ``concatenate`` and ``stack`` share, their inputs' checks.
"""

from __future__ import annotations

import math

import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.recipes.ops import base
from paramreg_jax._src.sources import selection as sel_lib


def flat_span_program(node: base.Unary, region: sel_lib.Region, build: base.Building) -> base.Run:
  """The input rows spanning ``region``'s flat byte range, then a gather."""
  out_meta, in_meta = build.meta(node), build.meta(node.input)
  out_shape, in_shape = out_meta.shape, in_meta.shape
  corners = [tuple(a for a, _ in region), tuple(b - 1 for _, b in region)]
  first, last = (int(np.ravel_multi_index(c, out_shape)) if out_shape else 0 for c in corners)
  osz, isz = out_meta.dtype.itemsize, in_meta.dtype.itemsize
  byte_lo, byte_hi = first * osz, (last + 1) * osz
  elem_lo, elem_hi = byte_lo // isz, -(-byte_hi // isz)  # input elements spanning the bytes
  if in_shape:
    row = math.prod(in_shape[1:])
    r0, r1 = elem_lo // row, -(-elem_hi // row)
    in_region: sel_lib.Region = ((r0, r1), *((0, d) for d in in_shape[1:]))
    base_elem = r0 * row
  else:
    in_region, base_elem = (), 0
  child = build.child(node.input, in_region)
  grid = np.ix_(*(np.arange(a, b) for a, b in region)) if region else ()
  positions = np.ravel_multi_index(grid, out_shape) - first if region else np.zeros((), int)
  lo, hi = byte_lo - base_elem * isz, byte_hi - base_elem * isz

  def run(fetch: base.Fetch) -> np.ndarray:
    raw = np.ascontiguousarray(child(fetch)).reshape(-1).view(np.uint8)[lo:hi]
    return np.asarray(raw.view(out_meta.dtype)[positions], out_meta.dtype)

  return run


def check_join_inputs(
  node: base.Recipe, inputs: list[base.Meta], axis: int, stacking: bool
) -> None:
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
