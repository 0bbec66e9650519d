"""Host buffers to a global ``jax.Array``: one call per weight, however many devices hold it.

``jax.device_put`` of one numpy array per shard pays Python dispatch per shard (about 40 µs on
CPU), and ``jax.make_array_from_single_device_arrays`` again per weight. Restoring 10,000
[64, 64] tensors over 8 devices is then dominated by it. :func:`assembler` hands every device's
buffer of one weight to JAX's batched transfer in one call, which builds the device buffers in
C++ (on CPU an aligned, C-contiguous buffer is adopted without a copy, as ``jax.device_put``
does).

:func:`layout` describes how a sharding splits a shape. When the shards tile the array as a
regular grid (every ``NamedSharding`` whose axes divide the shape), a small weight is built on
the host directly in *grid order*, ``[blocks..., block shape...]``: each device's shard is then
one contiguous block of that buffer, written by one strided copy for the whole weight.

The batched transfer is JAX's own (what ``jax.make_array_from_callback`` ends in), reached
through ``jax._src``; where that is missing or its signature changed, :func:`assembler` falls back
to the public ``jax.device_put`` + ``jax.make_array_from_single_device_arrays`` (set
``PARAMREG_PUBLIC_TRANSFER=1`` to force it). Both give the same array (tested).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import os
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from paramreg_jax._src.sources import host_memory
from paramreg_jax._src.sources import selection as sel_lib


def _private_transfer() -> Any:
  """JAX's batched transfer as ``(shape, dtype, sharding) -> (devices, buffers) -> jax.Array``,
  or None where this JAX does not have it."""
  if os.environ.get("PARAMREG_PUBLIC_TRANSFER", "0") not in ("", "0"):
    return None
  try:
    from jax._src import core
    from jax._src.interpreters import pxla
  except ImportError:
    return None
  put = getattr(pxla, "batched_device_put", None)
  update = getattr(core, "update_aval_with_sharding", None)
  shaped = getattr(core, "ShapedArray", None)
  if put is None or update is None or shaped is None:
    return None
  try:
    params = list(inspect.signature(put).parameters)[:4]
  except (TypeError, ValueError):
    return None
  if params != ["aval", "sharding", "xs", "devices"]:
    return None

  def transferrer(shape: tuple[int, ...], dtype: np.dtype, sharding: Any) -> Any:
    aval = update(shaped(shape, dtype), sharding)  # as jax.make_array_from_callback builds it
    return lambda devices, buffers: put(aval, sharding, buffers, devices)

  return transferrer


_TRANSFER = _private_transfer()


@dataclasses.dataclass(frozen=True)
class DeviceSplit:
  """How ``sharding`` splits ``shape`` over this process's devices.

  Attributes:
    devices: the addressable devices, in the order JAX assembles them.
    regions: each device's box of the global array.
    grid: blocks per axis when the distinct boxes tile the array as a regular grid (equal
      boxes, every axis cut evenly), else None.
    coords: each device's block coordinates in that grid (None without a grid).
  """

  shape: tuple[int, ...]
  devices: tuple[Any, ...]
  regions: tuple[sel_lib.Region, ...]
  grid: tuple[int, ...] | None
  coords: tuple[tuple[int, ...], ...] | None

  @property
  def block(self) -> tuple[int, ...]:
    """The shape of one grid block (the shard shape)."""
    assert self.grid is not None
    return tuple(n // g for n, g in zip(self.shape, self.grid))

  @property
  def grid_shape(self) -> tuple[int, ...]:
    """The host buffer of a weight built in grid order: ``(*grid, *block)``."""
    assert self.grid is not None
    return (*self.grid, *self.block)

  def to_grid(self, value: np.ndarray) -> np.ndarray:
    """``value`` (the whole weight, or a stack of them along leading axes) viewed in grid
    order (no copy; copy it into a buffer of ``grid_shape``)."""
    assert self.grid is not None
    n = len(self.shape)
    lead = value.ndim - n
    split = [d for g, b in zip(self.grid, self.block) for d in (g, b)]
    axes = [*range(lead), *range(lead, lead + 2 * n, 2), *range(lead + 1, lead + 2 * n, 2)]
    return value.reshape(*value.shape[:lead], *split).transpose(axes)

  def shards(self, built: np.ndarray) -> list[np.ndarray]:
    """Each device's buffer, in ``devices`` order, of a weight built in grid order."""
    return [built[i] for i in self.indices]

  @functools.cached_property
  def indices(self) -> tuple[tuple[Any, ...], ...]:
    """Each device's index into a weight built in grid order."""
    assert self.coords is not None
    return tuple((*c, ...) for c in self.coords)

  def views(self, value: np.ndarray) -> list[np.ndarray]:
    """Each device's box of ``value`` (the whole weight), in ``devices`` order: views, which
    the transfer copies."""
    return [value[sel_lib.region_slices(r)] for r in self.regions]

  def aligned(self, built: np.ndarray) -> bool:
    """Whether every device's buffer of ``built`` (a weight built in grid order) starts
    64-byte aligned and is C-contiguous: what a CPU device adopts without a copy."""
    return built.flags.c_contiguous and all(
      v.ctypes.data % host_memory.HOST_ALIGNMENT == 0 for v in self.shards(built)
    )


