"""Every block-quantized format, by the name GGUF gives it."""

from __future__ import annotations

from paramreg_jax._src.recipes.quant import k_quants
from paramreg_jax._src.recipes.quant import legacy
from paramreg_jax._src.recipes.quant import microscaling
from paramreg_jax._src.recipes.quant.block_format import QuantFormat

FORMATS: dict[str, QuantFormat] = {
  f.name: f
  for f in (
    legacy.Q8_0,
    legacy.Q4_0,
    legacy.Q4_1,
    legacy.Q5_0,
    legacy.Q5_1,
    k_quants.Q2_K,
    k_quants.Q3_K,
    k_quants.Q4_K,
    k_quants.Q5_K,
    k_quants.Q6_K,
    microscaling.FORMAT,
  )
}
