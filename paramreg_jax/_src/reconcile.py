"""``reconcile``: fit a keyed optimizer state from an older model to a new parameter tree.

Model surgery (add, remove, rename, reorder, freeze, resize) changes which parameter keys
exist. ``reconcile`` matches the old state to the new parameters **by key**: surviving keys keep
their state bit-exact, new keys get fresh state from ``tx.init``, vanished keys are dropped, and
a shape/dtype change is an error unless asked to re-initialise. Nothing is silent: the returned
:class:`SurgeryReport` lists every key in each category.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax

from paramreg_jax._src import devices as devices_lib
from paramreg_jax._src import errors
from paramreg_jax._src import keyed as keyed_lib
from paramreg_jax._src import keys as keys_lib

Path = keyed_lib.Path


@dataclasses.dataclass(frozen=True)
class SurgeryReport:
  """What :func:`reconcile` did to each parameter key (tuples of keys, sorted).

  Attributes:
    kept: keys whose state was carried over bit-exact.
    added: new keys, given fresh state from ``tx.init``.
    dropped: keys whose state was discarded (the parameter is gone or now has no state).
    reinitialized: keys present before whose state was re-created (shape/dtype change with
      ``on_shape_mismatch="init"``, or state that moved to another part of the optimizer).
    renamed: ``(old key, new key)`` pairs applied by ``rename`` (their state counts as kept
      under the new key).

  Examples:
    >>> from paramreg_jax import SurgeryReport
    >>> print(SurgeryReport(kept=("n:a",), added=("n:b",), dropped=(), reinitialized=()))
    SurgeryReport: 1 kept, 1 added, 0 dropped, 0 re-initialised
      kept:          n:a
      added:         n:b
  """

  kept: tuple[str, ...] = ()
  added: tuple[str, ...] = ()
  dropped: tuple[str, ...] = ()
  reinitialized: tuple[str, ...] = ()
  renamed: tuple[tuple[str, str], ...] = ()

  def _rows(self) -> list[tuple[str, tuple[str, ...]]]:
    return [
      ("kept", self.kept),
      ("added", self.added),
      ("dropped", self.dropped),
      ("re-initialised", self.reinitialized),
      ("renamed", tuple(f"{a} -> {b}" for a, b in self.renamed)),
    ]

  @property
  def changed(self) -> bool:
    """Whether anything other than keeping state happened."""
    return bool(self.added or self.dropped or self.reinitialized or self.renamed)

  def __str__(self) -> str:
    head = (
      f"SurgeryReport: {len(self.kept)} kept, {len(self.added)} added, "
      f"{len(self.dropped)} dropped, {len(self.reinitialized)} re-initialised"
    )
    lines = [head] + [f"  {label + ':':<14} {', '.join(ks)}" for label, ks in self._rows() if ks]
    return "\n".join(lines)

  def _repr_html_(self) -> str:
    colors = {
      "kept": "#2e7d32",
      "added": "#1565c0",
      "dropped": "#c62828",
      "re-initialised": "#ef6c00",
      "renamed": "#6a1b9a",
    }
    rows = "".join(
      f"<tr><td style='color:{colors[label]};font-weight:bold'>{label}</td>"
      f"<td>{len(ks)}</td><td><code>{html.escape(', '.join(ks)) or '&mdash;'}</code></td></tr>"
      for label, ks in self._rows()
    )
    return (
      "<table><thead><tr><th>state</th><th>#</th><th>parameter keys</th></tr></thead>"
      f"<tbody>{rows}</tbody></table>"
    )


def _spec(x: Any) -> tuple[tuple[int, ...], Any]:
  return tuple(np.shape(x)), keyed_lib.dtype_of(x)  # numpy's or jax's extended (PRNG key) dtype


def _fmt(spec: tuple[tuple[int, ...], Any]) -> str:
  return f"{spec[0]} {getattr(spec[1], 'name', spec[1])}"


def _check_option(name: str, value: str, allowed: tuple[str, ...]) -> None:
  if value not in allowed:
    raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def _optimizer_state(state: Any) -> Any:
  """``nnx.state(optimizer)`` (live or restored without a target) holds the optax state under
  ``opt_state``; anything else is taken to be the optax state itself."""
  if isinstance(state, Mapping) and "opt_state" in state:
    return state["opt_state"]
  return state


def reconcile(
  tx: Any,
  state: Any,
  params: Any,
  *,
  on_missing: Literal["init", "error"] = "init",
  on_unexpected: Literal["drop", "error"] = "drop",
  on_shape_mismatch: Literal["error", "init"] = "error",
  rename: Mapping[str, str] | Callable[[str], str] | None = None,
) -> tuple[Any, SurgeryReport]:
  """Fits an optimizer state, possibly from an older model, to ``params``, by parameter key.

  Args:
    tx: the transformation that built the state: plain optax or :func:`keyed` (whose ``by``
      is used).
    state: the old state, in any form: live; restored by orbax with or without a target
      (plain nested dicts and lists); ``nnx.state(optimizer)`` (its ``opt_state`` is used,
      ``{'value': x}`` levels are understood); or a state written by paramreg_jax < 0.2
      (moments stored as ``{canonical key: leaf}``).
    params: the new parameter tree.
    on_missing: ``"init"`` gives new parameters fresh state; ``"error"`` refuses.
    on_unexpected: ``"drop"`` discards state of vanished keys; ``"error"`` refuses.
    on_shape_mismatch: ``"error"`` (default) refuses a shape/dtype change and names every
      offending key; ``"init"`` re-initialises it.
    rename: old key -> new key (a mapping, or a function returning the key unchanged when it
      does not apply), for renamed modules and reordered lists; the state follows its weight.

  Returns:
    ``(new_state, report)``: a state with exactly the structure of ``tx.init(params)``, and a
    :class:`SurgeryReport`. ``tx.init`` only runs if some key needs fresh state.

  Raises:
    TypeError: ``tx`` is not an optax transformation.
    ReconcileError: any refused category (all offenders listed at once), or non-parameter
      state (counts, hyperparameters) missing or changed, i.e. the optimizer itself changed.

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> from paramreg_jax import keyed, reconcile
    >>> tx = keyed(optax.adam(1e-3))
    >>> old = tx.init({"a": jnp.ones(2), "gone": jnp.ones(3)})
    >>> new_state, report = reconcile(tx, old, {"a": jnp.ones(2), "new": jnp.ones(4)})
    >>> report.kept, report.added, report.dropped
    (('n:a',), ('n:new',), ('n:gone',))
  """
  inner, by = keyed_lib.keyed_info(tx) or (tx, "name")
  if not isinstance(inner, optax.GradientTransformation):
    raise TypeError(
      "reconcile needs the optax transformation that built the state (plain or "
      f"paramreg_jax.keyed), got {type(tx).__name__}"
    )
  _check_option("on_missing", on_missing, ("init", "error"))
  _check_option("on_unexpected", on_unexpected, ("drop", "error"))
  _check_option("on_shape_mismatch", on_shape_mismatch, ("error", "init"))
  # the data flow: where the new state keeps what -> what the old state has -> compare ->
  # refuse (all problems at once, nothing changed) -> assemble the new state and the report
  layout = _new_layout(inner, params, by)
  old = _read_old_state(_optimizer_state(state), layout.prefixes, rename)
  diff = _compare(layout, old)
  _refuse(diff, on_missing, on_unexpected, on_shape_mismatch)
  return _assemble(inner, params, layout, old, diff), diff.report(old.renamed)


Slot = tuple[Path, str]  # (mirror prefix in the state, parameter key)


@dataclasses.dataclass(frozen=True)
class _Layout:
  """Where the optimizer keeps what for the new parameters: ``tx.init``'s abstract state."""

  abstract: Any
  index: keyed_lib.ParamIndex
  prefixes: list[Path]  # the state's subtrees that mirror the parameters, longest first
  leaves: list[tuple[Path, Any]]  # (path in the state, ShapeDtypeStruct)
  slots: dict[Path, Slot | None]  # per-parameter leaves; None for counts, hyperparameters

  @property
  def keys(self) -> set[str]:
    return {slot[1] for slot in self.slots.values() if slot is not None}


