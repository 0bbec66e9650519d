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
from paramreg_jax._src.match.evidence import Checkpoint
from paramreg_jax._src.match.vocabulary import concepts


class Shapes:
  """What the rule counts: how many target leaves have each shape, the checkpoint tensors of
  each shape, and which leaves each tensor is a candidate of."""

  def __init__(self, slots: list[Any], ranked: Mapping[str, list[Candidate]], ck: Checkpoint):
    self.leaves: dict[tuple[int, ...], int] = {}
    for s in slots:
      self.leaves[tuple(s.shape)] = self.leaves.get(tuple(s.shape), 0) + 1
    self.tensors: dict[tuple[int, ...], list[str]] = {}
    for key, shape in ck.shapes.items():
      self.tensors.setdefault(tuple(shape), []).append(key)
    self.takers: dict[str, set[str]] = {}
    for name, cands in ranked.items():
      for c in cands:
        for k in c.keys:
          self.takers.setdefault(k, set()).add(name)


def fit(
  slot: Any,
  every: list[Candidate],
  shapes: Shapes,
  sure: Mapping[str, tuple[str, ...]],
  ck: Checkpoint,
) -> Candidate | None:
  """A weight that exactly one checkpoint tensor fits, in one layout, when no other target
  leaf fits that tensor and both are the same kind of array: an embedding table and an
  embedding table stored as the leaf is (``tokens/embedding`` and
  ``embeddings.word_embeddings.weight``), a conv kernel and a conv weight (a patch embedding
  or stem: ``embedding/kernel`` ``(8, 8, 3, 32)`` and ``patch_embeddings.projection.weight``
  ``(32, 3, 8, 8)``), a linear kernel and a linear weight (a classifier). Taken although the
  names share only the kind: the shape says it, being the only one of its kind in the target
  and in the checkpoint (but for tensors other leaves are sure to take by name: an untied
  head's ``lm_head`` beside the embedding that ``embed/embedding`` takes: ``sure``, what
  other leaves take by a hint or a single best name). Outside the layers only (inside them,
  closure decides). A vector (a norm, a bias) is never decided so, and neither is a leaf
  another arrangement could fill (a heads-split kernel)."""
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
  others = shapes.takers[key] - {slot.name}  # leaves it fits that are sure to take another
  if (
    len(stored) != len(shape)
    or table != embedding
    or any(key in sure.get(n, (key,)) for n in others)
  ):
    return None
  taken = {k for n, keys in sure.items() if n != slot.name for k in keys}
  if shapes.leaves[shape] != 1 or [k for k in shapes.tensors[stored] if k not in taken] != [key]:
    return None
  if embedding and stored != shape:
    return None
  kind = "embeddings" if embedding else "conv kernels" if len(shape) > 2 else "linear weights"
  return dataclasses.replace(cand, reason=f"unique shape, both {kind}")
