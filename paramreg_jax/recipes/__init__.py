"""Derived-weight recipes: declarative rename/transpose/split/stack/cast/view of checkpoint tensors."""

from paramreg_jax._src.errors import AliasError
from paramreg_jax._src.errors import ByteCountMismatchError
from paramreg_jax._src.errors import DtypeMismatchError
from paramreg_jax._src.errors import ElementCountMismatchError
from paramreg_jax._src.errors import EmptyInputsError
from paramreg_jax._src.errors import EmptySourceKeyError
from paramreg_jax._src.errors import InvalidIndicesError
from paramreg_jax._src.errors import InvalidJoinAxisError
from paramreg_jax._src.errors import InvalidPermutationError
from paramreg_jax._src.errors import InvalidRangeError
from paramreg_jax._src.errors import InvalidSelectionAxisError
from paramreg_jax._src.errors import RecipeError
from paramreg_jax._src.errors import RecipeSetError
from paramreg_jax._src.errors import RecipeShapeMismatchError
from paramreg_jax._src.errors import SelectionError
from paramreg_jax._src.errors import UnknownSourceKeyError
from paramreg_jax._src.errors import UnsupportedDtypeError
from paramreg_jax._src.errors import ZeroSizedOutputError
from paramreg_jax._src.recipes.inference import infer
from paramreg_jax._src.recipes.inference import source_keys
from paramreg_jax._src.recipes.ops import Recipe
from paramreg_jax._src.recipes.ops import cast
from paramreg_jax._src.recipes.ops import concatenate
from paramreg_jax._src.recipes.ops import neg_log
from paramreg_jax._src.recipes.ops import reshape
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
  "AliasError",
  "ByteCountMismatchError",
  "DtypeMismatchError",
  "ElementCountMismatchError",
  "EmptyInputsError",
  "EmptySourceKeyError",
  "FusedSplit",
  "InvalidIndicesError",
  "InvalidJoinAxisError",
  "InvalidPermutationError",
  "InvalidRangeError",
  "InvalidSelectionAxisError",
  "Recipe",
  "RecipeError",
  "RecipeSet",
  "RecipeSetError",
  "RecipeShapeMismatchError",
  "Rename",
  "SelectionError",
  "UnknownSourceKeyError",
  "UnsupportedDtypeError",
  "ZeroSizedOutputError",
  "cast",
  "concatenate",
  "evaluate",
  "fused_split",
  "infer",
  "neg_log",
  "rename",
  "reshape",
  "select",
  "source",
  "source_keys",
  "stack",
  "subtract_one",
  "transpose",
  "view",
)
