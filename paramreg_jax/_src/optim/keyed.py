"""``keyed``: any optax transformation, with parameter identity derived from tree paths.

``keyed(tx).init(params)`` *is* ``tx.init(params)``: the same pytree, leaf for leaf. Moments keep
the parameters' structure, metadata boxes (``nn.Partitioned``, NNX variables) included, so every
optax, flax and equinox utility that pairs state with parameters keeps working, and ``update``
returns ``tx``'s updates bit for bit. What ``keyed`` adds is identity, derived from paths and
never stored in the state:

* ``update`` checks, at trace time (nothing runs inside a jitted step), that the state is what
  ``tx.init`` builds for the parameters it is updating; otherwise a ``StateMismatchError`` names
  every missing, unexpected and reshaped parameter key, instead of optax's structure error or,
  worse, a silent broadcast;
* :func:`state_keys` and :func:`param_state` read a state by canonical key;
* :func:`~paramreg_jax.reconcile` fits a state from an older model to new parameters by key.

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

from paramreg_jax._src import api_types
from paramreg_jax._src import errors
from paramreg_jax._src.registry import assign as registry_lib
from paramreg_jax._src.registry import keys as keys_lib

_KEYED_MARK = "__paramreg_keyed__"
_CACHE_SIZE = 64
_LATER_STEPS = 3  # how many updates' worth of state forms the check accepts beyond init's


def _is_masked(x: Any) -> bool:
  return isinstance(x, optax.MaskedNode)


def dtype_of(x: Any) -> Any:
  """``x``'s dtype: numpy's, or jax's extended ones (PRNG keys in dpsgd's state)."""
  dtype = getattr(x, "dtype", None)
  return dtype if dtype is not None else np.asarray(x).dtype


def _abstract(tree: Any) -> Any:
  """Shapes and dtypes only (tracers, arrays, numbers); pytree nodes and boxes kept."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), dtype_of(x)), tree)


def _leaf_signature(x: Any) -> tuple[tuple[int, ...], Any]:
  try:
    return x.shape, x.dtype  # arrays, tracers, ShapeDtypeStructs: plain attribute reads
  except AttributeError:
    return tuple(np.shape(x)), dtype_of(x)  # Python numbers


def _signature(tree: Any) -> tuple[Any, tuple[tuple[tuple[int, ...], Any], ...]]:
  """Treedef, and shape and dtype per leaf: what the state ``tx.init`` builds depends on."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  return treedef, tuple(map(_leaf_signature, leaves))


# --- which parameter each leaf of a state belongs to ----------------------------------------------


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
    leaves, flat_def = jax.tree_util.tree_flatten(node, is_leaf=_is_masked)
    treedef: Any = flat_def
    if not leaves or treedef.num_leaves > len(self.keys):
      return None
    if treedef.num_nodes == 1 and not _is_masked(leaves[0]):  # a leaf: mirrors a bare array
      bare = len(self.keys) == 1 and isinstance(self.positions, int)
      ok = bare and np.shape(leaves[0]) == self.shapes[0] and dtype_of(leaves[0]) == self.dtypes[0]
      return (self.keys[0],) if ok else None
    try:
      parts = treedef.flatten_up_to(self.positions)
    except (ValueError, TypeError):
      return None
    out: list[str | None] = []
    for leaf, part in zip(leaves, parts):
      if _is_masked(leaf):
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


# --- the update-time check -----------------------------------------------------------------------


def state_leaves(tree: Any) -> list[tuple[Path, Any]]:
  """``(path components, leaf)`` of a state, whatever form it comes in.

  A flax ``Variable``'s own ``.value`` slot and the ``{'value': x}`` dicts orbax writes for a
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


def _slot_table(state: Any, prefixes: list[Path]) -> tuple[dict[tuple[Path, str], Any], dict]:
  """``{(mirror prefix, parameter key): shape}`` and ``{path: shape}`` for the other leaves.

  A leaf under a mirror prefix belongs to the parameter named by the rest of its path (or, in
  states written by paramreg_jax < 0.2, by the canonical key stored as its last component).
  """
  slots: dict[tuple[Path, str], Any] = {}
  plain: dict[Path, Any] = {}
  longest_first = sorted(prefixes, key=len, reverse=True)
  for comps, leaf in state_leaves(state):  # (a MaskedNode has no leaves)
    key = slot_key(comps, longest_first)
    if key is None:
      plain[comps] = tuple(np.shape(leaf))
    else:
      slots[key] = tuple(np.shape(leaf))
  return slots, plain


