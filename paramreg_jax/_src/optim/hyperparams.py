"""``inject_hyperparams``' hyperparameters in a state: which are numeric (compared with the
code's by ``reconcile``) and which come from a schedule (code, never compared)."""

from __future__ import annotations

from typing import Any

import numpy as np

from paramreg_jax._src.optim import mirrors as mirrors_lib
from paramreg_jax._src.optim.state_layout import OldState
from paramreg_jax._src.optim.state_layout import StateLayout

Path = mirrors_lib.Path


def paths(layout: StateLayout) -> list[Path]:
  """``inject_hyperparams``' numeric hyperparameters in the state (``.../hyperparams/<name>``)."""
  return [
    c
    for c, sds in layout.leaves
    if layout.owners[c] is None and len(c) >= 2 and c[-2] == "hyperparams" and not sds.shape
  ]


def scheduled(tx: Any) -> frozenset[str]:
  """The names of ``inject_hyperparams``' hyperparameters that ``tx`` (anywhere inside it)
  takes from a schedule: the schedule is the code, and the value in the state is only its
  last output (each update recomputes it from the count), so it is never compared."""
  names: set[str] = set()
  seen: set[int] = set()
  todo: list[Any] = [tx]
  while todo and len(seen) < 10_000:
    obj = todo.pop()
    if id(obj) in seen:
      continue
    seen.add(id(obj))
    if isinstance(obj, tuple):  # a GradientTransformation, or a tuple of them (chain)
      todo.extend(x for x in obj if callable(x) or isinstance(x, tuple))
    elif callable(obj):
      code = getattr(obj, "__code__", None)
      cells = getattr(obj, "__closure__", None) or ()
      for name, cell in zip(code.co_freevars if code else (), cells):
        try:
          value = cell.cell_contents
        except ValueError:  # an empty cell
          continue
        if name == "sched_hps" and isinstance(value, dict):  # optax.inject_hyperparams'
          names.update(str(k) for k in value)
        elif callable(value) or isinstance(value, tuple):
          todo.append(value)
  return frozenset(names)


def changed(
  layout: StateLayout, old: OldState, fresh: dict[Path, Any], scheduled: frozenset[str]
) -> list[tuple[Path, Any, Any]]:
  """``(path, state's value, code's value)`` of the numeric hyperparameters that differ (a
  scheduled one is the code's schedule whatever its last value)."""
  out = []
  for comps in paths(layout):
    if comps[-1] in scheduled:
      continue
    have, want = old.plain.get(comps), fresh.get(comps)
    if have is None or want is None:
      continue
    if not np.array_equal(np.asarray(have), np.asarray(want)):
      out.append((comps, have, want))
  return out


def shown(changed: list[tuple[Path, Any, Any]]) -> list[tuple[str, str, str]]:
  return [
    ("/".join(c), f"{np.asarray(a).item():g}", f"{np.asarray(b).item():g}") for c, a, b in changed
  ]
