"""Every op, and the inverse steps their ``invert`` rules emit, by name."""

from __future__ import annotations

from paramreg_jax._src.recipes.ops.base import InverseStep
from paramreg_jax._src.recipes.ops.base import Recipe
from paramreg_jax._src.recipes.ops.block_part import BlockPart
from paramreg_jax._src.recipes.ops.cast import Cast
from paramreg_jax._src.recipes.ops.concatenate import Concatenate
from paramreg_jax._src.recipes.ops.dequantize import Dequantize
from paramreg_jax._src.recipes.ops.mxfp4 import Mxfp4
from paramreg_jax._src.recipes.ops.neg_log import NegLog
from paramreg_jax._src.recipes.ops.reshape import Reshape
from paramreg_jax._src.recipes.ops.scale_blocks import ScaleBlocks
from paramreg_jax._src.recipes.ops.select import Select
from paramreg_jax._src.recipes.ops.source import Source
from paramreg_jax._src.recipes.ops.stack import Stack
from paramreg_jax._src.recipes.ops.subtract_one import SubtractOne
from paramreg_jax._src.recipes.ops.transpose import Transpose
from paramreg_jax._src.recipes.ops.view import View

OPS: tuple[type[Recipe], ...] = (
  Source,
  Select,
  Concatenate,
  Stack,
  Reshape,
  Transpose,
  Cast,
  View,
  NegLog,
  SubtractOne,
  Dequantize,
  ScaleBlocks,
  Mxfp4,
  BlockPart,
)
"""Every op; a new one is added here once it has its file."""

INVERSE_STEPS: dict[str, InverseStep] = {s.name: s for op in OPS for s in op.inverse_steps}
"""Every step an op's ``invert`` may emit, by name (each name belongs to one op)."""
