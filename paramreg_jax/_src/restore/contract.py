"""The backend contract: what ``materialize``, ``bind`` and ``plan_restore`` call, typed.

A :class:`ParameterBackend` turns recipes into arrays on devices. Its calls, in the order a
restore makes them:

``preflight_recipe(recipe, context)``
  at planning: can this backend build the weight (dtype, sharding)? Nothing is read.
``materialize_all(source, [(recipe, context), ...])``
  starts building a whole unit: reads are shared and windowed across weights.
``finish_all([materialization, ...])``
  one wait for every transfer of the unit; the weights, in order.
``share_materialized_weight(weight)``
  a tied parameter: the owner's weight, shared.
``validate_bind(target, weights)``, ``bind(target, weights)``
  the whole unit checked against the target, then placed in it.

Reading one tensor (a lease) is the recipe ``source(key, selection)``, so there is one way to
build a weight. :class:`~paramreg_jax.JaxBackend` builds ``jax.Array`` weights; a new
backend (another array library, another device runtime) implements this class.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import Protocol
from typing import runtime_checkable

import jax
import numpy as np

from paramreg_jax._src.recipes import ops
from paramreg_jax._src.sources import checkpoint_source as source_lib

Parameter = Any
"""A target slot: a ``jax.Array``, or a ``jax.ShapeDtypeStruct`` with a ``.sharding``."""


@dataclasses.dataclass
class MaterializationContext:
  """Where one weight goes, and the host-memory budget of the unit it belongs to.

  Attributes:
    key: the target key (for messages).
    shape, dtype, sharding: what the weight must be.
    max_inflight_bytes: source bytes the host may hold at once besides the restored arrays
      (three windows of a third of it: being read, read, being built); ``None`` for
      :func:`default_max_inflight_bytes`.
    on_bytes: called with the byte count of every block read (progress bars).

  A :class:`ParameterBackend` receives one per weight from :func:`~paramreg_jax.materialize`;
  build one yourself only to call a backend directly.

  Examples:
    >>> import jax, numpy as np
    >>> from paramreg_jax import MaterializationContext
    >>> device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    >>> ctx = MaterializationContext("n:w", (8,), np.dtype(np.float32), device)
    >>> ctx.for_slot("n:b", (2,), np.float32, device).shape
    (2,)
  """

  key: str
  shape: tuple[int, ...]
  dtype: np.dtype
  sharding: jax.sharding.Sharding
  max_inflight_bytes: int | None = None
  on_bytes: Callable[[int], None] | None = None

  def for_slot(
    self, key: str, shape: tuple[int, ...], dtype: Any, sharding: Any
  ) -> MaterializationContext:
    """A context for another weight sharing this one's budget and progress."""
    return MaterializationContext(
      key, tuple(shape), np.dtype(dtype), sharding, self.max_inflight_bytes, self.on_bytes
    )


@dataclasses.dataclass(frozen=True)
class Materialization:
  """A weight whose device transfers may still be in flight (finish it to wait).

  Attributes:
    key: the target key it was built for.
    weight: the array (its transfers may be in flight until ``finish_all``).
    adopted: every shard is a host buffer a CPU device adopted as it was (no transfer to wait
      for).

  Examples:
    >>> import jax, numpy as np
    >>> from paramreg_jax import JaxBackend, MaterializationContext, MemorySource, recipes
    >>> src = MemorySource({"w": np.ones(4, np.float32)})
    >>> device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    >>> ctx = MaterializationContext("n:w", (4,), np.dtype(np.float32), device)
    >>> [m] = JaxBackend().materialize_all(src, [(recipes.source("w"), ctx)])
    >>> m.key, m.weight.shape
    ('n:w', (4,))
  """

  key: str
  weight: jax.Array
  adopted: bool = False


@runtime_checkable
class ParameterBackend(Protocol):
  """Materializes checkpoint data into native weights and binds them to parameter slots.

  :func:`~paramreg_jax.plan_restore` calls ``preflight_recipe`` (metadata only) for every
  recipe; :func:`~paramreg_jax.materialize` calls ``materialize_all`` once for the unit, then
  ``finish_all`` once, then ``share_materialized_weight`` for each tied weight;
  :func:`~paramreg_jax.bind` calls ``validate_bind`` for every slot before it calls ``bind``
  for any. ``bind`` cannot fail after a successful ``validate_bind`` on the same arguments, so
  a whole unit is validated before anything is published.

  Examples:
    >>> from paramreg_jax import JaxBackend, ParameterBackend
    >>> isinstance(JaxBackend(), ParameterBackend)
    True
  """

  def preflight_recipe(self, recipe: ops.Recipe, source: source_lib.CheckpointSource) -> None:
    """Raises a ``RecipeError`` when ``recipe`` could never be materialized (metadata only)."""
    ...

  def materialize_all(
    self,
    source: source_lib.CheckpointSource,
    requests: Sequence[tuple[ops.Recipe, MaterializationContext]],
  ) -> list[Materialization]:
    """Starts building every requested weight (a plain tensor is ``source(key)``)."""
    ...

  def finish_all(self, materializations: Sequence[Materialization]) -> list[jax.Array]:
    """Waits for the weights' transfers; returns them in order."""
    ...

  def share_materialized_weight(self, weight: jax.Array) -> jax.Array:
    """The weight a tied parameter gets from its owner's."""
    ...

  def validate_bind(self, parameter: Parameter, weight: jax.Array) -> None:
    """Raises ``BindError`` (with ``.problems``) unless ``weight`` can replace ``parameter``."""
    ...

  def bind(self, parameter: Parameter, weight: jax.Array) -> jax.Array:
    """The slot's new value (after a successful :meth:`validate_bind`)."""
    ...
