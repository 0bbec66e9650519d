"""Q4_K: super-blocks of 256 4-bit values in 8 groups with 6-bit scales and minimums, and
float16 ``d``/``dmin`` (144 bytes): ``x = d * sc * q - dmin * m``."""

from __future__ import annotations

import numpy as np

from paramreg_jax._src.recipes.quant import base

K = base.QK_K


def scale_min(packed: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
  """The 8 six-bit scales and minimums packed in 12 bytes (shared by Q4_K and Q5_K)."""
  groups = packed.reshape((n, 3, 4))
  d, m, m_d = groups[:, 0:1], groups[:, 1:2], groups[:, 2:3]
  sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
  mins = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
  return sc.reshape((n, 8)), mins.reshape((n, 8))


def dequantize(blocks: np.ndarray) -> np.ndarray:
  n = blocks.shape[0]
  d, dmin = base.f16(blocks[:, :2]), base.f16(blocks[:, 2:4])
  sc, m = scale_min(blocks[:, 4:16], n)
  dl = (d * sc.astype(np.float32)).reshape((n, -1, 1))
  dm = (dmin * m.astype(np.float32)).reshape((n, -1, 1))
  q = base.nibbles(blocks[:, 16:], n, 32).reshape((n, -1, 32)).astype(np.float32)
  return (dl * q - dm).reshape((n, K))


FORMAT = base.QuantFormat("Q4_K", K, 144, dequantize)