def slot_key(comps: Path, prefixes: list[Path]) -> tuple[Path, str] | None:
  """``(prefix, parameter key)`` of a state leaf at ``comps``, if it lies under a mirror."""
  for prefix in prefixes:
    n = len(prefix)
    if len(comps) > n and comps[:n] == prefix:
      rest = comps[n:]
      if len(rest) == 1 and keys_lib.is_canonical_key(rest[0]):
        return prefix, rest[0]  # a KeyedSlots entry of an older paramreg_jax
      name = "/".join(keys_lib.escape_component(c) for c in rest)
      return prefix, keys_lib.NAMED_KEY_PREFIX + name
    if len(comps) == n and comps == prefix:
      return prefix, keys_lib.INDEXED_KEY_PREFIX + "0"  # mirrors a bare-array parameter
  return None


def positions_of(slots: Any, state: Any = None) -> dict[str, str]:
  """``{named key: positional key}`` of the parameters a state mirrors: the order in which
  their names first appear in its fullest mirror (a parameter's flatten position, for a state
  built by ``tx.init``). Masked parameters have no state, so a masked state's positions cannot
  be told: ``ValueError``."""
  if state is not None and any(
    _is_masked(x) for x in jax.tree_util.tree_leaves(state, is_leaf=_is_masked)
  ):
    raise ValueError(
      "the state masks some parameters (optax.masked / multi_transform), so their positions "
      "cannot be read from it; key this optimizer by name (keyed(tx, by='name'))"
    )
  per_prefix: dict[Path, list[str]] = {}
  for prefix, key in slots:
    names = per_prefix.setdefault(prefix, [])
    if key not in names:
      names.append(key)
  fullest = max(per_prefix.values(), key=len, default=[])
  return {name: keys_lib.INDEXED_KEY_PREFIX + str(i) for i, name in enumerate(fullest)}


def rekey(table: dict[tuple[Path, str], Any], names: dict[str, str]) -> dict[tuple[Path, str], Any]:
  """A slot table with its named keys replaced by ``names[key]`` (positional keys)."""
  return {(prefix, names.get(key, key)): v for (prefix, key), v in table.items()}


def _mismatch(
  state: Any, expected: Any, reference: Any, per_example_ok: bool, by: registry_lib.By
) -> errors.StateMismatchError | None:
  """The error for a state that is not what ``tx.init`` builds for these parameters."""
  index = ParamIndex.of(reference, by)
  prefixes = [prefix for prefix, _, _ in mirrors(expected, index)]
  want, want_plain = _slot_table(expected, prefixes)
  have, have_plain = _slot_table(state, prefixes)
  if by == "position":  # the parameters' positions, and the state's own order
    want = rekey(want, dict(zip(ParamIndex.of(reference, "name").keys, index.keys)))
    try:
      have = rekey(have, positions_of(have, state))
    except ValueError as e:
      return errors.StateMismatchError(f"the optimizer state does not match its parameters; {e}")
  want_keys = {k for _, k in want}
  have_keys = {k for _, k in have}
  missing = sorted(want_keys - have_keys)
  unexpected = sorted(have_keys - want_keys)
  changed = sorted(
    f"{key}: state {'/'.join(prefix) or '<root>'} was built for {have[prefix, key]}, the "
    f"parameter is {shape}"
    for (prefix, key), shape in want.items()
    if (prefix, key) in have and have[prefix, key] != shape
  )
  other = [
    f"{'/'.join(p)}: {have_plain[p]} where the optimizer builds {shape}"
    if p in have_plain
    else f"{'/'.join(p)}: missing, the optimizer builds it"
    for p, shape in sorted(want_plain.items())
    if have_plain.get(p) != shape
  ] + [
    f"{'/'.join(p)}: not built by the optimizer" for p in sorted(set(have_plain) - set(want_plain))
  ]
  if not (missing or unexpected or changed or other):
    structure: Any = jax.tree.structure(state, is_leaf=_is_masked)
    if structure == jax.tree.structure(expected, is_leaf=_is_masked):
      return None  # same entries and shapes; only leaf types differ (e.g. Python numbers)
    return errors.StateMismatchError(
      "the optimizer state holds the right entries and shapes but not the optimizer's own "
      "structure (restored without a target?): run `state, report = paramreg_jax.reconcile(tx, "
      "state, params)` once, or restore with a target"
    )
  if per_example_ok and not (missing or unexpected or other) and _per_example(have, want):
    return None
  return errors.StateMismatchError(
    "the optimizer state does not match the parameters it is updating: "
    f"{len(missing)} parameter(s) without state, {len(unexpected)} state key(s) without a "
    f"parameter, {len({line.split(':')[0] + ':' + line.split(':')[1] for line in changed})} "
    "reshaped parameter(s)"
    + (f", {len(other)} other difference(s) (the optimizer changed?)" if other else "")
    + ". After changing the model, run `state, report = paramreg_jax.reconcile(tx, state, "
    "params)` once before updating:"
    + errors.bullet_list(
      [f"missing state: {k}" for k in missing]
      + [f"unexpected state: {k}" for k in unexpected]
      + changed
      + other
    )
  )