def _grid(
  shape: tuple[int, ...], regions: Sequence[sel_lib.Region]
) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]] | None:
  """The regular grid ``regions`` tile ``shape`` with, and each region's coordinates in it."""
  grid, sizes = [], []
  for axis, n in enumerate(shape):
    cuts = sorted({r[axis] for r in regions})
    size = cuts[0][1] - cuts[0][0]
    if size == 0 or n % size or cuts != [(i, i + size) for i in range(0, n, size)]:
      return None
    grid.append(n // size)
    sizes.append(size)
  if len(set(regions)) != math.prod(grid):
    return None
  return tuple(grid), tuple(tuple(lo // s for (lo, _), s in zip(r, sizes)) for r in regions)


@functools.lru_cache(maxsize=1024)
def _layout(sharding: Any, shape: tuple[int, ...]) -> DeviceSplit:
  index_map = sharding.addressable_devices_indices_map(shape)
  devices = tuple(index_map)
  regions = tuple(sel_lib.normalize_index(index_map[d], shape, where="sharding") for d in devices)
  found = _grid(shape, regions) if regions else None
  grid, coords = found if found is not None else (None, None)
  return DeviceSplit(shape, devices, regions, grid, coords)


def layout(sharding: jax.sharding.Sharding, shape: Sequence[int]) -> DeviceSplit:
  """How ``sharding`` splits ``shape`` (cached per sharding and shape).

  Examples:
    >>> import jax
    >>> from paramreg_jax._src.restore.jax_backend.transfer import layout
    >>> device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    >>> lay = layout(device, (4, 6))
    >>> lay.grid, lay.regions
    ((1, 1), (((0, 4), (0, 6)),))
  """
  shape = tuple(int(d) for d in shape)
  try:
    return _layout(sharding, shape)
  except TypeError:  # an unhashable sharding
    return _layout.__wrapped__(sharding, shape)


def assembler(
  shape: Sequence[int], dtype: Any, sharding: jax.sharding.Sharding
) -> Callable[[Sequence[Any], Sequence[np.ndarray]], jax.Array]:
  """A function ``(devices, buffers) -> jax.Array`` for arrays of one shape, dtype and
  sharding: the global array whose shard on ``devices[i]`` is ``buffers[i]``, in one call.

  ``devices`` must be ``layout(sharding, shape).devices`` (every addressable device, in that
  order) and each buffer that device's box.

  Examples:
    >>> import jax, numpy as np
    >>> from paramreg_jax._src.restore.jax_backend.transfer import assembler, layout
    >>> sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    >>> make = assembler((2,), np.float32, sharding)
    >>> make(layout(sharding, (2,)).devices, [np.ones(2, np.float32)]).tolist()
    [1.0, 1.0]
  """
  shape, dtype = tuple(int(d) for d in shape), np.dtype(dtype)
  make = _TRANSFER or public_assembler
  return make(shape, dtype, sharding)  # type: ignore[no-any-return]


def public_assembler(
  shape: tuple[int, ...], dtype: np.dtype, sharding: jax.sharding.Sharding
) -> Callable[[Sequence[Any], Sequence[np.ndarray]], jax.Array]:
  """:func:`assembler` through JAX's public API only (a transfer per shard, then one
  assembly): the fallback, and the reference the fast path is tested against."""

  def make(devices: Sequence[Any], buffers: Sequence[np.ndarray]) -> jax.Array:
    parts = jax.device_put(list(buffers), list(devices))
    return jax.make_array_from_single_device_arrays(shape, sharding, parts)

  return make
