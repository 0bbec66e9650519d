"""``reconcile``: fit a keyed optimizer state from an older model to a new parameter tree.

Model surgery (add, remove, rename, reorder, freeze, resize) changes which parameter keys
exist. ``reconcile`` matches the old state to the new parameters **by key**: surviving keys keep
their state bit-exact, new keys get fresh state from ``tx.init``, vanished keys are dropped, and
a shape/dtype change is an error unless asked to re-initialise. Nothing is silent: the returned
:class:`SurgeryReport` lists every key in each category.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax

from paramreg_jax._src import api_types
from paramreg_jax._src import devices as devices_lib
from paramreg_jax._src import errors
from paramreg_jax._src.optim import align
from paramreg_jax._src.optim import hyperparams as hyperparams_lib
from paramreg_jax._src.optim import keyed as keyed_lib
from paramreg_jax._src.optim import mirrors as mirrors_lib
from paramreg_jax._src.optim import resize as resize_lib
from paramreg_jax._src.optim.report import SurgeryReport
from paramreg_jax._src.optim.state_layout import OldState
from paramreg_jax._src.optim.state_layout import StateLayout
from paramreg_jax._src.optim.state_layout import matching_form
from paramreg_jax._src.optim.state_layout import new_layout
from paramreg_jax._src.optim.state_layout import read_old_state
from paramreg_jax._src.optim.state_layout import spec
from paramreg_jax._src.registry import keys as keys_lib

Path = mirrors_lib.Path


def _fmt(spec: tuple[tuple[int, ...], Any]) -> str:
  return f"{spec[0]} {getattr(spec[1], 'name', spec[1])}"


def _not_traced(state: Any, params: Any) -> None:
  """Refuses a call under ``jax.jit`` (or any transformation) at trace time: the result would
  keep the old state's shardings, not the new parameters'."""
  traced = [x for x in jax.tree.leaves((state, params)) if isinstance(x, jax.core.Tracer)]
  if traced:
    raise errors.ReconcileError(
      f"reconcile was called under a jax transformation (jit, vmap, grad: {len(traced)} leaves "
      "of the state and parameters are tracers); it reads shapes and shardings and places the "
      "state on the new parameters' devices, which a traced program cannot do. Call it eagerly, "
      "once when resuming, and jit the training step"
    )


def _check_option(name: str, value: str, allowed: tuple[str, ...]) -> None:
  if value not in allowed:
    raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def reconcile(
  tx: api_types.Transformation,
  state: api_types.PyTree,
  params: api_types.PyTree,
  *,
  on_missing: Literal["init", "error"] = "init",
  on_unexpected: Literal["drop", "error"] = "drop",
  on_shape_mismatch: Literal["error", "init", "overlap"] | resize_lib.Resize = "error",
  rename: Mapping[str, str] | Callable[[str], str] | None = None,
  hyperparams: Literal["code", "state"] = "code",
  on_incomplete: Literal["error", "init"] = "error",
) -> tuple[Any, SurgeryReport]:
  """Fits an optimizer state, possibly from an older model, to ``params``, by parameter key.

  Args:
    tx: the transformation that built the state: plain optax or :func:`keyed` (whose ``by``
      is used).
    state: the old state, in any form: live; restored by orbax with or without a target
      (plain nested dicts and lists); ``nnx.state(optimizer)`` (its ``opt_state`` is used,
      ``{'value': x}`` levels are understood); or a state saved by the first keyed design
      (moments stored as ``{canonical key: leaf}``).
    params: the new parameter tree.
    on_missing: ``"init"`` gives new parameters fresh state; ``"error"`` refuses.
    on_unexpected: ``"drop"`` discards state of vanished keys; ``"error"`` refuses.
    on_shape_mismatch: a parameter whose shape or dtype changed: ``"error"`` (default)
      refuses and names every such key; ``"init"`` re-initialises its state; ``"overlap"``
      keeps the state of the rows, columns and layers both shapes have and initialises the
      rest as ``tx.init`` does (a vocabulary or an MLP that grew or shrank); or a callable
      ``(key, old_leaf, fresh_leaf) -> leaf`` (:func:`layer_map` for deeper or shallower
      stacked layers). The report's ``resized`` says what was kept per key.
    rename: old key -> new key (a mapping, or a function returning the key unchanged when it
      does not apply), for renamed modules and reordered lists; the state follows its weight.
    hyperparams: a numeric hyperparameter of ``optax.inject_hyperparams`` whose value in the
      state differs from the one the code now gives (``learning_rate=1e-4`` where the state
      holds ``1e-2``): ``"code"`` (default) takes the code's, ``"state"`` keeps the state's;
      either way the report lists it, old -> new.
    on_incomplete: a parameter whose old state is only partly there (Adam's ``mu`` without
      its ``nu``: a truncated or damaged checkpoint): ``"error"`` (default) refuses, naming the
      parameter and the missing leaves; ``"init"`` gives it fresh state in every leaf (never
      half a moment).

  Returns:
    ``(new_state, report)``: a state with exactly the structure of ``tx.init(params)``, and a
    :class:`SurgeryReport`. ``tx.init`` only runs if some key needs fresh state.

  Raises:
    TypeError: ``tx`` is not an optax transformation.
    ReconcileError: any refused category (all offenders listed at once), or non-parameter
      state (counts, hyperparameters) missing or changed, i.e. the optimizer itself changed;
      or a call under ``jax.jit`` (refused at trace time: call it eagerly).

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> from paramreg_jax import keyed, reconcile
    >>> tx = keyed(optax.adam(1e-3))
    >>> old = tx.init({"a": jnp.ones(2), "gone": jnp.ones(3)})
    >>> new_state, report = reconcile(tx, old, {"a": jnp.ones(2), "new": jnp.ones(4)})
    >>> report.kept, report.added, report.dropped
    (('n:a',), ('n:new',), ('n:gone',))
  """
  inner, by = keyed_lib.keyed_info(tx) or (keyed_lib.as_transformation(tx, "reconcile"), "name")
  _check_option("on_missing", on_missing, ("init", "error"))
  _check_option("on_unexpected", on_unexpected, ("drop", "error"))
  if not callable(on_shape_mismatch):
    _check_option("on_shape_mismatch", on_shape_mismatch, ("error", "init", "overlap"))
  _check_option("hyperparams", hyperparams, ("code", "state"))
  _check_option("on_incomplete", on_incomplete, ("error", "init"))
  _not_traced(state, params)
  # the data flow: where the new state keeps what -> what the old state has -> compare ->
  # refuse (all problems at once, nothing changed) -> assemble the new state and the report
  layout = new_layout(inner, params, by)
  old = read_old_state(mirrors_lib.optimizer_state(state), layout, rename, by)
  old = dataclasses.replace(old, params=params)
  layout = matching_form(layout, old)
  diff = _compare(layout, old)
  if diff.optimizer_problems and by == "name":  # the same state under a new wrapping?
    layout, old, diff = _realign(state, layout, rename, params) or (layout, old, diff)
  _refuse(diff, on_missing, on_unexpected, on_shape_mismatch, on_incomplete)
  diff.complete(layout)
  fresh = _fresh(inner, params, layout, diff)
  resized = _resize(layout, old, diff, fresh, on_shape_mismatch)
  changed = hyperparams_lib.changed(layout, old, fresh, hyperparams_lib.scheduled(inner))
  if hyperparams == "code":
    diff.needs_init |= {comps for comps, _, _ in changed}
  report = diff.report(old)
  keys = {key for key, _ in resized.values()}
  report = dataclasses.replace(
    report,
    reinitialized=tuple(k for k in report.reinitialized if k not in keys),
    resized=tuple(sorted({(key, how) for (key, how) in resized.values()})),
    hyperparams=tuple(
      (name, old_v, new_v, hyperparams) for name, old_v, new_v in hyperparams_lib.shown(changed)
    ),
  )
  return _assemble(layout, old, diff, fresh), report


@dataclasses.dataclass
class _Diff:
  """What differs between the old state and the new layout."""

  added: list[str]
  dropped: list[str]
  kept: set[str]
  mismatched: dict[str, list[str]]  # key -> one line per state leaf that changed
  moves: dict[str, str]  # mismatched key -> the new key its old state fits (a moved layer)
  moved: set[str]  # keys whose state exists, but not in every place the new optimizer needs
  needs_init: set[Path]  # leaves of the new state that tx.init must provide
  optimizer_problems: list[str]  # non-parameter state that does not match
  optimizer_changed: str  # what of the old state the new optimizer does not keep
  shifted: tuple[tuple[str, int, int], ...]
  # key -> (the state leaves it has, those it lacks), where it has some but not all
  incomplete: dict[str, tuple[list[str], list[str]]] = dataclasses.field(default_factory=dict)

  def complete(self, layout: StateLayout) -> None:
    """Every leaf of an incompletely saved parameter is fresh (never half a moment)."""
    self.needs_init |= {
      c for c, owner in layout.owners.items() if owner is not None and owner[1] in self.incomplete
    }

  def report(self, old: OldState) -> SurgeryReport:
    reinit = set(self.mismatched) | self.moved | set(self.incomplete)
    return SurgeryReport(
      kept=tuple(sorted(self.kept - reinit)),
      added=tuple(self.added),
      dropped=tuple(self.dropped),
      reinitialized=tuple(sorted(reinit)),
      renamed=old.renamed,
      optimizer_changed=self.optimizer_changed,
      shifted=self.shifted,
    )


def _realign(
  state: Any, layout: StateLayout, rename: Any, params: Any
) -> tuple[StateLayout, OldState, _Diff] | None:
  """The old state read by what its leaves are (``align``), when that fits the new optimizer:
  its moments and counts kept, the new optimizer's other state fresh, and said so."""
  found = align.translate(mirrors_lib.state_leaves(mirrors_lib.optimizer_state(state)), layout)
  if found is None:
    return None
  leaves, moves = found
  old = read_old_state(None, layout, rename, "name", leaves=leaves)
  old = dataclasses.replace(old, params=params)
  form = matching_form(layout, old)
  diff = _compare(form, old, new_state_ok=True)
  if diff.optimizer_problems:
    return None
  fresh = {form.owners[c][0] if form.owners[c] is not None else c for c in diff.needs_init}  # type: ignore[index]
  note = align.describe(moves, sorted(fresh))
  diff.optimizer_changed = note + (f"; {diff.optimizer_changed}" if diff.optimizer_changed else "")
  return form, old, diff


