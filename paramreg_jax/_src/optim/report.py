"""``SurgeryReport``: what :func:`~paramreg_jax.reconcile` did to each parameter's optimizer
state (kept, added, dropped, re-initialised, renamed), and what it noticed (the optimizer
changed; a list of layers changed length while state stayed with its index)."""

from __future__ import annotations

import dataclasses
import html

from paramreg_jax._src import html_table
from paramreg_jax._src import text_width


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
    optimizer_changed: what of the old state the new optimizer does not keep (Adam's ``mu``
      after a switch to SGD, ...), empty when the optimizer is the same.
    shifted: ``(list, old length, new length)`` of each list of parameters (``layers``) that
      changed length without a ``rename`` for it: keys are paths, so every index kept the state
      of whatever sat there before, right if entries were appended or removed at the end.
    resized: ``(key, what was kept)`` of each parameter whose shape changed and whose state
      ``on_shape_mismatch="overlap"`` or a callable carried over in part.
    hyperparams: ``(path, state's value, code's value, kept)`` of each ``inject_hyperparams``
      hyperparameter the code now sets differently; ``kept`` is ``"code"`` or ``"state"``.

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
  optimizer_changed: str = ""
  shifted: tuple[tuple[str, int, int], ...] = ()
  hyperparams: tuple[tuple[str, str, str, str], ...] = ()
  resized: tuple[tuple[str, str], ...] = ()

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
    return bool(
      self.added
      or self.dropped
      or self.reinitialized
      or self.renamed
      or self.optimizer_changed
      or self.hyperparams
      or self.resized
    )

  def _notes(self) -> list[tuple[str, str]]:
    out = []
    if self.optimizer_changed:
      out.append(("optimizer", self.optimizer_changed))
    for key, how in self.resized:
      out.append(("resized", f"{key}: {how}"))
    for path, was, now, kept in self.hyperparams:
      which = "the code's" if kept == "code" else "the state's, kept (hyperparams='state')"
      out.append(("hyperparams", f"{path}: {was} (state) -> {now} (code); now {which}"))
    for where, before, after in self.shifted:
      out.append(
        (
          "check",
          f"{where} went from {before} to {after} entries and state stays with its index: "
          f"right if entries were added or removed at the end; if one was inserted or deleted "
          f"in the middle, pass rename={{old key: new key}} so state follows its weight",
        )
      )
    return out

  def __str__(self) -> str:
    head = (
      f"SurgeryReport: {len(self.kept)} kept, {len(self.added)} added, "
      f"{len(self.dropped)} dropped, {len(self.reinitialized)} re-initialised"
    )
    lines = [head]
    for label, ks in self._rows():
      if ks:
        lines += text_width.items(f"  {label + ':':<14} ", ks)
    for label, text in self._notes():
      start = f"  {label + ':':<14} "
      lines += text_width.prose(text, start, " " * len(start))
    return "\n".join(lines)

  def _repr_html_(self) -> str:
    colors = {
      "kept": "#2e7d32",
      "added": "#1565c0",
      "dropped": "#c62828",
      "re-initialised": "#ef6c00",
      "renamed": "#6a1b9a",
    }
    rows = [
      [
        f"<span style='color:{colors[label]};font-weight:bold'>{label}</span>",
        str(len(ks)),
        html_table.code(", ".join(ks)) if ks else "&mdash;",
      ]
      for label, ks in self._rows()
    ]
    notes = [
      [f"<b>{html.escape(label)}</b>", "", html.escape(text)] for label, text in self._notes()
    ]
    return html_table.table(["state", "#", "parameter keys"], rows + notes, wrap=[2])
