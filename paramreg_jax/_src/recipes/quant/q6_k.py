"""Q6_K: super-blocks of 256 6-bit values in 16 groups with int8 scales, and a float16 ``d``
(210 bytes): ``x = d * sc * (q - 32)``."""

from __future__ import annotations

import numpy as np

from paramreg_jax._src.recipes.quant import base

K = base.QK_K


def dequantize(blocks: np.ndarray) -> np.ndarray:
  n = blocks.shape[0]
  ql, qh = blocks[:, : K // 2], blocks[:, K // 2 : K // 2 + K // 4]
  scales = np.ascontiguousarray(blocks[:, K // 2 + K // 4 : -2]).view(np.int8)
  d = base.f16(blocks[:, -2:])
  dl = (d * scales.astype(np.float32)).reshape((n, K // 16, 1))
  low = base.nibbles(ql, n, 64).reshape((n, -1, 32))
  high = (base.bits(qh, n, 4, 32, 2) & np.uint8(0x03)).reshape((n, -1, 32))
  q = (low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)
  return (dl * q.reshape((n, K // 16, -1)).astype(np.float32)).reshape((n, K))


FORMAT = base.QuantFormat("Q6_K", K, 210, dequantize)
