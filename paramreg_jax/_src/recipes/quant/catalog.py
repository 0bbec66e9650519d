"""Every block-quantized format, by the name GGUF gives it."""

from __future__ import annotations

from paramreg_jax._src.recipes.quant import mxfp4
from paramreg_jax._src.recipes.quant import q2_k
from paramreg_jax._src.recipes.quant import q3_k
from paramreg_jax._src.recipes.quant import q4_0
from paramreg_jax._src.recipes.quant import q4_1
from paramreg_jax._src.recipes.quant import q4_k
from paramreg_jax._src.recipes.quant import q5_0
from paramreg_jax._src.recipes.quant import q5_1
from paramreg_jax._src.recipes.quant import q5_k
from paramreg_jax._src.recipes.quant import q6_k
from paramreg_jax._src.recipes.quant import q8_0
from paramreg_jax._src.recipes.quant.base import QuantFormat

FORMATS: dict[str, QuantFormat] = {
  m.FORMAT.name: m.FORMAT
  for m in (q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, mxfp4)
}
