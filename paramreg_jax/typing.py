"""The types in paramreg_jax's signatures, for annotating code that wraps it.

``PyTree`` follows jax's convention (``Any``: the structure is checked at run time, with an
error naming the path); the others spell out what each argument accepts.

Examples:
  >>> import paramreg_jax as prj
  >>> from paramreg_jax.typing import PyTree, Recipes
  >>> def load(target: PyTree, src: prj.sources.CheckpointSource, recipes: Recipes) -> PyTree:
  ...   return prj.restore(target, src, recipes=recipes)
"""

from paramreg_jax._src.api_types import DtypePolicy
from paramreg_jax._src.api_types import Exclude
from paramreg_jax._src.api_types import Hints
from paramreg_jax._src.api_types import PyTree
from paramreg_jax._src.api_types import Recipes
from paramreg_jax._src.api_types import RenameRules
from paramreg_jax._src.api_types import Transformation

__all__ = (
  "DtypePolicy",
  "Exclude",
  "Hints",
  "PyTree",
  "Recipes",
  "RenameRules",
  "Transformation",
)
