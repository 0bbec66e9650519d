"""Evaluating recipes on host, reading only what the requested output region needs.

Selection pushdown: a region of the output is mapped back through each operation to the
smallest regions of the sources that produce it, and only those are read.

Exact read bounds per operation (for an output region R):
  * source / select / cast / neg_log / subtract_one: exactly the elements of R (for
    ``Indices``, each distinct selected index once);
  * transpose: exactly R, permuted back;
  * concatenate: for each input, only its part of R (inputs outside R are not read);
  * stack: only the stacked inputs R covers, each on R without the stacked axis;
  * reshape / view: the input's leading-axis rows that span R's flat (byte) range: at most
    R's flat span plus two input rows.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from paramreg_jax._src import selection as sel_lib
from paramreg_jax._src.recipes import ops


def evaluate(recipe: ops.Recipe, src: Any, index: Any = None) -> np.ndarray:
  """The value of ``recipe`` (or just the region ``index`` of it) as a numpy array.

  Args:
    recipe: a recipe.
    src: a checkpoint source.
    index: ``None`` for the whole output, or a tuple of slices into the output shape.

  Returns:
    ``evaluate(recipe, src)[index]``, computed reading only what that region needs.

  Examples:
    >>> import numpy as np
    >>> from paramreg_jax import recipes
    >>> from paramreg_jax.sources import MemorySource
    >>> src = MemorySource({"left": np.ones((2, 3), np.float32), "right": np.zeros((2, 3), np.float32)})
    >>> r = recipes.concatenate([recipes.source("left"), recipes.source("right")], axis=0)
    >>> recipes.evaluate(r, src, (slice(1, 3),)).tolist(), src.stats.bytes_read
    ([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], 24)
  """
  memo: dict[int, Any] = {}
  meta = ops._infer(ops._check_recipe(recipe, "recipe"), src, memo)
  region = sel_lib.normalize_index(index, meta.shape, where=str(recipe))
  return np.ascontiguousarray(_eval(recipe, src, region, memo))


def _meta(node: ops.Recipe, memo: dict[int, Any]) -> Any:
  return memo[id(node)]


def _eval(node: ops.Recipe, src: Any, region: sel_lib.Region, memo: dict[int, Any]) -> np.ndarray:
  meta = _meta(node, memo)
  if any(a == b for a, b in region):
    return np.empty(sel_lib.region_shape(region), meta.dtype)
  if isinstance(node, ops.Source):
    return src.lease(node.key, node.selection).read(sel_lib.region_slices(region))
  if isinstance(node, ops.Select):
    return sel_lib.read_selected(
      lambda r: _eval(node.input, src, r, memo), node.selection, region, meta.dtype
    )
  if isinstance(node, ops.Concatenate):
    parts, offset, (a, b) = [], 0, region[node.axis]
    for child in node.inputs:
      length = _meta(child, memo).shape[node.axis]
      lo, hi = max(a, offset), min(b, offset + length)
      if lo < hi:
        sub = list(region)
        sub[node.axis] = (lo - offset, hi - offset)
        parts.append(_eval(child, src, tuple(sub), memo))
      offset += length
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=node.axis)
  if isinstance(node, ops.Stack):
    a, b = region[node.axis]
    rest = region[: node.axis] + region[node.axis + 1 :]
    return np.stack([_eval(node.inputs[i], src, rest, memo) for i in range(a, b)], axis=node.axis)
  if isinstance(node, ops.Transpose):
    inner = [None] * len(region)
    for out_axis, in_axis in enumerate(node.axes):
      inner[in_axis] = region[out_axis]  # type: ignore[call-overload]
    value = _eval(node.input, src, tuple(inner), memo)  # type: ignore[arg-type]
    return np.transpose(value, node.axes)
  if isinstance(node, ops.Cast):
    return _eval(node.input, src, region, memo).astype(node.dtype)
  if isinstance(node, ops.NegLog):
    x = _eval(node.input, src, region, memo)
    with np.errstate(invalid="ignore", divide="ignore"):
      return np.log(-x).astype(x.dtype)
  if isinstance(node, ops.SubtractOne):
    x = _eval(node.input, src, region, memo)
    return (x - np.asarray(1, x.dtype)).astype(x.dtype)
  if isinstance(node, (ops.Reshape, ops.View)):
    return _eval_flat(node, src, region, memo)
  raise TypeError(f"unknown recipe node {node!r}")


def _eval_flat(
  node: ops.Reshape | ops.View, src: Any, region: sel_lib.Region, memo: dict[int, Any]
) -> np.ndarray:
  """Reshape/view: read the input rows spanning the region's flat range, then gather."""
  out_meta = _meta(node, memo)
  in_meta = _meta(node.input, memo)
  out_shape, in_shape = out_meta.shape, in_meta.shape
  corners = [tuple(a for a, _ in region), tuple(b - 1 for _, b in region)]
  first, last = (int(np.ravel_multi_index(c, out_shape)) if out_shape else 0 for c in corners)
  osz, isz = out_meta.dtype.itemsize, in_meta.dtype.itemsize
  byte_lo, byte_hi = first * osz, (last + 1) * osz
  elem_lo, elem_hi = byte_lo // isz, -(-byte_hi // isz)  # input elements spanning the bytes
  if in_shape:
    row = math.prod(in_shape[1:])
    r0, r1 = elem_lo // row, -(-elem_hi // row)
    in_region = ((r0, r1), *((0, d) for d in in_shape[1:]))
    base = r0 * row
  else:
    in_region, base = (), 0
  flat = np.ascontiguousarray(_eval(node.input, src, in_region, memo)).reshape(-1)
  raw = flat.view(np.uint8)[byte_lo - base * isz : byte_hi - base * isz]
  segment = raw.view(out_meta.dtype)
  grid = np.ix_(*(np.arange(a, b) for a, b in region)) if region else ()
  positions = np.ravel_multi_index(grid, out_shape) - first if region else np.zeros((), int)
  return np.asarray(segment[positions], out_meta.dtype)
