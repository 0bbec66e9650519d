"""The decision: each target takes its single best candidate or is reported (unmatched,
ambiguous, claimed twice); a fused tensor is split only in a layout known for that checkpoint;
a head is tied to the embedding only on evidence."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

from paramreg_jax._src.match import axes
from paramreg_jax._src.match import closure
from paramreg_jax._src.match import coherence
from paramreg_jax._src.match import evidence
from paramreg_jax._src.match import fused
from paramreg_jax._src.match import order
from paramreg_jax._src.match import refusal
from paramreg_jax._src.match import towers
from paramreg_jax._src.match import unique
from paramreg_jax._src.match.candidates import Candidate
from paramreg_jax._src.match.candidates import distinct
from paramreg_jax._src.match.proposal import Proposal
from paramreg_jax._src.match.proposal import code
from paramreg_jax._src.match.vocabulary import concepts
from paramreg_jax._src.match.vocabulary import same_path
from paramreg_jax._src.match.vocabulary import shared_modules
from paramreg_jax._src.recipes import ops

MIN_SCORE = 0.5


def choose(
  slots: list[Any],
  ranked: dict[str, list[Candidate]],
  proposals: dict[str, Proposal],
  ck: evidence.Checkpoint,
  hinted: frozenset[str] = frozenset(),
  roles: Mapping[str, str] | None = None,
) -> list[str]:
  """Decides every target that has candidates; returns the problems (ambiguous, conflicting,
  claimed twice). Phases: each target's single best candidate by name; open ones settled by
  their decided siblings (module) and by the other layers (layer); conflicts refused; fused
  tensors split in their known layout; keys claimed twice refused. ``hinted``: targets whose
  candidates a hint named (any score counts); ``roles``: the part (q, k, v, o) each numbered
  sibling's order says it is (``order.fused_roles``)."""
  picked, open_ = _best(slots, ranked, proposals, hinted, ck)
  blocks = {s.name: evidence.target_indices(s.name, concepts(s.name).indices, ck) for s in slots}
  by_hint = {*hinted, *(n for n, p in proposals.items() if p.reason == "hint")}
  closing = functools.partial(
    closure.settle,
    blocks=blocks,
    ck=ck,
    hinted={blocks[n] for n in by_hint if n in blocks},
    hinted_leaves=by_hint,
  )
  contests = _Contests(picked, open_, hinted, ranked)
  offered = coherence.offered_by(ranked)
  _settle(picked, open_, proposals, ck, closing, contests, frozenset(by_hint), offered)
  problems = _conflicts(picked, proposals, hinted, ranked)
  problems.update(
    {
      n: ambiguous(n, cands)
      for n, cands in open_.items()
      if n in hinted or cands[0].score >= MIN_SCORE
    }
  )
  for name in problems:
    picked.pop(name, None)
  shapes = {s.name: tuple(s.shape) for s in slots}
  for group, names in _fused_groups(picked).items():
    axis = picked[names[0]].fused[1]  # type: ignore[index]
    problem = fused.split(group, axis, names, shapes, ck, proposals, roles or {})
    if problem:
      problems[names[0]] = problem
  out = list(problems.values())
  out += _publish(picked, proposals, hinted, ranked)
  return out


