"""Derived-weight recipes: declarative rename/transpose/split/stack/cast/view of checkpoint tensors."""

from paramreg_jax._src import surface as _surface
from paramreg_jax._src.recipes.inference import infer
from paramreg_jax._src.recipes.inference import source_keys
from paramreg_jax._src.recipes.ops import Recipe
from paramreg_jax._src.recipes.ops import block_mins
from paramreg_jax._src.recipes.ops import block_scales
from paramreg_jax._src.recipes.ops import block_values
from paramreg_jax._src.recipes.ops import cast
from paramreg_jax._src.recipes.ops import concatenate
from paramreg_jax._src.recipes.ops import dequantize
from paramreg_jax._src.recipes.ops import mxfp4
from paramreg_jax._src.recipes.ops import neg_log
from paramreg_jax._src.recipes.ops import reshape
from paramreg_jax._src.recipes.ops import scale_blocks
from paramreg_jax._src.recipes.ops import select
from paramreg_jax._src.recipes.ops import source
from paramreg_jax._src.recipes.ops import stack
from paramreg_jax._src.recipes.ops import subtract_one
from paramreg_jax._src.recipes.ops import transpose
from paramreg_jax._src.recipes.ops import view
from paramreg_jax._src.recipes.sets import FusedSplit
from paramreg_jax._src.recipes.sets import RecipeSet
from paramreg_jax._src.recipes.sets import Rename
from paramreg_jax._src.recipes.sets import fused_split
from paramreg_jax._src.recipes.sets import rename
from paramreg_jax._src.restore.evaluate import evaluate

__all__ = (
  "FusedSplit",
  "Recipe",
  "RecipeSet",
  "Rename",
  "block_mins",
  "block_scales",
  "block_values",
  "cast",
  "concatenate",
  "dequantize",
  "evaluate",
  "fused_split",
  "infer",
  "mxfp4",
  "neg_log",
  "rename",
  "reshape",
  "scale_blocks",
  "select",
  "source",
  "source_keys",
  "stack",
  "subtract_one",
  "transpose",
  "view",
)

# a name exported elsewhere: an AttributeError that says where
__getattr__ = _surface.elsewhere("paramreg_jax.recipes")
