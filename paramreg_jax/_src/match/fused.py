"""A fused tensor's parts (``qkv``, ``gate_up``): split only in the layout the checkpoint is
known to use (its name, its config); where nothing says it, each part is offered in every
known layout whose parts tile the tensor, and nothing is split by guess."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

from paramreg_jax._src.match import axes
from paramreg_jax._src.match import coherence
from paramreg_jax._src.match import config_facts
from paramreg_jax._src.match import evidence
from paramreg_jax._src.match import hints
from paramreg_jax._src.match.candidates import FUSED_AXIS_BY_WIDTHS
from paramreg_jax._src.match.candidates import FUSED_PARTS
from paramreg_jax._src.match.candidates import out_axes_of_width
from paramreg_jax._src.match.proposal import Proposal
from paramreg_jax._src.match.proposal import code
from paramreg_jax._src.match.refusal import Choice
from paramreg_jax._src.match.refusal import Problem
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
  out_first: bool  # the parts keep their output axes before their input ([out, in])
  scan_axis: int = 0  # where a stacked target keeps its layers

  def outs(self, name: str) -> tuple[int, ...]:
    """A part's output axes (its heads and head size where the target splits them)."""
    return _outs(self.per_layer[name], len(self.stored), self.out_first)

  def part(self, name: str, part: str, rows: list[int], layout: str) -> Proposal:
    """``name`` as ``part`` (``rows`` along the fused axis)."""
    layers = _part_layers(
      rows, self.keys, self.axis, self.stored, self.per_layer[name], self.out_first
    )
    how = "" if layout == "contiguous" else f" ({layout.replace('_', ' ')} layout)"
    reason = f"part of fused {self.keys[0]!r}{how}"
    if self.stacked:
      recipe = ops.stack(layers, axis=self.scan_axis)
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
  at = ck.scan_axis or 0  # a stacked part is a candidate only where this is known
  per_layer = {n: shapes[n][:at] + shapes[n][at + 1 :] if stacked else shapes[n] for n in names}
  found = _geometry(names, per_layer, stored, axis, ck, ck.concepts[keys[0]].bare)
  if isinstance(found, str):
    return f"{', '.join(names)}: parts of fused {keys[0]!r} {stored}, but {found}"
  axis, widths, out_first = found
  present = tuple(p for n in names for p in parts if p in tokens[n])
  f = _Fused(keys, axis, stored, stacked, tuple(names), present, widths, per_layer, out_first, at)
  facts, by = ck.facts, ""
  said_by_config = ck.facts.qkv_layout if fused == "qkv" else ck.facts.gate_up_layout
  layout = said_by_config or config_facts.layout_by_name(keys[0], stored, axis)
  if keys[0] in ck.layouts:  # the user's word
    layout, size = ck.layouts[keys[0]]
    size = size if layout in _BY_HEADS else 1  # four blocks are four blocks, whatever the heads
    facts, by = _with_heads(f, facts, size), ", as the layout hint says"
  rows = (
    config_facts.part_rows(layout, present, list(widths), facts)
    if layout and (layout == "contiguous" or present == parts)
    else None
  )
  if isinstance(rows, dict) and present == parts and not _tiles(rows, stored[axis]):
    rows = f"the layout {layout!r} does not tile its {stored[axis]} rows with these parts"
  unsure = [n for n in names if roles.get(n, "").endswith("?")]
  if not isinstance(rows, dict) or unsure:
    return _undecided(f, ck.facts, roles, str(layout) if isinstance(rows, dict) else rows)
  for name, part in zip(names, present):
    p = f.part(name, part, rows[part], str(layout))
    p = dataclasses.replace(p, reason=p.reason + by)
    if name in roles:  # nothing in its name said which part: its place among its siblings did
      p = dataclasses.replace(p, reason=f"{p.reason}, in order: the {roles[name]} of its siblings")
    proposals[name] = p
  return None


def _tiles(rows: Mapping[str, list[int]], size: int) -> bool:
  """Whether the parts' rows are every row of the fused axis, each once."""
  return sorted(i for r in rows.values() for i in r) == list(range(size))