def _best(
  slots: list[Any],
  ranked: dict[str, list[Candidate]],
  proposals: dict[str, Proposal],
  hinted: frozenset[str],
  ck: evidence.Checkpoint,
) -> tuple[dict[str, Candidate], dict[str, list[Candidate]]]:
  """Each target's single best candidate by name (``picked``), and the open ones: tied at the
  top, or (below the name threshold) every candidate that fits the shape."""
  picked: dict[str, Candidate] = {}
  open_: dict[str, list[Candidate]] = {}
  unnamed: list[tuple[Any, list[Candidate]]] = []  # no candidate named like it
  for slot in slots:
    if slot.name in proposals:
      continue
    every = distinct(ranked.get(slot.name, []))
    if slot.name in hinted:
      cands = every
    else:
      cands = [c for c in every if c.score >= MIN_SCORE]
    if not cands:
      unnamed.append((slot, every))
      continue
    rivals = [c for c in cands[1:] if c.score == cands[0].score]
    same = _same_path(slot.name, cands[: len(rivals) + 1]) if rivals else None
    place = _same_place(slot.name, cands[: len(rivals) + 1]) if rivals and not same else None
    if same is not None:  # names alike, one of them the leaf's own path: that one
      picked[slot.name] = dataclasses.replace(same, reason=f"{same.reason}, the same path")
    elif place is not None:  # names alike, one of them under the leaf's own modules
      picked[slot.name] = place
    elif rivals:
      open_[slot.name] = every  # the equal best first, then everything else that fits
    else:
      picked[slot.name] = cands[0]
  if unnamed:
    # what the other leaves are sure to take: a hint's tensors, a single best name's
    sure = {n: p.keys for n, p in proposals.items()}
    sure.update({n: c.keys for n, c in picked.items() if n not in hinted})
    shapes = unique.Shapes(slots, ranked, ck)
    for slot, every in unnamed:
      only = unique.fit(slot, every, shapes, sure, ck) or unique.only_norm(slot, every, shapes, ck)
      if only is not None:
        picked[slot.name] = only
      elif every:
        open_[slot.name] = every  # maybe a tied head; decided in tie_heads
    order = [s.name for s in slots]  # in the target's order, as the names were decided
    picked = {n: picked[n] for n in order if n in picked}
    open_ = {n: open_[n] for n in order if n in open_}
  return picked, open_


def _same_path(name: str, top: list[Candidate]) -> Candidate | None:
  """The one candidate among the equal best that is a single tensor whose key is the leaf's
  own path (``encoder/block/0/1/layer_norm_1/scale`` and ``...layer_norm_1.weight``, beside
  ``layer_norm_2``: one concept, two tensors), in one layout; None if none or more."""
  same = [c for c in top if len(c.keys) == 1 and same_path(name, c.keys[0])]
  return same[0] if len(same) == 1 else None


def _same_place(name: str, top: list[Candidate]) -> Candidate | None:
  """The one candidate among the equal best that is a single tensor under more of the leaf's
  own modules than any other (``up_blocks_1/attentions_0/.../attn1/key`` takes
  ``up_blocks.1.attentions.0...attn1.to_k``, not ``attentions.1``'s: two items of a list,
  named alike but for their numbers), in one layout; None if none or more."""
  depths = [(shared_modules(name, c.keys[0]), c) for c in top if len(c.keys) == 1]
  best = max((d for d, _ in depths), default=0)
  at = [c for d, c in depths if d == best]
  if best == 0 or len(at) != 1:
    return None
  return dataclasses.replace(at[0], reason=f"{at[0].reason}, under the same {best} modules")


def _top(cands: list[Candidate]) -> list[Candidate]:
  """What evidence may choose among: the equal-best by name, or every candidate when none is
  named like the target."""
  if cands[0].score < MIN_SCORE:
    return cands
  return [c for c in cands if c.score == cands[0].score]


def _decided(picked: dict[str, Candidate], proposals: dict[str, Proposal]) -> dict[str, Any]:
  out = {n: p.keys for n, p in proposals.items() if p.alias_of is None}
  out.update({n: c.keys for n, c in picked.items()})
  return out


def align_towers(
  slots: list[Any],
  ranked: dict[str, list[Candidate]],
  proposals: dict[str, Proposal],
  hinted: frozenset[str],
  ck: evidence.Checkpoint,
) -> dict[str, str]:
  """``{target tower: checkpoint tower}`` from the anchors: each leaf's single best candidate
  by name (as :func:`choose` picks it) that no other leaf's pick claims (``towers.align``)."""
  picked, _ = _best(slots, ranked, proposals, hinted, ck)
  claims: dict[Any, int] = {}
  for cand in picked.values():
    for k in cand.claimed:
      claims[k] = claims.get(k, 0) + 1
  anchors = {
    n: c
    for n, c in picked.items()
    if n not in hinted and c.fused is None and all(claims[k] == 1 for k in c.claimed)
  }
  return towers.align([s.name for s in slots], anchors, ck)


