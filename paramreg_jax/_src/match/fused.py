"""A fused tensor's parts (``qkv``, ``gate_up``): split only in the layout the checkpoint is
known to use (its name, its config); where nothing says it, each part is offered in every
known layout whose parts tile the tensor, and nothing is split by guess."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from paramreg_jax._src.match import evidence
from paramreg_jax._src.match.refusal import Choice
from paramreg_jax._src.match.refusal import Problem
from paramreg_jax._src.match.report import Proposal
from paramreg_jax._src.match.report import code
from paramreg_jax._src.match.vocabulary import concepts
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.sources.selection import Indices
from paramreg_jax._src.sources.selection import Range

_PARTS = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}


def split(
  group: str | tuple[str, ...],
  axis: int,
  names: list[str],
  shapes: dict[str, tuple[int, ...]],
  ck: evidence.Checkpoint,
  proposals: dict[str, Proposal],
) -> str | None:
  """Proposes the parts of a fused tensor (or of each layer's, stacked) for ``names``, in the
  layout this checkpoint is known to use; returns a problem if it is not known or the parts'
  widths do not tile the tensor."""
  keys = (group,) if isinstance(group, str) else group
  stacked = not isinstance(group, str)
  tokens = {n: concepts(n).tokens for n in names}
  fused = "qkv" if any(tokens[n] & {"q", "k", "v"} for n in names) else "gate_up"
  parts = _PARTS[fused]
  names.sort(key=lambda n: min(parts.index(t) for t in tokens[n] if t in parts))
  stored = ck.shapes[keys[0]]
  per_layer = {n: shapes[n][1:] if stacked else shapes[n] for n in names}
  # each part's width along the fused axis is its target's output size (a weight's last axes
  # after [in]; an experts-stacked [E, out, in] keeps E in front)
  lead = max(len(stored) - 1, 0)
  widths = [math.prod(per_layer[n][lead:]) for n in names]
  if sum(widths) != stored[axis]:
    return (
      f"{', '.join(names)}: parts of fused {keys[0]!r} {stored}, but their widths {widths} sum "
      f"to {sum(widths)}, not its axis {axis} ({stored[axis]}): a part is missing or misread"
    )
  facts = ck.facts
  layout = evidence.layout_by_name(keys[0]) or (
    facts.qkv_layout if fused == "qkv" else facts.gate_up_layout
  )
  present = tuple(p for n in names for p in parts if p in tokens[n])
  rows = (
    evidence.part_rows(layout, present, widths, facts)
    if layout and (layout == "contiguous" or present == parts)
    else None
  )
  if not isinstance(rows, dict):
    said = f"config.json model_type {facts.model_type!r}" if facts.model_type else "no config.json"
    why = f"; {rows}" if isinstance(rows, str) else ""
    return Problem(
      f"{', '.join(names)}: parts of fused {keys[0]!r} {stored}, but how its {'/'.join(parts)} "
      f"are laid out along axis {axis} is not known for this checkpoint ({said}{why}): "
      "nothing is split by guess. Restore from a source that has the model's config.json "
      "(SafetensorsSource reads it beside the weights; match(..., config=...) for others), or "
      "choose each part in the layout the model uses (hints below)",
      names,
      _layout_choices(keys, axis, names, present, widths, per_layer, facts, stored, stacked),
    )
  for name, part in zip(names, present):
    proposals[name] = _fused_part(
      keys, axis, name, rows[part], str(layout), stored, per_layer[name], stacked
    )
  return None


def _fused_part(
  keys: tuple[str, ...],
  axis: int,
  name: str,
  rows: list[int],
  layout: str,
  stored: tuple[int, ...],
  shape: tuple[int, ...],
  stacked: bool,
) -> Proposal:
  """``name``'s part (``rows`` along ``axis``) of the fused tensor (of each layer's, stacked)."""
  layers = _part_layers(rows, keys, axis, stored, shape)
  how = "" if layout == "contiguous" else f" ({layout.replace('_', ' ')} layout)"
  reason = f"part of fused {keys[0]!r}{how}"
  return (
    Proposal(name, ops.stack(layers, axis=0), f"{reason}, stacked {len(keys)} layers", keys)
    if stacked
    else Proposal(name, layers[0], reason, keys)
  )


def _layout_choices(
  keys: tuple[str, ...],
  axis: int,
  names: list[str],
  present: tuple[str, ...],
  widths: list[int],
  per_layer: dict[str, tuple[int, ...]],
  facts: evidence.Facts,
  stored: tuple[int, ...],
  stacked: bool,
) -> dict[str, tuple[Choice, ...]]:
  """Each part in every known layout its widths fit (head counts from the config, or from
  the target's split heads): the choices of a fused tensor whose layout nothing says."""
  lead = max(len(stored) - 1, 0)
  outs = [per_layer[n][lead:] for n in names]
  if not facts.heads and present == ("q", "k", "v") and all(len(o) == 2 for o in outs):
    facts = dataclasses.replace(facts, heads=outs[0][0], kv_heads=outs[1][0], head_dim=outs[0][1])
  out: dict[str, list[Choice]] = {n: [] for n in names}
  for layout, said in evidence.LAYOUTS.items():
    rows = evidence.part_rows(layout, present, widths, facts)
    if not isinstance(rows, dict) or (layout != "contiguous" and len(present) != 3):
      continue
    if sorted(i for r in rows.values() for i in r) != list(range(stored[axis])):
      continue  # the parts must tile the fused axis in this layout
    for name, part in zip(names, present):
      p = _fused_part(keys, axis, name, rows[part], layout, stored, per_layer[name], stacked)
      same = [j for j, c in enumerate(out[name]) if c.hint == p.recipe]
      if same:  # two layouts that agree here (grouped with one q head per group is per head)
        c = out[name][same[0]]
        out[name][same[0]] = dataclasses.replace(c, reason=f"{c.reason}, or {said}")
      else:
        out[name].append(Choice(p.recipe, code(p.recipe), f"if laid out {said}", None))  # type: ignore[arg-type]
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
