"""The decision: each target takes its single best candidate or is reported (unmatched,
ambiguous, claimed twice); a fused tensor is split only in a layout known for that checkpoint;
a head is tied to the embedding only on evidence."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from paramreg_jax._src.match import evidence
from paramreg_jax._src.match.candidates import Candidate
from paramreg_jax._src.match.report import Proposal
from paramreg_jax._src.match.report import code
from paramreg_jax._src.match.vocabulary import concepts
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.selection import Indices
from paramreg_jax._src.selection import Range

MIN_SCORE = 0.5
_PARTS = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}


def choose(
  slots: list[Any],
  ranked: dict[str, list[Candidate]],
  proposals: dict[str, Proposal],
  ck: evidence.Checkpoint,
) -> list[str]:
  """Picks each target's single best candidate; records every unmatched or ambiguous one."""
  problems: list[str] = []
  picked: dict[str, Candidate] = {}
  for slot in slots:
    if slot.name in proposals:
      continue
    cands = distinct([c for c in ranked.get(slot.name, []) if c.score >= MIN_SCORE])
    if not cands:
      continue  # maybe a tied head; decided in tie_heads
    best = cands[0]
    rivals = [c for c in cands[1:] if c.score == best.score]
    if rivals:
      problems.append(ambiguous(slot.name, [best, *rivals]))
      continue
    picked[slot.name] = best
  # fused parts: the targets sharing one fused tensor split it in its known layout
  groups: dict[str | tuple[str, ...], list[str]] = {}
  for name, cand in picked.items():
    if cand.fused is not None:
      groups.setdefault(cand.fused[0], []).append(name)
  shapes = {s.name: tuple(s.shape) for s in slots}
  for group, names in groups.items():
    axis = picked[names[0]].fused[1]  # type: ignore[index]
    problem = _split_fused(group, axis, names, shapes, ck, proposals)
    if problem:
      problems.append(problem)
  # a checkpoint key is never used by two targets
  owners: dict[str, list[str]] = {}
  for name, cand in picked.items():
    if cand.fused is None:
      for k in cand.keys:
        owners.setdefault(k, []).append(name)
  clashes = {k: ns for k, ns in owners.items() if len(ns) > 1}
  for name, cand in picked.items():
    if cand.fused is not None:
      continue
    clash = sorted({n for k in cand.keys for n in clashes.get(k, ()) if n != name})
    if clash:
      problems.append(
        f"{name}: ambiguous: {shown(cand)} is also the best match of {', '.join(clash)}"
      )
      continue
    proposals[name] = Proposal(name, cand.build(), cand.reason, cand.keys)
  return problems


def distinct(cands: list[Candidate]) -> list[Candidate]:
  """The candidates with duplicates (same tensors, same layout) removed, order kept."""
  seen, out = set(), []
  for c in cands:
    if (c.keys, c.reason) not in seen:
      seen.add((c.keys, c.reason))
      out.append(c)
  return out


def ambiguous(name: str, cands: list[Candidate]) -> str:
  """The problem for a parameter that several candidates fit equally: each with its recipe,
  and the hint to paste for the first."""
  lines = [f"{name}: ambiguous between {len(cands)} candidates of equal score:"]
  for c in cands[:4]:
    lines.append(f"      {shown(c)} [{c.reason}] ({c.score:.2f})")
  first = next((c for c in cands if c.build is not None), None)
  if first is not None:
    lines.append(f"    to choose the first: hints={{{name!r}: {code(first.build())}}}")
  return "\n".join(lines)


