"""Q6_K: super-blocks of 256 6-bit values in 16 groups with int8 scales, and a float16 ``d``
(210 bytes): ``x = d * sc * (q - 32)``."""

from __future__ import annotations

import numpy as np

from paramreg_jax._src.recipes.quant import base

K = base.QK_K


def _scales(blocks: np.ndarray) -> np.ndarray:
  """Each group of 16's scale ``d * sc``, float32 ``[n, 16]``."""
  scales = np.ascontiguousarray(blocks[:, K // 2 + K // 4 : -2]).view(np.int8)
  return base.f16(blocks[:, -2:]) * scales.astype(np.float32)


def _values(blocks: np.ndarray) -> np.ndarray:
  """The 6-bit values less 32 (-32..31), int8 ``[n, 256]``."""
  n = blocks.shape[0]
  ql, qh = blocks[:, : K // 2], blocks[:, K // 2 : K // 2 + K // 4]
  low = base.nibbles(ql, n, 64).reshape((n, -1, 32))
  high = (base.bits(qh, n, 4, 32, 2) & np.uint8(0x03)).reshape((n, -1, 32))
  return ((low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)).reshape((n, K))


def dequantize(blocks: np.ndarray) -> np.ndarray:
  n = blocks.shape[0]
  dl = _scales(blocks).reshape((n, K // 16, 1))
  q = _values(blocks).reshape((n, K // 16, -1)).astype(np.float32)
  return (dl * q).reshape((n, K))


def split(blocks: np.ndarray) -> base.Parts:
  """The signed 6-bit values and each group of 16's scale with ``d`` folded in."""
  return base.Parts(_values(blocks), _scales(blocks))


KEPT = base.Kept(np.dtype(np.int8), np.dtype(np.float32), 16, False, split)
FORMAT = base.QuantFormat("Q6_K", K, 210, dequantize, KEPT)
