"""Which parameter each leaf of an optimizer state belongs to, found by structure.

Parameter-shaped subtrees of a state ("mirrors": Adam's ``mu``/``nu``, traces, accumulators) are
found by structure: a subtree mirrors the parameters when it has their structure, with
``optax.MaskedNode`` standing for masked subtrees (so prefix masks and labels work); its leaves
may have other shapes (adafactor's factored moments). A bare-array parameter is mirrored by a
leaf of its shape and dtype.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import optax

from paramreg_jax._src.registry import assign as registry_lib
from paramreg_jax._src.registry import keys as keys_lib


def is_masked(x: Any) -> bool:
  """Whether ``x`` is optax's placeholder for a masked parameter subtree."""
  return isinstance(x, optax.MaskedNode)


def dtype_of(x: Any) -> Any:
  """``x``'s dtype: numpy's, or jax's extended ones (PRNG keys in dpsgd's state)."""
  dtype = getattr(x, "dtype", None)
  return dtype if dtype is not None else np.asarray(x).dtype


@dataclasses.dataclass(frozen=True)
class ParamIndex:
  """The parameters' keys and shapes by flatten position, and a tree of those positions."""

  positions: Any  # the params tree with each leaf replaced by its flatten index
  keys: tuple[str, ...]
  shapes: tuple[tuple[int, ...], ...]
  dtypes: tuple[Any, ...]

  @classmethod
  def of(cls, params: Any, by: registry_lib.By) -> ParamIndex:
    leaves, flat_def = jax.tree_util.tree_flatten(params)
    treedef: Any = flat_def  # PyTreeDef's methods are not in jax's type stubs
    if treedef.num_nodes == 1 and treedef.num_leaves == 1:
      keys: tuple[str, ...] = (keys_lib.INDEXED_KEY_PREFIX + "0",)  # a bare array has no path
    else:
      keys = registry_lib.tree_keys(params, treedef, by=by)[0]
    return cls(
      treedef.unflatten(range(len(leaves))),
      tuple(keys),
      tuple(tuple(np.shape(x)) for x in leaves),
      tuple(dtype_of(x) for x in leaves),
    )

  def mirror_keys(self, node: Any) -> tuple[str | None, ...] | None:
    """The parameter key of each leaf of ``node`` (``None`` at ``MaskedNode`` leaves), if ``node``
    mirrors the parameters; else ``None``."""
    if node is None or isinstance(node, (str, bytes)):
      return None
    leaves, flat_def = jax.tree_util.tree_flatten(node, is_leaf=is_masked)
    treedef: Any = flat_def
    if not leaves or treedef.num_leaves > len(self.keys):
      return None
    if treedef.num_nodes == 1 and not is_masked(leaves[0]):  # a leaf: mirrors a bare array
      bare = len(self.keys) == 1 and isinstance(self.positions, int)
      ok = bare and np.shape(leaves[0]) == self.shapes[0] and dtype_of(leaves[0]) == self.dtypes[0]
      return (self.keys[0],) if ok else None
    try:
      parts = treedef.flatten_up_to(self.positions)
    except (ValueError, TypeError):
      return None
    out: list[str | None] = []
    for leaf, part in zip(leaves, parts):
      if is_masked(leaf):
        out.append(None)  # stands for a masked subtree: no state for those parameters
      elif isinstance(part, int):  # shapes may differ: adafactor's factored moments
        out.append(self.keys[part])
      else:
        return None
    return tuple(out) if any(k is not None for k in out) else None


Path = tuple[str, ...]


def components(path: Any) -> Path:
  return tuple(keys_lib.entry_to_component(e) for e in path)


def mirrors(state: Any, index: ParamIndex) -> list[tuple[Path, Any, tuple[str | None, ...]]]:
  """``(prefix, subtree, keys)`` of every subtree of ``state`` that mirrors the parameters."""
  keys_of: dict[int, tuple[str | None, ...]] = {}  # id(node) -> keys, for the nodes that mirror

  def is_mirror(node: Any) -> bool:
    keys = index.mirror_keys(node)
    if keys is not None:
      keys_of[id(node)] = keys
    return keys is not None

  flat = jax.tree_util.tree_flatten_with_path(state, is_leaf=is_mirror)[0]
  return [(components(path), node, keys_of[id(node)]) for path, node in flat if id(node) in keys_of]


def state_leaves(tree: Any) -> list[tuple[Path, Any]]:
  """``(path components, leaf)`` of a state, whatever form it comes in.

  A flax ``Variable``'s own ``.value`` attribute and the ``{'value': x}`` dicts orbax writes for a
  saved ``nnx.State`` are not part of the path, so live, restored and pure NNX states agree.
  """
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  paths = keys_lib.fold_saved_variables([p for p, _ in flat])
  out = []
  for path, (_, leaf) in zip(paths, flat):
    if len(path) > 1 and keys_lib.is_variable_slot(path[-1]):
      path = path[:-1]
    out.append((components(path), leaf))
  return out


def owner_of(comps: Path, prefixes: list[Path]) -> tuple[Path, str] | None:
  """``(prefix, parameter key)`` of a state leaf at ``comps``, if it lies under a mirror."""
  for prefix in prefixes:
    n = len(prefix)
    if len(comps) > n and comps[:n] == prefix:
      rest = comps[n:]
      if len(rest) == 1 and keys_lib.is_canonical_key(rest[0]):
        return prefix, rest[0]  # a state saved by the first keyed design (see reconcile)
      name = "/".join(keys_lib.escape_component(c) for c in rest)
      return prefix, keys_lib.NAMED_KEY_PREFIX + name
    if len(comps) == n and comps == prefix:
      return prefix, keys_lib.INDEXED_KEY_PREFIX + "0"  # mirrors a bare-array parameter
  return None


def positions_of(owners: Any, state: Any = None) -> dict[str, str]:
  """``{named key: positional key}`` of the parameters a state mirrors: the order in which
  their names first appear in its fullest mirror (a parameter's flatten position, for a state
  built by ``tx.init``). Masked parameters have no state, so a masked state's positions cannot
  be told: ``ValueError``."""
  if state is not None and any(
    is_masked(x) for x in jax.tree_util.tree_leaves(state, is_leaf=is_masked)
  ):
    raise ValueError(
      "the state masks some parameters (optax.masked / multi_transform), so their positions "
      "cannot be read from it; key this optimizer by name (keyed(tx, by='name'))"
    )
  per_prefix: dict[Path, list[str]] = {}
  for prefix, key in owners:
    names = per_prefix.setdefault(prefix, [])
    if key not in names:
      names.append(key)
  fullest = max(per_prefix.values(), key=len, default=[])
  return {name: keys_lib.INDEXED_KEY_PREFIX + str(i) for i, name in enumerate(fullest)}


def rekey(table: dict[tuple[Path, str], Any], names: dict[str, str]) -> dict[tuple[Path, str], Any]:
  """An owner table with its named keys replaced by ``names[key]`` (positional keys)."""
  return {(prefix, names.get(key, key)): v for (prefix, key), v in table.items()}


def optimizer_state(state: Any) -> Any:
  """The optax state in ``state``: ``nnx.state(optimizer)`` (live, pure, or restored without a
  target) and a restored flax ``TrainState`` hold it under ``opt_state``, a live
  ``TrainState`` (or a subclass) as its field; anything else is taken to be the optax state
  itself."""
  if isinstance(state, Mapping) and "opt_state" in state:
    return state["opt_state"]
  from flax.training import train_state  # flax is imported by then wherever a state exists

  if isinstance(state, train_state.TrainState):
    return state.opt_state
  return state
