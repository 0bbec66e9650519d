"""Q3_K: super-blocks of 256 3-bit values (2 low bits, a high-bit mask) in 16 groups with 6-bit
signed scales, and a float16 ``d`` (110 bytes): ``x = d * (sc - 32) * q``."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from paramreg_jax._src.recipes.quant import base

K = base.QK_K


def _scales(packed: np.ndarray, n: int) -> np.ndarray:
  """The 16 six-bit scales: low nibbles from bytes 0-7, high 2 bits from bytes 8-11."""
  low = packed[:, :8].reshape((n, 1, 8)) >> np.array([0, 4], np.uint8).reshape((1, 2, 1))
  high = packed[:, 8:].reshape((n, 1, 4)) >> np.array([0, 2, 4, 6], np.uint8).reshape((1, 4, 1))
  scales = (low.reshape((n, 16)) & np.uint8(0x0F)) | (
    (high.reshape((n, 16)) & np.uint8(0x03)) << np.uint8(4)
  )
  return (scales.astype(np.int8) - np.int8(32)).astype(np.float32)


def _group_scales(blocks: np.ndarray) -> np.ndarray:
  """Each group of 16's scale ``d * (sc - 32)``, float32 ``[n, 16]``."""
  packed, d = blocks[:, K // 8 + K // 4 : -2], base.f16(blocks[:, -2:])
  return d * _scales(packed, blocks.shape[0])


def _values(blocks: np.ndarray) -> np.ndarray:
  """The signed 3-bit values (-4..3), int8 ``[n, 256]``."""
  n = blocks.shape[0]
  hmask, qs = blocks[:, : K // 8], blocks[:, K // 8 : K // 8 + K // 4]
  ql = base.bits(qs, n, 4, 32, 2).reshape((n, 16, K // 16)) & np.uint8(3)
  qh = base.bits(hmask, n, 8, 32, 1).reshape((n, 16, K // 16)) & np.uint8(1)
  qh = qh ^ np.uint8(1)  # a set mask bit means no offset
  return (ql.astype(np.int8) - (qh << np.uint8(2)).astype(np.int8)).reshape((n, K))


def dequantize(blocks: np.ndarray) -> np.ndarray:
  n = blocks.shape[0]
  dl = _group_scales(blocks).reshape((n, 16, 1))
  return (dl * _values(blocks).reshape((n, 16, -1)).astype(np.float32)).reshape((n, K))


def split(blocks: np.ndarray) -> base.Parts:
  """The signed 3-bit values and each group's scale with ``d`` folded in."""
  return base.Parts(_values(blocks).astype(ml_dtypes.int4), _group_scales(blocks))


KEPT = base.Kept(np.dtype(ml_dtypes.int4), np.dtype(np.float32), 16, False, split)
FORMAT = base.QuantFormat("Q3_K", K, 110, dequantize, KEPT)
