"""Recipes run backwards: where each piece of a parameter goes in the checkpoint's tensors.

A recipe builds a parameter from checkpoint tensors. :func:`invert` walks it from the top and
returns :class:`Placement` values: "apply these ops to the parameter's value, and the result is
this region of that checkpoint tensor". Only metadata is used; nothing is read or computed.

Every op has an exact inverse except the selections: a ``select`` (or a ``source`` selection)
places its value in part of the tensor, and the export plan checks that the parts of each
tensor are covered. A ``select`` that keeps part of a ``reshape``, ``view``, ``concatenate`` or
``stack`` has no place in the stored tensor and is refused.
``neg_log`` inverts to ``-exp`` and ``subtract_one`` to ``+ 1``: exact up to float rounding.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from paramreg_jax._src.recipes import ops
from paramreg_jax._src.sources import selection as sel_lib

# One axis of a region: None (all of it), (start, stop), or a tuple of indices (in output order).
AxisRegion = None | tuple[int, int] | tuple[tuple[int, ...]]
Region = tuple[Any, ...]


class NotInvertible(Exception):
  """A recipe node that cannot be run backwards; ``str`` says which and why."""


@dataclasses.dataclass(frozen=True)
class Placement:
  """``ops`` applied to a parameter's value give ``region`` of checkpoint tensor ``key``.

  Attributes:
    key: the checkpoint tensor.
    region: one entry per axis of that tensor: ``None`` (whole axis), ``("range", start,
      stop)`` or ``("indices", (i, ...))``.
    ops: ``(name, *args)`` steps from the parameter's value to the piece's value.
    shape: the piece's shape (the region's shape), dtype: the tensor's dtype.
  """

  key: str
  region: Region
  ops: tuple[tuple[Any, ...], ...]
  shape: tuple[int, ...]
  dtype: np.dtype


def _compose(region: Region, selection: Any, shape: tuple[int, ...]) -> Region:
  """``region`` (in the selection's output coordinates) in its input's coordinates."""
  if isinstance(selection, sel_lib.Full):
    return region
  axis = selection.axis
  inner = region[axis]
  if isinstance(selection, sel_lib.Range):
    base = list(range(selection.start, selection.stop))
  else:
    base = list(selection.indices)
  if inner is None:
    picked = base
  elif inner[0] == "range":
    picked = base[inner[1] : inner[2]]
  else:
    picked = [base[i] for i in inner[1]]
  out = list(region)
  if picked == list(range(picked[0], picked[0] + len(picked))):
    out[axis] = (
      None if len(picked) == shape[axis] else ("range", picked[0], picked[0] + len(picked))
    )
  else:
    out[axis] = ("indices", tuple(picked))
  return tuple(out)


def _region_shape(region: Region, shape: tuple[int, ...]) -> tuple[int, ...]:
  out = []
  for axis_region, n in zip(region, shape):
    if axis_region is None:
      out.append(n)
    elif axis_region[0] == "range":
      out.append(axis_region[2] - axis_region[1])
    else:
      out.append(len(axis_region[1]))
  return tuple(out)


def invert(recipe: ops.Recipe, src: Any) -> list[Placement]:
  """The placements that write a parameter built by ``recipe`` back into ``src``'s tensors.

  Raises:
    NotInvertible: a node cannot be run backwards (the message names it).

  Examples:
    >>> import numpy as np
    >>> from paramreg_jax import recipes as R
    >>> from paramreg_jax.sources import MemorySource, Range
    >>> src = MemorySource({"qkv": np.zeros((6, 4), np.float32)})
    >>> [p] = invert(R.transpose(R.source("qkv", Range(0, 2, 4)), (1, 0)), src)
    >>> p.key, p.region, p.ops
    ('qkv', (('range', 2, 4), None), (('transpose', (1, 0)),))
  """
  out: list[Placement] = []
  memo: dict[int, Any] = {}
  meta = ops._infer(recipe, src, memo)  # validates the recipe against the metadata once
  _walk(recipe, src, memo, (None,) * len(meta.shape), (), out)
  return out


def _walk(
  node: ops.Recipe,
  src: Any,
  memo: dict[int, Any],
  region: Region,
  steps: tuple[tuple[Any, ...], ...],
  out: list,
) -> None:
  meta = ops._infer(node, src, memo)
  full = all(r is None for r in region)
  if isinstance(node, ops.Source):
    stored = src.metadata(node.key)
    placed = _compose(region, node.selection, tuple(stored.shape))
    shape = _region_shape(placed, tuple(stored.shape))
    out.append(Placement(node.key, placed, steps, shape, np.dtype(stored.dtype)))
    return
  if isinstance(node, ops.Select):
    inner = ops._infer(node.input, src, memo)
    _walk(node.input, src, memo, _compose(region, node.selection, tuple(inner.shape)), steps, out)
    return
  if isinstance(node, ops.Transpose):
    back = tuple(int(i) for i in np.argsort(node.axes))
    moved = [None] * len(region)
    for i, axis in enumerate(node.axes):
      moved[axis] = region[i]
    _walk(node.input, src, memo, tuple(moved), (*steps, ("transpose", back)), out)
    return
  if isinstance(node, ops.Cast):
    inner = ops._infer(node.input, src, memo)
    _walk(node.input, src, memo, region, (*steps, ("astype", np.dtype(inner.dtype))), out)
    return
  if isinstance(node, ops.NegLog):
    _walk(node.input, src, memo, region, (*steps, ("neg_exp",)), out)
    return
  if isinstance(node, ops.SubtractOne):
    _walk(node.input, src, memo, region, (*steps, ("add_one",)), out)
    return
  if not full:
    raise NotInvertible(
      f"{node}: a select above it keeps part of its output, and part of a "
      f"{type(node).__name__.lower()} has no place in the stored tensor (select the stored "
      "tensor before reshaping or joining instead)"
    )
  if isinstance(node, ops.Reshape):
    inner = ops._infer(node.input, src, memo)
    shape = tuple(inner.shape)
    _walk(node.input, src, memo, (None,) * len(shape), (*steps, ("reshape", shape)), out)
    return
  if isinstance(node, ops.View):
    inner = ops._infer(node.input, src, memo)
    shape = tuple(inner.shape)
    view_step: tuple[Any, ...] = ("view", np.dtype(inner.dtype), shape)
    _walk(node.input, src, memo, (None,) * len(shape), (*steps, view_step), out)
    return
  if isinstance(node, ops.Concatenate):
    offset = 0
    for child in node.inputs:
      n = ops._infer(child, src, memo).shape[node.axis]
      step = ("slice", node.axis, offset, offset + n)
      _walk(child, src, memo, (None,) * len(meta.shape), (*steps, step), out)
      offset += n
    return
  if isinstance(node, ops.Stack):
    for i, child in enumerate(node.inputs):
      rank = len(ops._infer(child, src, memo).shape)
      _walk(child, src, memo, (None,) * rank, (*steps, ("take", node.axis, i)), out)
    return
  raise NotInvertible(f"{node}: no inverse for {type(node).__name__}")


def apply(steps: tuple[tuple[Any, ...], ...], value: np.ndarray) -> np.ndarray:
  """Runs a placement's ``ops`` on a parameter's value (host numpy)."""
  for step in steps:
    name = step[0]
    if name == "transpose":
      value = np.transpose(value, step[1])
    elif name == "astype":
      value = value.astype(step[1], copy=False)
    elif name == "reshape":
      value = np.reshape(value, step[1])
    elif name == "view":
      value = np.ascontiguousarray(value).view(step[1]).reshape(step[2])
    elif name == "slice":
      index = [slice(None)] * value.ndim
      index[step[1]] = slice(step[2], step[3])
      value = value[tuple(index)]
    elif name == "take":
      value = np.take(value, step[2], axis=step[1])
    elif name == "neg_exp":
      value = -np.exp(value)
    elif name == "add_one":
      value = value + np.ones((), value.dtype)
    else:  # pragma: no cover - the walk above makes only these
      raise AssertionError(step)
  return value


def leading_region(
  steps: tuple[tuple[Any, ...], ...], shape: tuple[int, ...]
) -> tuple[tuple[slice | int, ...], tuple[tuple[Any, ...], ...]]:
  """Splits the leading ``slice``/``take`` steps off as an index into the parameter, so only
  that part of a sharded parameter is fetched; returns ``(index, remaining steps)``."""
  index: list[Any] = [slice(None)] * len(shape)
  axes = list(range(len(shape)))  # parameter axis of each axis of the current value
  i = 0
  while i < len(steps) and steps[i][0] in ("slice", "take"):
    step = steps[i]
    axis = axes[step[1]]
    start = index[axis].start or 0  # an earlier slice of the same axis
    if step[0] == "slice":
      index[axis] = slice(start + step[2], start + step[3])
    else:
      index[axis] = start + step[2]
      del axes[step[1]]
    i += 1
  return tuple(index), steps[i:]