def _split_fused(
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
  # each part's width along the fused axis is its target's output size
  widths = [
    math.prod(per_layer[n]) if len(stored) == 1 else math.prod(per_layer[n][1:]) for n in names
  ]
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
    known = "; ".join(f"{k}: {v}" for k, v in evidence.LAYOUTS.items())
    said = f"config.json model_type {facts.model_type!r}" if facts.model_type else "no config.json"
    why = f"; {rows}" if isinstance(rows, str) else ""
    return (
      f"{', '.join(names)}: parts of fused {keys[0]!r} {stored}, but how its {'/'.join(parts)} "
      f"are laid out along axis {axis} is not known for this checkpoint ({said}{why}). "
      f"Fused layouts differ by model ({known}): nothing is split by guess. Restore from a "
      "source that has the model's config.json (SafetensorsSource reads it beside the "
      "weights; match(..., config=...) for others), or give each part as a hint, "
      f"e.g. hints={{{names[0]!r}: R.source({keys[0]!r}, prj.Indices({axis}, [rows...]))}}"
    )
  for name, part in zip(names, present):
    shape, picked = per_layer[name], rows[part]
    contiguous = picked == list(range(picked[0], picked[0] + len(picked)))
    selection: Any = (
      Range(axis, picked[0], picked[0] + len(picked))
      if contiguous
      else Indices(axis, tuple(picked))
    )
    layers = []
    for key in keys:
      recipe: ops.Recipe = ops.source(key, selection)
      if len(stored) == 2 and axis == 0:  # [out, in] parts: transpose to [in, out]
        recipe = ops.transpose(recipe, (1, 0))
      natural = (len(picked),) if len(stored) == 1 else (stored[1 - axis], len(picked))
      if shape != natural:
        recipe = ops.reshape(recipe, shape)  # heads split
      layers.append(recipe)
    how = "" if layout == "contiguous" else f" ({str(layout).replace('_', ' ')} layout)"
    reason = f"part of fused {keys[0]!r}{how}"
    if stacked:
      proposals[name] = Proposal(
        name, ops.stack(layers, axis=0), f"{reason}, stacked {len(keys)} layers", keys
      )
    else:
      proposals[name] = Proposal(name, layers[0], reason, keys)
  return None


def shown(c: Candidate) -> str:
  if len(c.keys) > 2:
    return f"{c.keys[0]!r} .. {c.keys[-1]!r} ({len(c.keys)} layers)"
  return ", ".join(repr(k) for k in c.keys)


def tie_heads(
  slots: list[Any],
  ranked: dict[str, list[Candidate]],
  proposals: dict[str, Proposal],
  problems: list[str],
  ck: evidence.Checkpoint,
  unused: list[str],
) -> None:
  """Targets left without a candidate: a head tied to the embedding (when the config says so,
  or when no unused tensor could be the head), else unmatched."""
  embed = next(
    (
      s
      for s in slots
      if s.name in proposals
      and {"embed", "w"} <= concepts(s.name).tokens
      and not concepts(s.name).tokens & {"pos", "type"}
    ),
    None,
  )
  for slot in slots:
    if slot.name in proposals or any(_names(p, slot.name) for p in problems):
      continue
    tc = concepts(slot.name)
    shape = tuple(slot.shape)
    if "head" in tc.tokens and tc.kind == "w" and embed is not None:
      eshape = tuple(embed.shape)
      if shape in (eshape, eshape[::-1]):
        fits = [k for k in unused if ck.shapes.get(k) in (shape, shape[::-1])]
        if ck.facts.tied is False:
          problems.append(
            f"{slot.name} {shape}: unmatched: the config says tie_word_embeddings=false, and "
            "no checkpoint tensor is named like a head"
            + (f" (unused and of its shape: {', '.join(map(repr, fits[:4]))})" if fits else "")
            + "; pass the head's tensor as a hint"
          )
          continue
        if fits and ck.facts.tied is not True:
          problems.append(
            f"{slot.name} {shape}: ambiguous: it could be tied to the embedding "
            f"({embed.name}), or be the unused {', '.join(map(repr, fits[:4]))} of its shape, "
            f"and nothing says which; pass hints={{{slot.name!r}: {fits[0]!r}}}, or restore "
            "from a source with the config.json that says tie_word_embeddings"
          )
          continue
        evidence_ = "config: tie_word_embeddings" if ck.facts.tied else "no head tensor"
        if shape == eshape:
          why = f"tied to the embedding ({evidence_})"
          proposals[slot.name] = Proposal(slot.name, None, why, (), embed.name)
        else:
          owner = proposals[embed.name]
          recipe = ops.transpose(owner.recipe, (1, 0))  # type: ignore[arg-type]
          why = f"tied to the embedding, transposed ({evidence_})"
          proposals[slot.name] = Proposal(slot.name, recipe, why, owner.keys)
        continue
    near = distinct(ranked.get(slot.name, []))
    tied = [c for c in near if c.score == near[0].score] if near else []
    if len(tied) > 1:  # several fit the shape and none the name better than the others
      problems.append(
        ambiguous(slot.name, tied).replace(
          f"{slot.name}: ambiguous between",
          f"{slot.name} {shape}: its name matches no checkpoint name; ambiguous between",
          1,
        )
      )
      continue
    hint = (
      "; closest: " + "; ".join(f"{shown(c)} ({c.score:.2f}, {c.reason})" for c in near[:3])
      if near
      else ""
    )
    problems.append(
      f"{slot.name} {shape}: unmatched: no checkpoint tensor at "
      f"{'layer ' + str(tc.indices) if tc.indices else 'this level'} fits its name and shape{hint}"
    )


def _names(problem: str, name: str) -> bool:
  """Whether ``problem`` is about ``name`` (problems start ``a, b (shape): ...``)."""
  head = problem.split(":", 1)[0]
  return name in (part.split(" ")[0] for part in head.split(", "))


def cast_to_targets(slots: list[Any], proposals: dict[str, Proposal], source: Any) -> None:
  """A stored dtype other than the parameter's becomes an explicit, reported cast."""
  for slot in slots:
    p = proposals.get(slot.name)
    if p is None or p.recipe is None or p.reason.startswith("hint"):
      continue
    want = np.dtype(slot.dtype)
    if ops.infer(p.recipe, source).dtype != want:
      recipe = ops.cast(p.recipe, want)
      proposals[slot.name] = dataclasses.replace(
        p, recipe=recipe, reason=f"{p.reason}, cast to {want.name}"
      )
