"""``restore``: plan, materialize and bind in one call (the target flattened once)."""

from __future__ import annotations

from collections.abc import Mapping

from paramreg_jax._src import api_types
from paramreg_jax._src.restore import bind as bind_lib
from paramreg_jax._src.restore import contract
from paramreg_jax._src.restore import materialize as materialize_lib
from paramreg_jax._src.restore import planning
from paramreg_jax._src.restore import target as target_lib
from paramreg_jax._src.sources import base as source_lib


def restore(
  target: api_types.PyTree,
  source: source_lib.CheckpointSource,
  *,
  recipes: api_types.Recipes | None = None,
  aliases: Mapping[str, str] | None = None,
  rename: api_types.RenameRules | None = None,
  exclude: api_types.Exclude | None = None,
  dtype_policy: api_types.DtypePolicy = "exact",
  max_inflight_bytes: int | None = None,
  progress: bool = False,
  backend: contract.ParameterBackend | None = None,
) -> api_types.PyTree:
  """``bind(target, materialize(plan_restore(target, source, ...)))`` in one call.

  Args:
    target: the tree to restore into (abstract is fine: ``jax.eval_shape`` output with
      shardings, or an ``nnx.Module``).
    source: a checkpoint source.
    recipes, aliases, rename, exclude, dtype_policy: see :func:`plan_restore`.
    max_inflight_bytes, progress, backend: see :func:`materialize`.

  Returns:
    The restored tree (for an ``nnx.Module``: its new ``Param`` state, for ``nnx.update``).

  Examples:
    >>> import jax, numpy as np
    >>> from paramreg_jax import restore
    >>> from paramreg_jax import MemorySource
    >>> src = MemorySource({"dense/kernel": np.ones((2, 3), np.float32)})
    >>> params = restore({"dense": {"kernel": jax.ShapeDtypeStruct((2, 3), np.float32)}}, src)
    >>> params["dense"]["kernel"].shape
    (2, 3)
  """
  planning.check_arguments(source, dtype_policy)
  with materialize_lib.no_cyclic_gc():
    leaves, treedef, slots = target_lib.slots(target)  # once, for the plan and the bind
    plan = planning.plan_slots(
      slots, source, recipes, aliases, rename, exclude, dtype_policy, backend
    )
    unit = materialize_lib.materialize(
      plan, backend=backend, max_inflight_bytes=max_inflight_bytes, progress=progress
    )
    return bind_lib.bind_slots(leaves, treedef, slots, unit, exclude, backend)
