"""The two sides ``reconcile`` compares: the layout of the new optimizer's state (where it keeps
what, for the new parameters) and the old state read against it (per-parameter leaves by key,
``rename`` applied; the rest by path; what the new optimizer keeps nowhere)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any
from typing import Literal

import jax
import numpy as np
import optax

from paramreg_jax._src import errors
from paramreg_jax._src.optim import check as check_lib
from paramreg_jax._src.optim import mirrors as mirrors_lib
from paramreg_jax._src.registry import keys as keys_lib

Path = mirrors_lib.Path


def spec(x: Any) -> tuple[tuple[int, ...], Any]:
  return tuple(np.shape(x)), mirrors_lib.dtype_of(x)  # numpy's or jax's extended (PRNG key) dtype


Owner = tuple[Path, str]  # (mirror prefix in the state, parameter key)


@dataclasses.dataclass(frozen=True)
class StateLayout:
  """Where the optimizer keeps what for the new parameters: ``tx.init``'s abstract state."""

  abstract: Any
  index: mirrors_lib.ParamIndex
  prefixes: list[Path]  # the state's subtrees that mirror the parameters, longest first
  leaves: list[tuple[Path, Any]]  # (path in the state, ShapeDtypeStruct)
  owners: dict[Path, Owner | None]  # per-parameter leaves; None for counts, hyperparameters
  names: dict[str, str]  # named key -> the key used here (itself, or p:<index> by position)
  # the abstract states after 1, 2 updates (optax.monitor fills its state late): traced only
  # when the old state is not in ``tx.init``'s form (tracing updates costs ~15x ``tx.init``)
  later_forms: Callable[[], list[Any]]

  @functools.cached_property
  def later(self) -> list[Any]:
    return self.later_forms()

  @property
  def keys(self) -> set[str]:
    return {owner[1] for owner in self.owners.values() if owner is not None}


def new_layout(
  inner: optax.GradientTransformation, params: Any, by: Literal["name", "position"]
) -> StateLayout:
  abstract = jax.eval_shape(inner.init, params)
  index = mirrors_lib.ParamIndex.of(params, by)
  named = mirrors_lib.ParamIndex.of(params, "name") if by == "position" else index
  names = dict(zip(named.keys, index.keys))
  prefixes = sorted(
    (prefix for prefix, _, _ in mirrors_lib.mirrors(abstract, index)), key=len, reverse=True
  )
  leaves = mirrors_lib.state_leaves(abstract)
  owners = owners_of(leaves, prefixes, names)
  later = functools.partial(later_forms, inner, params)
  return StateLayout(abstract, index, prefixes, leaves, owners, names, later)


def owners_of(
  leaves: list[tuple[Path, Any]], prefixes: list[Path], names: dict[str, str]
) -> dict[Path, Owner | None]:
  """Each state leaf's (mirror prefix, parameter key), or None for counts, hyperparameters."""
  out: dict[Path, Owner | None] = {}
  for comps, _ in leaves:
    owner = mirrors_lib.owner_of(comps, prefixes)
    out[comps] = None if owner is None else (owner[0], names.get(owner[1], owner[1]))
  return out


def later_forms(inner: optax.GradientTransformation, params: Any) -> list[Any]:
  """The abstract states after one and two updates (``optax.monitor`` fills its measurements
  at the first update): forms of this very optimizer's state, never a change of optimizer."""
  return check_lib.stepped_states(inner, params, params, {}, 2)


def plain_specs(layout: StateLayout) -> dict[Path, Any]:
  return {c: (tuple(x.shape), x.dtype) for c, x in layout.leaves if layout.owners[c] is None}


def matching_form(layout: StateLayout, old: OldState) -> StateLayout:
  """The layout of the state's form the old state is in: ``tx.init``'s, or a later one that
  the optimizer's own updates produce (its non-parameter leaves all match)."""
  specs = {c: spec(x) for c, x in old.plain.items()}
  if all(specs.get(c) == spec for c, spec in plain_specs(layout).items()):
    return layout
  for abstract in layout.later:
    leaves = mirrors_lib.state_leaves(abstract)
    owners = owners_of(leaves, layout.prefixes, layout.names)
    form = dataclasses.replace(layout, abstract=abstract, leaves=leaves, owners=owners)
    if all(specs.get(c) == spec for c, spec in plain_specs(form).items()):
      return form
  return layout


@dataclasses.dataclass(frozen=True)
class OldState:
  """The old state's leaves: per-parameter ones by (prefix, renamed key), the rest by path."""

  owners: dict[Owner, Any]
  plain: dict[Path, Any]
  renamed: tuple[tuple[str, str], ...]
  elsewhere: dict[str, list[Path]]  # keys with state where the new optimizer keeps none
  overwritten: tuple[str, ...]  # old keys whose state a rename replaced (their key was taken)
  discarded: list[Path]  # non-parameter leaves the new optimizer does not keep
  params: Any = None  # the new parameters (their placement, for the kept state)

  @property
  def keys(self) -> set[str]:
    return {key for _, key in self.owners}