def _compare(layout: StateLayout, old: OldState, new_state_ok: bool = False) -> _Diff:
  old_keys, new_keys = old.keys, layout.keys
  had_state = old_keys | set(old.elsewhere)
  problems: list[str] = []
  mismatched: dict[str, list[str]] = {}
  needs_init: set[Path] = set()
  moved: set[str] = set()
  shapes: dict[str, tuple[Any, Any]] = {}  # key -> (its old state's spec, the new one's)
  parts: dict[str, tuple[list[str], list[str]]] = {}  # key -> (leaves it has, leaves it lacks)
  for comps, sds in layout.leaves:
    want = (tuple(sds.shape), sds.dtype)
    owner = layout.owners[comps]
    if owner is not None:
      prefix, key = owner
      have = old.owners.get(owner)
      shapes.setdefault(key, (None if have is None else spec(have), want))
      parts.setdefault(key, ([], []))[have is None].append("/".join(prefix) or "<root>")
      if have is None:
        needs_init.add(comps)
        if key in had_state and not new_state_ok:  # else: a wrapper's own (MultiSteps' acc_grads)
          moved.add(key)
      elif spec(have) != want:
        mismatched.setdefault(key, []).append(
          f"{key}: state {'/'.join(prefix) or '<root>'} has {_fmt(spec(have))}, the new "
          f"parameters need {_fmt(want)}"
        )
      continue
    have = old.plain.get(comps)
    if have is None and new_state_ok:  # a wrapper's own state (MultiSteps' counters): fresh
      needs_init.add(comps)
    elif have is None:
      problems.append(f"{'/'.join(comps)}: missing from the old state (the optimizer changed?)")
    elif spec(have) != want:
      problems.append(
        f"{'/'.join(comps)}: old state has {_fmt(spec(have))}, the optimizer now needs {_fmt(want)}"
      )
  problems += _way_out(problems, layout, old, had_state, new_keys)
  # a re-initialised key gets fresh state in every leaf it owns
  needs_init |= {
    c for c, owner in layout.owners.items() if owner is not None and owner[1] in mismatched
  }
  return _Diff(
    added=sorted(new_keys - had_state),
    dropped=sorted((had_state - new_keys) | set(old.overwritten)),
    kept=new_keys & old_keys,
    mismatched=mismatched,
    moves=_moves(mismatched, shapes, old_keys),
    moved=moved,
    needs_init=needs_init,
    optimizer_problems=problems,
    optimizer_changed=_optimizer_change(layout, old),
    shifted=_shifted(new_keys & old_keys, had_state, new_keys, old.renamed),
    incomplete={} if new_state_ok else _incomplete(parts, old_keys),
  )


