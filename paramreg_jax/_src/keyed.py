"""``keyed``: optax state stored by canonical parameter key instead of tree position.

``keyed(tx)`` wraps any optax transformation. Its state is the inner state with every subtree
that mirrors the parameters (moments, traces, accumulators, ``MultiSteps`` gradients, EMA
params) replaced by a :class:`KeyedSlots` mapping ``canonical key -> leaf``. Counts and
hyperparameters stay where they are. The conversion is pure restructuring: under ``jax.jit``
it compiles away, and updates are bit-identical to ``tx``'s.

The static layout of each mirror (its tree structure, the key at each position, masked
positions, parameter shapes) travels in the pytree aux data of its ``KeyedSlots``, so
``update`` needs no cache and no host work beyond checking shapes at trace time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from collections.abc import Mapping
from typing import Any

import jax
import optax

from paramreg_jax._src import errors
from paramreg_jax._src import keys as keys_lib
from paramreg_jax._src import registry as registry_lib

_KEYED_MARK = "__paramreg_keyed__"


def _is_masked(x: Any) -> bool:
  return isinstance(x, optax.MaskedNode)


@dataclasses.dataclass(frozen=True)
class SlotLayout:
  """Static layout of one mirrored subtree (pytree aux data of ``KeyedSlots``).

  Attributes:
    structure: the inner subtree's treedef, with ``optax.MaskedNode`` counted as a leaf.
    leaf_keys: the canonical key at each leaf position of ``structure``.
    masked: whether each position holds a ``MaskedNode`` (no state for that parameter).
    param_shapes: the parameter's shape at each position, checked against updates.
  """

  structure: Any
  leaf_keys: tuple[str, ...]
  masked: tuple[bool, ...]
  param_shapes: tuple[tuple[int, ...], ...]
  # Derived once (layouts are static; they were re-sorted on every access and every step):
  # the keys that hold state, sorted (the order of ``KeyedSlots`` children), and their positions.
  keys: tuple[str, ...] = dataclasses.field(init=False, compare=False, repr=False)
  positions: dict[str, int] = dataclasses.field(init=False, compare=False, repr=False)

  def __post_init__(self) -> None:
    keys = tuple(sorted(k for k, m in zip(self.leaf_keys, self.masked) if not m))
    object.__setattr__(self, "keys", keys)
    object.__setattr__(self, "positions", {k: i for i, k in enumerate(keys)})


class KeyedSlots(Mapping[str, Any]):
  """A read-only mapping ``canonical key -> state leaf`` for one mirrored state subtree.

  It is a pytree node whose children are the leaves in sorted key order, each under a
  ``DictKey(canonical key)`` path entry, so a checkpoint stores ``mu`` as a dict keyed by
  ``n:dense/kernel``-style keys, and restoring it without a target gives that plain dict back.

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> from paramreg_jax import keyed
    >>> tx = keyed(optax.adam(1e-3))
    >>> state = tx.init({"dense": {"kernel": jnp.zeros((2, 2)), "bias": jnp.zeros(2)}})
    >>> mu = state[0].mu
    >>> list(mu), mu["n:dense/bias"].shape
    (['n:dense/bias', 'n:dense/kernel'], (2,))
  """

  __slots__ = ("_layout", "_leaves")

  def __init__(self, layout: SlotLayout, leaves: tuple[Any, ...]):
    self._layout = layout
    self._leaves = tuple(leaves)

  @property
  def layout(self) -> SlotLayout:
    return self._layout

  def __getitem__(self, key: str) -> Any:
    index = self._layout.positions.get(key)
    if index is None:
      raise KeyError(key)
    return self._leaves[index]

  def __iter__(self) -> Iterator[str]:
    return iter(self._layout.keys)

  def __len__(self) -> int:
    return len(self._leaves)

  def __reduce__(self) -> tuple[Any, ...]:
    return (KeyedSlots, (self._layout, self._leaves))

  def __repr__(self) -> str:
    items = ", ".join(
      f"{k!r}: {getattr(v, 'shape', v)}" for k, v in zip(self._layout.keys, self._leaves)
    )
    return f"KeyedSlots({{{items}}})"

  __eq__ = object.__eq__  # type: ignore[assignment]  # leaves are arrays
  __hash__ = object.__hash__  # type: ignore[assignment]

  # --- conversion -----------------------------------------------------------------------

  @classmethod
  def from_inner(cls, subtree: Any, layout: SlotLayout) -> KeyedSlots:
    leaves = layout.structure.flatten_up_to(subtree)
    by_key = {k: x for k, x, m in zip(layout.leaf_keys, leaves, layout.masked) if not m}
    return cls(layout, tuple(by_key[k] for k in layout.keys))

  def to_inner(self) -> Any:
    layout = self._layout
    by_key = dict(zip(layout.keys, self._leaves))
    leaves = [
      optax.MaskedNode() if m else by_key[k] for k, m in zip(layout.leaf_keys, layout.masked)
    ]
    return layout.structure.unflatten(leaves)


jax.tree_util.register_pytree_with_keys(
  KeyedSlots,
  lambda s: (
    tuple((jax.tree_util.DictKey(k), x) for k, x in zip(s.layout.keys, s._leaves)),
    s.layout,
  ),
  lambda layout, leaves: KeyedSlots(layout, tuple(leaves)),
  flatten_func=lambda s: (s._leaves, s.layout),
)


def _is_keyed(x: Any) -> bool:
  return isinstance(x, KeyedSlots)


# --- building layouts -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Template:
  """A tree the inner state may mirror: its treedef, keys and leaf shapes."""

  treedef: Any
  keys: tuple[str, ...]
  shapes: tuple[tuple[int, ...], ...]


def _template(tree: Any, by: registry_lib.By, *, what: str) -> _Template:
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  treedef_: Any = treedef
  if treedef_.num_nodes == 1 and treedef_.num_leaves == 1:
    raise errors.MalformedKeyError(
      f"{what} is a single bare array; keyed optimizer state needs a tree of parameters: wrap "
      "it in a dict ({'w': params})"
    )
  keys, _ = registry_lib.tree_keys(tree, treedef, by=by)
  shapes = tuple(tuple(getattr(x, "shape", ())) for x in leaves)
  return _Template(treedef, keys, shapes)


def _templates(params: Any, by: registry_lib.By) -> list[_Template]:
  out = [_template(params, by, what="params")]
  if isinstance(params, optax.LookaheadParams):  # fast/slow: inner state mirrors params.fast
    out.append(_template(params.fast, by, what="params.fast"))
  return out


def _to_keyed(inner: Any, templates: list[_Template]) -> Any:
  by_treedef = {t.treedef: t for t in templates}

  def match(node: Any) -> _Template | None:
    if node is None or _is_masked(node) or isinstance(node, (jax.Array, jax.ShapeDtypeStruct)):
      return None
    structure = jax.tree_util.tree_structure(node, is_leaf=_is_masked)
    return by_treedef.get(structure)

  def convert(node: Any) -> Any:
    t = match(node)
    if t is None:
      return node
    structure = jax.tree_util.tree_structure(node, is_leaf=_is_masked)
    masked = tuple(_is_masked(x) for x in jax.tree_util.tree_leaves(node, is_leaf=_is_masked))
    layout = SlotLayout(structure, t.keys, masked, t.shapes)
    return KeyedSlots.from_inner(node, layout)

  return jax.tree.map(convert, inner, is_leaf=lambda n: match(n) is not None)


def _from_keyed(state: Any) -> Any:
  return jax.tree.map(lambda s: s.to_inner() if _is_keyed(s) else s, state, is_leaf=_is_keyed)


def _rekey(new_inner: Any, old_state: Any) -> Any:
  """Puts ``new_inner`` back into the keyed layout of ``old_state`` (same positions)."""
  flat, treedef_ = jax.tree_util.tree_flatten(old_state, is_leaf=_is_keyed)
  treedef: Any = treedef_
  parts = treedef.flatten_up_to(new_inner)
  return treedef.unflatten(
    [KeyedSlots.from_inner(p, o.layout) if _is_keyed(o) else p for o, p in zip(flat, parts)]
  )


def layouts(state: Any) -> list[SlotLayout]:
  """The layouts of every ``KeyedSlots`` in ``state``, in flatten order."""
  return [s.layout for s in jax.tree_util.tree_leaves(state, is_leaf=_is_keyed) if _is_keyed(s)]


def _check_updates(state: Any, updates: Any, by: registry_lib.By) -> None:
  """Trace-time check that ``updates`` are the parameters the state was built for."""
  found = layouts(state)
  if not found:
    return
  leaves, treedef = jax.tree_util.tree_flatten(updates)
  keys, _ = registry_lib.tree_keys(updates, treedef, by=by)
  shapes = dict(zip(keys, (tuple(getattr(x, "shape", ())) for x in leaves)))
  for layout in found:
    expected = dict(zip(layout.leaf_keys, layout.param_shapes))
    if expected == shapes:
      continue
    missing = sorted(set(shapes) - set(expected))
    unexpected = sorted(set(expected) - set(shapes))
    changed = sorted(
      f"{k}: state was built for {expected[k]}, the update is {shapes[k]}"
      for k in set(expected) & set(shapes)
      if expected[k] != shapes[k]
    )
    raise errors.StateMismatchError(
      "the keyed optimizer state does not match the parameters it is updating: "
      f"{len(missing)} parameter(s) without state, {len(unexpected)} state key(s) without a "
      f"parameter, {len(changed)} shape change(s). After changing the model, run "
      "`state, report = paramreg_jax.reconcile(tx, state, params)` once before updating:"
      + errors.bullet_list(
        [f"missing state: {k}" for k in missing]
        + [f"unexpected state: {k}" for k in unexpected]
        + changed
      )
    )


def keyed(
  tx: optax.GradientTransformation, *, by: registry_lib.By = "name"
) -> optax.GradientTransformationExtraArgs:
  """Wraps an optax transformation so its per-parameter state is keyed by canonical key.

  Args:
    tx: any ``optax.GradientTransformation`` (or ``GradientTransformationExtraArgs``),
      including ``chain``, ``partition``, ``masked``, ``MultiSteps``, ``inject_hyperparams``
      and ``lookahead`` compositions.
    by: ``"name"`` (keys from tree paths, order-independent) or ``"position"``.

  Returns:
    A transformation whose ``update(updates, state, params=None, **extra)`` gives
    bit-identical updates to ``tx``; its state stores every params-mirroring subtree as a
    :class:`KeyedSlots` mapping (``state[0].mu["n:dense/kernel"]``).

  Raises:
    StateMismatchError: (at update) the state's keys or parameter shapes differ from the
      updates'; run :func:`reconcile` after changing the model.

  Examples:
    >>> import jax, jax.numpy as jnp, optax
    >>> from paramreg_jax import keyed
    >>> params = {"dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.zeros(2)}}
    >>> tx = keyed(optax.adam(1e-2))
    >>> state = tx.init(params)
    >>> sorted(state[0].mu)
    ['n:dense/bias', 'n:dense/kernel']
    >>> grads = jax.tree.map(jnp.ones_like, params)
    >>> updates, state = tx.update(grads, state, params)
    >>> plain, _ = optax.adam(1e-2).update(grads, optax.adam(1e-2).init(params), params)
    >>> bool(jnp.all(updates["dense"]["kernel"] == plain["dense"]["kernel"]))
    True
  """
  if by not in ("name", "position"):
    raise ValueError(f"by must be 'name' or 'position', got {by!r}")
  inner = optax.with_extra_args_support(tx)

  def init_fn(params: Any) -> Any:
    return _to_keyed(inner.init(params), _templates(params, by))

  def update_fn(updates: Any, state: Any, params: Any = None, **extra: Any) -> tuple[Any, Any]:
    _check_updates(state, updates, by)
    new_updates, new_inner = inner.update(updates, _from_keyed(state), params, **extra)
    return new_updates, _rekey(new_inner, state)

  setattr(init_fn, _KEYED_MARK, (tx, by))
  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def keyed_info(tx: Any) -> tuple[optax.GradientTransformation, registry_lib.By] | None:
  """``(inner tx, by)`` if ``tx`` was made by :func:`keyed`, else ``None``."""
  return getattr(getattr(tx, "init", None), _KEYED_MARK, None)


def state_keys(state: Any) -> frozenset[str]:
  """The parameter keys a keyed optimizer state holds state for.

  Works on a live keyed state and on one restored from a checkpoint without a target (where
  the ``KeyedSlots`` came back as plain dicts keyed by canonical keys).

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> from paramreg_jax import keyed, state_keys
    >>> state = keyed(optax.adam(1e-3)).init({"w": jnp.zeros(2), "b": jnp.zeros(1)})
    >>> sorted(state_keys(state))
    ['n:b', 'n:w']
  """
  found: set[str] = set()
  for layout in layouts(state):
    found.update(layout.keys)
  for path, _ in jax.tree_util.tree_flatten_with_path(state, is_leaf=_is_keyed)[0]:
    if path:
      last = keys_lib.entry_to_component(path[-1])
      if keys_lib.is_canonical_key(last):
        found.add(last)
  return frozenset(found)
