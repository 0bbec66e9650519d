"""Q5_K: super-blocks of 256 5-bit values (low nibbles, a high-bit mask) in 8 groups with 6-bit
scales and minimums, and float16 ``d``/``dmin`` (176 bytes): ``x = d * sc * q - dmin * m``."""

from __future__ import annotations

import numpy as np

from paramreg_jax._src.recipes.quant import base
from paramreg_jax._src.recipes.quant import q4_k

K = base.QK_K


def dequantize(blocks: np.ndarray) -> np.ndarray:
  n = blocks.shape[0]
  d, dmin = base.f16(blocks[:, :2]), base.f16(blocks[:, 2:4])
  sc, m = q4_k.scale_min(blocks[:, 4:16], n)
  qh, qs = blocks[:, 16 : 16 + K // 8], blocks[:, 16 + K // 8 :]
  dl = (d * sc.astype(np.float32)).reshape((n, -1, 1))
  dm = (dmin * m.astype(np.float32)).reshape((n, -1, 1))
  ql = base.nibbles(qs, n, 32).reshape((n, -1, 32))
  high = (base.bits(qh, n, 8, 32, 1) & np.uint8(0x01)).reshape((n, -1, 32))
  q = (ql | (high << np.uint8(4))).astype(np.float32)
  return (dl * q - dm).reshape((n, K))


FORMAT = base.QuantFormat("Q5_K", K, 176, dequantize)