def _incomplete(
  parts: dict[str, tuple[list[str], list[str]]], old_keys: set[str]
) -> dict[str, tuple[list[str], list[str]]]:
  """The keys whose old state has some of the leaves the new optimizer needs, not all."""
  return {k: (has, lacks) for k, (has, lacks) in parts.items() if has and lacks and k in old_keys}


def _way_out(
  problems: list[str], layout: StateLayout, old: OldState, had_state: set[str], new_keys: set[str]
) -> list[str]:
  """What to do when the optimizer's own state does not fit (always said, never guessed)."""
  out: list[str] = []
  if problems and not had_state & new_keys and old.plain.keys().isdisjoint(layout.owners):
    seen = sorted("/".join(c) for c in old.plain)[:3]
    out.append(
      f"no entry of the old state is where this optimizer keeps one (it has {', '.join(seen)}, "
      f"...; this optimizer builds {', '.join('/'.join(c) for c, _ in layout.leaves[:3])}, ...), "
      "and its parts cannot be matched by what they are (nothing alike, or two alike, such as "
      "two Adams in one chain): the state was built by another optimizer (or is not an optax "
      "state). Reconcile with the optimizer that built it and change the optimizer afterwards, "
      "or start fresh with tx.init(params)"
    )
  elif problems:
    out.append(
      "the old state was built by another optimizer (or another configuration of it): its "
      "non-parameter state does not fit this one. Reconcile with the optimizer that built it "
      "to carry the state through the model's changes, or start this optimizer fresh with "
      "tx.init(params) (the parameters are unaffected)"
    )
  return out