class _Contests:
  """Picks that another pick claims too: made open again (each with every candidate) so that
  stronger evidence may settle them, and put back if nothing does (then refused at
  publication as claimed twice)."""

  def __init__(self, picked, open_, hinted, ranked):
    self.picked, self.open_, self.hinted, self.ranked = picked, open_, hinted, ranked
    self.first: dict[str, Candidate] = {}

  def reopen(self) -> None:
    owners: dict[Any, list[str]] = {}
    for name, cand in self.picked.items():
      if cand.fused is None and name not in self.hinted:
        for k in cand.claimed:
          owners.setdefault(k, []).append(name)
    for name in {n for ns in owners.values() if len(ns) > 1 for n in ns}:
      self.first.setdefault(name, self.picked.pop(name))
      self.open_[name] = distinct(self.ranked.get(name, []))

  def restore(self) -> None:
    for name, cand in self.first.items():
      if name in self.open_:
        del self.open_[name]
        self.picked[name] = cand


def _settle(
  picked: dict[str, Candidate],
  open_: dict[str, list[Candidate]],
  proposals: dict[str, Proposal],
  ck: evidence.Checkpoint,
  closing: Any,
  contests: _Contests,
  by_hint: frozenset[str],
  offered: Any,
) -> None:
  """Open targets that decided siblings (same module), other layers, their numbered
  siblings' order or, last, closure inside their layer single out, among all of their own
  candidates: that evidence outranks a tie (or a miss) by name."""
  rules = (
    ("module of ", coherence.settle_by_module),
    ("as in ", lambda open_, done: coherence.settle_by_layer(open_, done, offered)),
    ("", lambda open_, decided: order.settle(open_, decided, ck, _top, by_hint)),
    ("closure: ", closing),
    ("beside ", lambda open_, done: coherence.settle_by_subtree(open_, done, _top, by_hint)),
  )
  for _ in range(12):
    contests.reopen()
    settled = {}
    for how, rule in rules:
      for name, (cand, by) in rule(open_, _decided(picked, proposals)).items():
        settled[name] = dataclasses.replace(cand, reason=f"{cand.reason}, {how}{by}")
      if settled:
        break
    if not settled:
      break
    for name, cand in settled.items():
      picked[name] = cand
      del open_[name]
  contests.restore()


def _conflicts(
  picked: dict[str, Candidate],
  proposals: dict[str, Proposal],
  hinted: frozenset[str],
  ranked: dict[str, list[Candidate]],
) -> dict[str, str]:
  """Leaves of one module from different checkpoint modules, layers offered the same choices
  that chose differently: each undecided-by-hint leaf involved is refused (a hint is the
  user's word)."""
  decided = _decided(picked, proposals)
  found = {
    **coherence.layer_conflicts(decided, coherence.offered_by(ranked)),
    **coherence.module_conflicts(decided),
  }
  return {n: p for n, p in found.items() if n in picked and n not in hinted}


def _fused_groups(picked: dict[str, Candidate]) -> dict[Any, list[str]]:
  groups: dict[str | tuple[str, ...], list[str]] = {}
  for name, cand in picked.items():
    if cand.fused is not None:
      groups.setdefault(cand.fused[0], []).append(name)
  return groups


def _publish(
  picked: dict[str, Candidate],
  proposals: dict[str, Proposal],
  hinted: frozenset[str],
  ranked: dict[str, list[Candidate]],
) -> list[str]:
  """Proposes every picked candidate whose keys no other target claims; a key a hint uses is
  never taken by another target's best guess (and never by elimination either: that target is
  refused, naming the hint)."""
  by_hint = {k: n for n, p in proposals.items() for k in p.keys}
  by_hint.update(
    {k: n for n, c in picked.items() if n in hinted and c.fused is None for k in c.keys}
  )
  owners: dict[Any, list[str]] = {}
  for name, cand in picked.items():
    if cand.fused is None:
      for k in cand.claimed:
        owners.setdefault(k, []).append(name)
  problems = []
  for name, cand in picked.items():
    if cand.fused is not None:
      continue
    taken = sorted({by_hint[k] for k in cand.keys if by_hint.get(k, name) != name})
    clash = sorted({n for k in cand.claimed for n in owners[k] if n != name})
    if taken and name not in hinted:
      problems.append(
        f"{name}: its best candidate {shown(cand)} [{cand.reason}] is what the hint for "
        f"{', '.join(taken)} names; nothing else is chosen for it by elimination; its "
        f"candidates:{_every(name, ranked)}"
      )
    elif clash:
      problems.append(
        f"{name}: ambiguous: {shown(cand)} is also the best match of {', '.join(clash)}; "
        f"its candidates:{_every(name, ranked)}"
      )
    else:
      proposals[name] = Proposal(name, cand.build(), cand.reason, cand.keys)
  return problems


