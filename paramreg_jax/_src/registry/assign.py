"""Assigning a whole tree: every leaf's key from its path (or position), registered at once;
``tree_keys`` and the registrations are cached per tree structure."""

from __future__ import annotations

import operator
import threading
from typing import Any

import jax
import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.registry import keys as keys_lib
from paramreg_jax._src.registry import registry as registry_lib
from paramreg_jax._src.registry import slots as slots_lib
from paramreg_jax._src.registry.ids import param_ids
from paramreg_jax._src.registry.registry import By
from paramreg_jax._src.registry.registry import ParamRegistry

_KEY_CACHE: dict[tuple[Any, str], tuple[tuple[str, ...], tuple[str | None, ...]]] = {}
_KEY_CACHE_LOCK = threading.Lock()
_KEY_CACHE_MAX = 512


def tree_keys(
  tree: Any, treedef: Any, *, by: By, leaves: Any = None
) -> tuple[tuple[str, ...], tuple[str | None, ...]]:
  """``(keys, names)`` of ``tree``'s leaves in flatten order, cached per treedef.

  Raises:
    KeyCollisionError: if two leaves map to the same name (all collisions listed).
  """
  if by not in ("name", "position"):
    raise ValueError(f"by must be 'name' or 'position', got {by!r}")
  cache_key = (treedef, by)
  hit = _KEY_CACHE.get(cache_key)
  if hit is not None:
    return hit
  if by == "position":
    n = treedef.num_leaves
    result: tuple[tuple[str, ...], tuple[str | None, ...]] = (
      tuple(keys_lib.indexed_key(i) for i in range(n)),
      (None,) * n,
    )
  else:
    names = tuple(keys_lib.tree_names(tree, leaves=leaves))
    if len(set(names)) != len(names):
      flat, _ = jax.tree_util.tree_flatten_with_path(tree)
      raise_collisions(names, [p for p, _ in flat])
    result = (tuple(map(keys_lib.NAMED_KEY_PREFIX.__add__, names)), names)
  with _KEY_CACHE_LOCK:
    if len(_KEY_CACHE) >= _KEY_CACHE_MAX:
      _KEY_CACHE.pop(next(iter(_KEY_CACHE)))
    _KEY_CACHE[cache_key] = result
  return result


def raise_collisions(names: tuple[str, ...], paths: list[Any]) -> None:
  """Raises one ``KeyCollisionError`` listing every name shared by several leaves."""
  groups: dict[str, list[str]] = {}
  for name, path in zip(names, paths):
    groups.setdefault(name, []).append(jax.tree_util.keystr(tuple(path)))
  lines = [f"n:{name} <- {', '.join(ps)}" for name, ps in groups.items() if len(ps) > 1]
  raise errors.KeyCollisionError(
    f"{len(lines)} canonical name(s) are shared by different leaves (e.g. {{0: x, '0': y}}); "
    "rename one of each group so every leaf has its own path name, or use by='position':"
    + errors.bullet_list(lines)
  )


_ASSIGN_CACHE: dict[tuple[Any, ...], tuple[ParamRegistry, tuple[int, ...]]] = {}


_get_shape = operator.attrgetter("shape")
_get_dtype = operator.attrgetter("dtype")


def _specs(leaves: list[Any], keys: tuple[str, ...]) -> tuple[Any, ...]:
  """``(shape, dtype)`` per leaf; arrays in C-speed maps, anything else through ``leaf_spec``."""
  try:
    shapes = list(map(_get_shape, leaves))
    dtypes = list(map(_get_dtype, leaves))
  except AttributeError:
    return _specs_slow(leaves, keys)
  if set(map(type, shapes)) <= {tuple} and all(
    issubclass(t, np.dtype) for t in set(map(type, dtypes))
  ):
    return tuple(zip(shapes, dtypes))
  return _specs_slow(leaves, keys)


def _specs_slow(leaves: list[Any], keys: tuple[str, ...]) -> tuple[Any, ...]:
  out: list[Any] = []
  append = out.append
  np_dtype = np.dtype
  for x in leaves:
    try:
      shape = x.shape
      dtype = x.dtype
    except AttributeError:
      append(slots_lib.leaf_spec(x, where=keys[len(out)]))
      continue
    if type(shape) is not tuple or not isinstance(dtype, np_dtype):
      append(slots_lib.leaf_spec(x, where=keys[len(out)]))
    else:
      append((shape, dtype))
  return tuple(out)