def _moves(
  mismatched: dict[str, Any], shapes: dict[str, tuple[Any, Any]], old_keys: set[str]
) -> dict[str, str]:
  """For each reshaped key, the one other new key its old state fits (a layer inserted,
  reordered or renamed), when there is exactly one: the rename that keeps its moments."""
  out = {}
  for key in sorted(mismatched):
    have = shapes[key][0]
    fits = [
      k
      for k, (had, want) in shapes.items()
      if k != key and want == have and (k not in old_keys or k in mismatched)
    ]
    if len(fits) == 1:
      out[key] = fits[0]
  return out


def _optimizer_change(layout: StateLayout, old: OldState) -> str:
  """What of the old state the new optimizer does not keep, in a sentence ("" if nothing)."""
  gone = sorted(
    {"/".join(p[:-1] if len(p) > 1 else p) for ps in old.elsewhere.values() for p in ps}
  )
  gone += sorted("/".join(p) for p in old.discarded)
  if not gone:
    return ""
  keeps = sorted({"/".join(prefix) or "<root>" for prefix in layout.prefixes})
  keeps += sorted({"/".join(c) for c, owner in layout.owners.items() if owner is None})
  shown = ", ".join(gone[:6]) + (f", ... ({len(gone)} in all)" if len(gone) > 6 else "")
  return (
    f"the old state's {shown} are not kept: the optimizer changed "
    f"(it now keeps {', '.join(keeps[:6]) or 'no state'})"
  )