def _with_heads(f: _Fused, facts: config_facts.Facts, size: int | None) -> config_facts.Facts:
  """The head counts a per-head layout needs: the config's, the head size a layout hint gives
  (``per_head:64``), or the target's own split heads (q, k, v ``[.., heads, head_dim]``)."""
  outs = [f.outs(n) for n in f.names]
  if size and f.present == ("q", "k", "v") and not any(w % size for w in f.widths):
    w = f.widths
    return dataclasses.replace(facts, heads=w[0] // size, kv_heads=w[1] // size, head_dim=size)
  if not facts.heads and f.present == ("q", "k", "v") and all(len(o) == 2 for o in outs):
    return dataclasses.replace(facts, heads=outs[0][0], kv_heads=outs[1][0], head_dim=outs[0][1])
  return facts


def _outs(shape: tuple[int, ...], rank: int, out_first: bool) -> tuple[int, ...]:
  """The output axes of a part of ``shape`` cut from a fused tensor of ``rank`` axes: after
  its input (``[in, out...]``) or before it (``[out..., in]``); an experts-stacked
  ``[E, out, in]`` keeps E in front."""
  lead = max(rank - 1, 0)
  if not lead:
    return shape  # a bias: all output
  return shape[lead - 1 : -1] if out_first else shape[lead:]


def _geometry(
  names: list[str],
  per_layer: dict[str, tuple[int, ...]],
  stored: tuple[int, ...],
  axis: int,
  ck: evidence.Checkpoint,
  bare: bool,
) -> tuple[int, tuple[int, ...], bool] | str:
  """``(fused axis, each part's width along it, whether the parts are [out, in])``, or why
  not. A part's width is its output size; whether its output axes come first is what its
  relation to the stored tensor (transposed or not: the orientation evidence) and the stored
  layout say. A ``kernel`` is ``[in, out]``; a torch-style ``weight`` is whatever its relation
  says; where nothing says it, each reading is tried and only one that tiles may stand. A
  ``bare`` stored parameter (GPT-OSS's experts) is oriented by the bare ones decided only.
  The fused axis is one of the last two (experts and layers stay whole): where both tile, the
  parts' widths cannot say which."""
  rank = len(stored)
  relations = {axes.orientation(ck, n, bare=bare) for n in names}
  flip = relations.pop() if len(relations) == 1 else None
  readings: list[tuple[int, tuple[int, ...], bool]] = []
  tried: list[tuple[tuple[int, ...], int]] = []
  for out_first in (False, True):
    if out_first and (rank == 1 or any(axes.in_out_leaf(n) for n in names)):
      continue
    widths = tuple(math.prod(_outs(per_layer[n], rank, out_first)) for n in names)
    if rank == 1:
      at = [0]
    elif flip in ("t", "same"):  # the stored out axis follows from the part's orientation
      at = [rank - 2 if out_first == (flip == "same") else rank - 1]
    elif axis != FUSED_AXIS_BY_WIDTHS:  # the stored layout is known; the part's is not
      at = [axis]
    else:  # nothing known: an out axis the parts tile
      at = out_axes_of_width(stored, sum(widths))
    tried.append((widths, at[0] if at else axis))
    for a in at:
      if stored[a] == sum(widths) and (axis == FUSED_AXIS_BY_WIDTHS or a == axis):
        readings.append((a, widths, out_first))
  if len(readings) == 1:  # two readings transpose the parts differently: never a pick
    return readings[0]
  if not readings:
    first, where = tried[0]
    where = max(where, 0)
    return (
      f"their widths {list(first)} sum to {sum(first)}, not its axis {where} "
      f"({stored[where]}): a part is missing or misread"
    )
  return (
    "whether the parts are [in, out] or [out, in] is not known (both tile it, and no other "
    "linear weight's shape says which); pass each part as a hint"
  )


def _undecided(
  f: _Fused, facts: config_facts.Facts, roles: Mapping[str, str], known: str | None
) -> Problem:
  """The problem when the layout is unknown (``known`` is None or why), or is ``known`` but
  gate and up are told apart by nothing: each part in each layout it may be, to choose."""
  layouts = tuple(config_facts.LAYOUTS) if known not in config_facts.LAYOUTS else (str(known),)
  if f.present == ("gate", "up") and known not in config_facts.LAYOUTS:
    layouts = config_facts.GATE_UP_LAYOUTS
  choices = _layout_choices(f, facts, roles, layouts)
  stored, key = f.stored, f.keys[0]
  if known in config_facts.LAYOUTS:  # gate and up by their order only: either way round
    unsure = [n for n in f.names if roles.get(n, "").endswith("?")]
    return Problem(
      f"{', '.join(unsure)}: the {' and '.join(f.present)} parts of fused {key!r} {stored}, "
      "but nothing says which is which (their names do not, and code calls gate and up in "
      "either order); choose each (hints below)",
      unsure,
      {n: choices[n] for n in unsure},
    )
  said = (
    f"config.json model_type {facts.model_type!r}"
    if facts.model_type
    else "its config has no model_type: not a transformers config.json"
    if facts.foreign
    else "no config.json"
  )
  why = f"; {known}" if known else ""
  parts = FUSED_PARTS["qkv" if "q" in f.present else "gate_up"]
  module = coherence.checkpoint_module(key)
  if f.stacked:
    module = hints.layer_template(module)
  # one layout hint answers every part, unless only their order says which part each is
  by_order = any(roles.get(n, "").endswith("?") for n in f.names)
  asked = () if by_order else _layout_hints(f, facts, layouts)
  fix = (
    f"say the layout the model uses: one hint for the fused {module!r} (hints below)"
    if asked
    else "choose each part in the layout the model uses (hints below)"
  )
  if facts.model_type:  # its config is there and does not say: only the model's code does
    fix = fix[0].upper() + fix[1:]
  else:
    fix = (
      "Restore from a source that has the model's config.json (SafetensorsSource reads it "
      "beside the weights; match(..., config=...) for others), or " + fix
    )
  return Problem(
    f"{', '.join(f.names)}: parts of fused {key!r} {stored}, but how its {'/'.join(parts)} "
    f"are laid out along axis {f.axis} is not known for this checkpoint ({said}{why}): "
    "nothing is split by guess. " + fix,
    f.names,
    {module: asked} if asked else choices,
  )


def _layout_hints(
  f: _Fused, facts: config_facts.Facts, layouts: tuple[str, ...]
) -> tuple[Choice, ...]:
  """Each layout the parts tile, as the value of a layout hint (``"contiguous"``; a per-head
  layout whose head count nothing gives, once per head size that divides the parts:
  ``"per_head:64"``); layouts that split alike are one line."""
  out: list[Choice] = []
  rows_of: list[Any] = []
  for layout in layouts:
    sizes: list[int | None] = [None]
    if layout in _BY_HEADS and _with_heads(f, facts, None).heads is None:
      # a head size that divides every part, into more than one head (one head: contiguous)
      sizes = [
        d
        for d in _HEAD_SIZES
        if not any(w % d for w in f.widths) and 1 < f.widths[0] // d <= _MAX_HEADS
      ]
    for size in sizes:
      rows = _rows(f, layout, _with_heads(f, facts, size if layout in _BY_HEADS else 1))
      if rows is None:
        continue
      said = _said(f, layout) + (f", {_heads(f.widths[0] // size)} of {size}" if size else "")
      hint = f"{layout}:{size}" if size else layout
      if rows in rows_of:  # splits as an earlier line does (per head with one head: contiguous)
        j = rows_of.index(rows)
        out[j] = dataclasses.replace(out[j], reason=f"{out[j].reason}, or {said}")
        continue
      rows_of.append(rows)
      out.append(Choice(hint, json.dumps(hint), f"if laid out {said}", None))
  return tuple(out)


def _layout_choices(
  f: _Fused, facts: config_facts.Facts, roles: Mapping[str, str], layouts: tuple[str, ...]
) -> dict[str, tuple[Choice, ...]]:
  """Each part in each of ``layouts`` its widths fit (head counts from the config, or from
  the target's split heads; where neither gives them, a per-head layout is offered for each
  common head size that divides the parts, said on its line); a part only its order guesses
  (gate or up) as either."""
  outs = [f.outs(n) for n in f.names]
  heads = [(facts, "")]
  if not facts.heads and f.present == ("q", "k", "v"):
    if all(len(o) == 2 for o in outs):
      heads = [
        (dataclasses.replace(facts, heads=outs[0][0], kv_heads=outs[1][0], head_dim=outs[0][1]), "")
      ]
    else:
      heads += [
        (
          dataclasses.replace(facts, heads=f.widths[0] // d, kv_heads=f.widths[1] // d, head_dim=d),
          f", {_heads(f.widths[0] // d)} of {d}",
        )
        for d in _HEAD_SIZES
        if not any(w % d for w in f.widths) and f.widths[0] // d <= _MAX_HEADS
      ]
  out: dict[str, list[Choice]] = {n: [] for n in f.names}
  for layout in layouts:
    for known, said_heads in heads if layout in _BY_HEADS else heads[:1]:
      rows = _rows(f, layout, known)
      if rows is not None:
        _offer(f, roles, layout, rows, _said(f, layout) + said_heads, out)
  return {n: tuple(c) for n, c in out.items()}


def _rows(f: _Fused, layout: str, known: config_facts.Facts) -> dict[str, list[int]] | None:
  """The rows each part takes in ``layout`` (head counts from ``known``), if the layout holds
  these parts (a per-head one, all three of q, k, v) and they tile the fused axis in it."""
  rows = config_facts.part_rows(layout, f.present, list(f.widths), known)
  if not isinstance(rows, dict) or (layout in _BY_HEADS and len(f.present) != 3):
    return None
  return rows if _tiles(rows, f.stored[f.axis]) else None


def _said(f: _Fused, layout: str) -> str:
  """How a line says ``layout``: a gate_up's contiguous one (or whichever of gate and up the
  target has) is ``[gate | up]``."""
  if "q" not in f.present and layout == "contiguous":
    return "[gate | up] one after the other"
  return config_facts.LAYOUTS[layout]


def _heads(n: int) -> str:
  return f"{n} head" + ("s" if n != 1 else "")


# the layouts whose rows depend on the head count (CodeGen's four blocks do not)
_BY_HEADS = ("per_head", "grouped")
# head sizes models use, for a per-head layout when nothing gives the head count
_HEAD_SIZES = (8, 16, 32, 64, 80, 96, 128, 256)
_MAX_HEADS = 128


def _offer(
  f: _Fused,
  roles: Mapping[str, str],
  layout: str,
  rows: dict[str, list[int]],
  said: str,
  out: dict[str, list[Choice]],
) -> None:
  """Each part's choice in one layout, merged into a line that gives the same recipe."""
  for name, own in zip(f.names, f.present):
    either = roles.get(name, "").endswith("?")
    for part in f.present if either else (own,):
      if f.per_layer[f.names[f.present.index(part)]] != f.per_layer[name]:
        continue
      p = f.part(name, part, rows[part], layout)
      same = [j for j, c in enumerate(out[name]) if c.hint == p.recipe]
      if same:  # two layouts that agree here (grouped with one q head per group is per head)
        c = out[name][same[0]]
        if said not in c.reason:
          out[name][same[0]] = dataclasses.replace(c, reason=f"{c.reason}, or {said}")
      else:
        why = f"the {part} part, " if either else ""
        out[name].append(Choice(p.recipe, code(p.recipe), f"{why}if laid out {said}", None))  # type: ignore[arg-type]


def _part_layers(
  picked: list[int],
  keys: tuple[str, ...],
  axis: int,
  stored: tuple[int, ...],
  shape: Any,
  out_first: bool,
) -> list[ops.Recipe]:
  """One part (rows ``picked`` along ``axis``) of each fused tensor in ``keys``."""
  contiguous = picked == list(range(picked[0], picked[0] + len(picked)))
  selection: Any = (
    Range(axis, picked[0], picked[0] + len(picked)) if contiguous else Indices(axis, tuple(picked))
  )
  return [_part(key, selection, stored, axis, len(picked), shape, out_first) for key in keys]


def _part(
  key: str,
  selection: Any,
  stored: tuple[int, ...],
  axis: int,
  width: int,
  shape: Any,
  out_first: bool,
) -> ops.Recipe:
  """One part of the fused ``key``: its rows, turned to the target's ``[.., in, out]`` (or
  ``[.., out, in]``, ``out_first``), heads split to the target's ``shape``."""
  recipe: ops.Recipe = ops.source(key, selection)
  natural = list(stored)
  natural[axis] = width
  out_at = len(stored) - 2 if out_first else len(stored) - 1
  if len(stored) >= 2 and axis != out_at:
    order = (*range(len(stored) - 2), len(stored) - 1, len(stored) - 2)
    recipe = ops.transpose(recipe, order)
    natural = [natural[i] for i in order]
  return recipe if tuple(shape) == tuple(natural) else ops.reshape(recipe, shape)