def read_old_state(
  state: Any,
  layout: StateLayout,
  rename: Mapping[str, str] | Callable[[str], str] | None,
  by: Literal["name", "position"],
  leaves: list[tuple[Path, Any]] | None = None,
) -> OldState:
  """The old state's leaves by (mirror prefix, key) with ``rename`` applied, the other leaves
  by path, and what the new optimizer will not keep. ``leaves``: the state's leaves already
  moved (a state found under a new wrapping)."""
  raw: dict[Owner, Any] = {}
  plain: dict[Path, Any] = {}
  for comps, leaf in mirrors_lib.state_leaves(state) if leaves is None else leaves:
    owner = mirrors_lib.owner_of(comps, layout.prefixes)
    if owner is None:
      plain[comps] = leaf
    else:
      raw[owner] = leaf
  known = {p for p in layout.owners if layout.owners[p] is None}
  if any(p not in known for p in plain):  # only then: forms the updates fill in
    known |= {c for form in layout.later for c, _ in mirrors_lib.state_leaves(form)}
  elsewhere = state_elsewhere(plain, known, {k for _, k in raw} | set(layout.names))
  if by == "position":
    try:
      names = mirrors_lib.positions_of(raw, state)
    except ValueError as e:
      raise errors.ReconcileError(f"cannot reconcile by position: {e}") from None
    raw = mirrors_lib.rekey(raw, names)
    elsewhere = {names.get(k, k): ps for k, ps in elsewhere.items()}
  fn = rename_fn(rename, {k for _, k in raw} | set(elsewhere))
  pairs = {key: fn(key) for key in {k for _, k in raw} | set(elsewhere)}
  for new_key in pairs.values():
    keys_lib.parse_key(new_key)
  # a renamed key wins its target over the old key of that name (a layer deleted and the
  # following ones shifted down): that old state is dropped, and reported
  targets: dict[str, list[str]] = {}
  for old_key, new_key in pairs.items():
    targets.setdefault(new_key, []).append(old_key)
  overwritten: list[str] = []
  for new_key, sources in targets.items():
    if len(sources) == 1:
      continue
    moved = [k for k in sources if pairs[k] != k]
    if len(moved) > 1:
      raise errors.ReconcileError(
        f"rename maps several old keys to {new_key} ({', '.join(sorted(moved))}); each new key "
        "may receive the state of one old key only. Fix the rename mapping"
      )
    overwritten.extend(k for k in sources if pairs[k] == k)
  gone = set(overwritten)
  owners = {(prefix, pairs[key]): leaf for (prefix, key), leaf in raw.items() if key not in gone}
  elsewhere = {pairs[k]: ps for k, ps in elsewhere.items() if k not in gone}
  per_parameter = {p for ps in elsewhere.values() for p in ps}
  discarded = [p for p in plain if p not in known and p not in per_parameter]
  return OldState(
    owners,
    plain,
    tuple(sorted((a, b) for a, b in pairs.items() if a != b)),
    elsewhere,
    tuple(sorted(overwritten)),
    discarded,
  )


def state_elsewhere(
  plain: dict[Path, Any], known: set[Path], names: set[str]
) -> dict[str, list[Path]]:
  """Per-parameter state the new optimizer keeps nowhere (Adam's ``mu`` after a switch to SGD):
  leaves outside the new layout whose path ends in a parameter's name."""
  out: dict[str, list[Path]] = {}
  for comps in plain:
    if comps in known:
      continue
    for j in range(1, len(comps)):
      key = keys_lib.NAMED_KEY_PREFIX + "/".join(keys_lib.escape_component(c) for c in comps[j:])
      if key in names:
        out.setdefault(key, []).append(comps)
        break
  return out


def rename_fn(
  rename: Mapping[str, str] | Callable[[str], str] | None, old_keys: set[str]
) -> Callable[[str], str]:
  """``rename`` as a function; a mapping is checked: every old key must have state."""
  if rename is None:
    return lambda k: k
  if isinstance(rename, Mapping):
    mapping = dict(rename)
    unknown = []
    for old_key, new_key in mapping.items():
      keys_lib.parse_key(old_key)
      keys_lib.parse_key(new_key)
      if old_key not in old_keys:
        unknown.append(f"{old_key}{errors.did_you_mean(old_key, sorted(old_keys))}")
    if unknown:
      raise errors.ReconcileError(
        "rename names old keys that have no state in the old optimizer state (a typo, or a "
        "parameter the optimizer masks); nothing was changed:" + errors.bullet_list(unknown)
      )
    return lambda k: mapping.get(k, k)
  if callable(rename):
    return rename
  raise TypeError(f"rename must be a mapping or a callable, got {type(rename).__name__}")
