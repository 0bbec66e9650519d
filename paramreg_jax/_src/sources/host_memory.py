"""Host buffers that reads land in: 64-byte aligned, so that ``jax.device_put`` on the CPU
backend adopts them without a copy, and backed by transparent huge pages when large (the
first-touch page faults of a large restored array are then cheaper).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np


def nbytes_of(shape: Sequence[int], dtype: Any) -> int:
  size = 1
  for d in shape:
    size *= int(d)
  return size * np.dtype(dtype).itemsize


HOST_ALIGNMENT = 64


def aligned_empty(shape: Sequence[int], dtype: Any) -> np.ndarray:
  """An uninitialised C-order array whose data is 64-byte aligned.

  ``jax.device_put`` on the CPU backend adopts such a buffer without copying it, so reading a
  region straight into one saves a full copy per shard.
  """
  dtype = np.dtype(dtype)
  n = nbytes_of(shape, dtype)
  if n >= _HUGE_MIN and _huge_pages():
    raw = np.empty(n + _HUGE, np.uint8)
    offset = (-raw.ctypes.data) % _HUGE
    _madvise_huge(raw.ctypes.data + offset, n - n % _HUGE)
  else:
    raw = np.empty(n + HOST_ALIGNMENT, np.uint8)
    offset = (-raw.ctypes.data) % HOST_ALIGNMENT
  return raw[offset : offset + n].view(dtype).reshape(tuple(shape))


_HUGE = 2 * 2**20
_HUGE_MIN = 4 * 2**20
_MADV_HUGEPAGE = 14


@functools.cache
def _huge_pages() -> bool:
  """Whether restore buffers of 4 MiB and more ask for transparent huge pages: on Linux unless
  ``PARAMREG_HUGEPAGES=0``. Huge pages make the first-touch page faults of large restored
  arrays cheaper (docs/benchmarks.md); only whole 2 MiB pages inside the buffer are advised, so
  no page outside the array becomes resident."""
  return sys.platform == "linux" and os.environ.get("PARAMREG_HUGEPAGES") != "0"


def _madvise_huge(address: int, length: int) -> None:
  """``madvise(MADV_HUGEPAGE)``; a kernel without THP refuses it, which changes nothing."""
  import ctypes

  try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(length), _MADV_HUGEPAGE)
  except (OSError, AttributeError):
    pass


def read_into_aligned(value: Any, dtype: Any) -> np.ndarray:
  """``np.array(value)`` (one copy), into a 64-byte aligned buffer."""
  out = aligned_empty(np.shape(value), dtype)
  np.copyto(out, value, casting="no")
  return out


def stacked_buffer(
  out: np.ndarray | None, n: int, shape: tuple[int, ...], dtype: np.dtype
) -> np.ndarray:
  """``out`` checked to hold ``n`` tensors of ``shape`` and ``dtype`` stacked, or a new
  aligned buffer for them."""
  if out is None:
    return aligned_empty((n, *shape), dtype)
  if out.shape != (n, *shape) or out.dtype != dtype or not out.flags.c_contiguous:
    raise ValueError(
      f"read_stacked(out=...) needs a C-contiguous {(n, *shape)} {dtype.name} array, got "
      f"{out.shape} {out.dtype.name}{'' if out.flags.c_contiguous else ' (not contiguous)'}"
    )
  return out
