"""Q4_0: blocks of 32 4-bit values and one float16 scale (18 bytes): ``x = (q - 8) * d``."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from paramreg_jax._src.recipes.quant import base


def dequantize(blocks: np.ndarray) -> np.ndarray:
  n = blocks.shape[0]
  d = base.f16(blocks[:, :2])
  qs = base.nibbles(blocks[:, 2:], n, 16).astype(np.int8) - np.int8(8)
  return d * qs.astype(np.float32)


def split(blocks: np.ndarray) -> base.Parts:
  """The int4 values (``q - 8``) and the float16 scale of each block."""
  qs = base.nibbles(blocks[:, 2:], blocks.shape[0], 16).astype(np.int8) - np.int8(8)
  return base.Parts(qs.astype(ml_dtypes.int4), np.ascontiguousarray(blocks[:, :2]).view(np.float16))


KEPT = base.Kept(np.dtype(ml_dtypes.int4), np.dtype(np.float16), 1, False, split)
FORMAT = base.QuantFormat("Q4_0", 32, 18, dequantize, KEPT)
