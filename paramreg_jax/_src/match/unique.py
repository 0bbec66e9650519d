"""A weight only its own shape fits: outside the layers, a leaf whose shape is the only one of
its kind, and the one tensor that fits it, are the same parameter when they are the same kind
of array (an embedding table, a conv kernel, a linear weight). Evidence from shapes alone,
used by ``decide`` where names say nothing (``embedding/kernel`` and
``patch_embeddings.projection.weight``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from paramreg_jax._src.match.candidates import Candidate
from paramreg_jax._src.match.candidates import distinct
from paramreg_jax._src.match.evidence import Checkpoint
from paramreg_jax._src.match.report import Proposal
from paramreg_jax._src.match.vocabulary import concepts


def takers(ranked: Mapping[str, list[Candidate]]) -> dict[str, set[str]]:
  """``{checkpoint key: the target leaves it is a candidate of}``."""
  out: dict[str, set[str]] = {}
  for name, cands in ranked.items():
    for c in cands:
      for k in c.keys:
        out.setdefault(k, set()).add(name)
  return out


def shape_counts(
  slots: list[Any],
  ranked: dict[str, list[Candidate]],
  proposals: dict[str, Proposal],
  hinted: frozenset[str],
  ck: Checkpoint,
  min_score: float,
) -> tuple[dict, dict, dict[str, tuple[str, ...]]]:
  """How many target leaves have each shape; the checkpoint tensors of each shape; and what
  each leaf is sure to take (a hint, or its single best candidate by name)."""
  leaves: dict[tuple[int, ...], int] = {}
  for s in slots:
    leaves[tuple(s.shape)] = leaves.get(tuple(s.shape), 0) + 1
  tensors: dict[tuple[int, ...], list[str]] = {}
  for key, shape in ck.shapes.items():
    tensors.setdefault(tuple(shape), []).append(key)
  sure = {n: p.keys for n, p in proposals.items()}
  for s in slots:
    cands = [c for c in distinct(ranked.get(s.name, [])) if c.score >= min_score]
    if s.name not in sure and s.name not in hinted and cands:
      if not [c for c in cands[1:] if c.score == cands[0].score]:
        sure[s.name] = cands[0].keys
  return leaves, tensors, sure


def fit(
  slot: Any, every: list[Candidate], takers: Any, counts: Any, ck: Checkpoint
) -> Candidate | None:
  """A weight that exactly one checkpoint tensor fits, in one layout, when no other target
  leaf fits that tensor and both are the same kind of array: an embedding table and an
  embedding table stored as the leaf is (``tokens/embedding`` and
  ``embeddings.word_embeddings.weight``), a conv kernel and a conv weight (a patch embedding
  or stem: ``embedding/kernel`` ``(8, 8, 3, 32)`` and ``patch_embeddings.projection.weight``
  ``(32, 3, 8, 8)``), a linear kernel and a linear weight (a classifier). Taken although the
  names share only the kind: the shape says it, being the only one of its kind in the target
  and in the checkpoint (but for tensors other leaves are sure to take by name: an untied
  head's ``lm_head`` beside the embedding that ``embed/embedding`` takes). Outside the layers
  only (inside them, closure decides). A vector
  (a norm, a bias) is never decided so, and neither is a leaf another arrangement could fill
  (a heads-split kernel)."""
  shape = tuple(slot.shape)
  if len(shape) < 2 or len(every) != 1 or concepts(slot.name).indices:
    return None
  (cand,) = every
  if len(cand.keys) != 1 or cand.fused is not None or cand.claims is not None:
    return None
  (key,) = cand.keys
  if ck.concepts[key].indices:
    return None
  stored = tuple(ck.shapes[key])
  table = slot.name.rpartition("/")[2] == "embedding" or "embed" in concepts(slot.name).tokens
  tokens = ck.concepts[key].tokens
  embedding = "embed" in tokens and not tokens & {"proj", "project"} and len(stored) == 2
  leaves, tensors, sure = counts()
  others = takers()[key] - {slot.name}  # leaves it fits that are sure to take another
  if (
    len(stored) != len(shape)
    or table != embedding
    or any(key in sure.get(n, (key,)) for n in others)
  ):
    return None
  taken = {k for n, keys in sure.items() if n != slot.name for k in keys}
  if leaves[shape] != 1 or [k for k in tensors[stored] if k not in taken] != [key]:
    return None
  if embedding and stored != shape:
    return None
  kind = "embeddings" if embedding else "conv kernels" if len(shape) > 2 else "linear weights"
  return dataclasses.replace(cand, reason=f"unique shape, both {kind}")