def _per_example(have: dict[Any, Any], want: dict[Any, Any]) -> bool:
  """Updates are per-example gradients (``contrib.dpsgd``): every parameter-shaped update has
  one extra leading axis, of one common size, over the state built for the parameters."""
  if not want or set(have) != set(want):
    return False
  sizes = set()
  for slot, per_example in want.items():
    built_for = have[slot]
    if len(per_example) != len(built_for) + 1 or per_example[1:] != built_for:
      return False
    sizes.add(per_example[0])
  return len(sizes) == 1


# --- keyed ---------------------------------------------------------------------------------------


def as_transformation(tx: Any, where: str) -> optax.GradientTransformation:
  """``tx`` as an optax ``GradientTransformation``: itself, ``MultiSteps.gradient_transformation()``,
  or any object with ``init`` and ``update`` (as optax's own wrappers accept)."""
  if isinstance(tx, optax.GradientTransformation):
    return tx
  to_tx = getattr(tx, "gradient_transformation", None)
  if callable(to_tx):  # optax.MultiSteps
    return to_tx()
  init, update = getattr(tx, "init", None), getattr(tx, "update", None)
  if callable(init) and callable(update):
    return optax.GradientTransformationExtraArgs(init, update)
  raise TypeError(
    f"{where} takes an optax transformation (e.g. optax.adam(1e-3), or an object with init and "
    f"update such as optax.MultiSteps), got {type(tx).__name__}"
  )


def stepped_states(
  tx: optax.GradientTransformation, updates: Any, params: Any, extra: dict[str, Any], steps: int
) -> list[Any]:
  """The abstract states after 1..``steps`` updates from ``tx.init``: the forms the
  optimizer's own state takes (``optax.monitor`` fills its measurements at the first update).
  Stops at an update that ``eval_shape`` cannot trace (one that needs more than gradients)."""
  out: list[Any] = []
  try:
    state = jax.eval_shape(tx.init, _abstract(params if params is not None else updates))
    for _ in range(steps):
      state = jax.eval_shape(lambda u, s, p: tx.update(u, s, p, **extra)[1], updates, state, params)
      out.append(state)
  except Exception:  # an update that needs what eval_shape lacks: no (further) forms
    pass
  return out


def optimizer_state(state: Any) -> Any:
  """The optax state in ``state``: ``nnx.state(optimizer)`` (live, pure, or restored without a
  target) holds it under ``opt_state``; anything else is taken to be the optax state itself."""
  if isinstance(state, Mapping) and "opt_state" in state:
    return state["opt_state"]
  return state