def _shifted(
  kept: set[str], had: set[str], new: set[str], renamed: tuple[tuple[str, str], ...]
) -> tuple[tuple[str, int, int], ...]:
  """Lists of parameters (``layers/<i>/...``) whose length changed while some of their entries
  kept state by index, with no rename touching them."""

  def lists(keys: set[str]) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for key in keys:
      if not key.startswith(keys_lib.NAMED_KEY_PREFIX):
        continue  # positional keys follow the flatten order by design
      comps = key.split(":", 1)[1].split("/")
      for j, comp in enumerate(comps):
        if comp.isdigit():
          out.setdefault("/".join(comps[:j]), set()).add(int(comp))
    return out

  before, after, kept_in = lists(had), lists(new), lists(kept)
  touched = {w for pair in renamed for k in pair for w in lists({k})}
  return tuple(
    (f"{where}/" if where else "<root>", len(before[where]), len(after[where]))
    for where in sorted(kept_in)
    if where in before
    and where in after
    and len(before[where]) != len(after[where])
    and where not in touched
  )


def _refuse(
  diff: _Diff, on_missing: str, on_unexpected: str, on_shape_mismatch: Any, on_incomplete: str
) -> None:
  """Raises one ``ReconcileError`` listing every refused difference (nothing is changed)."""
  problems = list(diff.optimizer_problems)
  if problems:
    problems.insert(0, "non-parameter state (counts, hyperparameters) does not match:")
  if on_incomplete == "error" and diff.incomplete:
    problems.append(
      f"{len(diff.incomplete)} parameter(s) have only part of their state (a truncated or "
      "damaged checkpoint?): half a moment is never kept; restore the state whole, or pass "
      "on_incomplete='init' to start these parameters' state afresh:"
    )
    problems.extend(
      f"  {key}: has {', '.join(has)}; missing {', '.join(lacks)}"
      for key, (has, lacks) in sorted(diff.incomplete.items())
    )
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
  if on_unexpected == "error" and diff.optimizer_changed:
    problems.append(f"{diff.optimizer_changed} (on_unexpected='error')")
  if isinstance(on_shape_mismatch, str) and on_shape_mismatch == "error" and diff.moves:
    problems.append(
      "the old state of a reshaped parameter fits another new parameter: if parameters moved "
      "(a layer inserted, reordered or renamed), pass "
      f"rename={diff.moves!r} so the state follows its weight"
    )
  if isinstance(on_shape_mismatch, str) and on_shape_mismatch == "error" and diff.mismatched:
    problems.append(
      f"{len(diff.mismatched)} parameter(s) changed shape or dtype; pass "
      "on_shape_mismatch='overlap' to keep the state of the rows and columns both shapes have "
      "(a grown vocabulary or MLP), prj.layer_map([...]) for deeper or shallower stacked "
      "layers, 'init' to re-initialise their state, or fix the model:"
    )
    problems.extend("  " + line for key in sorted(diff.mismatched) for line in diff.mismatched[key])
  if problems:
    raise errors.ReconcileError(
      "cannot reconcile the optimizer state with the new parameters; nothing was changed:"
      + errors.bullet_list(problems)
    )