_LISTED = 12  # candidates a refusal lists in full


def ambiguous(name: str, cands: list[Candidate], lead: str = "") -> str:
  """The problem for a parameter that several candidates fit equally: every candidate with
  its recipe and why it is one (the equal best, then the rest that fit its shape). No pick is
  offered: nothing tells them apart."""
  top = _top(cands)
  lines = [
    f"{lead or name + ':'} ambiguous between {len(top)} candidates of equal score "
    "(name, shape and config do not tell them apart):"
  ]
  lines += [_listed(c) for c in top[:_LISTED]]
  rest = [c for c in cands if c not in top]
  if rest:
    lines.append("    also of its shape, named less like it:")
    lines += [_listed(c) for c in rest[: max(0, _LISTED - len(top))]]
  shown_ = min(len(top), _LISTED) + len(rest[: max(0, _LISTED - len(top))])
  if len(cands) > shown_:
    lines.append(f"      ... and {len(cands) - shown_} more")
  if len({c.keys for c in top}) == 1 and len({"transpose" in c.reason for c in top}) == 2:
    lines.append(
      "    only the layout differs: nothing here says whether the checkpoint keeps its linear "
      "weights [out, in] (torch) or [in, out]; pass its config.json (match(..., config=...)), "
      "which says it for every weight at once, or give the recipe of the right one as the hint"
    )
  elif len({c.keys for c in top}) == 1:
    lines.append("    only the layout differs: give the recipe of the right one as the hint")
  else:
    lines.append(
      f"    name the right one: hints={{{name!r}: '<checkpoint name>'}} (match derives the "
      "layout), or give its recipe"
    )
  return "\n".join(lines)


def _every(name: str, ranked: dict[str, list[Candidate]]) -> str:
  """A refused parameter's candidates, each with its recipe, and how to name the right one."""
  every = "".join(f"\n{_listed(c)}" for c in distinct(ranked.get(name, []))[:_LISTED])
  return f"{every}\n    name the right one: hints={{{name!r}: '<checkpoint name>'}}"


def _listed(c: Candidate) -> str:
  recipe = f": {code(c.build())}" if c.build is not None else ""
  return f"      {shown(c)} [{c.reason}] ({c.score:.2f}){recipe}"


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
    if slot.name in proposals or any(names(p, slot.name) for p in problems):
      continue
    tc = concepts(slot.name)
    shape = tuple(slot.shape)
    if "head" in tc.tokens and tc.kind == "w" and embed is not None:
      if shape in (tuple(embed.shape), tuple(embed.shape)[::-1]):
        _tie_head(slot, embed, proposals, problems, ck, unused)
        continue
    problems.append(_unmatched(slot, ranked, ck))


