"""The recipe vocabulary: one file per op, each with its four rules (see ``base.py``).

A recipe describes how to derive one weight from checkpoint tensors: ``source`` reads a key
(optionally a selection of it); ``select``, ``concatenate``, ``stack``, ``reshape``,
``transpose``, ``cast``, ``view``, ``neg_log`` and ``subtract_one`` transform it; and
``dequantize``, ``scale_blocks``, ``mxfp4`` and ``block_values``/``block_scales``/
``block_mins`` read quantized storage. Nothing is dequantized unless a recipe says so: packed
data stays as it is (``view`` reinterprets bits). ``op_table.OPS`` lists every op; a new one is
a file here and a line there (``tests/test_op_contract.py`` then asks for its sample).
"""

from paramreg_jax._src.recipes.ops.base import InverseStep
from paramreg_jax._src.recipes.ops.base import NotInvertible
from paramreg_jax._src.recipes.ops.base import Read
from paramreg_jax._src.recipes.ops.base import Recipe
from paramreg_jax._src.recipes.ops.base import check_axis
from paramreg_jax._src.recipes.ops.base import check_recipe
from paramreg_jax._src.recipes.ops.base import nodes
from paramreg_jax._src.recipes.ops.block_part import BlockPart
from paramreg_jax._src.recipes.ops.block_part import block_mins
from paramreg_jax._src.recipes.ops.block_part import block_scales
from paramreg_jax._src.recipes.ops.block_part import block_values
from paramreg_jax._src.recipes.ops.cast import Cast
from paramreg_jax._src.recipes.ops.cast import cast
from paramreg_jax._src.recipes.ops.concatenate import Concatenate
from paramreg_jax._src.recipes.ops.concatenate import concatenate
from paramreg_jax._src.recipes.ops.dequantize import Dequantize
from paramreg_jax._src.recipes.ops.dequantize import dequantize
from paramreg_jax._src.recipes.ops.mxfp4 import Mxfp4
from paramreg_jax._src.recipes.ops.mxfp4 import mxfp4
from paramreg_jax._src.recipes.ops.neg_log import NegLog
from paramreg_jax._src.recipes.ops.neg_log import neg_log
from paramreg_jax._src.recipes.ops.op_table import INVERSE_STEPS
from paramreg_jax._src.recipes.ops.op_table import OPS
from paramreg_jax._src.recipes.ops.reshape import Reshape
from paramreg_jax._src.recipes.ops.reshape import reshape
from paramreg_jax._src.recipes.ops.scale_blocks import ScaleBlocks
from paramreg_jax._src.recipes.ops.scale_blocks import scale_blocks
from paramreg_jax._src.recipes.ops.select import Select
from paramreg_jax._src.recipes.ops.select import select
from paramreg_jax._src.recipes.ops.source import Source
from paramreg_jax._src.recipes.ops.source import map_sources
from paramreg_jax._src.recipes.ops.source import rekey
from paramreg_jax._src.recipes.ops.source import source
from paramreg_jax._src.recipes.ops.stack import Stack
from paramreg_jax._src.recipes.ops.stack import stack
from paramreg_jax._src.recipes.ops.subtract_one import SubtractOne
from paramreg_jax._src.recipes.ops.subtract_one import subtract_one
from paramreg_jax._src.recipes.ops.transpose import Transpose
from paramreg_jax._src.recipes.ops.transpose import transpose
from paramreg_jax._src.recipes.ops.view import View
from paramreg_jax._src.recipes.ops.view import view

__all__ = (
  "INVERSE_STEPS",
  "OPS",
  "BlockPart",
  "Cast",
  "Concatenate",
  "Dequantize",
  "InverseStep",
  "Mxfp4",
  "NegLog",
  "NotInvertible",
  "Read",
  "Recipe",
  "Reshape",
  "ScaleBlocks",
  "Select",
  "Source",
  "Stack",
  "SubtractOne",
  "Transpose",
  "View",
  "block_mins",
  "block_scales",
  "block_values",
  "cast",
  "check_axis",
  "check_recipe",
  "concatenate",
  "dequantize",
  "map_sources",
  "mxfp4",
  "neg_log",
  "nodes",
  "rekey",
  "reshape",
  "scale_blocks",
  "select",
  "source",
  "stack",
  "subtract_one",
  "transpose",
  "view",
)
