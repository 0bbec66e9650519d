"""The key grammar: tree paths to canonical names and keys, and back.

A tree path (a tuple of ``jax.tree_util`` key entries) becomes a *name*: its components joined
by ``/``. Components are escaped JSON-Pointer style (RFC 6901), ``~`` → ``~0`` and ``/`` →
``~1``, plus one extension: the empty component is written ``~2`` so that every name component
is non-empty and ``name_to_path`` inverts ``path_to_name`` exactly. Int keys and their decimal
strings give the same component (orbax turns ``{0: x}`` into ``{'0': x}``). The trailing
``.value``/``.raw_value`` attribute of a flax NNX ``Variable`` (the slot the Variable node
itself contributes) is not part of the name. A dict key ``'value'`` is a name like any other
(``attn/value`` is the value projection); the ``{'value': x}`` levels orbax writes for a saved
``nnx.State`` are folded by :func:`fold_saved_variables`, used by the readers of such trees.

Canonical keys are ``n:<name>`` (named) and ``p:<index>`` (positional, the flatten order).
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from paramreg_jax._src import errors

NAMED_KEY_PREFIX = "n:"
INDEXED_KEY_PREFIX = "p:"

#: Largest index a ``p:<index>`` key may carry; a larger one is a corrupt or hostile key.
MAX_POSITIONAL_INDEX = 1 << 24

_NNX_VALUE_ATTRS = frozenset({"value", "raw_value"})
_INDEX_RE = re.compile(r"0|[1-9][0-9]*")
_EMPTY_COMPONENT = "~2"


def entry_to_component(entry: Any) -> str:
  """The raw (unescaped) name component of one ``jax.tree_util`` key entry."""
  if isinstance(entry, jax.tree_util.DictKey):
    key = entry.key
  elif isinstance(entry, jax.tree_util.GetAttrKey):
    return entry.name
  elif isinstance(entry, jax.tree_util.SequenceKey):
    return str(entry.idx)
  elif isinstance(entry, jax.tree_util.FlattenedIndexKey):
    key = entry.key
  else:
    key = getattr(entry, "key", getattr(entry, "name", getattr(entry, "idx", entry)))
  if isinstance(key, str):
    return key
  if isinstance(key, (int, np.integer)):  # bools fold too: True is 1 as a dict key
    return str(int(key))
  if isinstance(key, (float, np.floating)) and float(key).is_integer():
    return str(int(key))  # {1.0: x} and {1: x} are the same dict slot
  return str(key)


def escape_component(component: str) -> str:
  """Escapes one raw component (``~`` → ``~0``, ``/`` → ``~1``, empty → ``~2``)."""
  if not component:
    return _EMPTY_COMPONENT
  return component.replace("~", "~0").replace("/", "~1")


def unescape_component(escaped: str, *, name: str) -> str:
  """Reverses :func:`escape_component`; a stray ``~`` or empty component is malformed."""
  if escaped == _EMPTY_COMPONENT:
    return ""
  if not escaped:
    raise errors.MalformedKeyError(
      f"name {name!r} has an empty component; empty components are written '~2' "
      "(use path_to_name to build names)"
    )
  if "~" not in escaped:
    return escaped
  out = []
  i = 0
  while i < len(escaped):
    ch = escaped[i]
    if ch == "~":
      nxt = escaped[i + 1 : i + 2]
      if nxt not in ("0", "1"):
        raise errors.MalformedKeyError(
          f"name {name!r} has a bad escape {escaped[i : i + 2]!r} in component {escaped!r}; "
          "'~' must be written '~0' and '/' inside a component '~1'"
        )
      out.append("~" if nxt == "0" else "/")
      i += 2
    else:
      out.append(ch)
      i += 1
  return "".join(out)


_SMALL_INTS = tuple(str(i) for i in range(4096))
_DictKey = jax.tree_util.DictKey
_GetAttrKey = jax.tree_util.GetAttrKey
_SequenceKey = jax.tree_util.SequenceKey


def _escaped(entry: Any) -> str:
  """``escape_component(entry_to_component(entry))``, with the common cases inlined."""
  t = type(entry)
  if t is _DictKey:
    k = entry.key
  elif t is _GetAttrKey:
    k = entry.name
  elif t is _SequenceKey:
    i = entry.idx
    return _SMALL_INTS[i] if 0 <= i < 4096 else str(i)
  else:
    k = entry_to_component(entry)
  if type(k) is not str:
    k = entry_to_component(entry)
  if not k or "~" in k or "/" in k:
    return escape_component(k)
  return k


def is_variable_slot(entry: Any) -> bool:
  """A trailing NNX ``.value`` attribute (the slot of a live ``Variable``); dict keys never."""
  return type(entry) is _GetAttrKey and entry.name in _NNX_VALUE_ATTRS


def fold_saved_variables(paths: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
  """``paths`` with the ``{'value': x}`` levels of saved flax ``Variable`` objects removed.

  Orbax restores an ``nnx.State`` (or ``nnx.state(optimizer)``) without a target as nested
  dicts in which every variable is a dict holding exactly one key, ``'value'``. A trailing
  ``DictKey('value')`` is dropped only when it is its parent's only child, so a user's
  ``{'query', 'key', 'value'}`` dict keeps its names. Readers of saved trees (the orbax source,
  ``reconcile``) call this; the grammar itself never folds dict keys.

  Examples:
    >>> import jax
    >>> from paramreg_jax._src.registry.keys import fold_saved_variables, path_to_name
    >>> saved = {"dense": {"kernel": {"value": 1.0}}, "attn": {"key": 2.0, "value": 3.0}}
    >>> paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(saved)[0]]
    >>> [path_to_name(p) for p in fold_saved_variables(paths)]
    ['attn/key', 'attn/value', 'dense/kernel']
  """
  children: dict[tuple[Any, ...], int] = {}
  for path in paths:
    if path:
      parent = tuple(entry_to_component(e) for e in path[:-1])
      children[parent] = children.get(parent, 0) + 1
  out = []
  for path in paths:
    path = tuple(path)
    if (
      len(path) > 1
      and type(path[-1]) is _DictKey
      and path[-1].key == "value"
      and children[tuple(entry_to_component(e) for e in path[:-1])] == 1
    ):
      path = path[:-1]
    out.append(path)
  return out


def path_to_name(path: Sequence[Any]) -> str:
  """Converts a ``jax.tree_util`` key path to its canonical name.

  Args:
    path: a key path, as given by ``jax.tree_util.tree_flatten_with_path``.

  Returns:
    The components joined by ``/``, each escaped (``~`` → ``~0``, ``/`` → ``~1``, empty →
    ``~2``); int keys give their decimal string; a trailing NNX ``value`` attribute is dropped.

  Raises:
    MalformedKeyError: for the empty path (a bare leaf at the root has no name).

  Examples:
    >>> import jax
    >>> from paramreg_jax import path_to_name
    >>> tree = {"encoder": [{"kernel": 1.0}], "a/b": 2.0}
    >>> [path_to_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    ['a~1b', 'encoder/0/kernel']
  """
  if len(path) > 1 and is_variable_slot(path[-1]):
    path = path[:-1]
  if not path:
    raise errors.MalformedKeyError(
      "a leaf at the root of the tree has no path, so it has no name; put it in a container "
      "({'w': x}) or use by='position'"
    )
  return "/".join(map(_escaped, path))


def paths_to_names(paths: Sequence[Sequence[Any]]) -> list[str]:
  """``[path_to_name(p) for p in paths]``, sharing the work for common prefixes.

  ``tree_flatten_with_path`` hands sibling leaves the *same* prefix entry objects, so a prefix
  is memoised by the identities of its entries (the same objects always spell the same name).
  """
  memo: dict[tuple[int, ...], str] = {}
  out: list[str] = []
  append = out.append
  for path in paths:
    n = len(path)
    if n > 1 and is_variable_slot(path[-1]):
      path = path[:-1]
      n -= 1
    if n <= 1:
      append(path_to_name(path))
      continue
    prefix_ids = tuple(map(id, path[:-1]))
    prefix = memo.get(prefix_ids)
    if prefix is None:
      prefix = "/".join(map(_escaped, path[:-1]))
      memo[prefix_ids] = prefix
    append(prefix + "/" + _escaped(path[-1]))
  return out


_FAST_LEAVES = (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct, float, int, complex)
# whether a type is a leaf type of the walk, learnt per type from its first instance (jax's
# tracers are jax.Array instances without subclassing it)
_LEAF_TYPES: dict[type, bool] = {}


def _is_leaf(node: Any) -> bool:
  known = _LEAF_TYPES.get(type(node))
  if known is None:
    known = isinstance(node, _FAST_LEAVES) and not isinstance(node, bool)
    if len(_LEAF_TYPES) < 4096:
      _LEAF_TYPES[type(node)] = known
  return known


def fast_tree_names(tree: Any, leaves: Sequence[Any]) -> list[str] | None:
  """Names of ``tree``'s leaves by a direct walk of plain dicts, lists and tuples.

  Equal to ``paths_to_names`` of ``tree_flatten_with_path`` whenever it returns a list; it
  returns ``None`` (use the general path) on any other node type, and also unless the walk met
  exactly ``leaves`` (the objects of ``jax.tree_util.tree_flatten(tree)``, in order), so an
  ordering difference can never pass silently.
  """
  names: list[str] = []
  walked: list[Any] = []
  if not _walk(tree, "", names, walked):
    return None
  if len(walked) != len(leaves) or any(map(operator.is_not, walked, leaves)):
    return None
  return names


def _walk(node: Any, prefix: str, names: list[str], walked: list[Any]) -> bool:
  """Appends the names and leaves under ``node``; False on anything the walk does not know.
  A container's leaf children are handled in its loop (no call per leaf)."""
  leaf_types = _LEAF_TYPES
  t = type(node)
  if t is dict:
    try:
      keys = sorted(node)
    except TypeError:
      return False
    for k in keys:
      if type(k) is str:
        comp = k if k and "~" not in k and "/" not in k else escape_component(k)
      elif type(k) is int:
        comp = str(k)
      else:
        return False
      child = node[k]
      leaf = leaf_types.get(type(child))
      if leaf is None:
        leaf = _is_leaf(child)
      if leaf:
        names.append(prefix + comp)
        walked.append(child)
      elif not _walk(child, prefix + comp + "/", names, walked):
        return False
    return True
  if t is list or t is tuple:
    for i, child in enumerate(node):
      comp = _SMALL_INTS[i] if i < 4096 else str(i)
      leaf = leaf_types.get(type(child))
      if leaf is None:
        leaf = _is_leaf(child)
      if leaf:
        names.append(prefix + comp)
        walked.append(child)
      elif not _walk(child, prefix + comp + "/", names, walked):
        return False
    return True
  if node is None:
    return True
  if _is_leaf(node):
    if not prefix:
      return False  # a bare root leaf: let path_to_name raise its error
    names.append(prefix[:-1])  # dicts, lists, tuples: every key is part of the name
    walked.append(node)
    return True
  return False


def name_to_path(name: str) -> tuple[str, ...]:
  """Splits a canonical name into its raw (unescaped) components.

  Args:
    name: a name as produced by :func:`path_to_name`.

  Returns:
    The components, unescaped; ``name_to_path(path_to_name(p))`` gives ``p``'s components.

  Raises:
    MalformedKeyError: for an empty name, an empty component or a bad ``~`` escape.

  Examples:
    >>> from paramreg_jax import name_to_path
    >>> name_to_path("encoder/0/a~1b")
    ('encoder', '0', 'a/b')
  """
  if not isinstance(name, str) or not name:
    raise errors.MalformedKeyError(f"a parameter name must be a non-empty string, got {name!r}")
  return tuple(unescape_component(c, name=name) for c in name.split("/"))


@dataclasses.dataclass(frozen=True)
class ParsedKey:
  """A validated canonical key: ``name`` for ``n:`` keys, ``index`` for ``p:`` keys."""

  key: str
  name: str | None = None
  index: int | None = None


def named_key(name: str) -> str:
  """``n:<name>``, after checking that ``name`` follows the grammar."""
  name_to_path(name)
  return NAMED_KEY_PREFIX + name


def indexed_key(index: int) -> str:
  """``p:<index>`` for a non-negative index."""
  if not 0 <= index <= MAX_POSITIONAL_INDEX:
    raise errors.MalformedKeyError(
      f"positional index {index} is outside [0, {MAX_POSITIONAL_INDEX}]"
    )
  return f"{INDEXED_KEY_PREFIX}{index}"


def parse_key(key: str) -> ParsedKey:
  """Parses and validates a canonical key (``n:<name>`` or ``p:<index>``).

  Raises:
    UnknownKeyPrefixError: for any prefix other than ``n:`` / ``p:``.
    MalformedKeyError: for an empty or malformed name, or an index that is not canonical
      (``p:``, ``p:007``, ``p:-1``, ``p:x``) or larger than ``MAX_POSITIONAL_INDEX``.
  """
  if not isinstance(key, str):
    raise errors.UnknownKeyPrefixError(
      f"unrecognised parameter key {key!r}: expected a string starting with 'n:' or 'p:'"
    )
  if key.startswith(NAMED_KEY_PREFIX):
    name = key[len(NAMED_KEY_PREFIX) :]
    name_to_path(name)
    return ParsedKey(key, name=name)
  if key.startswith(INDEXED_KEY_PREFIX):
    digits = key[len(INDEXED_KEY_PREFIX) :]
    if not _INDEX_RE.fullmatch(digits):
      raise errors.MalformedKeyError(
        f"malformed parameter key {key!r}: {digits!r} is not a canonical index "
        "(decimal digits, no sign, no leading zeros)"
      )
    index = int(digits)
    if index > MAX_POSITIONAL_INDEX:
      raise errors.MalformedKeyError(
        f"malformed parameter key {key!r}: index {index} exceeds the limit "
        f"{MAX_POSITIONAL_INDEX}; the checkpoint key is corrupt"
      )
    return ParsedKey(key, index=index)
  raise errors.UnknownKeyPrefixError(
    f"unrecognised parameter key {key!r}: expected 'n:<name>' or 'p:<index>' "
    "(raw addresses and other ad-hoc keys are not stable identities)"
  )


def is_canonical_key(key: Any) -> bool:
  """Whether ``key`` is a valid canonical key (never raises)."""
  try:
    parse_key(key)
  except errors.MalformedKeyError:
    return False
  return True


def tree_names(tree: Any, *, leaves: Sequence[Any] | None = None) -> list[str]:
  """Canonical names of the leaves of ``tree`` in flatten order (no collision check): the one
  way a tree is named (``registry.tree_keys`` adds the ``n:``/``p:`` keys and the check).

  Args:
    tree: a pytree.
    leaves: ``jax.tree_util.tree_leaves(tree)``, when the caller has them: a tree of plain
      containers is then named without flattening it again.
  """
  if leaves is not None:
    fast = fast_tree_names(tree, leaves)
    if fast is not None:
      return fast
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return paths_to_names([p for p, _ in flat])
