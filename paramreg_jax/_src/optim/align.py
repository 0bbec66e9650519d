"""Optimizer state found under a new wrapping, by what it is.

The same Adam inside a new chain (a clip added in front: its state moves from ``0/mu/w`` to
``1/0/mu/w``), inside ``MultiSteps`` (``inner_opt_state/0/mu/w``), inside
``inject_hyperparams`` (``inner_state/0/mu/w``), or behind ``multi_transform`` labels
(``inner_states/<label>/inner_state/0/mu/w``) keeps its moments and count: a leaf's *identity*
is its path with chain positions and these wrapper fields removed, and the parameter it mirrors
kept whole (``mu`` of ``n:w``; ``count``). ``reconcile`` uses it only when the old state does
not fit the new optimizer as it is, and only when every identity is unique on both sides: two
Adams in one chain are refused, never guessed.
"""

from __future__ import annotations

from typing import Any

from paramreg_jax._src.optim.state_layout import Path
from paramreg_jax._src.optim.state_layout import StateLayout
from paramreg_jax._src.registry import keys as keys_lib

_WRAPPERS = frozenset({"inner_state", "inner_opt_state"})


def identity(prefix: Path) -> tuple[str, ...]:
  """A state path without chain positions and wrapper fields (a label after ``inner_states``
  is a wrapper too)."""
  out: list[str] = []
  skip = False
  for comp in prefix:
    if skip:
      skip = False
    elif comp == "inner_states":
      skip = True
    elif not comp.isdigit() and comp not in _WRAPPERS:
      out.append(comp)
  return tuple(out)


def _old_identity(comps: Path, names: set[str]) -> tuple[tuple[str, ...], str | None]:
  for j in range(1, len(comps)):
    key = keys_lib.NAMED_KEY_PREFIX + "/".join(keys_lib.escape_component(c) for c in comps[j:])
    if key in names:
      return identity(comps[:j]), key
  return identity(comps), None


def translate(
  leaves: list[tuple[Path, Any]], layout: StateLayout
) -> tuple[list[tuple[Path, Any]], list[tuple[Path, Path]]] | None:
  """The old state's leaves moved to where the new optimizer keeps the same thing, and the
  moves; None when nothing matches or an identity is not unique (on either side)."""
  new_ids: dict[tuple[Any, ...], Path] = {}
  for comps, _ in layout.leaves:
    owner = layout.owners[comps]
    ident: tuple[tuple[str, ...], str | None] = (
      (identity(owner[0]), owner[1]) if owner is not None else (identity(comps), None)
    )
    if ident in new_ids:
      return None  # the new optimizer keeps two things alike (two Adams): nothing is guessed
    new_ids[ident] = comps
  names = set(layout.names)
  seen: set[tuple[Any, ...]] = set()
  out, moves = [], []
  for comps, leaf in leaves:
    ident = _old_identity(comps, names)
    if ident in seen:
      return None
    seen.add(ident)
    target = new_ids.get(ident)
    out.append((target if target is not None else comps, leaf))
    if target is not None and target != comps:
      moves.append((comps, target))
  return (out, moves) if moves else None


def describe(moves: list[tuple[Path, Path]], fresh: list[Path]) -> str:
  """The report's sentence for a state found under a new wrapping."""
  shown = ", ".join(f"{'/'.join(a)} -> {'/'.join(b)}" for a, b in moves[:4])
  more = f", ... ({len(moves)} in all)" if len(moves) > 4 else ""
  text = f"the same transformations under a new wrapping, kept by what they are ({shown}{more})"
  if fresh:
    text += f"; new state, as tx.init gives it: {', '.join('/'.join(c) for c in fresh[:6])}"
  return text
