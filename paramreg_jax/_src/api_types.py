"""Type aliases of the public signatures: what an editor shows for ``target``, ``recipes``, ...

``PyTree`` follows jax's own convention (``Any``: the structure is checked at run time, with an
error naming the path); the others spell out what each argument accepts.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any
from typing import Literal
from typing import Protocol
from typing import TypeAlias
from typing import runtime_checkable

if TYPE_CHECKING:
  from paramreg_jax._src.recipes.ops import Recipe
  from paramreg_jax._src.recipes.sets import RecipeSet
  from paramreg_jax._src.recipes.sets import Rename

PyTree: TypeAlias = Any
"""A pytree of parameters: arrays or ``jax.ShapeDtypeStruct`` objects (with shardings), flax
linen params, an ``nnx.State`` or ``nnx.Module``, an equinox module."""

Recipes: TypeAlias = "Mapping[str, Recipe] | RecipeSet | Iterable[tuple[str, Recipe]]"
"""Target name -> recipe: a mapping, a ``RecipeSet`` or ``Match`` (with its aliases), or pairs."""

RenameRules: TypeAlias = "Rename | Mapping[str, str | None] | Iterable[tuple[str, str | None]]"
"""Checkpoint key -> target name: exact names, or ``(regex, replacement)`` rules (``None``
drops the key)."""

Exclude: TypeAlias = "Iterable[str] | Callable[[str], bool] | str"
"""Globs over canonical names (``"head/**"``), or a predicate on names."""

Hints: TypeAlias = "Mapping[str, str | Recipe | range | Sequence[int]]"
"""Target name -> a checkpoint name (or a part that names it in every layer) or a recipe; a
fused checkpoint tensor -> its layout; a target stack -> the checkpoint layers it holds."""

DtypePolicy: TypeAlias = Literal["exact", "cast"]
"""``"exact"``: a dtype difference is an error; ``"cast"``: convert."""


@runtime_checkable
class Transformation(Protocol):
  """What ``keyed`` and ``reconcile`` accept: an ``optax.GradientTransformation`` or any object
  with optax's ``init``/``update`` (``optax.MultiSteps(...)``).

  Examples:
    >>> import optax
    >>> from paramreg_jax.typing import Transformation
    >>> isinstance(optax.adam(1e-3), Transformation)
    True
  """

  def init(self, params: Any, /) -> Any: ...

  def update(self, updates: Any, state: Any, params: Any = None, /) -> Any: ...