def _new_layout(
  inner: optax.GradientTransformation, params: Any, by: Literal["name", "position"]
) -> _Layout:
  abstract = jax.eval_shape(inner.init, params)
  index = keyed_lib.ParamIndex.of(params, by)
  prefixes = sorted(
    (prefix for prefix, _, _ in keyed_lib.mirrors(abstract, index)), key=len, reverse=True
  )
  leaves = keyed_lib.state_leaves(abstract)
  slots = {comps: keyed_lib.slot_key(comps, prefixes) for comps, _ in leaves}
  return _Layout(abstract, index, prefixes, leaves, slots)


@dataclasses.dataclass(frozen=True)
class _OldState:
  """The old state's leaves: per-parameter ones by (prefix, renamed key), the rest by path."""

  slots: dict[Slot, Any]
  plain: dict[Path, Any]
  renamed: tuple[tuple[str, str], ...]

  @property
  def keys(self) -> set[str]:
    return {key for _, key in self.slots}


@dataclasses.dataclass
class _Diff:
  """What differs between the old state and the new layout."""

  added: list[str]
  dropped: list[str]
  kept: set[str]
  mismatched: dict[str, list[str]]  # key -> one line per state leaf that changed
  moved: set[str]  # keys whose state exists, but not in every place the new optimizer needs
  needs_init: set[Path]  # leaves of the new state that tx.init must provide
  optimizer_problems: list[str]  # non-parameter state that does not match

  def report(self, renamed: tuple[tuple[str, str], ...]) -> SurgeryReport:
    reinit = set(self.mismatched) | self.moved
    return SurgeryReport(
      kept=tuple(sorted(self.kept - reinit)),
      added=tuple(self.added),
      dropped=tuple(self.dropped),
      reinitialized=tuple(sorted(reinit)),
      renamed=renamed,
    )


