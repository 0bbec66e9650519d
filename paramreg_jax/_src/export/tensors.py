"""Writing one checkpoint tensor from the parameters that make it.

A tensor is copied from the source, written as row runs of its pieces (each parameter's part
fetched from its shards only for the region the tensor needs, in blocks of the budget), or,
when pieces join along an inner axis or overlap (tied parameters reading one tensor),
assembled whole, checking that overlapping pieces agree bit for bit.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.export import invert as inv
from paramreg_jax._src.export.plan import TensorPlan
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource


def index_box(index: tuple[Any, ...], shape: tuple[int, ...]) -> list[tuple[int, int]]:
  """``[(start, stop)]`` per axis of an index of ints and slices (steps of 1), or of a shard's
  index (slices with ``None`` ends)."""
  return [
    (i, i + 1) if isinstance(i, int) else (i.start or 0, n if i.stop is None else i.stop)
    for i, n in zip(index, shape)
  ]


def overlap(
  out_box: Any, data_box: Any, held: Any
) -> tuple[tuple[slice, ...], tuple[slice, ...]] | None:
  """Where the part of ``held`` that both ``data`` (covering ``data_box``) and ``out``
  (covering ``out_box``) span sits in each: ``(data index, out index)``; None if nothing."""
  lo = [max(a[0], b[0], c[0]) for a, b, c in zip(held, data_box, out_box)]
  hi = [min(a[1], b[1], c[1]) for a, b, c in zip(held, data_box, out_box)]
  if any(x >= y for x, y in zip(lo, hi)):
    return None
  src = tuple(slice(x - d[0], y - d[0]) for x, y, d in zip(lo, hi, data_box))
  return src, tuple(slice(x - o[0], y - o[0]) for x, y, o in zip(lo, hi, out_box))


def fetch_region(leaf: Any, index: tuple[Any, ...]) -> np.ndarray:
  """``leaf[index]`` on the host, copying only the shards the index touches. Indexing happens
  in numpy (a CPU device's buffer is viewed, not copied): indexing the ``jax.Array`` would
  compile an XLA program per distinct slice."""
  if not isinstance(leaf, jax.Array) or len(leaf.sharding.device_set) == 1:
    return np.asarray(leaf)[index]
  box = index_box(index, tuple(leaf.shape))
  out = np.empty([hi - lo for lo, hi in box], leaf.dtype)
  seen = set()
  for shard in leaf.addressable_shards:
    where = tuple(index_box(shard.index, tuple(leaf.shape)))
    if where in seen:
      continue
    seen.add(where)
    found = overlap(box, where, where)
    if found is not None:
      src_index, dst_index = found
      out[dst_index] = np.asarray(shard.data)[src_index]
  squeeze = tuple(axis for axis, i in enumerate(index) if isinstance(i, int))
  return out.squeeze(squeeze) if squeeze else out


def _piece(fetch: Fetch, placement: inv.Placement, key: str, param: str) -> np.ndarray:
  lead, rest = inv.leading_region(placement.ops, fetch.shape(param))
  value = inv.apply(rest, fetch(param, lead))
  if value.shape != placement.shape or value.dtype != placement.dtype:
    raise errors.ExportError(
      f"{key}: {param} gives a {value.shape} {value.dtype} piece, the tensor needs "
      f"{placement.shape} {placement.dtype}",
      key,
    )
  return value


def _rows(region: tuple[Any, ...], n: int) -> list[tuple[int, int, int]] | None:
  """Contiguous row runs ``(first row, first piece row, count)`` of a region that restricts
  at most axis 0; ``None`` when it restricts another axis."""
  if any(r is not None for r in region[1:]):
    return None
  r = region[0] if region else None
  if r is None:
    return [(0, 0, n)]
  if r[0] == "range":
    return [(r[1], 0, r[2] - r[1])]
  runs: list[tuple[int, int, int]] = []
  for j, row in enumerate(r[1]):
    if runs and runs[-1][0] + runs[-1][2] == row and runs[-1][1] + runs[-1][2] == j:
      runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
    else:
      runs.append((row, j, 1))
  return runs


class Fetch:
  """``fetch(param, index)``: a parameter's region on this host (``_fetch``, from the shards
  this process holds); the multi-host export passes regions it gathered."""

  def __init__(self, leaves: dict[str, Any]):
    self.leaves = leaves

  def shape(self, param: str) -> tuple[int, ...]:
    return tuple(self.leaves[param].shape)

  def __call__(self, param: str, index: tuple[Any, ...]) -> np.ndarray:
    return fetch_region(self.leaves[param], index)


def write_tensor(
  fd: int, start: int, t: TensorPlan, fetch: Fetch, src: CheckpointSource, block: int
) -> None:
  """Writes checkpoint tensor ``t`` at ``start`` of ``fd``: copied from the source, row runs of
  its pieces, or (pieces along an inner axis, overlapping pieces) assembled whole."""
  row_bytes = (
    int(np.prod(t.shape[1:], dtype=np.int64)) * t.dtype.itemsize if t.shape else t.dtype.itemsize
  )
  if t.copied:
    lease = src.lease(t.key)
    _write_rows(
      fd,
      start,
      lambda rows: lease.read(_row_index(t.shape, rows)),
      0,
      0,
      _nrows(t.shape),
      row_bytes,
      block,
    )
    return
  runs = [_rows(p.placement.region, _nrows(t.shape)) for p in t.pieces]
  overlapping = sum(int(np.prod(p.placement.shape, dtype=np.int64)) for p in t.pieces) > int(
    np.prod(t.shape, dtype=np.int64)
  )
  if all(r is not None for r in runs) and not overlapping:
    for p, piece_runs in zip(t.pieces, runs):
      assert piece_runs is not None
      value = _piece(fetch, p.placement, t.key, p.param)
      if not t.shape:
        value = value.reshape(1)
      for first, piece_first, count in piece_runs:
        _write_rows(fd, start, value.__getitem__, first, piece_first, count, row_bytes, block)
      del value
    return
  out = np.empty(t.shape, t.dtype)
  owner = np.full(t.shape, -1, np.int32) if overlapping else None
  for n, p in enumerate(t.pieces):
    value = _piece(fetch, p.placement, t.key, p.param)
    index = _index(p.placement.region, t.shape)
    if owner is not None:
      had = owner[index]
      clash = (had >= 0) & ~same_bits(out[index], value)
      if clash.any():
        other = t.pieces[int(had[clash].flat[0])].param
        raise errors.ExportError(
          f"checkpoint tensor {t.key!r}: {other} and {p.param} both write it and their values "
          f"differ, so one of their updates would be lost. Tie them in the model (one "
          f"parameter used in both places), or export only the one to keep: "
          f"exclude=[{p.param.removeprefix('n:')!r}] writes {other}'s value",
          t.key,
        )
      owner[index] = n
    out[index] = value
  flat = out.reshape(_nrows(t.shape), -1) if t.shape else out.reshape(1)
  _write_rows(fd, start, flat.__getitem__, 0, 0, _nrows(t.shape), row_bytes, block)


def _index(region: tuple[Any, ...], shape: tuple[int, ...]) -> Any:
  """A numpy index for a placement's region (an outer product when several axes gather)."""
  if sum(r is not None and r[0] == "indices" for r in region) <= 1:
    return tuple(
      slice(None) if r is None else slice(r[1], r[2]) if r[0] == "range" else list(r[1])
      for r in region
    )
  return np.ix_(
    *[
      np.arange(n) if r is None else np.arange(r[1], r[2]) if r[0] == "range" else np.array(r[1])
      for r, n in zip(region, shape)
    ]
  )


def same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """Elementwise: the same bytes (NaN payloads and -0 included)."""
  size = a.dtype.itemsize
  a8 = np.ascontiguousarray(a).view(np.uint8).reshape(*a.shape, size)
  b8 = np.ascontiguousarray(b).view(np.uint8).reshape(*b.shape, size)
  return (a8 == b8).all(-1)


def _nrows(shape: tuple[int, ...]) -> int:
  return shape[0] if shape else 1


def _row_index(shape: tuple[int, ...], rows: slice) -> Any:
  return None if not shape else (rows,) + (slice(None),) * (len(shape) - 1)


def _write_rows(
  fd: int,
  start: int,
  rows: Any,
  first: int,
  piece_first: int,
  count: int,
  row_bytes: int,
  block: int,
) -> None:
  step = max(1, block // max(row_bytes, 1))
  for k in range(0, count, step):
    n = min(step, count - k)
    chunk = np.ascontiguousarray(rows(slice(piece_first + k, piece_first + k + n))).reshape(-1)
    view = chunk.view(np.uint8).data
    offset = start + (first + k) * row_bytes
    done = 0
    while done < len(view):
      done += os.pwrite(fd, view[done:], offset + done)
