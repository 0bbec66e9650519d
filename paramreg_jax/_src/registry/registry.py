"""``ParamRegistry``: stable identities for the leaves of a parameter pytree.

The registry is an immutable value: every registering function returns a *new* registry (or
the same object when nothing changed). It is a pytree with no leaves and is hashable with value
equality, so it can ride inside optax state and be passed to ``jax.jit`` as a static argument.

Identity is the tree path (named slots, ``n:<name>``) or the flatten position (positional
slots, ``p:<index>``). There is no address cache: JAX arrays are values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any
from typing import Literal

import jax
import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.registry import keys as keys_lib
from paramreg_jax._src.registry import slots as slots_lib
from paramreg_jax._src.registry.ids import ParamId

By = Literal["name", "position"]


class ParamRegistry:
  """An immutable registry of stable parameter identities.

  Slots are ``n:<name>`` (named, order-independent) or ``p:<index>`` (positional). Each slot
  records what is known of its leaf (shape, element count, dtype); an unknown size accepts any
  leaf. ``len`` counts every slot, including slots restored from checkpoint keys and padding
  placeholders.

  Examples:
    >>> import jax.numpy as jnp
    >>> from paramreg_jax import ParamRegistry, assign_keys
    >>> reg, keys = assign_keys(ParamRegistry(), {"dense": {"kernel": jnp.ones((2, 3))}})
    >>> keys
    {'dense': {'kernel': 'n:dense/kernel'}}
    >>> len(reg), reg.keys()
    (1, ('n:dense/kernel',))
  """

  __slots__ = ("_cols", "_hash", "_index")

  def __init__(self) -> None:
    self._cols: slots_lib.Columns = slots_lib.EMPTY
    self._hash: int | None = None
    self._index: dict[str, int] | None = None

  @classmethod
  def _make(cls, cols: slots_lib.Columns, index: dict[str, int] | None = None) -> ParamRegistry:
    reg = cls.__new__(cls)
    reg._cols = cols
    reg._hash = None
    reg._index = index
    return reg

  @property
  def _by_key(self) -> dict[str, int]:
    if self._index is None:
      self._index = {k: i for i, k in enumerate(self._cols.keys)}
    return self._index

  # --- queries --------------------------------------------------------------------------

  def __len__(self) -> int:
    return len(self._cols.keys)

  def is_empty(self) -> bool:
    """Whether the registry has no slot."""
    return not self._cols.keys

  def keys(self) -> tuple[str, ...]:
    """Every canonical key, in registration order (index 0 first)."""
    return self._cols.keys

  def _slot(self, pid: ParamId | int) -> slots_lib.Slot | None:
    index = pid.index if isinstance(pid, ParamId) else pid
    cols = self._cols
    if not isinstance(index, (int, np.integer)) or not 0 <= index < len(cols.keys):
      return None
    shape = cols.shapes[index]
    numel = math.prod(shape) if shape is not None else cols.numels[index]
    return slots_lib.Slot(cols.keys[index], cols.names[index], shape, numel, cols.dtypes[index])

  def key(self, pid: ParamId) -> str | None:
    """The canonical key of ``pid``, or ``None`` if it is out of range."""
    slot = self._slot(pid)
    return None if slot is None else slot.key

  def name(self, pid: ParamId) -> str | None:
    """The name of a named slot; ``None`` for positional slots and out-of-range ids."""
    slot = self._slot(pid)
    return None if slot is None else slot.name

  def numel(self, pid: ParamId) -> int | None:
    """The recorded element count, or ``None`` when unknown or out of range."""
    slot = self._slot(pid)
    return None if slot is None else slot.numel

  def shape(self, pid: ParamId) -> tuple[int, ...] | None:
    """The recorded shape, or ``None`` when unknown or out of range."""
    slot = self._slot(pid)
    return None if slot is None else slot.shape

  def dtype(self, pid: ParamId) -> np.dtype | None:
    """The recorded dtype, or ``None`` when unknown or out of range."""
    slot = self._slot(pid)
    return None if slot is None else slot.dtype

  def id_for_key(self, key: str) -> ParamId | None:
    """The id of the slot with canonical ``key``, or ``None``."""
    index = self._by_key.get(key)
    return None if index is None else ParamId(index)

  def clear(self) -> ParamRegistry:
    """A new empty registry (the next positional key is ``p:0`` again)."""
    return ParamRegistry()

  # --- value semantics ------------------------------------------------------------------

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, ParamRegistry):
      return NotImplemented
    return self is other or self._cols == other._cols

  def __hash__(self) -> int:
    if self._hash is None:
      self._hash = hash(self._cols)
    return self._hash

  def __reduce__(self) -> tuple[Any, ...]:
    return (ParamRegistry._make, (self._cols,))

  def __repr__(self) -> str:
    n = len(self)
    shown = []
    for i in range(min(n, 4)):
      s = self._slot(i)
      assert s is not None
      shown.append(f"{s.key}: {slots_lib.fmt_spec(s.shape, s.numel, s.dtype)}")
    more = f", ... ({n - 4} more)" if n > 4 else ""
    return f"ParamRegistry({{{', '.join(shown)}{more}}})"

  # --- registration (each returns a new registry) ---------------------------------------

  def id_for_named(self, name: str, leaf: Any) -> tuple[ParamRegistry, ParamId]:
    """Resolves the id of the named slot ``n:<name>``, registering it the first time.

    The same name always gives the same id, wherever the array lives. A known shape or dtype
    that differs from ``leaf``'s is an error, never silently accepted.

    Args:
      name: the canonical name (see :func:`path_to_name`).
      leaf: anything with ``.shape`` and ``.dtype``.

    Returns:
      ``(registry, id)``; ``registry`` is ``self`` when nothing changed.

    Raises:
      MalformedKeyError: if ``name`` is empty or malformed.
      ShapeMismatchError: if the slot records another shape, element count or dtype.

    Examples:
      >>> import jax.numpy as jnp
      >>> from paramreg_jax import ParamRegistry
      >>> reg, a = ParamRegistry().id_for_named("w", jnp.zeros(4))
      >>> reg2, b = reg.id_for_named("w", jnp.ones(4))
      >>> a == b, reg2 is reg, reg.key(a)
      (True, True, 'n:w')
    """
    key = keys_lib.named_key(name)
    shape, dtype = slots_lib.leaf_spec(leaf, where=key)
    reg = self._register(((key, name, shape, dtype),))
    return reg, ParamId(reg._by_key[key])

  def id_for_position(self, index: int, leaf: Any) -> tuple[ParamRegistry, ParamId]:
    """Resolves the positional slot ``p:<index>`` (the leaf's flatten position).

    A slot restored from a checkpoint is claimed when ``leaf`` matches its recorded
    shape/dtype (an unknown size accepts any leaf). A slot registered under a name is never
    claimed positionally.

    Raises:
      NamedSlotHijackError: if slot ``index`` is a named slot.
      OrderingContractError: if slot ``index`` records another shape/dtype; the resuming run
        must present its leaves in the order and with the shapes of the run that wrote the
        checkpoint.

    Examples:
      >>> import jax.numpy as jnp
      >>> from paramreg_jax import ParamRegistry
      >>> reg = ParamRegistry.from_keys({"p:0": 4, "p:1": 8})
      >>> reg, pid = reg.id_for_position(1, jnp.zeros(8))
      >>> pid, len(reg), reg.shape(pid)
      (ParamId(1), 2, (8,))
    """
    key = keys_lib.indexed_key(index)
    shape, dtype = slots_lib.leaf_spec(leaf, where=key)
    return self._register(((key, None, shape, dtype),)), ParamId(index)

  def restore_key(self, key: str, shape_or_numel: Any = None) -> tuple[ParamRegistry, ParamId]:
    """Recreates the slot described by a checkpoint key.

    Args:
      key: ``n:<name>`` (matched by name, in any order) or ``p:<index>`` (pads the registry
        with placeholder slots up to ``index``).
      shape_or_numel: ``None`` (unknown size: accept any leaf), an element count, a shape
        tuple, or an object with ``.shape`` (and optionally ``.dtype``).

    Returns:
      ``(registry, id)`` of the restored slot.

    Raises:
      UnknownKeyPrefixError: for a key without ``n:``/``p:`` (e.g. ``'0x7f9c2a001234'``).
      MalformedKeyError: for ``p:``, ``p:007``, ``p:-1``, ``p:x`` or an index past the limit.
      NamedSlotHijackError: ``p:<k>`` where slot ``k`` is named.
      ShapeMismatchError: the slot already records a different size.

    Examples:
      >>> from paramreg_jax import ParamRegistry
      >>> reg, pid = ParamRegistry().restore_key("p:2", 8)
      >>> reg.keys(), pid, reg.numel(pid)
      (('p:0', 'p:1', 'p:2'), ParamId(2), 8)
    """
    parsed = keys_lib.parse_key(key)
    shape, numel, dtype = slots_lib.parse_size(shape_or_numel, key)
    reg = self._register(((key, parsed.name, shape, dtype, numel),), restoring=True)
    return reg, ParamId(reg._by_key[key])

  @classmethod
  def from_keys(cls, keys: Iterable[str] | Mapping[str, Any]) -> ParamRegistry:
    """Rebuilds a registry from checkpoint keys (or a mapping key → shape / numel).

    Examples:
      >>> from paramreg_jax import ParamRegistry
      >>> ParamRegistry.from_keys(["n:b", "n:a"]).keys()
      ('n:b', 'n:a')
    """
    if isinstance(keys, str):
      raise TypeError("from_keys takes an iterable of keys, not a single string")
    items = keys.items() if isinstance(keys, Mapping) else ((k, None) for k in keys)
    batch = []
    for key, size in items:
      parsed = keys_lib.parse_key(key)
      shape, numel, dtype = slots_lib.parse_size(size, key)
      batch.append((key, parsed.name, shape, dtype, numel))
    return cls()._register(tuple(batch), restoring=True)

  # --- the one mutation primitive -------------------------------------------------------

  def _register(
    self, items: tuple[tuple[Any, ...], ...], *, restoring: bool = False
  ) -> ParamRegistry:
    """Registers ``(key, name, shape, dtype[, numel])`` items; returns the new registry.

    Validates every item before building anything, so a failure leaves no partial registry
    (there is none to leave: ``self`` is never modified).
    """
    cols: list[list[Any]] | None = None  # copy-on-write columns
    index = self._by_key

    def writable() -> list[list[Any]]:
      nonlocal cols, index
      if cols is None:
        cols = [list(c) for c in self._cols]
        index = dict(index)
      return cols

    for item in items:
      key, name, shape, dtype = item[:4]
      numel = item[4] if len(item) > 4 else None
      if shape is not None:
        numel = math.prod(shape)
      pos = index.get(key)
      if pos is None and name is None:  # positional: the key's index is the slot's index
        pos = int(key[len(keys_lib.INDEXED_KEY_PREFIX) :])
        size = len(cols[0]) if cols is not None else len(self._cols.keys)
        if pos >= size:
          c = writable()
          for i in range(size, pos + 1):
            pad_key = keys_lib.indexed_key(i)
            index[pad_key] = i
            for col, value in zip(c, (pad_key, None, None, None, None)):
              col.append(value)
      if pos is None:
        c = writable()
        index[key] = len(c[0])
        for col, value in zip(c, (key, name, shape, None if shape else numel, dtype)):
          col.append(value)
        continue
      src = cols if cols is not None else self._cols
      cur_shape: tuple[int, ...] | None = src[2][pos]
      cur = slots_lib.Slot(
        src[0][pos],
        src[1][pos],
        cur_shape,
        math.prod(cur_shape) if cur_shape is not None else src[3][pos],
        src[4][pos],
      )
      if name is None and cur.name is not None:
        raise errors.NamedSlotHijackError(
          f"{key}: slot {pos} was registered under the name {cur.name!r} "
          f"({cur.key}); the positional path never claims a named slot. Register this "
          "tree by='name', or restore it from 'p:' keys"
        )
      merged = slots_lib.merge(cur, shape, numel, dtype, restoring=restoring)
      if merged is not cur:
        c = writable()
        c[2][pos] = merged.shape
        c[3][pos] = None if merged.shape is not None else merged.numel
        c[4][pos] = merged.dtype
    if cols is None:
      return self
    return ParamRegistry._make(slots_lib.Columns(*(tuple(c) for c in cols)), index)


jax.tree_util.register_pytree_node(
  ParamRegistry,
  lambda reg: ((), reg._cols),
  lambda cols, _: ParamRegistry._make(cols),
)


def register_leaves(
  reg: ParamRegistry,
  keys: tuple[str, ...],
  names: tuple[str | None, ...],
  specs: tuple[Any, ...],
  *,
  named: bool,
) -> tuple[ParamRegistry, tuple[int, ...]]:
  """Registers a tree's leaves (their keys, names and ``(shape, dtype)``) at once; returns the
  new registry and each leaf's slot index."""
  if reg.is_empty() and named and specs:
    # Fresh registry, named keys (unique by construction): columns in flatten order.
    shapes, dtypes = zip(*specs)
    cols = slots_lib.Columns(keys, names, shapes, (None,) * len(keys), dtypes)
    return ParamRegistry._make(cols), tuple(range(len(keys)))
  new = reg._register(tuple(zip(keys, names, *zip(*specs))) if specs else ())
  by_key = new._by_key
  return new, tuple([by_key[k] for k in keys])
