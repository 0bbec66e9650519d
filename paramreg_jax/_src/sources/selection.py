"""Tensor selections (``Full``, ``Range``, ``Indices``) and read regions.

A *selection* picks part of a stored tensor along one axis; a *region* is a box
``((start, stop), ...)`` with one pair per axis, the unit of every physical read. ``jax``
hands out shard indices as tuples of slices; :func:`normalize_index` turns them into regions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from paramreg_jax._src import errors

Region = tuple[tuple[int, int], ...]


def _check_int(value: Any, what: str, *, minimum: int = 0) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
    raise errors.SelectionError(f"{what} must be an integer >= {minimum}, got {value!r}")
  return int(value)


@dataclasses.dataclass(frozen=True)
class Full:
  """Selects the whole tensor.

  Examples:
    >>> from paramreg_jax import Full
    >>> Full().apply_shape((2, 3), where="w")
    (2, 3)
  """

  def apply_shape(self, shape: tuple[int, ...], *, where: object) -> tuple[int, ...]:
    del where
    return tuple(shape)

  def __str__(self) -> str:
    return "[:]"


@dataclasses.dataclass(frozen=True)
class Range:
  """Selects ``start:stop`` (non-empty) along ``axis``.

  Args:
    axis: the axis of the stored tensor the range is on.
    start: the first index read.
    stop: one past the last index read (``stop > start``).

  Raises:
    SelectionError: ``axis``, ``start`` or ``stop`` is not an int >= 0.
    InvalidRangeError: the range is empty; (against a source) ``stop`` is beyond the axis.
    InvalidSelectionAxisError: (against a source) ``axis`` is beyond the tensor's rank.

  Examples:
    >>> from paramreg_jax import Range
    >>> Range(0, 1, 3).apply_shape((4, 2), where="w")
    (2, 2)
  """

  axis: int
  start: int
  stop: int

  def __post_init__(self) -> None:
    _check_int(self.axis, "Range.axis")
    _check_int(self.start, "Range.start")
    _check_int(self.stop, "Range.stop")
    if self.start >= self.stop:
      raise errors.InvalidRangeError(
        f"Range(axis={self.axis}, start={self.start}, stop={self.stop}) is empty: start must be "
        "below stop"
      )

  def apply_shape(self, shape: tuple[int, ...], *, where: object) -> tuple[int, ...]:
    _check_axis(self.axis, shape, where, self)
    if self.stop > shape[self.axis]:
      raise errors.InvalidRangeError(
        f"{where}: {self} runs past the end of axis {self.axis} (length {shape[self.axis]}); "
        f"stop must be <= {shape[self.axis]}"
      )
    out = list(shape)
    out[self.axis] = self.stop - self.start
    return tuple(out)

  def __str__(self) -> str:
    return f"Range(axis={self.axis}, {self.start}:{self.stop})"


@dataclasses.dataclass(frozen=True)
class Indices:
  """Gathers ``indices`` (non-empty, output order, duplicates allowed) along ``axis``.

  Args:
    axis: the axis of the stored tensor the indices are on.
    indices: the indices to read, in output order (a row read twice appears twice).

  Raises:
    SelectionError: ``axis`` or an index is not an int >= 0.
    InvalidIndicesError: ``indices`` is empty or not a sequence; (against a source) an index
      is beyond the axis.
    InvalidSelectionAxisError: (against a source) ``axis`` is beyond the tensor's rank.

  Examples:
    >>> from paramreg_jax import Indices
    >>> Indices(1, (2, 0, 2)).apply_shape((4, 3), where="w")
    (4, 3)
  """

  axis: int
  indices: tuple[int, ...]

  def __post_init__(self) -> None:
    _check_int(self.axis, "Indices.axis")
    if isinstance(self.indices, (str, bytes)) or not isinstance(self.indices, Sequence):
      raise errors.InvalidIndicesError(f"Indices.indices must be a sequence, got {self.indices!r}")
    object.__setattr__(self, "indices", tuple(_check_int(i, "each index") for i in self.indices))
    if not self.indices:
      raise errors.InvalidIndicesError(
        f"Indices(axis={self.axis}) selects nothing: give >= 1 index"
      )

  def apply_shape(self, shape: tuple[int, ...], *, where: object) -> tuple[int, ...]:
    _check_axis(self.axis, shape, where, self)
    bad = [i for i in self.indices if i >= shape[self.axis]]
    if bad:
      raise errors.InvalidIndicesError(
        f"{where}: {self} has indices {bad} out of range for axis {self.axis} (length "
        f"{shape[self.axis]})"
      )
    out = list(shape)
    out[self.axis] = len(self.indices)
    return tuple(out)

  def __str__(self) -> str:
    shown = ", ".join(map(str, self.indices[:6])) + (", ..." if len(self.indices) > 6 else "")
    return f"Indices(axis={self.axis}, [{shown}])"


Selection = Full | Range | Indices


def _check_axis(axis: int, shape: tuple[int, ...], where: object, sel: Any) -> None:
  if axis >= len(shape):
    raise errors.InvalidSelectionAxisError(
      f"{where}: {sel} selects axis {axis}, but the tensor has rank {len(shape)} "
      f"(shape {tuple(shape)})"
    )


def check_selection(selection: Any) -> Selection:
  """``selection`` if it is a selection (``None`` means ``Full()``), else a clear error."""
  if selection is None:
    return Full()
  if not isinstance(selection, (Full, Range, Indices)):
    raise errors.SelectionError(
      f"a selection must be Full(), Range(axis, start, stop) or Indices(axis, indices), got "
      f"{selection!r}"
    )
  return selection


# --- regions -------------------------------------------------------------------------------


def full_region(shape: tuple[int, ...]) -> Region:
  return tuple((0, d) for d in shape)


def region_shape(region: Region) -> tuple[int, ...]:
  return tuple(b - a for a, b in region)


def region_slices(region: Region) -> tuple[slice, ...]:
  return tuple(slice(a, b) for a, b in region)


def normalize_index(index: Any, shape: tuple[int, ...], *, where: str) -> Region:
  """A tuple of slices (as ``jax.make_array_from_callback`` passes) → a region of ``shape``."""
  if index is None:
    return full_region(shape)
  if not isinstance(index, tuple):
    index = (index,)
  if len(index) > len(shape):
    raise errors.InvalidRegionError(
      f"{where}: index {index} has {len(index)} entries for a tensor of rank {len(shape)}"
    )
  out = []
  for axis, dim in enumerate(shape):
    s = index[axis] if axis < len(index) else slice(None)
    if not isinstance(s, slice):
      raise errors.InvalidRegionError(f"{where}: index entries must be slices, got {s!r}")
    start, stop, step = s.indices(dim)
    if (
      step != 1
      or (s.start is not None and not 0 <= s.start <= dim)
      or (s.stop is not None and not 0 <= s.stop <= dim)
    ):
      raise errors.InvalidRegionError(
        f"{where}: slice {s} on axis {axis} (length {dim}) must have step 1 and bounds in "
        f"[0, {dim}]"
      )
    out.append((start, max(start, stop)))
  return tuple(out)


def selection_regions(
  selection: Selection, region: Region
) -> tuple[list[Region], list[int] | None, int]:
  """Maps a region of the *selected* tensor to source regions.

  Returns:
    ``(regions, gather, axis)``: the source regions to read (concatenated along ``axis``),
    and for ``Indices`` the positions to take from that concatenation (``None`` otherwise).
  """
  if isinstance(selection, Full):
    return [region], None, 0
  axis = selection.axis
  start, stop = region[axis]
  if isinstance(selection, Range):
    shifted = list(region)
    shifted[axis] = (selection.start + start, selection.start + stop)
    return [tuple(shifted)], None, axis
  wanted = selection.indices[start:stop]
  uniq = sorted(set(wanted))
  runs: list[tuple[int, int]] = []
  for i in uniq:
    if runs and runs[-1][1] == i:
      runs[-1] = (runs[-1][0], i + 1)
    else:
      runs.append((i, i + 1))
  regions = []
  for a, b in runs:
    r = list(region)
    r[axis] = (a, b)
    regions.append(tuple(r))
  pos = {v: k for k, v in enumerate(uniq)}
  return regions, [pos[v] for v in wanted], axis


def read_selected(read: Any, selection: Selection, region: Region, dtype: Any) -> np.ndarray:
  """Reads ``region`` of a selected tensor through ``read(source_region)``, minimally."""
  if any(a == b for a, b in region):
    return np.empty(region_shape(region), dtype)
  regions, gather, axis = selection_regions(selection, region)
  return join_selected([read(r) for r in regions], gather, axis)


def join_selected(parts: list[np.ndarray], gather: list[int] | None, axis: int) -> np.ndarray:
  """The selected region from the parts :func:`selection_regions` asked for, in its order."""
  out = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=axis)
  if gather is not None and gather != list(range(out.shape[axis])):
    out = np.take(out, gather, axis=axis)
  return out
