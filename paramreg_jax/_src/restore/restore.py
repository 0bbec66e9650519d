"""``materialize`` → ``MaterializedUnit`` → ``bind``: build every weight, then publish atomically.

``materialize`` reads and builds every planned weight (aliases share their owner's array) and
never touches the target; any failure drops everything built so far. ``bind`` validates the
whole unit against the target (coverage, duplicates, shape, dtype, sharding) and only then
returns a new tree by functional replacement, so publication is all or nothing.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from typing import Any

import jax

from paramreg_jax._src import api_types
from paramreg_jax._src import errors
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.restore import backend as backend_lib
from paramreg_jax._src.restore import plan as plan_lib
from paramreg_jax._src.restore import target as target_lib
from paramreg_jax._src.sources import base as source_lib


class MaterializedUnit(Mapping[str, jax.Array]):
  """An immutable mapping ``canonical key -> jax.Array`` ready to bind.

  Examples:
    >>> import jax.numpy as jnp
    >>> from paramreg_jax import MaterializedUnit
    >>> unit = MaterializedUnit({"n:w": jnp.ones(2)})
    >>> list(unit), len(unit)
    (['n:w'], 1)
  """

  def __init__(self, weights: Mapping[str, jax.Array] | Iterable[tuple[str, jax.Array]]):
    items = list(weights.items()) if isinstance(weights, Mapping) else list(weights)
    data: dict[str, jax.Array] = {}
    for key, value in items:
      if key in data:
        raise errors.BindError(
          f"{key}: two weights for one parameter (duplicate binding)", (f"{key}: duplicate",)
        )
      data[key] = value
    self._data = dict(sorted(data.items()))

  def __getitem__(self, key: str) -> jax.Array:
    return self._data[key]

  def __iter__(self) -> Iterator[str]:
    return iter(self._data)

  def __len__(self) -> int:
    return len(self._data)

  def __repr__(self) -> str:
    return f"MaterializedUnit({len(self._data)} weights: {', '.join(list(self._data)[:4])}{', ...' if len(self._data) > 4 else ''})"


@contextlib.contextmanager
def _progress_bar(enabled: bool, total: int, count: int) -> Iterator[Callable[[int], None] | None]:
  if not enabled:
    yield None
    return
  from tqdm.auto import tqdm

  bar = tqdm(
    total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=f"restoring {count} tensors"
  )
  try:
    yield bar.update
  finally:
    bar.close()


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
  """Python's cycle collector paused while weights are built: every task, program and array
  the restore allocates would otherwise trigger generation scans of the whole heap (10,000 small
  tensors: 1.5-2.0 s with it, 1.2 s without). Reference counting still frees everything; the
  collector resumes, as it was, when the restore ends (also on an error)."""
  enabled = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    if enabled:
      gc.enable()


def _recipe_of(entry: plan_lib.PlanEntry) -> ops.Recipe:
  """A plan entry's recipe; a direct entry is ``source(key)``."""
  if entry.kind == "direct" or entry.recipe is None:
    return ops.Source(str(entry.source_key))
  return entry.recipe


