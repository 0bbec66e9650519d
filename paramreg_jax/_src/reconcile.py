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

from paramreg_jax._src import devices as devices_lib
from paramreg_jax._src import errors
from paramreg_jax._src import keyed as keyed_lib
from paramreg_jax._src import keys as keys_lib
from paramreg_jax._src import registry as registry_lib

Path = tuple[str, ...]


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


def _components(path: Any) -> Path:
  return tuple(keys_lib.entry_to_component(e) for e in path)


def _spec(x: Any) -> tuple[tuple[int, ...], Any]:
  return tuple(np.shape(x)), np.dtype(getattr(x, "dtype", np.asarray(x).dtype))


def _fmt(spec: tuple[tuple[int, ...], Any]) -> str:
  return f"{spec[0]} {np.dtype(spec[1]).name}"


def _check_option(name: str, value: str, allowed: tuple[str, ...]) -> None:
  if value not in allowed:
    raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


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
  """Fits a keyed optimizer state, possibly from an older model, to ``params``.

  Args:
    tx: the transformation returned by :func:`keyed`.
    state: a keyed state: live, restored by orbax with a target, or restored without a target
      (plain nested dicts keyed by canonical keys).
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
    TypeError: ``tx`` is not a keyed transformation.
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
  if keyed_lib.keyed_info(tx) is None:
    raise TypeError(
      "reconcile needs the keyed transformation: pass paramreg_jax.keyed(tx), the same one "
      "that built the state"
    )
  _check_option("on_missing", on_missing, ("init", "error"))
  _check_option("on_unexpected", on_unexpected, ("drop", "error"))
  _check_option("on_shape_mismatch", on_shape_mismatch, ("error", "init"))

  abstract = jax.eval_shape(tx.init, params)
  old, renamed = _renamed_old_state(state, rename)

  # Where fresh state lives: slot leaves (prefix, key) and plain leaves (path).
  slot_paths: dict[Path, tuple[Path, str]] = {}
  for prefix, node in jax.tree_util.tree_flatten_with_path(abstract, is_leaf=keyed_lib._is_keyed)[
    0
  ]:
    if keyed_lib._is_keyed(node):
      p = _components(prefix)
      for key in node:
        slot_paths[(*p, key)] = (p, key)
  fresh_flat, fresh_treedef = jax.tree_util.tree_flatten_with_path(abstract)

  old_keys = {path[-1] for path in old if len(path) > 1 and keys_lib.is_canonical_key(path[-1])}
  fresh_keys = {key for _, key in slot_paths.values()}

  problems: list[str] = []
  mismatched: dict[str, list[str]] = {}
  needs_init: set[Path] = set()
  moved: set[str] = set()
  for path, sds in fresh_flat:
    comps = _components(path)
    want = (tuple(sds.shape), np.dtype(sds.dtype))
    have = old.get(comps)
    if comps in slot_paths:
      prefix, key = slot_paths[comps]
      if have is None:
        needs_init.add(comps)
        if key in old_keys:
          moved.add(key)
      elif _spec(have) != want:
        where = "/".join(prefix) or "<root>"
        mismatched.setdefault(key, []).append(
          f"{key}: state {where} has {_fmt(_spec(have))}, the new parameters need {_fmt(want)}"
        )
    elif have is None:
      problems.append(f"{'/'.join(comps)}: missing from the old state (the optimizer changed?)")
    elif _spec(have) != want:
      problems.append(
        f"{'/'.join(comps)}: old state has {_fmt(_spec(have))}, the optimizer now needs {_fmt(want)}"
      )

  added = sorted(fresh_keys - old_keys)
  dropped = sorted(old_keys - fresh_keys)
  if problems:
    problems.insert(0, "non-parameter state (counts, hyperparameters) does not match:")
  if on_missing == "error" and added:
    problems.append(
      f"{len(added)} new parameter(s) have no state (on_missing='error'): {', '.join(added)}"
    )
  if on_unexpected == "error" and dropped:
    problems.append(
      f"{len(dropped)} state key(s) have no parameter (on_unexpected='error'): {', '.join(dropped)}"
    )
  if on_shape_mismatch == "error" and mismatched:
    problems.append(
      f"{len(mismatched)} parameter(s) changed shape or dtype; pass on_shape_mismatch='init' to "
      "re-initialise their state, or fix the model:"
    )
    problems.extend("  " + line for key in sorted(mismatched) for line in mismatched[key])
  if problems:
    raise errors.ReconcileError(
      "cannot reconcile the optimizer state with the new parameters; nothing was changed:"
      + errors.bullet_list(problems)
    )

  reinit_keys = set(mismatched) | moved
  for comps, (_, key) in slot_paths.items():
    if key in mismatched:
      needs_init.add(comps)
  fresh_values = None
  if needs_init:
    fresh_values = {
      _components(p): x for p, x in jax.tree_util.tree_flatten_with_path(tx.init(params))[0]
    }
  placement = _param_shardings(params, keyed_lib.keyed_info(tx)[1])  # type: ignore[index]
  leaves = []
  for path, _ in fresh_flat:
    comps = _components(path)
    if comps in needs_init:
      assert fresh_values is not None
      leaves.append(fresh_values[comps])
      continue
    kept = old[comps]
    kept = kept if isinstance(kept, jax.Array) else jnp.asarray(kept)
    # State that mirrors a parameter follows it to its (possibly new) mesh, bit-exact.
    param = placement.get(slot_paths[comps][1]) if comps in slot_paths else None
    if param is not None and param[0] == kept.shape:
      if not kept.sharding.is_equivalent_to(param[1], kept.ndim):
        kept = devices_lib.settle(jax.device_put(kept, param[1]))  # one reshard in flight
    leaves.append(kept)
  new_state = jax.tree_util.tree_unflatten(fresh_treedef, leaves)
  report = SurgeryReport(
    kept=tuple(sorted(fresh_keys & old_keys - reinit_keys)),
    added=tuple(added),
    dropped=tuple(dropped),
    reinitialized=tuple(sorted(reinit_keys)),
    renamed=renamed,
  )
  return new_state, report


def _param_shardings(params: Any, by: Any) -> dict[str, tuple[tuple[int, ...], Any]]:
  """``{key: (shape, sharding)}`` of the parameters that are placed ``jax.Array``s."""
  leaves, treedef = jax.tree_util.tree_flatten(params)
  keys, _ = registry_lib.tree_keys(params, treedef, by=by)
  return {
    k: (tuple(x.shape), x.sharding)
    for k, x in zip(keys, leaves)
    if isinstance(x, jax.Array) and isinstance(getattr(x, "sharding", None), jax.sharding.Sharding)
  }


def _renamed_old_state(
  state: Any, rename: Mapping[str, str] | Callable[[str], str] | None
) -> tuple[dict[Path, Any], tuple[tuple[str, str], ...]]:
  """``{path components: leaf}`` of the old state, with slot keys renamed."""
  flat = [(_components(p), x) for p, x in jax.tree_util.tree_flatten_with_path(state)[0]]
  if rename is None:
    return dict(flat), ()
  if isinstance(rename, Mapping):
    mapping = dict(rename)
    for old_key, new_key in mapping.items():
      keys_lib.parse_key(old_key)
      keys_lib.parse_key(new_key)
    fn: Callable[[str], str] = lambda k: mapping.get(k, k)  # noqa: E731
  elif callable(rename):
    fn = rename
  else:
    raise TypeError(f"rename must be a mapping or a callable, got {type(rename).__name__}")
  out: dict[Path, Any] = {}
  pairs: dict[str, str] = {}
  for comps, leaf in flat:
    if len(comps) > 1 and keys_lib.is_canonical_key(comps[-1]):
      old_key = comps[-1]
      if old_key not in pairs:
        pairs[old_key] = fn(old_key)
        keys_lib.parse_key(pairs[old_key])
      new_key = pairs[old_key]
      comps = (*comps[:-1], new_key)
    if comps in out:
      sources = sorted(k for k, v in pairs.items() if v == comps[-1])
      raise errors.ReconcileError(
        f"rename maps several old keys to {comps[-1]} ({', '.join(sources)}); each new key may "
        "receive the state of one old key only. Fix the rename mapping"
      )
    out[comps] = leaf
  return out, tuple(sorted((a, b) for a, b in pairs.items() if a != b))
