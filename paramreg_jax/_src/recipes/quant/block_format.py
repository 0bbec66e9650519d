"""What a block-quantized format is: blocks of ``nbytes`` bytes, each ``block`` values.

A format (one file each in this folder) is a :class:`QuantFormat`: its name as GGUF spells it,
the values and bytes of a block, and ``dequantize(blocks)``: ``uint8 [n, nbytes]`` to
``float32 [n, block]``. The arithmetic follows the reference dequantizers of the ``gguf``
package step for step (numpy, float32), so the values are equal bit for bit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

QK_K = 256  # values per block of the k-quants


@dataclasses.dataclass(frozen=True)
class Parts:
  """A block's contents as a quantized model holds them: ``values [n, block]``, and one scale
  (and, for the formats with minimums, one minimum) per group of ``block // groups`` values:
  ``x = scale * q`` or ``x = scale * q - min``, in float32, as the reference computes it."""

  values: np.ndarray
  scales: np.ndarray
  mins: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class Kept:
  """How a format is kept quantized: the dtypes of its parts, its groups per block, and
  ``split(blocks) -> Parts``."""

  values_dtype: np.dtype
  scales_dtype: np.dtype
  groups: int
  mins: bool
  split: Callable[[np.ndarray], Parts]


@dataclasses.dataclass(frozen=True)
class QuantFormat:
  """A block format; ``kept`` for the formats a quantized model can hold as they are."""

  name: str
  block: int
  nbytes: int
  dequantize: Callable[[np.ndarray], np.ndarray]
  kept: Kept | None = None


def f16(column: np.ndarray) -> np.ndarray:
  """Little-endian float16 bytes ``[n, 2]`` as float32 ``[n, 1]``."""
  return np.ascontiguousarray(column).view(np.float16).astype(np.float32)


def nibbles(qs: np.ndarray, n: int, width: int) -> np.ndarray:
  """The low then the high 4 bits of each group of ``width`` bytes, ``[n, -1]`` uint8."""
  shifted = qs.reshape((n, -1, 1, width)) >> np.array([0, 4], np.uint8).reshape((1, 1, 2, 1))
  return (shifted & np.uint8(0x0F)).reshape((n, -1))


def bits(packed: np.ndarray, n: int, count: int, width: int, step: int) -> np.ndarray:
  """``count`` fields of ``step`` bits from each group of ``width`` bytes (lowest first)."""
  shifts = np.arange(0, count * step, step, dtype=np.uint8).reshape((1, 1, count, 1))
  return packed.reshape((n, -1, 1, width)) >> shifts