def _compare(layout: _Layout, old: _OldState) -> _Diff:
  old_keys, new_keys = old.keys, layout.keys
  problems: list[str] = []
  mismatched: dict[str, list[str]] = {}
  needs_init: set[Path] = set()
  moved: set[str] = set()
  for comps, sds in layout.leaves:
    want = (tuple(sds.shape), sds.dtype)
    slot = layout.slots[comps]
    if slot is not None:
      prefix, key = slot
      have = old.slots.get(slot)
      if have is None:
        needs_init.add(comps)
        if key in old_keys:
          moved.add(key)
      elif _spec(have) != want:
        mismatched.setdefault(key, []).append(
          f"{key}: state {'/'.join(prefix) or '<root>'} has {_fmt(_spec(have))}, the new "
          f"parameters need {_fmt(want)}"
        )
      continue
    have = old.plain.get(comps)
    if have is None:
      problems.append(f"{'/'.join(comps)}: missing from the old state (the optimizer changed?)")
    elif _spec(have) != want:
      problems.append(
        f"{'/'.join(comps)}: old state has {_fmt(_spec(have))}, the optimizer now needs {_fmt(want)}"
      )
  if problems and not old_keys & new_keys and old.plain.keys().isdisjoint(layout.slots):
    seen = sorted("/".join(c) for c in old.plain)[:3]
    problems.append(
      f"no entry of the old state is where the optimizer keeps one (it has {', '.join(seen)}, "
      f"...; the optimizer builds {', '.join('/'.join(c) for c, _ in layout.leaves[:3])}, ...): "
      "pass the optax state itself, built by this optimizer"
    )
  # a re-initialised key gets fresh state in every leaf it owns
  needs_init |= {
    c for c, slot in layout.slots.items() if slot is not None and slot[1] in mismatched
  }
  return _Diff(
    added=sorted(new_keys - old_keys),
    dropped=sorted(old_keys - new_keys),
    kept=new_keys & old_keys,
    mismatched=mismatched,
    moved=moved,
    needs_init=needs_init,
    optimizer_problems=problems,
  )


