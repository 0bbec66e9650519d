"""Q4_1: blocks of 32 4-bit values, a float16 scale and minimum (20 bytes): ``x = q * d + m``."""

from __future__ import annotations

import numpy as np

from paramreg_jax._src.recipes.quant import base


def dequantize(blocks: np.ndarray) -> np.ndarray:
  n = blocks.shape[0]
  d, m = base.f16(blocks[:, :2]), base.f16(blocks[:, 2:4])
  qs = base.nibbles(blocks[:, 4:], n, 16).astype(np.float32)
  return (d * qs) + m


FORMAT = base.QuantFormat("Q4_1", 32, 20, dequantize)
