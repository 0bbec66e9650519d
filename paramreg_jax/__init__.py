"""paramreg_jax: stable, path-derived identities for JAX parameters.

Every parameter gets a canonical key from its tree path (``n:encoder/0/kernel``); optimizer
state, checkpoint entries, recipes, reports and errors all use it.
"""

from paramreg_jax._src.errors import KeyCollisionError
from paramreg_jax._src.errors import MalformedKeyError
from paramreg_jax._src.errors import NamedSlotHijackError
from paramreg_jax._src.errors import OrderingContractError
from paramreg_jax._src.errors import ParamRegError
from paramreg_jax._src.errors import PatternError
from paramreg_jax._src.errors import ShapeMismatchError
from paramreg_jax._src.errors import UnknownKeyPrefixError
from paramreg_jax._src.keys import INDEXED_KEY_PREFIX
from paramreg_jax._src.keys import NAMED_KEY_PREFIX
from paramreg_jax._src.keys import name_to_path
from paramreg_jax._src.keys import path_to_name
from paramreg_jax._src.registry import ParamId
from paramreg_jax._src.registry import ParamRegistry
from paramreg_jax._src.registry import assign_ids
from paramreg_jax._src.registry import assign_keys

__version__ = "0.1.0.dev0"

__all__ = (
  "INDEXED_KEY_PREFIX",
  "NAMED_KEY_PREFIX",
  "KeyCollisionError",
  "MalformedKeyError",
  "NamedSlotHijackError",
  "OrderingContractError",
  "ParamId",
  "ParamRegError",
  "ParamRegistry",
  "PatternError",
  "ShapeMismatchError",
  "UnknownKeyPrefixError",
  "assign_ids",
  "assign_keys",
  "name_to_path",
  "path_to_name",
)
