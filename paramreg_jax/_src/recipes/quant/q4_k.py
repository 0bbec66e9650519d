"""Q4_K: super-blocks of 256 4-bit values in 8 groups with 6-bit scales and minimums, and
float16 ``d``/``dmin`` (144 bytes): ``x = d * sc * q - dmin * m``."""

from __future__ import annotations

import ml_dtypes
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


def group_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Each group's scale ``d * sc`` and minimum ``dmin * m``, float32 ``[n, 8]`` (Q4_K, Q5_K)."""
  n = blocks.shape[0]
  d, dmin = base.f16(blocks[:, :2]), base.f16(blocks[:, 2:4])
  sc, m = scale_min(blocks[:, 4:16], n)
  return d * sc.astype(np.float32), dmin * m.astype(np.float32)


def _values(blocks: np.ndarray) -> np.ndarray:
  return base.nibbles(blocks[:, 16:], blocks.shape[0], 32)


def dequantize(blocks: np.ndarray) -> np.ndarray:
  n = blocks.shape[0]
  dl, dm = group_scales(blocks)
  q = _values(blocks).reshape((n, -1, 32)).astype(np.float32)
  return (dl.reshape((n, -1, 1)) * q - dm.reshape((n, -1, 1))).reshape((n, K))


def split(blocks: np.ndarray) -> base.Parts:
  """The 4-bit values (0..15), and each group's scale and minimum with ``d``/``dmin`` folded in."""
  scales, mins = group_scales(blocks)
  return base.Parts(_values(blocks).astype(ml_dtypes.uint4), scales, mins)


KEPT = base.Kept(np.dtype(ml_dtypes.uint4), np.dtype(np.float32), 8, True, split)
FORMAT = base.QuantFormat("Q4_K", K, 144, dequantize, KEPT)
