"""Recipes run backwards: where each piece of a parameter goes in the checkpoint's tensors.

A recipe builds a parameter from checkpoint tensors. :func:`invert` walks it from the top and
returns :class:`Placement` values: "apply these ops to the parameter's value, and the result is
this region of that checkpoint tensor". Only metadata is used; nothing is read or computed.

Each op's ``invert`` rule (its file in ``recipes/ops/``) says where its output goes. Every op
has an exact inverse except the selections: a ``select`` (or a ``source`` selection) places its
value in part of the tensor, and the export plan checks that the parts of each tensor are
covered. A ``select`` that keeps part of a ``reshape``, ``view``, ``concatenate`` or ``stack``
has no place in the stored tensor and is refused. ``neg_log`` inverts to ``-exp`` and
``subtract_one`` to ``+ 1``: exact up to float rounding.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from paramreg_jax._src.recipes import inference
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.recipes.ops import base
from paramreg_jax._src.recipes.ops.concatenate import SLICE
from paramreg_jax._src.recipes.ops.stack import TAKE
from paramreg_jax._src.sources import selection as sel_lib
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource

NotInvertible = ops.NotInvertible
Region = base.InverseRegion


@dataclasses.dataclass(frozen=True)
class Placement:
  """``ops`` applied to a parameter's value give ``region`` of checkpoint tensor ``key``.

  Attributes:
    key: the checkpoint tensor.
    region: one entry per axis of that tensor: ``None`` (whole axis), ``("range", start,
      stop)`` or ``("indices", (i, ...))``.
    ops: ``(step, *args)`` steps from the parameter's value to the piece's value, each
      ``step`` an op's :class:`InverseStep` (run as ``step.apply(value, *args)``).
    shape: the piece's shape (the region's shape), dtype: the tensor's dtype.
  """

  key: str
  region: Region
  ops: tuple[tuple[Any, ...], ...]
  shape: tuple[int, ...]
  dtype: np.dtype


class _Walking:
  """The inverter's side of :class:`base.Walking`: metadata, and the placements so far."""

  def __init__(self, src: CheckpointSource, metas: inference.Metas):
    self.src = src
    self.metas = metas
    self.out: list[Placement] = []

  def meta(self, node: ops.Recipe) -> base.Meta:
    return self.metas[id(node)]

  def stored(self, key: str) -> base.Meta:
    return self.src.metadata(key)

  def walk(self, node: ops.Recipe, region: Region, steps: base.Steps) -> None:
    node.invert(region, steps, self)

  def place(self, key: str, region: Region, steps: base.Steps) -> None:
    stored = self.stored(key)
    shape = _region_shape(region, tuple(stored.shape))
    self.out.append(Placement(key, region, steps, shape, np.dtype(stored.dtype)))

  def compose(self, region: Region, selection: Any, shape: tuple[int, ...]) -> Region:
    """``region`` (in the selection's output coordinates) in its input's coordinates."""
    if isinstance(selection, sel_lib.Full):
      return region
    axis = selection.axis
    inner = region[axis]
    if isinstance(selection, sel_lib.Range):
      picked = list(range(selection.start, selection.stop))
    else:
      picked = list(selection.indices)
    if inner is not None and inner[0] == "range":
      picked = picked[inner[1] : inner[2]]
    elif inner is not None:
      picked = [picked[i] for i in inner[1]]
    out = list(region)
    if picked == list(range(picked[0], picked[0] + len(picked))):
      whole = len(picked) == shape[axis]
      out[axis] = None if whole else ("range", picked[0], picked[0] + len(picked))
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


def invert(recipe: ops.Recipe, src: CheckpointSource) -> list[Placement]:
  """The placements that write a parameter built by ``recipe`` back into ``src``'s tensors.

  Raises:
    NotInvertible: a node cannot be run backwards (the message names it).

  Examples:
    >>> import numpy as np
    >>> from paramreg_jax import recipes as R
    >>> from paramreg_jax import MemorySource, Range
    >>> src = MemorySource({"qkv": np.zeros((6, 4), np.float32)})
    >>> [p] = invert(R.transpose(R.source("qkv", Range(0, 2, 4)), (1, 0)), src)
    >>> p.key, p.region, p.ops
    ('qkv', (('range', 2, 4), None), ((transpose, (1, 0)),))
  """
  metas: inference.Metas = {}
  meta = inference.infer(recipe, src, memo=metas)  # validates the recipe once
  walking = _Walking(src, metas)
  walking.walk(recipe, base.whole(len(meta.shape)), ())
  return walking.out


def apply(steps: tuple[tuple[Any, ...], ...], value: np.ndarray) -> np.ndarray:
  """Runs a placement's ``ops`` on a parameter's value (host numpy)."""
  for step, *args in steps:
    value = step.apply(value, *args)
  return value


def describe(steps: tuple[tuple[Any, ...], ...]) -> list[str]:
  """Each step of a placement's ``ops`` in words."""
  return [step.describe(*args) for step, *args in steps]


def leading_region(
  steps: tuple[tuple[Any, ...], ...], shape: tuple[int, ...]
) -> tuple[tuple[slice | int, ...], tuple[tuple[Any, ...], ...]]:
  """Splits the leading ``slice``/``take`` steps off as an index into the parameter, so only
  that part of a sharded parameter is fetched; returns ``(index, remaining steps)``."""
  index: list[Any] = [slice(None)] * len(shape)
  axes = list(range(len(shape)))  # parameter axis of each axis of the current value
  i = 0
  while i < len(steps) and steps[i][0] in (SLICE, TAKE):
    step = steps[i]
    axis = axes[step[1]]
    start = index[axis].start or 0  # an earlier slice of the same axis
    if step[0] is SLICE:
      index[axis] = slice(start + step[2], start + step[3])
    else:
      index[axis] = start + step[2]
      del axes[step[1]]
    i += 1
  return tuple(index), steps[i:]
