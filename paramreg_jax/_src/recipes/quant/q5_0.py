"""Q5_0: blocks of 32 5-bit values (low nibbles, a 32-bit mask of high bits) and a float16
scale (22 bytes): ``x = (q - 16) * d``."""

from __future__ import annotations

import numpy as np

from paramreg_jax._src.recipes.quant import base


def high_bits(qh: np.ndarray, n: int) -> np.ndarray:
  """The 32 high bits of each block, ``[n, 32]`` uint8."""
  words = np.ascontiguousarray(qh).view(np.uint32).reshape((n, 1))
  return ((words >> np.arange(32, dtype=np.uint32).reshape((1, 32))) & np.uint32(1)).astype(
    np.uint8
  )


def dequantize(blocks: np.ndarray) -> np.ndarray:
  n = blocks.shape[0]
  d = base.f16(blocks[:, :2])
  qh = high_bits(blocks[:, 2:6], n)
  ql = base.nibbles(blocks[:, 6:], n, 16)
  qs = (ql | (qh << np.uint8(4))).astype(np.int8) - np.int8(16)
  return d * qs.astype(np.float32)


FORMAT = base.QuantFormat("Q5_0", 32, 22, dequantize)