def _refuse(diff: _Diff, on_missing: str, on_unexpected: str, on_shape_mismatch: str) -> None:
  """Raises one ``ReconcileError`` listing every refused difference (nothing is changed)."""
  problems = list(diff.optimizer_problems)
  if problems:
    problems.insert(0, "non-parameter state (counts, hyperparameters) does not match:")
  if on_missing == "error" and diff.added:
    problems.append(
      f"{len(diff.added)} new parameter(s) have no state (on_missing='error'): "
      f"{', '.join(diff.added)}"
    )
  if on_unexpected == "error" and diff.dropped:
    problems.append(
      f"{len(diff.dropped)} state key(s) have no parameter (on_unexpected='error'): "
      f"{', '.join(diff.dropped)}"
    )
  if on_shape_mismatch == "error" and diff.mismatched:
    problems.append(
      f"{len(diff.mismatched)} parameter(s) changed shape or dtype; pass "
      "on_shape_mismatch='init' to re-initialise their state, or fix the model:"
    )
    problems.extend("  " + line for key in sorted(diff.mismatched) for line in diff.mismatched[key])
  if problems:
    raise errors.ReconcileError(
      "cannot reconcile the optimizer state with the new parameters; nothing was changed:"
      + errors.bullet_list(problems)
    )


def _assemble(
  inner: optax.GradientTransformation, params: Any, layout: _Layout, old: _OldState, diff: _Diff
) -> Any:
  """The new state: kept leaves bit-exact (on their parameter's placement), the rest fresh."""
  fresh = dict(keyed_lib.state_leaves(inner.init(params))) if diff.needs_init else {}
  placement = _param_shardings(params, layout.index)
  leaves = []
  for comps, _ in layout.leaves:
    if comps in diff.needs_init:
      leaves.append(fresh[comps])
      continue
    slot = layout.slots[comps]
    kept = old.slots[slot] if slot is not None else old.plain[comps]
    kept = kept if isinstance(kept, jax.Array) else jnp.asarray(kept)
    # State that mirrors a parameter follows it to its (possibly new) mesh, bit-exact.
    param = placement.get(slot[1]) if slot is not None else None
    if param is not None and param[0] == kept.shape:
      if not kept.sharding.is_equivalent_to(param[1], kept.ndim):
        kept = devices_lib.settle(jax.device_put(kept, param[1]))  # one reshard in flight
    leaves.append(kept)
  structure: Any = jax.tree_util.tree_structure(layout.abstract)  # (PyTreeDef is untyped)
  return structure.unflatten(leaves)


def _param_shardings(params: Any, index: keyed_lib.ParamIndex) -> dict[str, tuple[Any, Any]]:
  """``{key: (shape, sharding)}`` of the parameters that are placed ``jax.Array``s."""
  return {
    k: (tuple(x.shape), x.sharding)
    for k, x in zip(index.keys, jax.tree_util.tree_leaves(params))
    if isinstance(x, jax.Array) and isinstance(getattr(x, "sharding", None), jax.sharding.Sharding)
  }


