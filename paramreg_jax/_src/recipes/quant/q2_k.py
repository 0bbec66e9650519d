"""Q2_K: super-blocks of 256 2-bit values in 16 groups, each with a 4-bit scale and minimum,
and float16 ``d``/``dmin`` (84 bytes): ``x = d * sc * q - dmin * m``."""

from __future__ import annotations

import numpy as np

from paramreg_jax._src.recipes.quant import base

K = base.QK_K


def dequantize(blocks: np.ndarray) -> np.ndarray:
  n = blocks.shape[0]
  scales, qs = blocks[:, : K // 16], blocks[:, K // 16 : K // 16 + K // 4]
  d, dmin = base.f16(blocks[:, -4:-2]), base.f16(blocks[:, -2:])
  dl = (d * (scales & 0xF).astype(np.float32)).reshape((n, K // 16, 1))
  ml = (dmin * (scales >> 4).astype(np.float32)).reshape((n, K // 16, 1))
  q = base.bits(qs, n, 4, 32, 2) & np.uint8(3)
  q = q.reshape((n, K // 16, 16)).astype(np.float32)
  return (dl * q - ml).reshape((n, -1))


FORMAT = base.QuantFormat("Q2_K", K, 84, dequantize)
