"""The update-time check of ``keyed``: the state is what ``tx.init`` builds for the parameters
being updated (or what its first updates make of it), decided at trace time and cached per
parameter signature; otherwise a ``StateMismatchError`` names every missing, unexpected and
reshaped parameter key."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import jax
import numpy as np
import optax

from paramreg_jax._src import errors
from paramreg_jax._src.optim import mirrors as mirrors_lib
from paramreg_jax._src.optim.mirrors import ParamIndex
from paramreg_jax._src.optim.mirrors import Path
from paramreg_jax._src.optim.mirrors import is_masked
from paramreg_jax._src.registry import assign as registry_lib

_CACHE_SIZE = 64
_LATER_STEPS = 3  # how many updates' worth of state forms the check accepts beyond init's


def _abstract(tree: Any) -> Any:
  """Shapes and dtypes only (tracers, arrays, numbers); pytree nodes and boxes kept."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), mirrors_lib.dtype_of(x)), tree)


def _leaf_signature(x: Any) -> tuple[tuple[int, ...], Any]:
  try:
    return x.shape, x.dtype  # arrays, tracers, ShapeDtypeStructs: plain attribute reads
  except AttributeError:
    return tuple(np.shape(x)), mirrors_lib.dtype_of(x)  # Python numbers


def _signature(tree: Any) -> tuple[Any, tuple[tuple[tuple[int, ...], Any], ...]]:
  """Treedef, and shape and dtype per leaf: what the state ``tx.init`` builds depends on."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  return treedef, tuple(map(_leaf_signature, leaves))


def _owner_table(state: Any, prefixes: list[Path]) -> tuple[dict[tuple[Path, str], Any], dict]:
  """``{(mirror prefix, parameter key): shape}`` and ``{path: shape}`` for the other leaves.

  A leaf under a mirror prefix belongs to the parameter named by the rest of its path (or, in
  a state saved by the first keyed design, by the canonical key stored as its last component).
  """
  owners: dict[tuple[Path, str], Any] = {}
  plain: dict[Path, Any] = {}
  longest_first = sorted(prefixes, key=len, reverse=True)
  for comps, leaf in mirrors_lib.state_leaves(state):  # (a MaskedNode has no leaves)
    key = mirrors_lib.owner_of(comps, longest_first)
    if key is None:
      plain[comps] = tuple(np.shape(leaf))
    else:
      owners[key] = tuple(np.shape(leaf))
  return owners, plain


def _mismatch(
  state: Any, expected: Any, reference: Any, per_example_ok: bool, by: registry_lib.By
) -> errors.StateMismatchError | None:
  """The error for a state that is not what ``tx.init`` builds for these parameters."""
  index = ParamIndex.of(reference, by)
  prefixes = [prefix for prefix, _, _ in mirrors_lib.mirrors(expected, index)]
  want, want_plain = _owner_table(expected, prefixes)
  have, have_plain = _owner_table(state, prefixes)
  if by == "position":  # the parameters' positions, and the state's own order
    want = mirrors_lib.rekey(want, dict(zip(ParamIndex.of(reference, "name").keys, index.keys)))
    try:
      have = mirrors_lib.rekey(have, mirrors_lib.positions_of(have, state))
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
    structure: Any = jax.tree.structure(state, is_leaf=is_masked)
    if structure == jax.tree.structure(expected, is_leaf=is_masked):
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
  for owner, per_example in want.items():
    built_for = have[owner]
    if len(per_example) != len(built_for) + 1 or per_example[1:] != built_for:
      return False
    sizes.add(per_example[0])
  return len(sizes) == 1


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


def _same(have: tuple[Any, Any], want: tuple[Any, Any]) -> bool:
  """Same structure and leaf shapes (dtypes may legitimately differ: ``mu_dtype``, casts)."""
  return have[0] == want[0] and all(
    tuple(a[0]) == tuple(b[0]) for a, b in zip(have[1], want[1], strict=True)
  )


class _Bounded(dict):  # type: ignore[type-arg]
  """A dict that forgets its oldest entry beyond ``_CACHE_SIZE`` entries."""

  def put(self, key: Hashable, value: Any) -> Any:
    if len(self) >= _CACHE_SIZE:
      self.pop(next(iter(self)))
    self[key] = value
    return value


def _form(state: Any) -> tuple[Any, Any]:
  """What the check compares: the state's structure and its leaves' shapes and dtypes."""
  return jax.tree.structure(state, is_leaf=is_masked), _signature(state)[1]


class Checker:
  """``keyed(tx)``'s functions: ``init`` is ``tx.init`` (remembering the state it built), and
  ``check`` raises unless a state is one ``tx`` builds for the parameters."""

  def __init__(self, tx: optax.GradientTransformation, by: registry_lib.By):
    self.tx = tx
    self.by = by
    self.built = _Bounded()  # params signature -> the form tx.init builds for it
    self.stepped = _Bounded()  # params signature -> the forms its first updates make

  def init(self, params: Any) -> Any:
    ParamIndex.of(params, self.by)  # names must be unique (KeyCollisionError names every clash)
    state = self.tx.init(params)
    self.built.put(_signature(params), _form(state))
    return state

  def check(self, state: Any, updates: Any, params: Any, extra: dict[str, Any]) -> None:
    reference = updates if params is None else params
    signature = _signature(reference)
    have = _form(state)
    known = self.built.get(signature)
    if known is not None and _same(have, known):
      return
    expected = jax.eval_shape(self.tx.init, _abstract(reference))
    fresh = self.built.put(signature, _form(expected))
    if _same(have, fresh):
      return
    if have[0] != fresh[0] and any(
      _same(have, f) for f in self._later(updates, params, signature, extra)
    ):
      return
    error = _mismatch(state, expected, reference, per_example_ok=params is None, by=self.by)
    if error is not None:
      raise error

  def _later(self, updates: Any, params: Any, signature: Any, extra: dict[str, Any]) -> list:
    """The forms of the states ``tx.update`` makes from ``tx.init`` (``optax.monitor`` fills
    its measurements at the first update): accepted like the init state itself."""
    if signature not in self.stepped:
      out: list[tuple[Any, Any]] = []
      for state in stepped_states(self.tx, updates, params, extra, _LATER_STEPS):
        form = _form(state)
        if any(_same(form, f) for f in out):
          break
        out.append(form)
      self.stepped.put(signature, out)
    return self.stepped[signature]
