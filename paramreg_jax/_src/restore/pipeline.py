"""``restore``: plan, materialize and bind in one call (the target flattened once)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from paramreg_jax._src import api_types
from paramreg_jax._src import errors
from paramreg_jax._src.restore import bind as bind_lib
from paramreg_jax._src.restore import contract
from paramreg_jax._src.restore import materialize as materialize_lib
from paramreg_jax._src.restore import planning
from paramreg_jax._src.restore import target as target_lib
from paramreg_jax._src.sources import checkpoint_source as source_lib

_OPTIONS = (
  "recipes",
  "aliases",
  "rename",
  "exclude",
  "dtype_policy",
  "max_inflight_bytes",
  "progress",
  "backend",
)


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
  **unexpected: Any,
) -> api_types.PyTree:
  """Restores ``target`` from ``source``: plan, materialize, bind, all or nothing.

  ``bind(target, materialize(plan_restore(target, source, ...)), exclude=exclude)`` in one
  call. The plan is checked from metadata before any payload is read, and nothing is bound
  unless every weight validates.

  Args:
    target: the tree to restore into: arrays or ``jax.ShapeDtypeStruct`` objects with
      shardings (an abstract tree from ``jax.eval_shape``/``nnx.eval_shape`` is enough), flax
      linen params, an ``nnx.State`` or ``nnx.Module``, an equinox module.
    source: a :class:`~paramreg_jax.sources.CheckpointSource` (``SafetensorsSource``,
      ``OrbaxSource``, ``GGUFSource``, ``MemorySource`` or your own).
    recipes: ``{target name: recipe}`` for the weights that are not stored as they are (a
      ``RecipeSet``, a :class:`~paramreg_jax.Match`, ``fused_split`` results, or a list of
      such mappings).
    aliases: ``{alias name: owner name}`` for tied weights: the alias gets the owner's array.
    rename: checkpoint key → target name rules (:func:`paramreg_jax.recipes.rename`, or its
      arguments); a key renamed to ``None`` is not loaded.
    exclude: globs (or a predicate) over names: target slots kept as they are, and checkpoint
      keys that may stay unused.
    dtype_policy: ``"exact"`` (a dtype difference is an error) or ``"cast"`` (convert).
    max_inflight_bytes: source bytes the host may hold at once besides the restored arrays;
      default (``None``): 1/64 of the memory available, between 4 and 16 MiB (64 MiB for a
      source at a URL).
    progress: show a tqdm bar of the bytes read (notebooks and terminals).
    backend: the :class:`~paramreg_jax.ParameterBackend` that checks, builds and binds the
      weights; default :class:`~paramreg_jax.JaxBackend`.

  Returns:
    The restored tree, of ``target``'s structure (for an ``nnx.Module``: its new ``Param``
    state, for ``nnx.update``).

  Raises:
    RestorePlanError: the checkpoint does not cover the target (unknown, missing or unused
      keys, shape or dtype differences, invalid recipes): every problem is listed, and nothing
      was read.
    MaterializationError: a read or build failed (names the key); nothing is kept.
    BindError: a weight does not fit its slot (shape, dtype, sharding); nothing is bound.

  Examples:
    >>> import jax, numpy as np
    >>> from paramreg_jax import restore
    >>> from paramreg_jax import MemorySource
    >>> src = MemorySource({"dense/kernel": np.ones((2, 3), np.float32)})
    >>> params = restore({"dense": {"kernel": jax.ShapeDtypeStruct((2, 3), np.float32)}}, src)
    >>> params["dense"]["kernel"].shape
    (2, 3)
  """
  errors.refuse_arguments("restore", unexpected, _OPTIONS)
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