def materialize(
  plan: plan_lib.RestorePlan,
  *,
  backend: backend_lib.ParameterBackend | None = None,
  max_inflight_bytes: int | None = None,
  progress: bool = False,
) -> MaterializedUnit:
  """Reads and builds every weight of ``plan`` as sharded ``jax.Array`` objects.

  Args:
    plan: from :func:`plan_restore`.
    backend: a :class:`ParameterBackend` (default :class:`JaxBackend`).
    max_inflight_bytes: source bytes the host may hold at once besides the restored arrays.
      Peak host memory during the call stays within the restored arrays plus
      ``max(max_inflight_bytes, the blocks one shard needs)``. Default
      (``None``): 1/64 of the memory available, between 4 and 16 MiB.
    progress: show a tqdm bar (bytes, rate) that works in notebooks and terminals.

  Returns:
    A :class:`MaterializedUnit` with one array per planned key; an alias holds its owner's
    array (one physical read).

  Raises:
    MaterializationError: a read or build failed; names the key. Nothing built is kept.

  Examples:
    >>> import jax, numpy as np
    >>> from paramreg_jax import materialize, plan_restore
    >>> from paramreg_jax.sources import MemorySource
    >>> src = MemorySource({"w": np.ones((2, 2), np.float32)})
    >>> target = {"w": jax.ShapeDtypeStruct((2, 2), np.float32), "tied": jax.ShapeDtypeStruct((2, 2), np.float32)}
    >>> unit = materialize(plan_restore(target, src, aliases={"tied": "w"}))
    >>> unit["n:tied"] is unit["n:w"], src.stats.reads
    (True, 1)
  """
  if not isinstance(plan, plan_lib.RestorePlan):
    raise TypeError(f"materialize takes a RestorePlan from plan_restore, got {type(plan).__name__}")
  if max_inflight_bytes is not None and (
    not isinstance(max_inflight_bytes, int)
    or isinstance(max_inflight_bytes, bool)
    or max_inflight_bytes <= 0
  ):
    raise ValueError(f"max_inflight_bytes must be a positive int, got {max_inflight_bytes!r}")
  backend = backend_lib.JaxBackend() if backend is None else backend
  owners = [e for e in plan.entries if e.kind != "alias"]
  weights: dict[str, Any] = {}
  key = None
  with _progress_bar(progress, plan.nbytes, len(owners)) as on_bytes, _no_cyclic_gc():
    base = backend_lib.MaterializationContext(
      "", (), jax.numpy.float32, target_lib.default_sharding(), max_inflight_bytes, on_bytes
    )
    try:
      contexts = [base.for_slot(e.key, e.shape, e.dtype, e.sharding) for e in owners]
      if hasattr(backend, "materialize_all"):  # one call: reads shared and windowed
        key = owners[0].key if owners else None
        built = backend.materialize_all(
          plan.source, [(_recipe_of(e), c) for e, c in zip(owners, contexts)]
        )
      else:  # any ParameterBackend, weight by weight
        built = []
        for entry, context in zip(owners, contexts):
          key = entry.key
          built.append(
            backend.materialize(plan.source.lease(entry.source_key), context)
            if entry.kind == "direct"
            else backend.materialize_recipe(entry.recipe, plan.source, context)
          )
      done = None
      finish_all = getattr(backend, "finish_all", None)
      if finish_all is not None:  # one wait for the whole unit
        try:
          done = finish_all(list(built))
        except Exception:
          done = None  # waited for again weight by weight below, naming the one that fails
      if done is not None:
        weights.update(zip((e.key for e in owners), done))
      else:
        for entry, m in zip(owners, built):
          key = entry.key
          weights[entry.key] = backend.finish_materialization(m)
      for entry in plan.entries:
        if entry.kind == "alias":
          key = entry.key
          weights[entry.key] = backend.share_materialized_weight(weights[str(entry.owner)])
    except errors.ParamRegError as e:
      weights.clear()
      if isinstance(e, errors.MaterializationError):
        if "nothing was kept" not in str(e):
          raise errors.MaterializationError(
            f"{e}; nothing was kept, the target is untouched", e.key
          ) from e
        raise
      raise errors.MaterializationError(
        f"{key}: {e}; nothing was kept, the target is untouched", key
      ) from e
    except (KeyboardInterrupt, Exception) as e:
      weights.clear()
      if isinstance(e, KeyboardInterrupt):
        errors.note_interrupted(e, key)
        raise
      raise errors.MaterializationError(
        f"{key}: {type(e).__name__}: {e}; nothing was kept, the target is untouched", key
      ) from e
  return MaterializedUnit(weights)


