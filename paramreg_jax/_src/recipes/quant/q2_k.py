"""Q2_K: super-blocks of 256 2-bit values in 16 groups, each with a 4-bit scale and minimum,
and float16 ``d``/``dmin`` (84 bytes): ``x = d * sc * q - dmin * m``."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from paramreg_jax._src.recipes.quant import base

K = base.QK_K


def _group_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Each group of 16's scale ``d * sc`` and minimum ``dmin * m``, float32 ``[n, 16]``."""
  scales = blocks[:, : K // 16]
  d, dmin = base.f16(blocks[:, -4:-2]), base.f16(blocks[:, -2:])
  return d * (scales & 0xF).astype(np.float32), dmin * (scales >> 4).astype(np.float32)


def _values(blocks: np.ndarray) -> np.ndarray:
  """The 2-bit values (0..3), uint8 ``[n, 256]``."""
  n = blocks.shape[0]
  qs = blocks[:, K // 16 : K // 16 + K // 4]
  return (base.bits(qs, n, 4, 32, 2) & np.uint8(3)).reshape((n, K))


def dequantize(blocks: np.ndarray) -> np.ndarray:
  n = blocks.shape[0]
  dl, ml = _group_scales(blocks)
  q = _values(blocks).reshape((n, K // 16, 16)).astype(np.float32)
  return (dl.reshape((n, -1, 1)) * q - ml.reshape((n, -1, 1))).reshape((n, -1))


def split(blocks: np.ndarray) -> base.Parts:
  """The 2-bit values, and each group's scale and minimum with ``d``/``dmin`` folded in."""
  scales, mins = _group_scales(blocks)
  return base.Parts(_values(blocks).astype(ml_dtypes.uint4), scales, mins)


KEPT = base.Kept(np.dtype(ml_dtypes.uint4), np.dtype(np.float32), 16, True, split)
FORMAT = base.QuantFormat("Q2_K", K, 84, dequantize, KEPT)
