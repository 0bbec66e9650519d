"""Q5_1: blocks of 32 5-bit values, a float16 scale and minimum (24 bytes): ``x = q * d + m``."""

from __future__ import annotations

import numpy as np

from paramreg_jax._src.recipes.quant import base
from paramreg_jax._src.recipes.quant import q5_0


def dequantize(blocks: np.ndarray) -> np.ndarray:
  n = blocks.shape[0]
  d, m = base.f16(blocks[:, :2]), base.f16(blocks[:, 2:4])
  qh = q5_0.high_bits(blocks[:, 4:8], n)
  ql = base.nibbles(blocks[:, 8:], n, 16)
  qs = (ql | (qh << np.uint8(4))).astype(np.float32)
  return (d * qs) + m


FORMAT = base.QuantFormat("Q5_1", 32, 24, dequantize)