def keyed(
  tx: optax.GradientTransformation | api_types.Transformation, *, by: registry_lib.By = "name"
) -> optax.GradientTransformation:
  """Wraps an optax transformation so its state is checked and read by parameter key.

  Args:
    tx: any ``optax.GradientTransformation`` (or ``GradientTransformationExtraArgs``), or an
      object with ``init`` and ``update`` such as ``optax.MultiSteps(...)``.
    by: ``"name"`` (keys from tree paths, order-independent) or ``"position"``.

  Returns:
    A transformation of ``tx``'s own kind. ``init`` is ``tx.init`` (the same state pytree);
    ``update`` checks the state against the parameters at trace time, then calls
    ``tx.update`` (bit-identical updates; extra keyword arguments reach ``tx`` as they would
    without the wrapper).

  Raises:
    StateMismatchError: (at update) the state is not what ``tx.init`` builds for these
      parameters: missing, unexpected or reshaped parameter keys, all named. Run
      :func:`reconcile` after changing the model.

  Examples:
    >>> import jax, jax.numpy as jnp, optax
    >>> from paramreg_jax import keyed, state_keys
    >>> params = {"dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.zeros(2)}}
    >>> tx = keyed(optax.adam(1e-2))
    >>> state = tx.init(params)
    >>> jax.tree.structure(state) == jax.tree.structure(optax.adam(1e-2).init(params))
    True
    >>> sorted(state_keys(state, params))
    ['n:dense/bias', 'n:dense/kernel']
    >>> grads = jax.tree.map(jnp.ones_like, params)
    >>> updates, state = tx.update(grads, state, params)
    >>> tx.update(grads, state, {"dense": {"kernel": jnp.ones((3, 2)), "bias": jnp.zeros(2)}})
    Traceback (most recent call last):
    ...
    paramreg_jax._src.errors.StateMismatchError: the optimizer state does not match the parameters it is updating: 0 parameter(s) without state, 0 state key(s) without a parameter, 1 reshaped parameter(s). After changing the model, run `state, report = paramreg_jax.reconcile(tx, state, params)` once before updating:
      - n:dense/kernel: state 0/mu was built for (2, 2), the parameter is (3, 2)
      - n:dense/kernel: state 0/nu was built for (2, 2), the parameter is (3, 2)
  """
  if by not in ("name", "position"):
    raise ValueError(f"by must be 'name' or 'position', got {by!r}")
  tx = as_transformation(tx, "keyed")
  # (params signature) -> abstract state that tx.init builds for it; bounded, per wrapper
  built: dict[Any, tuple[Any, Any]] = {}

  def remember(signature: Any, state: Any) -> None:
    if len(built) >= _CACHE_SIZE:
      built.pop(next(iter(built)))
    built[signature] = (jax.tree.structure(state, is_leaf=_is_masked), _signature(state)[1])

  def expected_for(reference: Any, signature: Any) -> tuple[Any, Any, Any]:
    abstract = jax.eval_shape(tx.init, _abstract(reference))
    remember(signature, abstract)
    return abstract, *built[signature]

  # states that tx.update produces from tx.init for a params signature (optax.monitor fills
  # its measurements at the first update): accepted like the init state itself
  stepped: dict[Any, list[tuple[Any, Any]]] = {}

  def later_states(updates: Any, params: Any, signature: Any, extra: dict[str, Any]) -> list:
    if signature not in stepped:
      out: list[tuple[Any, Any]] = []
      for state in stepped_states(tx, updates, params, extra, _LATER_STEPS):
        form = (jax.tree.structure(state, is_leaf=_is_masked), _signature(state)[1])
        if any(_same(form, f) for f in out):
          break
        out.append(form)
      if len(stepped) >= _CACHE_SIZE:
        stepped.pop(next(iter(stepped)))
      stepped[signature] = out
    return stepped[signature]

  def check(state: Any, updates: Any, params: Any, extra: dict[str, Any]) -> None:
    reference = updates if params is None else params
    signature = _signature(reference)
    known = built.get(signature)
    have = (jax.tree.structure(state, is_leaf=_is_masked), _signature(state)[1])
    if known is not None and _same(have, known):
      return
    expected, *fresh = expected_for(reference, signature)
    if _same(have, (fresh[0], fresh[1])):
      return
    if have[0] != fresh[0] and any(
      _same(have, f) for f in later_states(updates, params, signature, extra)
    ):
      return
    error = _mismatch(state, expected, reference, per_example_ok=params is None, by=by)
    if error is not None:
      raise error

  def init_fn(params: Any) -> Any:
    ParamIndex.of(params, by)  # names must be unique (KeyCollisionError names every clash)
    state = tx.init(params)
    remember(_signature(params), state)
    return state

  if isinstance(tx, optax.GradientTransformationExtraArgs):

    def update_fn(updates: Any, state: Any, params: Any = None, **extra: Any) -> Any:
      check(state, updates, params, extra)
      return tx.update(updates, state, params, **extra)

    wrapped: Any = optax.GradientTransformationExtraArgs(init_fn, update_fn)
  else:

    def update_plain(updates: Any, state: Any, params: Any = None) -> Any:
      check(state, updates, params, {})
      return tx.update(updates, state, params)

    wrapped = optax.GradientTransformation(init_fn, update_plain)
  setattr(init_fn, _KEYED_MARK, (tx, by))
  return wrapped


def _same(have: tuple[Any, Any], want: tuple[Any, Any]) -> bool:
  """Same structure and leaf shapes (dtypes may legitimately differ: ``mu_dtype``, casts)."""
  return have[0] == want[0] and all(
    tuple(a[0]) == tuple(b[0]) for a, b in zip(have[1], want[1], strict=True)
  )


def keyed_info(tx: Any) -> tuple[optax.GradientTransformation, registry_lib.By] | None:
  """``(inner tx, by)`` if ``tx`` was made by :func:`keyed`, else ``None``."""
  return getattr(getattr(tx, "init", None), _KEYED_MARK, None)
