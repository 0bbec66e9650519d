"""A fused tensor's parts (``qkv``, ``gate_up``): split only in the layout the checkpoint is
known to use (its name, its config); where nothing says it, each part is offered in every
known layout whose parts tile the tensor, and nothing is split by guess."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from paramreg_jax._src.match import evidence
from paramreg_jax._src.match.candidates import FUSED_AXIS_BY_WIDTHS
from paramreg_jax._src.match.candidates import FUSED_PARTS
from paramreg_jax._src.match.refusal import Choice
from paramreg_jax._src.match.refusal import Problem
from paramreg_jax._src.match.report import Proposal
from paramreg_jax._src.match.report import code
from paramreg_jax._src.match.vocabulary import concepts
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.sources.selection import Indices
from paramreg_jax._src.sources.selection import Range


@dataclasses.dataclass(frozen=True)
class _Fused:
  """One fused tensor (of each layer's, ``stacked``) and the target leaves that are its parts:
  ``names`` in part order, ``present`` their parts, ``widths`` their sizes along ``axis``."""

  keys: tuple[str, ...]
  axis: int
  stored: tuple[int, ...]
  stacked: bool
  names: tuple[str, ...]
  present: tuple[str, ...]
  widths: tuple[int, ...]
  per_layer: dict[str, tuple[int, ...]]

  def part(self, name: str, part: str, rows: list[int], layout: str) -> Proposal:
    """``name`` as ``part`` (``rows`` along the fused axis)."""
    layers = _part_layers(rows, self.keys, self.axis, self.stored, self.per_layer[name])
    how = "" if layout == "contiguous" else f" ({layout.replace('_', ' ')} layout)"
    reason = f"part of fused {self.keys[0]!r}{how}"
    if self.stacked:
      recipe = ops.stack(layers, axis=0)
      return Proposal(name, recipe, f"{reason}, stacked {len(self.keys)} layers", self.keys)
    return Proposal(name, layers[0], reason, self.keys)


def split(
  group: str | tuple[str, ...],
  axis: int,
  names: list[str],
  shapes: dict[str, tuple[int, ...]],
  ck: evidence.Checkpoint,
  proposals: dict[str, Proposal],
  roles: Mapping[str, str],
) -> str | None:
  """Proposes the parts of a fused tensor (or of each layer's, stacked) for ``names``, in the
  layout this checkpoint is known to use; returns a problem if it is not known, if only
  the siblings' order says which part each is and it cannot (gate and up), or if the parts'
  widths do not tile the tensor. ``roles``: the part each numbered sibling's order says."""
  keys = (group,) if isinstance(group, str) else group
  stacked = not isinstance(group, str)
  tokens = {n: concepts(n).tokens | {roles[n].rstrip("?")} - {""} for n in names if n in roles}
  tokens |= {n: concepts(n).tokens for n in names if n not in roles}
  fused = "qkv" if any(tokens[n] & {"q", "k", "v"} for n in names) else "gate_up"
  parts = FUSED_PARTS[fused]
  names.sort(key=lambda n: min(parts.index(t) for t in tokens[n] if t in parts))
  stored = ck.shapes[keys[0]]
  per_layer = {n: shapes[n][1:] if stacked else shapes[n] for n in names}
  # each part's width along the fused axis is its target's output size (a weight's last axes
  # after [in]; an experts-stacked [E, out, in] keeps E in front)
  lead = max(len(stored) - 1, 0)
  widths = [math.prod(per_layer[n][lead:]) for n in names]
  if axis == FUSED_AXIS_BY_WIDTHS:  # no convention known: the one axis the parts tile
    fits = [a for a, size in enumerate(stored) if size == sum(widths)]
    axis = fits[0] if len(fits) == 1 else 0
  if sum(widths) != stored[axis]:
    return (
      f"{', '.join(names)}: parts of fused {keys[0]!r} {stored}, but their widths {widths} sum "
      f"to {sum(widths)}, not its axis {axis} ({stored[axis]}): a part is missing or misread"
    )
  present = tuple(p for n in names for p in parts if p in tokens[n])
  f = _Fused(keys, axis, stored, stacked, tuple(names), present, tuple(widths), per_layer)
  layout = evidence.layout_by_name(keys[0]) or (
    ck.facts.qkv_layout if fused == "qkv" else ck.facts.gate_up_layout
  )
  rows = (
    evidence.part_rows(layout, present, widths, ck.facts)
    if layout and (layout == "contiguous" or present == parts)
    else None
  )
  unsure = [n for n in names if roles.get(n, "").endswith("?")]
  if not isinstance(rows, dict) or unsure:
    return _undecided(f, ck.facts, roles, str(layout) if isinstance(rows, dict) else rows)
  for name, part in zip(names, present):
    p = f.part(name, part, rows[part], str(layout))
    if name in roles:  # nothing in its name said which part: its place among its siblings did
      p = dataclasses.replace(p, reason=f"{p.reason}, in order: the {roles[name]} of its siblings")
    proposals[name] = p
  return None


def _undecided(
  f: _Fused, facts: evidence.Facts, roles: Mapping[str, str], known: str | None
) -> Problem:
  """The problem when the layout is unknown (``known`` is None or why), or is ``known`` but
  gate and up are told apart by nothing: each part in each layout it may be, to choose."""
  layouts = tuple(evidence.LAYOUTS) if known not in evidence.LAYOUTS else (str(known),)
  choices = _layout_choices(f, facts, roles, layouts)
  stored, key = f.stored, f.keys[0]
  if known in evidence.LAYOUTS:  # gate and up by their order only: either way round
    unsure = [n for n in f.names if roles.get(n, "").endswith("?")]
    return Problem(
      f"{', '.join(unsure)}: the {' and '.join(f.present)} parts of fused {key!r} {stored}, "
      "but nothing says which is which (their names do not, and code calls gate and up in "
      "either order); choose each (hints below)",
      unsure,
      {n: choices[n] for n in unsure},
    )
  said = f"config.json model_type {facts.model_type!r}" if facts.model_type else "no config.json"
  why = f"; {known}" if known else ""
  parts = FUSED_PARTS["qkv" if "q" in f.present else "gate_up"]
  return Problem(
    f"{', '.join(f.names)}: parts of fused {key!r} {stored}, but how its {'/'.join(parts)} "
    f"are laid out along axis {f.axis} is not known for this checkpoint ({said}{why}): "
    "nothing is split by guess. Restore from a source that has the model's config.json "
    "(SafetensorsSource reads it beside the weights; match(..., config=...) for others), or "
    "choose each part in the layout the model uses (hints below)",
    f.names,
    choices,
  )


def _layout_choices(
  f: _Fused, facts: evidence.Facts, roles: Mapping[str, str], layouts: tuple[str, ...]
) -> dict[str, tuple[Choice, ...]]:
  """Each part in each of ``layouts`` its widths fit (head counts from the config, or from
  the target's split heads); a part only its order guesses (gate or up) as either."""
  lead = max(len(f.stored) - 1, 0)
  outs = [f.per_layer[n][lead:] for n in f.names]
  if not facts.heads and f.present == ("q", "k", "v") and all(len(o) == 2 for o in outs):
    facts = dataclasses.replace(facts, heads=outs[0][0], kv_heads=outs[1][0], head_dim=outs[0][1])
  out: dict[str, list[Choice]] = {n: [] for n in f.names}
  for layout in layouts:
    rows = evidence.part_rows(layout, f.present, list(f.widths), facts)
    if not isinstance(rows, dict) or (layout != "contiguous" and len(f.present) != 3):
      continue
    if sorted(i for r in rows.values() for i in r) != list(range(f.stored[f.axis])):
      continue  # the parts must tile the fused axis in this layout
    said = evidence.LAYOUTS[layout]
    if len(f.present) == 2:
      said = f"[{' | '.join(f.present)}] one after the other"
    for name, own in zip(f.names, f.present):
      either = roles.get(name, "").endswith("?")
      for part in f.present if either else (own,):
        if f.per_layer[f.names[f.present.index(part)]] != f.per_layer[name]:
          continue
        p = f.part(name, part, rows[part], layout)
        same = [j for j, c in enumerate(out[name]) if c.hint == p.recipe]
        if same:  # two layouts that agree here (grouped with one q head per group is per head)
          c = out[name][same[0]]
          out[name][same[0]] = dataclasses.replace(c, reason=f"{c.reason}, or {said}")
        else:
          why = f"the {part} part, " if either else ""
          out[name].append(Choice(p.recipe, code(p.recipe), f"{why}if laid out {said}", None))  # type: ignore[arg-type]
  return {n: tuple(c) for n, c in out.items()}


def _part_layers(
  picked: list[int], keys: tuple[str, ...], axis: int, stored: tuple[int, ...], shape: Any
) -> list[ops.Recipe]:
  """One part (rows ``picked`` along ``axis``) of each fused tensor in ``keys``."""
  contiguous = picked == list(range(picked[0], picked[0] + len(picked)))
  selection: Any = (
    Range(axis, picked[0], picked[0] + len(picked)) if contiguous else Indices(axis, tuple(picked))
  )
  return [_part(key, selection, stored, axis, len(picked), shape) for key in keys]


def _part(
  key: str, selection: Any, stored: tuple[int, ...], axis: int, width: int, shape: Any
) -> ops.Recipe:
  """One part of the fused ``key``: its rows, ``[.., out, in]`` turned to ``[.., in, out]``,
  heads split to the target's ``shape``."""
  recipe: ops.Recipe = ops.source(key, selection)
  natural = list(stored)
  natural[axis] = width
  if len(stored) >= 2 and axis == len(stored) - 2:
    order = (*range(len(stored) - 2), len(stored) - 1, len(stored) - 2)
    recipe = ops.transpose(recipe, order)
    natural = [natural[i] for i in order]
  return recipe if tuple(shape) == tuple(natural) else ops.reshape(recipe, shape)
