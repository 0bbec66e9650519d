"""Towers: which subtree of the target is which subtree of the checkpoint.

A dual-tower model (CLIP's text and vision encoders), an encoder-decoder (T5, Whisper) keeps
one stack of layers under each of its top-level subtrees, and the stacks can have the same
shapes layer for layer: inside them, names and shapes alone cannot say which checkpoint tower
a target leaf comes from. The leaves that evidence decides alone do: a patch embedding only a
vision tower has, a token embedding, a norm named like its tensor. Each such *anchor* pairs its
target tower with its tensor's checkpoint tower. When every anchor of a target tower points to
one checkpoint tower, and no other target tower's anchors point there, the two are aligned,
and every leaf of that target tower is restricted to candidates outside the other checkpoint
towers (a tensor outside every tower, a shared embedding, stays a candidate).

A tower is a top-level subtree that holds layers (``txt/layers_0/...``,
``text_model.encoder.layer.0...``); the model's own prefix (``model.``) and a wrapper every
target leaf shares (``params/``) are not towers. Anchors that disagree align nothing: the
leaves are decided as without towers.

Examples:
  >>> import jax, numpy as np
  >>> import paramreg_jax as prj
  >>> sds = lambda *s: jax.ShapeDtypeStruct(s, np.float32)
  >>> ck = {"text_model.embeddings.token_embedding.weight": np.zeros((9, 4), np.float32),
  ...       "vision_model.embeddings.patch_embedding.weight": np.zeros((4, 3, 2, 2), np.float32)}
  >>> for tower in ("text_model", "vision_model"):
  ...   ck[f"{tower}.encoder.layers.0.mlp.fc1.weight"] = np.zeros((8, 4), np.float32)
  >>> target = {"txt": {"embed": {"embedding": sds(9, 4)},
  ...                   "layers_0": {"mlp": {"fc1": {"kernel": sds(4, 8)}}}},
  ...           "img": {"patch": {"kernel": sds(2, 2, 3, 4)},
  ...                   "layers_0": {"mlp": {"fc1": {"kernel": sds(4, 8)}}}}}
  >>> m = prj.match(target, prj.MemorySource(ck))
  >>> dict((t, r) for t, r, _ in m.rows())["img/layers_0/mlp/fc1/kernel"]
  "transpose(source('vision_model.encoder.layers.0.mlp.fc1.weight'), (1, 0))"
"""

from __future__ import annotations

import re
from collections.abc import Callable
from collections.abc import Mapping

from paramreg_jax._src.match.candidates import Candidate
from paramreg_jax._src.match.coherence import unescaped
from paramreg_jax._src.match.evidence import Checkpoint
from paramreg_jax._src.match.vocabulary import concepts

_COMPONENTS = re.compile(r"[./]")


def align(names: list[str], picked: Mapping[str, Candidate], ck: Checkpoint) -> dict[str, str]:
  """``{target tower: checkpoint tower}`` that the anchors (``picked``: leaves evidence
  decided alone, each claimed by no other) agree on."""
  ours = _towers(names, "/", _has_layers)
  theirs = _towers(list(ck.concepts), ".", lambda k: bool(ck.concepts[k].indices))
  layered = set(theirs.values())
  if len(set(ours.values())) < 2 or len(layered) < 2:
    return {}
  said: dict[str, set[str]] = {}
  for name, cand in picked.items():
    tower = ours.get(name)
    if tower is None or not cand.keys:
      continue
    where = {theirs.get(k) for k in cand.keys}
    if len(where) == 1 and (c := where.pop()) in layered:
      said.setdefault(tower, set()).add(c)
  agreed = {t: next(iter(cs)) for t, cs in said.items() if len(cs) == 1}
  chosen = list(agreed.values())
  return {t: c for t, c in agreed.items() if chosen.count(c) == 1}


def views(
  names: list[str], ck: Checkpoint
) -> dict[str, tuple[Checkpoint, frozenset[str], frozenset[str]]]:
  """``{leaf: (the checkpoint as its tower sees it, words out of its name, words in)}`` for
  every leaf of a tower aligned in ``ck.towers``: its own tower's tensors and those outside
  every tower; its name read with the checkpoint tower's words for its own tower's
  (``image_encoder/final_norm`` is compared with ``vision_model.layernorm`` as
  ``vision_model/final_norm``)."""
  if not ck.towers:
    return {}
  ours = _towers(names, "/", _has_layers)
  theirs = _towers(list(ck.concepts), ".", lambda k: bool(ck.concepts[k].indices))
  seen = {}
  for target_tower, tower in ck.towers.items():
    view = ck.restricted({k for k in ck.concepts if theirs.get(k, tower) == tower})
    seen[target_tower] = (view, _words(target_tower), _words(tower))
  return {n: seen[t] for n, t in ours.items() if t in seen}


def _words(tower: str) -> frozenset[str]:
  """A tower's own words: not a kind (a name alone reads as a weight), nor ``layers`` (a stack
  of layers named so is a tower of the layers it stacks, and stays one)."""
  return concepts(tower).tokens - {"w", "b", "layers"}


def _towers(names: list[str], sep: str, layered: Callable[[str], bool]) -> dict[str, str]:
  """``{name: its top-level subtree}`` for the subtrees that hold layers (``layered``) and
  are not a layer themselves (``layers_0``, ``block1``; a module named ``m13`` or flax's
  ``Encoder_0`` is a tower); a wrapper every name shares (``model.``, ``params/``) is not
  a tower: the level below it is, unless the wrapper is a layer (every name is inside
  ``layers_0``: its modules are not towers). haiku's ``/~/`` separates modules too."""
  split = [_COMPONENTS.split(n) if sep == "." else unescaped(n).split("/") for n in names]
  skip = 0
  while all(len(p) > skip + 1 for p in split) and len({p[skip] for p in split}) == 1:
    if concepts(split[0][skip]).indices:
      return {}
    skip += 1
  top = {n: p[skip] for n, p in zip(names, split) if len(p) > skip + 1}
  with_layers = {top[n] for n in top if layered(n)}
  return {n: t for n, t in top.items() if t in with_layers and not concepts(t).indices}


def _has_layers(name: str) -> bool:
  c = concepts(name)
  return bool(c.indices) or "layers" in c.tokens