def _read_old_state(
  state: Any, prefixes: list[Path], rename: Mapping[str, str] | Callable[[str], str] | None
) -> _OldState:
  """``{(mirror prefix, key): leaf}`` (keys renamed) and ``{path: leaf}`` of the other leaves."""
  if rename is None:
    fn: Callable[[str], str] = lambda k: k  # noqa: E731
  elif isinstance(rename, Mapping):
    mapping = dict(rename)
    for old_key, new_key in mapping.items():
      keys_lib.parse_key(old_key)
      keys_lib.parse_key(new_key)
    fn = lambda k: mapping.get(k, k)  # noqa: E731
  elif callable(rename):
    fn = rename
  else:
    raise TypeError(f"rename must be a mapping or a callable, got {type(rename).__name__}")
  slots: dict[tuple[Path, str], Any] = {}
  plain: dict[Path, Any] = {}
  pairs: dict[str, str] = {}
  for comps, leaf in keyed_lib.state_leaves(state):
    slot = keyed_lib.slot_key(comps, prefixes)
    if slot is None:
      plain[comps] = leaf
      continue
    prefix, old_key = slot
    if old_key not in pairs:
      pairs[old_key] = fn(old_key)
      keys_lib.parse_key(pairs[old_key])
    new_slot = (prefix, pairs[old_key])
    if new_slot in slots:
      sources = sorted(k for k, v in pairs.items() if v == new_slot[1])
      raise errors.ReconcileError(
        f"rename maps several old keys to {new_slot[1]} ({', '.join(sources)}); each new key may "
        "receive the state of one old key only. Fix the rename mapping"
      )
    slots[new_slot] = leaf
  return _OldState(slots, plain, tuple(sorted((a, b) for a, b in pairs.items() if a != b)))


def reconcile_optimizer(optimizer: Any, model: Any, restored: Any, **options: Any) -> SurgeryReport:
  """Loads a restored ``nnx.state(optimizer)`` of an older model into ``optimizer``, by key.

  The one-liner for flax NNX after model surgery: build the new model and its
  ``nnx.Optimizer`` as usual, restore the old optimizer state with orbax (no target needed),
  then ``report = prj.reconcile_optimizer(optimizer, model, restored)``. The optimizer's state
  (and its step) are replaced in place, keeping the new optimizer's variable metadata
  (shardings); nothing changes if reconciling fails.

  Args:
    optimizer: the new ``nnx.Optimizer`` (built for ``model``).
    model: the new model.
    restored: ``nnx.state(old_optimizer)`` (live or restored without a target), or just its
      optax state.
    **options: ``on_missing``, ``on_unexpected``, ``on_shape_mismatch``, ``rename`` (see
      :func:`reconcile`).

  Returns:
    The :class:`SurgeryReport`.

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> from flax import nnx
    >>> import paramreg_jax as prj
    >>> old_model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    >>> old = nnx.Optimizer(old_model, prj.keyed(optax.adam(1e-3)), wrt=nnx.Param)
    >>> class Bigger(nnx.Module):
    ...   def __init__(self, rngs):
    ...     self.kernel = old_model.kernel
    ...     self.bias = old_model.bias
    ...     self.extra = nnx.Param(jnp.zeros(4))
    >>> model = Bigger(nnx.Rngs(1))
    >>> optimizer = nnx.Optimizer(model, prj.keyed(optax.adam(1e-3)), wrt=nnx.Param)
    >>> print(prj.reconcile_optimizer(optimizer, model, nnx.state(old)))
    SurgeryReport: 2 kept, 1 added, 0 dropped, 0 re-initialised
      kept:          n:bias, n:kernel
      added:         n:extra
  """
  from flax import nnx

  pure = getattr(nnx, "as_pure", None) or nnx.pure
  params = pure(nnx.state(model, optimizer.wrt))
  new_state, report = reconcile(optimizer.tx, restored, params, **options)
  slots = jax.tree.leaves(optimizer.opt_state, is_leaf=lambda x: isinstance(x, nnx.Variable))
  values = jax.tree.leaves(new_state)
  if len(slots) != len(values) or any(
    np.shape(v.get_value()) != np.shape(x) for v, x in zip(slots, values)
  ):
    raise errors.ReconcileError(
      "the optimizer's state does not have the structure its transformation builds for the "
      "model's parameters; build the optimizer with nnx.Optimizer(model, tx, wrt=...) for this "
      "model. Nothing was changed"
    )
  step = None
  if isinstance(restored, Mapping) and "step" in restored:
    step = dict(keyed_lib.state_leaves({"step": restored["step"]})).get(("step",))
  for variable, value in zip(slots, values):
    variable.set_value(value)
  if step is not None:
    optimizer.step.set_value(jnp.asarray(step, optimizer.step.get_value().dtype))
  return report