def _resize(
  layout: StateLayout, old: OldState, diff: _Diff, fresh: dict[Path, Any], policy: Any
) -> dict[Path, tuple[str, str]]:
  """``{state leaf: (key, what was kept)}`` of the resized parameters' leaves that kept
  something, their new values stored in ``fresh`` (the leaves ``tx.init`` gives the rest of
  them); a leaf that kept nothing is not listed (its key is reported re-initialised)."""
  if policy in ("error", "init"):
    return {}
  out = {}
  for comps, owner in layout.owners.items():
    if owner is None or owner[1] not in diff.mismatched or old.owners.get(owner) is None:
      continue
    leaf, how, kept = resize_lib.apply(policy, owner[1], old.owners[owner], fresh[comps])
    fresh[comps] = leaf
    if kept:
      out[comps] = (owner[1], how)
  return out


def _fresh(
  inner: optax.GradientTransformation, params: Any, layout: StateLayout, diff: _Diff
) -> dict:
  """``tx.init``'s leaves, when some leaf needs them or hyperparameters are to be compared."""
  if not diff.needs_init and not hyperparams_lib.paths(layout):
    return {}
  return dict(mirrors_lib.state_leaves(inner.init(params)))


def _assemble(layout: StateLayout, old: OldState, diff: _Diff, fresh: dict[Path, Any]) -> Any:
  """The new state: kept leaves bit-exact (on their parameter's placement), the rest fresh."""
  placement = _param_shardings(old.params, layout.index)
  home = _replicated_home(placement)
  leaves = []
  for comps, _ in layout.leaves:
    if comps in diff.needs_init:
      leaves.append(fresh[comps])
      continue
    owner = layout.owners[comps]
    kept = old.owners[owner] if owner is not None else old.plain[comps]
    kept = kept if isinstance(kept, jax.Array) else jnp.asarray(kept)
    # State that mirrors a parameter follows it to its (possibly new) mesh, bit-exact.
    param = placement.get(owner[1]) if owner is not None else None
    if param is not None and param[0] == kept.shape:
      if not kept.sharding.is_equivalent_to(param[1], kept.ndim):
        kept = devices_lib.settle(jax.device_put(kept, param[1]))  # one reshard in flight
    elif home is not None and kept.sharding.device_set != home.device_set:
      # counts, hyperparameters, accumulators: onto the parameters' devices, replicated
      kept = devices_lib.settle(jax.device_put(kept, home))
    leaves.append(kept)
  structure: Any = jax.tree_util.tree_structure(layout.abstract)  # (PyTreeDef is untyped)
  return structure.unflatten(leaves)


def _replicated_home(placement: dict[str, tuple[Any, Any]]) -> Any:
  """A replicated sharding over the devices the parameters live on (their mesh when they have
  one), or None when they are not placed or live on different device sets."""
  shardings = [sharding for _, sharding in placement.values()]
  if not shardings or len({frozenset(s.device_set) for s in shardings}) != 1:
    return None
  mesh = next((s.mesh for s in shardings if isinstance(s, jax.sharding.NamedSharding)), None)
  if mesh is None:
    devices = sorted(shardings[0].device_set, key=lambda d: d.id)
    mesh = jax.sharding.Mesh(np.array(devices), ("devices",))
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def _param_shardings(params: Any, index: mirrors_lib.ParamIndex) -> dict[str, tuple[Any, Any]]:
  """``{key: (shape, sharding)}`` of the parameters that are placed ``jax.Array`` objects."""
  return {
    k: (tuple(x.shape), x.sharding)
    for k, x in zip(index.keys, jax.tree_util.tree_leaves(params))
    if isinstance(x, jax.Array) and isinstance(getattr(x, "sharding", None), jax.sharding.Sharding)
  }
