"""``ParamRegistry``: stable identities for the leaves of a parameter pytree.

The registry is an immutable value: every registering function returns a *new* registry (or
the same object when nothing changed). It is a pytree with no leaves and is hashable with value
equality, so it can ride inside optax state and be passed to ``jax.jit`` as a static argument.

Identity is the tree path (named slots, ``n:<name>``) or the flatten position (positional
slots, ``p:<index>``). There is no address cache: JAX arrays are values.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import threading
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any
from typing import Literal
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src import keys as keys_lib

By = Literal["name", "position"]


@dataclasses.dataclass(frozen=True, order=True, slots=True)
class ParamId:
  """The dense, stable index of one registry slot.

  Frozen, hashable and ordered by ``index``.

  Examples:
    >>> from paramreg_jax import ParamId
    >>> ParamId(3).index, ParamId(1) < ParamId(2)
    (3, True)
  """

  index: int

  def __repr__(self) -> str:
    return f"ParamId({self.index})"


_PARAM_IDS: list[ParamId] = []


def param_ids(indices: Any) -> list[ParamId]:
  """Interned ``ParamId`` objects for ``indices`` (ids are immutable, so they are shared)."""
  top = max(indices, default=-1)
  if top >= len(_PARAM_IDS):
    _PARAM_IDS.extend(ParamId(i) for i in range(len(_PARAM_IDS), top + 1))
  get = _PARAM_IDS.__getitem__
  return list(map(get, indices))


class _Slot(NamedTuple):
  """One slot, as seen by queries and error messages."""

  key: str
  name: str | None
  shape: tuple[int, ...] | None
  numel: int | None
  dtype: Any


class _Columns(NamedTuple):
  """The registry's storage: one tuple per field, ``ParamId(i)`` indexes position ``i``.

  ``numels[i]`` is only meaningful while ``shapes[i]`` is unknown (a slot restored from an
  element count); otherwise the element count is the product of the shape.
  """

  keys: tuple[str, ...]
  names: tuple[str | None, ...]
  shapes: tuple[tuple[int, ...] | None, ...]
  numels: tuple[int | None, ...]
  dtypes: tuple[Any, ...]


_EMPTY = _Columns((), (), (), (), ())


def _fmt_spec(shape: tuple[int, ...] | None, numel: int | None, dtype: Any) -> str:
  if shape is not None:
    text = str(tuple(shape))
  elif numel is not None:
    text = f"{numel} elements"
  else:
    text = "unknown shape"
  return text if dtype is None else f"{text} {np.dtype(dtype).name}"


def leaf_spec(leaf: Any, *, where: str = "leaf") -> tuple[tuple[int, ...], np.dtype]:
  """``(shape, dtype)`` of an array-like leaf (array, ``ShapeDtypeStruct``, Python scalar)."""
  shape = getattr(leaf, "shape", None)
  dtype = getattr(leaf, "dtype", None)
  if shape is not None and dtype is not None:
    try:
      return tuple(shape), np.dtype(dtype)
    except TypeError:  # extended dtypes (PRNG keys) are not numpy dtypes
      return tuple(shape), dtype
  if isinstance(leaf, (bool, int, float, complex, np.generic)):
    return (), np.dtype(jnp.result_type(leaf))
  raise TypeError(
    f"{where}: a parameter leaf must have .shape and .dtype (an array or a "
    f"jax.ShapeDtypeStruct), got {type(leaf).__name__}; remove it from the tree or make it "
    "an array"
  )


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
    self._cols: _Columns = _EMPTY
    self._hash: int | None = None
    self._index: dict[str, int] | None = None

  @classmethod
  def _make(cls, cols: _Columns, index: dict[str, int] | None = None) -> ParamRegistry:
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

  def _slot(self, pid: ParamId | int) -> _Slot | None:
    index = pid.index if isinstance(pid, ParamId) else pid
    cols = self._cols
    if not isinstance(index, (int, np.integer)) or not 0 <= index < len(cols.keys):
      return None
    shape = cols.shapes[index]
    numel = math.prod(shape) if shape is not None else cols.numels[index]
    return _Slot(cols.keys[index], cols.names[index], shape, numel, cols.dtypes[index])

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
      shown.append(f"{s.key}: {_fmt_spec(s.shape, s.numel, s.dtype)}")
    more = f", ... ({n - 4} more)" if n > 4 else ""
    return f"ParamRegistry({{{', '.join(shown)}{more}}})"

  # --- registration (each returns a new registry) ---------------------------------------

  def id_for_named(self, name: str, leaf: Any) -> tuple[ParamRegistry, ParamId]:
    """Resolves the id of the named slot ``n:<name>``, registering it the first time.

    The same name always gives the same id, wherever the array lives. Unlike the seed, a known
    shape or dtype that differs from ``leaf``'s is an error, not a silent acceptance.

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
    shape, dtype = leaf_spec(leaf, where=key)
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
    shape, dtype = leaf_spec(leaf, where=key)
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
    shape, numel, dtype = _parse_size(shape_or_numel, key)
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
      shape, numel, dtype = _parse_size(size, key)
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
      cur = _Slot(
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
      merged = _merge(cur, shape, numel, dtype, restoring=restoring)
      if merged is not cur:
        c = writable()
        c[2][pos] = merged.shape
        c[3][pos] = None if merged.shape is not None else merged.numel
        c[4][pos] = merged.dtype
    if cols is None:
      return self
    return ParamRegistry._make(_Columns(*(tuple(c) for c in cols)), index)


def _merge(slot: _Slot, shape: Any, numel: Any, dtype: Any, *, restoring: bool) -> _Slot:
  """Fills in what ``slot`` does not know; raises when known facts disagree."""
  bad = (
    (shape is not None and slot.shape is not None and shape != slot.shape)
    or (numel is not None and slot.numel is not None and numel != slot.numel)
    or (dtype is not None and slot.dtype is not None and dtype != slot.dtype)
  )
  if bad:
    recorded = _fmt_spec(slot.shape, slot.numel, slot.dtype)
    offered = _fmt_spec(shape, numel, dtype)
    if slot.name is None and not restoring:
      raise errors.OrderingContractError(
        f"{slot.key}: positional slot {slot.key[2:]} records {recorded}, but the leaf at "
        f"flatten position {slot.key[2:]} is {offered}. Positional identity is the flatten "
        "order: the resuming run must present the same leaves in the same order as the run "
        "that wrote the checkpoint (ordering contract); register by='name' to make resume "
        "order-independent"
      )
    raise errors.ShapeMismatchError(
      f"{slot.key}: the slot records {recorded}, but {offered} was offered; the parameter "
      "changed shape or dtype. Re-initialise its state (reconcile(..., "
      "on_shape_mismatch='init')) or fix the model"
    )
  new_shape = slot.shape if slot.shape is not None else shape
  new_numel = slot.numel if slot.numel is not None else numel
  new_dtype = slot.dtype if slot.dtype is not None else dtype
  if (new_shape, new_numel, new_dtype) == (slot.shape, slot.numel, slot.dtype):
    return slot
  return slot._replace(shape=new_shape, numel=new_numel, dtype=new_dtype)


def _parse_size(size: Any, key: str) -> tuple[tuple[int, ...] | None, int | None, Any]:
  """``(shape, numel, dtype)`` from ``None``, an int, a shape tuple or a shaped object."""
  if size is None:
    return None, None, None
  if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
    if size < 0:
      raise errors.MalformedKeyError(f"{key}: element count must be >= 0, got {size}")
    return None, (None if size == 0 else int(size)), None  # 0 means unknown (seed)
  if isinstance(size, (tuple, list)) and all(isinstance(d, (int, np.integer)) for d in size):
    shape = tuple(int(d) for d in size)
    return shape, math.prod(shape), None
  if hasattr(size, "shape"):
    shape = tuple(size.shape)
    dtype = getattr(size, "dtype", None)
    return shape, math.prod(shape), None if dtype is None else np.dtype(dtype)
  raise TypeError(
    f"{key}: expected None, an element count, a shape tuple or an array-like, got "
    f"{type(size).__name__}"
  )


jax.tree_util.register_pytree_node(
  ParamRegistry,
  lambda reg: ((), reg._cols),
  lambda cols, _: ParamRegistry._make(cols),
)


# --- assigning a whole tree -------------------------------------------------------------

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
    fast = None if leaves is None else keys_lib.fast_tree_names(tree, leaves)
    if fast is not None and len(set(fast)) == len(fast):
      names = tuple(fast)
    else:
      flat, _ = jax.tree_util.tree_flatten_with_path(tree)
      names = tuple(keys_lib.paths_to_names([p for p, _ in flat]))
      if len(set(names)) != len(names):
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
      append(leaf_spec(x, where=keys[len(out)]))
      continue
    if type(shape) is not tuple or not isinstance(dtype, np_dtype):
      append(leaf_spec(x, where=keys[len(out)]))
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
  if reg.is_empty() and by == "name" and specs:
    # Fresh registry, named keys (unique by construction): columns in flatten order.
    shapes, dtypes = zip(*specs)
    new = ParamRegistry._make(_Columns(keys, names, shapes, (None,) * len(keys), dtypes))
    indices: tuple[int, ...] = tuple(range(len(keys)))
  else:
    new = reg._register(tuple(zip(keys, names, *zip(*specs))) if specs else ())
    by_key = new._by_key
    indices = tuple([by_key[k] for k in keys])
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
    ShapeMismatchError / OrderingContractError / NamedSlotHijackError: see the methods.

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

  Examples:
    >>> import jax.numpy as jnp
    >>> from paramreg_jax import ParamRegistry, assign_keys
    >>> _, keys = assign_keys(ParamRegistry(), [jnp.zeros(2), jnp.zeros(3)], by="position")
    >>> keys
    ['p:0', 'p:1']
  """
  new, _, treedef, keys = _assign(reg, tree, by)
  return new, treedef.unflatten(keys)
