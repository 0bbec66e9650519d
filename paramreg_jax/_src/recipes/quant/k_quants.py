"""llama.cpp's k-quants: super-blocks of 256 values in groups of 16 or 32, with packed
per-group scales (and minimums) under float16 super-block factors. One section per format,
named as GGUF names it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from paramreg_jax._src.recipes.quant import block_format

K = block_format.QK_K  # values per super-block


def _grouped(values: np.ndarray, scales: np.ndarray, mins: np.ndarray | None = None) -> np.ndarray:
  """``scale * q`` (``- min``) for each group of a super-block, float32 ``[n, 256]``: the
  values ``[n, 256]``, one scale (and minimum) per group ``[n, groups]``. Every k-quant
  dequantizes so."""
  n, groups = scales.shape
  x = scales.reshape((n, groups, 1)) * values.reshape((n, groups, -1)).astype(np.float32)
  if mins is not None:
    x = x - mins.reshape((n, groups, 1))
  return x.reshape((n, K))


# -- Q2_K: super-blocks of 256 2-bit values in 16 groups, each with a 4-bit scale and minimum,
# and float16 ``d``/``dmin`` (84 bytes): ``x = d * sc * q - dmin * m``.


def _q2_k_group_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Each group of 16's scale ``d * sc`` and minimum ``dmin * m``, float32 ``[n, 16]``."""
  scales = blocks[:, : K // 16]
  d, dmin = block_format.f16(blocks[:, -4:-2]), block_format.f16(blocks[:, -2:])
  return d * (scales & 0xF).astype(np.float32), dmin * (scales >> 4).astype(np.float32)


def _q2_k_values(blocks: np.ndarray) -> np.ndarray:
  """The 2-bit values (0..3), uint8 ``[n, 256]``."""
  n = blocks.shape[0]
  qs = blocks[:, K // 16 : K // 16 + K // 4]
  return (block_format.bits(qs, n, 4, 32, 2) & np.uint8(3)).reshape((n, K))


def _q2_k_dequantize(blocks: np.ndarray) -> np.ndarray:
  return _grouped(_q2_k_values(blocks), *_q2_k_group_scales(blocks))


def _q2_k_split(blocks: np.ndarray) -> block_format.Parts:
  """The 2-bit values, and each group's scale and minimum with ``d``/``dmin`` folded in."""
  scales, mins = _q2_k_group_scales(blocks)
  return block_format.Parts(_q2_k_values(blocks).astype(ml_dtypes.uint4), scales, mins)


_Q2_K_KEPT = block_format.Kept(
  np.dtype(ml_dtypes.uint4), np.dtype(np.float32), 16, True, _q2_k_split
)
Q2_K = block_format.QuantFormat("Q2_K", K, 84, _q2_k_dequantize, _Q2_K_KEPT)


# -- Q3_K: super-blocks of 256 3-bit values (2 low bits, a high-bit mask) in 16 groups with 6-bit
# signed scales, and a float16 ``d`` (110 bytes): ``x = d * (sc - 32) * q``.


def _q3_k_scales(packed: np.ndarray, n: int) -> np.ndarray:
  """The 16 six-bit scales: low nibbles from bytes 0-7, high 2 bits from bytes 8-11."""
  low = packed[:, :8].reshape((n, 1, 8)) >> np.array([0, 4], np.uint8).reshape((1, 2, 1))
  high = packed[:, 8:].reshape((n, 1, 4)) >> np.array([0, 2, 4, 6], np.uint8).reshape((1, 4, 1))
  scales = (low.reshape((n, 16)) & np.uint8(0x0F)) | (
    (high.reshape((n, 16)) & np.uint8(0x03)) << np.uint8(4)
  )
  return (scales.astype(np.int8) - np.int8(32)).astype(np.float32)


def _q3_k_group_scales(blocks: np.ndarray) -> np.ndarray:
  """Each group of 16's scale ``d * (sc - 32)``, float32 ``[n, 16]``."""
  packed, d = blocks[:, K // 8 + K // 4 : -2], block_format.f16(blocks[:, -2:])
  return d * _q3_k_scales(packed, blocks.shape[0])


def _q3_k_values(blocks: np.ndarray) -> np.ndarray:
  """The signed 3-bit values (-4..3), int8 ``[n, 256]``."""
  n = blocks.shape[0]
  hmask, qs = blocks[:, : K // 8], blocks[:, K // 8 : K // 8 + K // 4]
  ql = block_format.bits(qs, n, 4, 32, 2).reshape((n, 16, K // 16)) & np.uint8(3)
  qh = block_format.bits(hmask, n, 8, 32, 1).reshape((n, 16, K // 16)) & np.uint8(1)
  qh = qh ^ np.uint8(1)  # a set mask bit means no offset
  return (ql.astype(np.int8) - (qh << np.uint8(2)).astype(np.int8)).reshape((n, K))


def _q3_k_dequantize(blocks: np.ndarray) -> np.ndarray:
  return _grouped(_q3_k_values(blocks), _q3_k_group_scales(blocks))


def _q3_k_split(blocks: np.ndarray) -> block_format.Parts:
  """The signed 3-bit values and each group's scale with ``d`` folded in."""
  return block_format.Parts(_q3_k_values(blocks).astype(ml_dtypes.int4), _q3_k_group_scales(blocks))


_Q3_K_KEPT = block_format.Kept(
  np.dtype(ml_dtypes.int4), np.dtype(np.float32), 16, False, _q3_k_split
)
Q3_K = block_format.QuantFormat("Q3_K", K, 110, _q3_k_dequantize, _Q3_K_KEPT)


# -- Q4_K: super-blocks of 256 4-bit values in 8 groups with 6-bit scales and minimums, and
# float16 ``d``/``dmin`` (144 bytes): ``x = d * sc * q - dmin * m``.


def _q4_k_scale_min(packed: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
  """The 8 six-bit scales and minimums packed in 12 bytes (shared by Q4_K and Q5_K)."""
  groups = packed.reshape((n, 3, 4))
  d, m, m_d = groups[:, 0:1], groups[:, 1:2], groups[:, 2:3]
  sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
  mins = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
  return sc.reshape((n, 8)), mins.reshape((n, 8))


def _q4_k_group_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Each group's scale ``d * sc`` and minimum ``dmin * m``, float32 ``[n, 8]`` (Q4_K, Q5_K)."""
  n = blocks.shape[0]
  d, dmin = block_format.f16(blocks[:, :2]), block_format.f16(blocks[:, 2:4])
  sc, m = _q4_k_scale_min(blocks[:, 4:16], n)
  return d * sc.astype(np.float32), dmin * m.astype(np.float32)


def _q4_k_values(blocks: np.ndarray) -> np.ndarray:
  return block_format.nibbles(blocks[:, 16:], blocks.shape[0], 32)


def _q4_k_dequantize(blocks: np.ndarray) -> np.ndarray:
  return _grouped(_q4_k_values(blocks), *_q4_k_group_scales(blocks))


def _q4_k_split(blocks: np.ndarray) -> block_format.Parts:
  """The 4-bit values (0..15), and each group's scale and minimum with ``d``/``dmin`` folded in."""
  scales, mins = _q4_k_group_scales(blocks)
  return block_format.Parts(_q4_k_values(blocks).astype(ml_dtypes.uint4), scales, mins)


_Q4_K_KEPT = block_format.Kept(
  np.dtype(ml_dtypes.uint4), np.dtype(np.float32), 8, True, _q4_k_split
)
Q4_K = block_format.QuantFormat("Q4_K", K, 144, _q4_k_dequantize, _Q4_K_KEPT)


# -- Q5_K: super-blocks of 256 5-bit values (low nibbles, a high-bit mask) in 8 groups with 6-bit
# scales and minimums, and float16 ``d``/``dmin`` (176 bytes): ``x = d * sc * q - dmin * m``.


def _q5_k_values(blocks: np.ndarray) -> np.ndarray:
  """The 5-bit values (0..31), uint8 ``[n, 256]``."""
  n = blocks.shape[0]
  qh, qs = blocks[:, 16 : 16 + K // 8], blocks[:, 16 + K // 8 :]
  ql = block_format.nibbles(qs, n, 32).reshape((n, -1, 32))
  high = (block_format.bits(qh, n, 8, 32, 1) & np.uint8(0x01)).reshape((n, -1, 32))
  return (ql | (high << np.uint8(4))).reshape((n, K))


def _q5_k_dequantize(blocks: np.ndarray) -> np.ndarray:
  return _grouped(_q5_k_values(blocks), *_q4_k_group_scales(blocks))


def _q5_k_split(blocks: np.ndarray) -> block_format.Parts:
  """The 5-bit values, and each group's scale and minimum with ``d``/``dmin`` folded in."""
  scales, mins = _q4_k_group_scales(blocks)
  return block_format.Parts(_q5_k_values(blocks), scales, mins)


_Q5_K_KEPT = block_format.Kept(np.dtype(np.uint8), np.dtype(np.float32), 8, True, _q5_k_split)
Q5_K = block_format.QuantFormat("Q5_K", K, 176, _q5_k_dequantize, _Q5_K_KEPT)


# -- Q6_K: super-blocks of 256 6-bit values in 16 groups with int8 scales, and a float16 ``d``
# (210 bytes): ``x = d * sc * (q - 32)``.


def _q6_k_scales(blocks: np.ndarray) -> np.ndarray:
  """Each group of 16's scale ``d * sc``, float32 ``[n, 16]``."""
  scales = np.ascontiguousarray(blocks[:, K // 2 + K // 4 : -2]).view(np.int8)
  return block_format.f16(blocks[:, -2:]) * scales.astype(np.float32)


def _q6_k_values(blocks: np.ndarray) -> np.ndarray:
  """The 6-bit values less 32 (-32..31), int8 ``[n, 256]``."""
  n = blocks.shape[0]
  ql, qh = blocks[:, : K // 2], blocks[:, K // 2 : K // 2 + K // 4]
  low = block_format.nibbles(ql, n, 64).reshape((n, -1, 32))
  high = (block_format.bits(qh, n, 4, 32, 2) & np.uint8(0x03)).reshape((n, -1, 32))
  return ((low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)).reshape((n, K))


def _q6_k_dequantize(blocks: np.ndarray) -> np.ndarray:
  return _grouped(_q6_k_values(blocks), _q6_k_scales(blocks))


def _q6_k_split(blocks: np.ndarray) -> block_format.Parts:
  """The signed 6-bit values and each group of 16's scale with ``d`` folded in."""
  return block_format.Parts(_q6_k_values(blocks), _q6_k_scales(blocks))


_Q6_K_KEPT = block_format.Kept(np.dtype(np.int8), np.dtype(np.float32), 16, False, _q6_k_split)
Q6_K = block_format.QuantFormat("Q6_K", K, 210, _q6_k_dequantize, _Q6_K_KEPT)