def _assign(
  reg: ParamRegistry, tree: Any, by: By
) -> tuple[ParamRegistry, tuple[int, ...], Any, tuple[str, ...]]:
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  keys, names = tree_keys(tree, treedef, by=by, leaves=leaves)
  specs = _specs(leaves, keys)
  cache_key = (reg, treedef, by, specs)
  hit = _ASSIGN_CACHE.get(cache_key)
  if hit is not None:
    return hit[0], hit[1], treedef, keys
  new, indices = registry_lib.register_leaves(reg, keys, names, specs, named=by == "name")
  with _KEY_CACHE_LOCK:
    if len(_ASSIGN_CACHE) >= _KEY_CACHE_MAX:
      _ASSIGN_CACHE.pop(next(iter(_ASSIGN_CACHE)))
    _ASSIGN_CACHE[cache_key] = (new, indices)
  return new, indices, treedef, keys


def assign_ids(reg: ParamRegistry, tree: Any, *, by: By = "name") -> tuple[ParamRegistry, Any]:
  """Gives every leaf of ``tree`` a stable ``ParamId``; pure.

  Args:
    reg: the registry to extend.
    tree: any pytree of arrays or ``jax.ShapeDtypeStruct`` (dicts, lists, NamedTuples, flax
      linen params, flax NNX ``nnx.State``, equinox modules). ``None`` leaves and empty
      subtrees are not parameters.
    by: ``"name"`` (identity is the tree path) or ``"position"`` (the flatten order).

  Returns:
    ``(registry, ids_tree)``; ``ids_tree`` has ``tree``'s structure with a ``ParamId`` at each
    leaf. Assigning the same tree again returns an equal registry and the same ids.

  Raises:
    KeyCollisionError: two leaves share a name (``by="name"``).
    ShapeMismatchError: a known key's leaf changed shape or dtype.
    OrderingContractError: with ``by="position"``, a positional slot restored from a
      checkpoint is claimed by a leaf of another shape or dtype (the leaves' order changed).
    NamedSlotHijackError: with ``by="position"``, a leaf claims a slot registered by name.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from paramreg_jax import ParamRegistry, assign_ids
    >>> params = {"b": jnp.zeros(3), "w": jnp.ones((2, 3))}
    >>> reg, ids = assign_ids(ParamRegistry(), params)
    >>> ids
    {'b': ParamId(0), 'w': ParamId(1)}
    >>> reg2, ids2 = assign_ids(reg, jax.tree.map(lambda x: x + 1, params))
    >>> ids2 == ids, reg2 == reg
    (True, True)
  """
  new, indices, treedef, _ = _assign(reg, tree, by)
  return new, treedef.unflatten(param_ids(indices))


def assign_keys(reg: ParamRegistry, tree: Any, *, by: By = "name") -> tuple[ParamRegistry, Any]:
  """Like :func:`assign_ids`, with canonical key strings (``n:dense/kernel``) at the leaves.

  Args:
    reg: the registry to extend.
    tree: any pytree of arrays or ``jax.ShapeDtypeStruct`` (as for :func:`assign_ids`).
    by: ``"name"`` (``n:`` keys from tree paths) or ``"position"`` (``p:`` keys from the
      flatten order).

  Returns:
    ``(registry, keys_tree)``; ``keys_tree`` has ``tree``'s structure with the canonical key
    string at each leaf.

  Raises:
    KeyCollisionError: two leaves share a name (``by="name"``).
    ShapeMismatchError: a known key's leaf changed shape or dtype.
    OrderingContractError: with ``by="position"``, a positional slot restored from a
      checkpoint is claimed by a leaf of another shape or dtype (the leaves' order changed).
    NamedSlotHijackError: with ``by="position"``, a leaf claims a slot registered by name.

  Examples:
    >>> import jax.numpy as jnp
    >>> from paramreg_jax import ParamRegistry, assign_keys
    >>> _, keys = assign_keys(ParamRegistry(), [jnp.zeros(2), jnp.zeros(3)], by="position")
    >>> keys
    ['p:0', 'p:1']
  """
  new, _, treedef, keys = _assign(reg, tree, by)
  return new, treedef.unflatten(keys)


def clear_caches() -> None:
  """Forgets every cached tree structure (benchmarks measure the uncached path with it)."""
  with _KEY_CACHE_LOCK:
    _KEY_CACHE.clear()
  _ASSIGN_CACHE.clear()