def bind(
  target: api_types.PyTree,
  unit: Mapping[str, Any],
  *,
  exclude: api_types.Exclude | None = None,
  backend: backend_lib.ParameterBackend | None = None,
) -> api_types.PyTree:
  """Validates the whole ``unit`` against ``target``, then returns the restored tree.

  Every target slot that is not excluded must get exactly one weight of the right shape,
  dtype and sharding, and every weight must have a slot. All problems are collected and raised
  at once; nothing is published unless everything validates. The input tree is never mutated.

  Args:
    target: the tree to restore into (see :func:`plan_restore`); for an ``nnx.Module`` the
      new ``nnx.State`` of its ``Param`` variables is returned (apply it with ``nnx.update``).
    unit: a :class:`MaterializedUnit` (or any mapping key → array).
    exclude: globs or a predicate over names: slots kept as they are (a weight supplied for
      one counts as unexpected).
    backend: the backend that validates and binds (default :class:`JaxBackend`).

  Returns:
    A new tree of ``target``'s structure with the weights in place.

  Raises:
    BindError: missing, unexpected or duplicate weights, or a shape/dtype/sharding mismatch at
      any slot (all listed); ``.problems`` holds them.

  Examples:
    >>> import jax.numpy as jnp
    >>> from paramreg_jax import bind
    >>> target = {"w": jnp.zeros(2), "b": jnp.zeros(1)}
    >>> new = bind(target, {"n:w": jnp.ones(2), "n:b": jnp.ones(1)})
    >>> new["w"].tolist(), target["w"].tolist()
    ([1.0, 1.0], [0.0, 0.0])
  """
  try:
    leaves, treedef, slots = target_lib.slots(target)
  except errors.KeyCollisionError as e:
    raise errors.BindError(f"the target has duplicate parameter names: {e}", (str(e),)) from None
  return _bind(leaves, treedef, slots, unit, exclude, backend)


def _bind(
  leaves: list[Any],
  treedef: Any,
  slots: list[target_lib.Slot],
  unit: Mapping[str, Any],
  exclude: api_types.Exclude | None,
  backend: backend_lib.ParameterBackend | None,
) -> api_types.PyTree:
  """:func:`bind` of a target already flattened (``restore`` flattens once)."""
  backend = backend_lib.JaxBackend() if backend is None else backend
  excluded = plan_lib._matcher(exclude)
  problems: list[str] = []
  wanted = {}
  for slot in slots:
    if excluded(slot.name):
      continue
    wanted[slot.key] = slot
    if slot.key not in unit:
      problems.append(f"{slot.key}: missing: no weight for this parameter")
      continue
    try:
      backend.validate_bind(leaves[slot.position], unit[slot.key])
    except errors.BindError as e:
      problems.extend(f"{slot.key}: {p}" for p in (e.problems or (str(e),)))
  for key in unit:
    if key not in wanted:
      known = any(s.key == key for s in slots)
      problems.append(
        f"{key}: unexpected: {'the parameter is excluded' if known else 'the target has no such parameter'}"
      )
  if problems:
    raise errors.BindError(
      errors.collected("bind", problems, "the target is unchanged"), tuple(problems)
    )
  new_leaves = list(leaves)
  for key, slot in wanted.items():
    new_leaves[slot.position] = backend.bind(leaves[slot.position], unit[key])
  return treedef.unflatten(new_leaves)


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
  backend: backend_lib.ParameterBackend | None = None,
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
    >>> from paramreg_jax.sources import MemorySource
    >>> src = MemorySource({"dense/kernel": np.ones((2, 3), np.float32)})
    >>> params = restore({"dense": {"kernel": jax.ShapeDtypeStruct((2, 3), np.float32)}}, src)
    >>> params["dense"]["kernel"].shape
    (2, 3)
  """
  plan_lib.check_arguments(source, dtype_policy)
  with _no_cyclic_gc():
    leaves, treedef, slots = target_lib.slots(target)  # once, for the plan and the bind
    plan = plan_lib.plan_slots(slots, source, recipes, aliases, rename, exclude, dtype_policy)
    unit = materialize(
      plan, backend=backend, max_inflight_bytes=max_inflight_bytes, progress=progress
    )
    return _bind(leaves, treedef, slots, unit, exclude, backend)
