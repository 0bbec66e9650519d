"""llama.cpp's first block formats: blocks of 32 values, each block with a float16 scale
(and, for the ``_1`` formats, a minimum). One section per format, named as GGUF names it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from paramreg_jax._src.recipes.quant import block_format

# -- Q8_0: blocks of 32 int8 values and one float16 scale (34 bytes): ``x = q * d``.


def _q8_0_dequantize(blocks: np.ndarray) -> np.ndarray:
  d = block_format.f16(blocks[:, :2])
  x = np.ascontiguousarray(blocks[:, 2:]).view(np.int8).astype(np.float32)
  return x * d


def _q8_0_split(blocks: np.ndarray) -> block_format.Parts:
  """The int8 values and the float16 scale of each block, as stored."""
  values = np.ascontiguousarray(blocks[:, 2:]).view(np.int8)
  return block_format.Parts(values, np.ascontiguousarray(blocks[:, :2]).view(np.float16))


_Q8_0_KEPT = block_format.Kept(np.dtype(np.int8), np.dtype(np.float16), 1, False, _q8_0_split)
Q8_0 = block_format.QuantFormat("Q8_0", 32, 34, _q8_0_dequantize, _Q8_0_KEPT)


# -- Q4_0: blocks of 32 4-bit values and one float16 scale (18 bytes): ``x = (q - 8) * d``.


def _q4_0_dequantize(blocks: np.ndarray) -> np.ndarray:
  n = blocks.shape[0]
  d = block_format.f16(blocks[:, :2])
  qs = block_format.nibbles(blocks[:, 2:], n, 16).astype(np.int8) - np.int8(8)
  return d * qs.astype(np.float32)


def _q4_0_split(blocks: np.ndarray) -> block_format.Parts:
  """The int4 values (``q - 8``) and the float16 scale of each block."""
  qs = block_format.nibbles(blocks[:, 2:], blocks.shape[0], 16).astype(np.int8) - np.int8(8)
  return block_format.Parts(
    qs.astype(ml_dtypes.int4), np.ascontiguousarray(blocks[:, :2]).view(np.float16)
  )


_Q4_0_KEPT = block_format.Kept(
  np.dtype(ml_dtypes.int4), np.dtype(np.float16), 1, False, _q4_0_split
)
Q4_0 = block_format.QuantFormat("Q4_0", 32, 18, _q4_0_dequantize, _Q4_0_KEPT)


# -- Q4_1: blocks of 32 4-bit values, a float16 scale and minimum (20 bytes): ``x = q * d + m``.


def _q4_1_dequantize(blocks: np.ndarray) -> np.ndarray:
  n = blocks.shape[0]
  d, m = block_format.f16(blocks[:, :2]), block_format.f16(blocks[:, 2:4])
  qs = block_format.nibbles(blocks[:, 4:], n, 16).astype(np.float32)
  return (d * qs) + m


Q4_1 = block_format.QuantFormat("Q4_1", 32, 20, _q4_1_dequantize)


# -- Q5_0: blocks of 32 5-bit values (low nibbles, a 32-bit mask of high bits) and a float16
# scale (22 bytes): ``x = (q - 16) * d``.


def _q5_0_high_bits(qh: np.ndarray, n: int) -> np.ndarray:
  """The 32 high bits of each block, ``[n, 32]`` uint8."""
  words = np.ascontiguousarray(qh).view(np.uint32).reshape((n, 1))
  return ((words >> np.arange(32, dtype=np.uint32).reshape((1, 32))) & np.uint32(1)).astype(
    np.uint8
  )


def _q5_0_dequantize(blocks: np.ndarray) -> np.ndarray:
  n = blocks.shape[0]
  d = block_format.f16(blocks[:, :2])
  qh = _q5_0_high_bits(blocks[:, 2:6], n)
  ql = block_format.nibbles(blocks[:, 6:], n, 16)
  qs = (ql | (qh << np.uint8(4))).astype(np.int8) - np.int8(16)
  return d * qs.astype(np.float32)


Q5_0 = block_format.QuantFormat("Q5_0", 32, 22, _q5_0_dequantize)


# -- Q5_1: blocks of 32 5-bit values, a float16 scale and minimum (24 bytes): ``x = q * d + m``.


def _q5_1_dequantize(blocks: np.ndarray) -> np.ndarray:
  n = blocks.shape[0]
  d, m = block_format.f16(blocks[:, :2]), block_format.f16(blocks[:, 2:4])
  qh = _q5_0_high_bits(blocks[:, 4:8], n)
  ql = block_format.nibbles(blocks[:, 8:], n, 16)
  qs = (ql | (qh << np.uint8(4))).astype(np.float32)
  return (d * qs) + m


Q5_1 = block_format.QuantFormat("Q5_1", 32, 24, _q5_1_dequantize)
