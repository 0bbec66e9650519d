"""MXFP4 (OCP microscaling): blocks of 32 FP4 (E2M1) values and one E8M0 exponent.

As GGUF stores it: 17 bytes, the exponent first, then 16 bytes of low-then-high nibbles.
As gpt-oss saves it (``*_blocks`` ``uint8 [..., G, 16]`` and ``*_scales`` E8M0
``[..., G]``): each byte holds two consecutive values, the low nibble first.
"""

from __future__ import annotations

import numpy as np

from paramreg_jax._src.recipes.quant import block_format

# E2M1 values, doubled (GGUF folds the halving into the exponent)
KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)
# E2M1 values (the OCP table gpt-oss uses)
FP4 = np.array(
  [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
  np.float32,
)


def e8m0_half(e: np.ndarray) -> np.ndarray:
  """``2 ** (e - 128)`` as float32 (an E8M0 exponent, halved), subnormals included."""
  e = e.astype(np.uint32)
  out = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
  return out.astype(np.uint32).view(np.float32)


def dequantize(blocks: np.ndarray) -> np.ndarray:
  n = blocks.shape[0]
  d = e8m0_half(blocks[:, :1])
  idx = block_format.nibbles(blocks[:, 1:], n, 16)
  return d * KVALUES[idx].astype(np.float32)


FORMAT = block_format.QuantFormat("MXFP4", 32, 17, dequantize)


def dequantize_split(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
  """gpt-oss's layout: ``blocks [..., G, 16]`` and E8M0 ``scales [..., G]`` to float32
  ``[..., G * 32]``: ``ldexp(FP4[nibble], scale - 127)``, the low nibble first."""
  lead = blocks.shape[:-2]
  groups = blocks.shape[-2]
  lo, hi = FP4[blocks & np.uint8(0x0F)], FP4[blocks >> np.uint8(4)]
  values = np.stack([lo, hi], axis=-1).reshape((*lead, groups, 32))
  exp = scales.astype(np.int32) - 127
  return np.ldexp(values, exp[..., None]).astype(np.float32).reshape((*lead, groups * 32))
