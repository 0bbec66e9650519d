"""``bind``: the whole unit validated against the target, then published at once.

``bind`` validates the whole unit against the target (coverage, duplicates, shape, dtype,
sharding) and only then returns a new tree by functional replacement, so publication is all or
nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from paramreg_jax._src import api_types
from paramreg_jax._src import errors
from paramreg_jax._src import patterns as patterns_lib
from paramreg_jax._src.restore import contract
from paramreg_jax._src.restore import target as target_lib
from paramreg_jax._src.restore.jax_backend import backend as backend_lib


def bind(
  target: api_types.PyTree,
  unit: Mapping[str, Any],
  *,
  exclude: api_types.Exclude | None = None,
  backend: contract.ParameterBackend | None = None,
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
  return bind_slots(leaves, treedef, slots, unit, exclude, backend)


def bind_slots(
  leaves: list[Any],
  treedef: Any,
  slots: list[target_lib.TargetSlot],
  unit: Mapping[str, Any],
  exclude: api_types.Exclude | None,
  backend: contract.ParameterBackend | None,
) -> api_types.PyTree:
  """:func:`bind` of a target already flattened (``restore`` flattens once)."""
  backend = backend_lib.default() if backend is None else backend
  excluded = patterns_lib.exclude_matcher(exclude)
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
