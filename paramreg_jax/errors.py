"""The error taxonomy: every error paramreg_jax raises, rooted at :class:`ParamRegError`.

Every error derives from :class:`ParamRegError` (a ``ValueError``), so ``except
paramreg_jax.ParamRegError`` catches all of them. The errors users catch most are also at the
top level (``prj.RestorePlanError``, ``prj.MaterializationError``, ``prj.BindError``,
``prj.MatchError``, ``prj.ExportError``, ``prj.ReconcileError``, ``prj.StateMismatchError``).

Examples:
  >>> import paramreg_jax as prj
  >>> from paramreg_jax import errors
  >>> issubclass(errors.UnknownTensorError, errors.StoreError), errors.BindError is prj.BindError
  (True, True)
"""

from paramreg_jax._src.errors import AliasError
from paramreg_jax._src.errors import BindError
from paramreg_jax._src.errors import ByteCountMismatchError
from paramreg_jax._src.errors import ContradictoryIndexMappingError
from paramreg_jax._src.errors import DtypeMismatchError
from paramreg_jax._src.errors import ElementCountMismatchError
from paramreg_jax._src.errors import EmptyInputsError
from paramreg_jax._src.errors import EmptySourceKeyError
from paramreg_jax._src.errors import ExportError
from paramreg_jax._src.errors import ExportPlanError
from paramreg_jax._src.errors import InvalidIndicesError
from paramreg_jax._src.errors import InvalidJoinAxisError
from paramreg_jax._src.errors import InvalidPermutationError
from paramreg_jax._src.errors import InvalidRangeError
from paramreg_jax._src.errors import InvalidRegionError
from paramreg_jax._src.errors import InvalidSelectionAxisError
from paramreg_jax._src.errors import KeyCollisionError
from paramreg_jax._src.errors import MalformedConfigError
from paramreg_jax._src.errors import MalformedGGUFError
from paramreg_jax._src.errors import MalformedIndexError
from paramreg_jax._src.errors import MalformedKeyError
from paramreg_jax._src.errors import MalformedSafetensorsError
from paramreg_jax._src.errors import MatchError
from paramreg_jax._src.errors import MaterializationError
from paramreg_jax._src.errors import MissingShardError
from paramreg_jax._src.errors import NamedSlotHijackError
from paramreg_jax._src.errors import OrderingContractError
from paramreg_jax._src.errors import ParamRegError
from paramreg_jax._src.errors import PatternError
from paramreg_jax._src.errors import QuantizedLayoutError
from paramreg_jax._src.errors import RecipeError
from paramreg_jax._src.errors import RecipeSetError
from paramreg_jax._src.errors import RecipeShapeMismatchError
from paramreg_jax._src.errors import ReconcileError
from paramreg_jax._src.errors import RestorePlanError
from paramreg_jax._src.errors import SelectionError
from paramreg_jax._src.errors import ShapeMismatchError
from paramreg_jax._src.errors import SourceIOError
from paramreg_jax._src.errors import StateMismatchError
from paramreg_jax._src.errors import StoreError
from paramreg_jax._src.errors import UndefinedValueError
from paramreg_jax._src.errors import UnknownKeyPrefixError
from paramreg_jax._src.errors import UnknownPartError
from paramreg_jax._src.errors import UnknownQuantizationError
from paramreg_jax._src.errors import UnknownSourceKeyError
from paramreg_jax._src.errors import UnknownTensorError
from paramreg_jax._src.errors import UnsafeShardPathError
from paramreg_jax._src.errors import UnsupportedDtypeError
from paramreg_jax._src.errors import ZeroSizedOutputError

__all__ = (
  "AliasError",
  "BindError",
  "ByteCountMismatchError",
  "ContradictoryIndexMappingError",
  "DtypeMismatchError",
  "ElementCountMismatchError",
  "EmptyInputsError",
  "EmptySourceKeyError",
  "ExportError",
  "ExportPlanError",
  "InvalidIndicesError",
  "InvalidJoinAxisError",
  "InvalidPermutationError",
  "InvalidRangeError",
  "InvalidRegionError",
  "InvalidSelectionAxisError",
  "KeyCollisionError",
  "MalformedConfigError",
  "MalformedGGUFError",
  "MalformedIndexError",
  "MalformedKeyError",
  "MalformedSafetensorsError",
  "MatchError",
  "MaterializationError",
  "MissingShardError",
  "NamedSlotHijackError",
  "OrderingContractError",
  "ParamRegError",
  "PatternError",
  "QuantizedLayoutError",
  "RecipeError",
  "RecipeSetError",
  "RecipeShapeMismatchError",
  "ReconcileError",
  "RestorePlanError",
  "SelectionError",
  "ShapeMismatchError",
  "SourceIOError",
  "StateMismatchError",
  "StoreError",
  "UndefinedValueError",
  "UnknownKeyPrefixError",
  "UnknownPartError",
  "UnknownQuantizationError",
  "UnknownSourceKeyError",
  "UnknownTensorError",
  "UnsafeShardPathError",
  "UnsupportedDtypeError",
  "ZeroSizedOutputError",
)
