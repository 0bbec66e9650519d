"""A weight only its own shape fits: outside the layers, a leaf whose shape is the only one of
its kind, and the one tensor that fits it, are the same parameter when they are the same kind
of array (an embedding table, a conv kernel, a linear weight). Evidence from shapes alone,
used by ``decide`` where names say nothing (``embedding/kernel`` and
``patch_embeddings.projection.weight``). And the one norm outside the layers on both sides
(:func:`only_norm`)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from paramreg_jax._src.match.candidates import Candidate
from paramreg_jax._src.match.evidence import Checkpoint
from paramreg_jax._src.match.vocabulary import Concepts
from paramreg_jax._src.match.vocabulary import concepts


class Shapes:
  """What the rules count: the target leaves of each shape, the checkpoint tensors of
  each shape, which leaves each tensor is a candidate of, and (counted once, when first
  asked) the norms outside the layers on each side."""

  def __init__(self, slots: list[Any], ranked: Mapping[str, list[Candidate]], ck: Checkpoint):
    self._slots, self._ck = slots, ck
    self.leaves: dict[tuple[int, ...], list[str]] = {}
    for s in slots:
      self.leaves.setdefault(tuple(s.shape), []).append(s.name)
    self.tensors: dict[tuple[int, ...], list[str]] = {}
    for key, shape in ck.shapes.items():
      self.tensors.setdefault(tuple(shape), []).append(key)
    self.takers: dict[str, set[str]] = {}
    for name, cands in ranked.items():
      for c in cands:
        for k in c.keys:
          self.takers.setdefault(k, set()).add(name)

  @functools.cached_property
  def outer_norms(self) -> tuple[list[str], list[str]]:
    """The target's and the checkpoint's norm scales outside the layers (:func:`only_norm`)."""
    ours = [s.name for s in self._slots if _outer_norm(concepts(s.name))]
    return ours, [k for k, c in self._ck.concepts.items() if _outer_norm(c)]


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
  and in the checkpoint (but for the leaves and tensors other evidence is sure of: an
  untied head's ``lm_head`` beside the embedding that ``embed/embedding`` takes, a head
  ``Dense_0/kernel`` of the shape of every layer's MLP kernel that names decide: ``sure``,
  what other leaves take by a hint or a single best name). Outside the layers only (inside them,
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
  # the only leaf of its shape and the only tensor of its stored shape, but for those other
  # evidence is sure of (an MLP's kernel in every layer of the head's shape, decided by name)
  if [n for n in shapes.leaves[shape] if n == slot.name or n not in sure] != [slot.name]:
    return None
  if [k for k in shapes.tensors[stored] if k not in taken] != [key]:
    return None
  if embedding and stored != shape:
    return None
  kind = "embeddings" if embedding else "conv kernels" if len(shape) > 2 else "linear weights"
  return dataclasses.replace(cand, reason=f"unique shape, both {kind}")


_STATISTICS = frozenset({"mean", "var"})  # a batch norm's running statistics: not its scale


def _outer_norm(c: Concepts) -> bool:
  """Whether a name is a norm's scale (not its bias, nor a batch norm's statistics) outside
  the layers."""
  return not c.indices and "norm" in c.tokens and c.kind == "w" and not c.tokens & _STATISTICS


def only_norm(
  slot: Any, every: list[Candidate], shapes: Shapes, ck: Checkpoint
) -> Candidate | None:
  """The scale of the one norm outside the layers, where the checkpoint has one too, of its
  width: mesh-transformer-jax's ``projection_shard/~/replicated_layer_norm`` and GPT-J's
  ``transformer.ln_f`` (names that share only the norm). Not where either side says it is
  the embeddings' norm and the other does not (a post-norm model's embedding norm is not a
  pre-norm model's final one); its bias follows by module coherence.

  Examples:
    >>> from paramreg_jax._src.match import evidence
    >>> from paramreg_jax._src.match.candidates import Candidate
    >>> keys = ["h.0.ln_1.weight", "ln_f.weight"]
    >>> ck = evidence.Checkpoint({k: concepts(k) for k in keys}, {k: (8,) for k in keys})
    >>> Slot = __import__("collections").namedtuple("Slot", "name shape")
    >>> slots = [Slot("layer_0/layer_norm/scale", (8,)), Slot("head/replicated_layer_norm/scale", (8,))]
    >>> every = [Candidate(0.25, ("ln_f.weight",), "name", None)]
    >>> only_norm(slots[1], every, Shapes(slots, {}, ck), ck).reason
    'the only norm outside the layers, on both sides'
  """
  tc = concepts(slot.name)
  if len(slot.shape) != 1 or not _outer_norm(tc):
    return None
  ours, theirs = shapes.outer_norms
  if len(ours) != 1 or len(theirs) != 1 or tuple(ck.shapes[theirs[0]]) != tuple(slot.shape):
    return None
  if ("embed" in tc.tokens) != ("embed" in ck.concepts[theirs[0]].tokens):
    return None
  found = [c for c in every if c.keys == (theirs[0],) and c.fused is None and c.claims is None]
  if len(found) != 1:
    return None
  return dataclasses.replace(found[0], reason="the only norm outside the layers, on both sides")
