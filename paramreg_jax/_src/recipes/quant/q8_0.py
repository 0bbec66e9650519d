"""Q8_0: blocks of 32 int8 values and one float16 scale (34 bytes): ``x = q * d``."""

from __future__ import annotations

import numpy as np

from paramreg_jax._src.recipes.quant import base


def dequantize(blocks: np.ndarray) -> np.ndarray:
  d = base.f16(blocks[:, :2])
  x = np.ascontiguousarray(blocks[:, 2:]).view(np.int8).astype(np.float32)
  return x * d


def split(blocks: np.ndarray) -> base.Parts:
  """The int8 values and the float16 scale of each block, as stored."""
  values = np.ascontiguousarray(blocks[:, 2:]).view(np.int8)
  return base.Parts(values, np.ascontiguousarray(blocks[:, :2]).view(np.float16))


KEPT = base.Kept(np.dtype(np.int8), np.dtype(np.float16), 1, False, split)
FORMAT = base.QuantFormat("Q8_0", 32, 34, dequantize, KEPT)
