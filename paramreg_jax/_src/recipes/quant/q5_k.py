"""Q5_K: super-blocks of 256 5-bit values (low nibbles, a high-bit mask) in 8 groups with 6-bit
scales and minimums, and float16 ``d``/``dmin`` (176 bytes): ``x = d * sc * q - dmin * m``."""

from __future__ import annotations

import numpy as np

from paramreg_jax._src.recipes.quant import base
from paramreg_jax._src.recipes.quant import q4_k

K = base.QK_K


def _values(blocks: np.ndarray) -> np.ndarray:
  """The 5-bit values (0..31), uint8 ``[n, 256]``."""
  n = blocks.shape[0]
  qh, qs = blocks[:, 16 : 16 + K // 8], blocks[:, 16 + K // 8 :]
  ql = base.nibbles(qs, n, 32).reshape((n, -1, 32))
  high = (base.bits(qh, n, 8, 32, 1) & np.uint8(0x01)).reshape((n, -1, 32))
  return (ql | (high << np.uint8(4))).reshape((n, K))


def dequantize(blocks: np.ndarray) -> np.ndarray:
  n = blocks.shape[0]
  dl, dm = q4_k.group_scales(blocks)
  q = _values(blocks).reshape((n, -1, 32)).astype(np.float32)
  return (dl.reshape((n, -1, 1)) * q - dm.reshape((n, -1, 1))).reshape((n, K))


def split(blocks: np.ndarray) -> base.Parts:
  """The 5-bit values, and each group's scale and minimum with ``d``/``dmin`` folded in."""
  scales, mins = q4_k.group_scales(blocks)
  return base.Parts(_values(blocks), scales, mins)


KEPT = base.Kept(np.dtype(np.uint8), np.dtype(np.float32), 8, True, split)
FORMAT = base.QuantFormat("Q5_K", K, 176, dequantize, KEPT)