def _tie_head(
  slot: Any,
  embed: Any,
  proposals: dict[str, Proposal],
  problems: list[str],
  ck: evidence.Checkpoint,
  unused: list[str],
) -> None:
  """A head of the embedding's shape (or its transpose): tied, unless the config says it is
  not or an unused tensor of its shape could be it and nothing says which."""
  shape, eshape = tuple(slot.shape), tuple(embed.shape)
  fits = [k for k in unused if ck.shapes.get(k) in (shape, shape[::-1])]
  if ck.facts.tied is False:
    problems.append(
      f"{slot.name} {shape}: unmatched: the config says tie_word_embeddings=false, and "
      "no checkpoint tensor is named like a head"
      + (f" (unused and of its shape: {', '.join(map(repr, fits[:4]))})" if fits else "")
      + "; pass the head's tensor as a hint"
    )
    return
  if fits and ck.facts.tied is not True:
    problems.append(
      f"{slot.name} {shape}: ambiguous: it could be tied to the embedding "
      f"({embed.name}), or be the unused {', '.join(map(repr, fits[:4]))} of its shape, "
      f"and nothing says which; pass hints={{{slot.name!r}: {fits[0]!r}}}, or restore "
      "from a source with the config.json that says tie_word_embeddings"
    )
    return
  evidence_ = "config: tie_word_embeddings" if ck.facts.tied else "no head tensor"
  # a square head (vocab = hidden) named as an [in, out] kernel is the table transposed
  in_out = axes.in_out_leaf(slot.name) and shape[0] == shape[-1]
  if shape == eshape and not in_out:
    why = f"tied to the embedding ({evidence_})"
    proposals[slot.name] = Proposal(slot.name, None, why, (), embed.name)
  else:
    owner = proposals[embed.name]
    recipe = ops.transpose(owner.recipe, (1, 0))  # type: ignore[arg-type]
    why = f"tied to the embedding, transposed ({evidence_})"
    proposals[slot.name] = Proposal(slot.name, recipe, why, owner.keys)


def _unmatched(slot: Any, ranked: dict[str, list[Candidate]], ck: evidence.Checkpoint) -> str:
  """The problem of a target no candidate was decided for: ambiguous among equals, or
  unmatched with what fits its shape, closest name first."""
  tc = concepts(slot.name)
  tc = dataclasses.replace(tc, indices=evidence.target_indices(slot.name, tc.indices, ck))
  shape = tuple(slot.shape)
  near = distinct(ranked.get(slot.name, []))
  tied = [c for c in near if c.score == near[0].score] if near else []
  if len(tied) > 1:  # several fit the shape and none the name better than the others
    lead = f"{slot.name} {shape}: its name matches no checkpoint name;"
    return ambiguous(slot.name, tied, lead)
  listed = "".join(f"\n{_listed(c)}" for c in near[:_LISTED])
  more = f"\n      ... and {len(near) - _LISTED} more" if len(near) > _LISTED else ""
  return (
    f"{slot.name} {shape}: unmatched: no checkpoint tensor at "
    f"{'layer ' + str(tc.indices) if tc.indices else 'this level'} fits its name and shape"
    + (f"; what fits its shape, closest name first:{listed}{more}" if near else "")
    + (f"\n    name the right one: hints={{{slot.name!r}: '<checkpoint name>'}}" if near else "")
    + ("" if near else _absent(slot, ck))
  )


def _absent(slot: Any, ck: evidence.Checkpoint) -> str:
  """What to do about a parameter no tensor of its level fits in a layout ``match`` derives
  from names: the tensors of as many values are its choices, where a layout fits (its name
  said nothing theirs did: an opaque name, a list index read as a layer); a tensor of as
  many values there may be it rearranged (heads permuted where no config gives their count):
  named, for its recipe; with none, most often a parameter the checkpoint does not have (a
  new classifier head, an adapter)."""
  module = coherence.target_module(slot.name) or slot.name
  without = (
    "If the checkpoint does not have this parameter (a new head, an adapter), match and "
    f"restore the rest: the target without {module!r}, then initialize it as your model does"
  )
  if refusal.as_many_values(slot, ck):
    return (
      "; no name, kind or level ties it to a tensor: those of as many values are its choices "
      f"(hints below), if the checkpoint has it. {without}"
    )
  size = math.prod(slot.shape)
  level = evidence.target_indices(slot.name, concepts(slot.name).indices, ck)
  alike = [k for k in ck.by_layer.get(level, ()) if math.prod(ck.shapes[k]) == size]
  if alike:
    shown = ", ".join(f"{k!r} {tuple(ck.shapes[k])}" for k in alike[:3])
    return (
      f"; {shown} {'has' if len(alike) == 1 else 'have'} as many values in a layout match "
      "does not derive here (the config's head count would say how heads are split): give "
      "its recipe"
    )
  return f"; no tensor there has as many values. {without}; if it does, give its recipe"


def names(problem: str, name: str) -> bool:
  """Whether ``problem`` is about ``name``."""
  return name in refusal.heads(problem)
