"""Closure inside an aligned block: the last leaves of a layer take the last tensors they fit.

A target's layer ``i`` and the checkpoint's layer ``i`` are one block: their numbers align
them. When evidence (names, config, siblings, order) has decided every other leaf of that
block, what is left of the target's block and what is left of the checkpoint's are the same
parameters. If they are as many, every leaf left fits at least one tensor left (shape and
layout), and the pairing by shape is forced, each forced pair is taken, reported as closure.

It decides only then, and nothing else:

- in a block where a hint decided a leaf, only among the tensors of a kind and size no
  hinted tensor has (the user's word is not evidence about the rest: a wrong hint can
  displace only a tensor it could have named); never at the top level (it aligns with
  nothing); outside the layers, a container
  (``stem``) whose decided leaves all come from under one checkpoint module
  (``embeddings``) is a block of its own;
- only a pair every perfect pairing of the block makes: a leaf that fits one tensor left, or
  a tensor left that one leaf fits; two leaves that fit the same two tensors (two norms of one
  width, gate and up) stay open and are asked;
- only a pair of one layout (a square weight that fits as stored and transposed is asked);
- not at all where no perfect pairing exists (a leaf with nothing left to take, a tensor
  nothing fits): the block does not correspond, and closure would only be elimination.

Examples:
  >>> import jax, numpy as np
  >>> import paramreg_jax as prj
  >>> ck = {"h.0.norm.weight": np.ones(4, np.float32), "h.0.norm.bias": np.zeros(4, np.float32),
  ...       "h.0.fc1.weight": np.ones((8, 4), np.float32),
  ...       "h.0.fc1.bias": np.zeros(8, np.float32),
  ...       "h.0.fc2.weight": np.ones((4, 8), np.float32),
  ...       "h.0.fc2.bias": np.zeros(4, np.float32)}
  >>> sds = lambda *s: jax.ShapeDtypeStruct(s, np.float32)
  >>> target = {"h_0": {"LayerNorm_0": {"scale": sds(4), "bias": sds(4)},
  ...                   "Dense_0": {"kernel": sds(4, 8), "bias": sds(8)},
  ...                   "Dense_1": {"kernel": sds(8, 4), "bias": sds(4)}}}
  >>> for row in prj.match(target, prj.MemorySource(ck)).rows()[2:4]:
  ...   print(row)
  ('h_0/Dense_1/bias', "source('h.0.fc2.bias')", 'name, closure: the last tensor of layer (0,) that fits it')
  ('h_0/Dense_1/kernel', "transpose(source('h.0.fc2.weight'), (1, 0))", 'name + transpose, closure: the last tensor of layer (0,) that fits it')

  Without closure, ``Dense_1/kernel`` ``(8, 4)`` is ``fc1.weight`` as stored or ``fc2.weight``
  transposed, and ``Dense_1/bias`` is ``fc2.bias`` or ``norm.bias``: asked.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Collection
from collections.abc import Mapping

from paramreg_jax._src.match import coherence
from paramreg_jax._src.match.candidates import Candidate
from paramreg_jax._src.match.evidence import Checkpoint
from paramreg_jax._src.match.stacks import nested_stack
from paramreg_jax._src.match.vocabulary import common_start

Block = tuple[int, ...]


def settle(
  open_: Mapping[str, list[Candidate]],
  decided: Mapping[str, tuple[str, ...]],
  blocks: Mapping[str, Block],
  ck: Checkpoint,
  hinted: Collection[Block],
  hinted_leaves: Collection[str] = (),
) -> dict[str, tuple[Candidate, str]]:
  """``{open leaf: (candidate, why)}`` for the pairs closure forces.

  ``blocks``: every target leaf's layer (``()`` outside the layers); ``decided``: the keys of
  each decided leaf; ``hinted``: the layers where a hint decided a leaf; ``hinted_leaves``:
  the leaves a hint decided."""
  members: dict[Block, list[str]] = {}
  stages: dict[str, list[str]] = {}  # a numbered stage's stacked blocks (nested_stack)
  for name, block in blocks.items():
    if block and (root := nested_stack(name)) is not None:
      stages.setdefault(root, []).append(name)
    elif block:
      members.setdefault(block, []).append(name)
  stacked, single = _stage_stacks(stages, decided, blocks, ck, hinted)
  for block, names in single.items():
    members.setdefault(block, []).extend(names)
  used = {k for keys in decided.values() for k in keys}
  out: dict[str, tuple[Candidate, str]] = {}
  for block, names in members.items():
    left = [n for n in names if n not in decided]
    free = [k for k in ck.by_layer.get(block, ()) if k not in used]
    if block in hinted:
      # what no hint could have displaced: tensors of a size and kind no hinted tensor has
      hints = [n for n in names if n in hinted_leaves]
      named = [k for n in hints for k in decided.get(n, ())]  # or still open: each line
      named += [k for n in hints for c in open_.get(n, ()) for k in c.keys]
      said = {_kind_and_size(k, ck) for k in named}
      free = [k for k in free if _kind_and_size(k, ck) not in said]
      left = [
        n
        for n in left
        if n in open_ and all(_kind_and_size(k, ck) not in said for c in open_[n] for k in c.keys)
      ]
    out.update(_close(left, free, open_, f"the last tensor of layer {block} that fits it"))
  out.update(_modules_in_layers(members, open_, decided, ck, hinted, used, out))
  for names, depth in stacked:
    out.update(_close_stack(names, open_, decided, ck, used, depth))
  # outside the layers: the container each open leaf sits in, as a module of its own, then
  # as a stacked block
  containers = _containers(open_, decided, blocks, frozenset(hinted_leaves))
  outside = [k for k in ck.shapes if not ck.concepts[k].indices]
  for container, names in containers:
    out.update(_close_container(container, names, open_, decided, used, outside))
  for _, names in containers:
    out.update(_close_stack(names, open_, decided, ck, used))
  return out


def _kind_and_size(key: str, ck: Checkpoint) -> tuple[str, int]:
  return ck.concepts[key].kind, math.prod(ck.shapes[key])


def _stage_stacks(
  stages: Mapping[str, list[str]],
  decided: Mapping[str, tuple[str, ...]],
  blocks: Mapping[str, Block],
  ck: Checkpoint,
  hinted: Collection[Block],
) -> tuple[list[tuple[list[str], int]], dict[Block, list[str]]]:
  """``(leaves, depth)`` of each stage's stacked blocks (``stages/1/blocks``) that closure
  reads as a stack of the checkpoint's blocks of that stage (their numbers ``depth`` deep),
  and ``{block: leaves}`` of those whose decided leaves hold one block only (a stage of one
  block, or a module named ``block`` in a layer that is no stack): closed as that block."""
  out: list[tuple[list[str], int]] = []
  single: dict[Block, list[str]] = {}
  for names in stages.values():
    block = blocks[names[0]]
    if block in hinted:
      continue
    depth = len(block) + 1
    layers = {_stacked_layers(decided[n], ck, depth) for n in names if n in decided}
    if len(layers) == 1 and len(one := next(iter(layers))) == 1:
      single.setdefault(one[0], []).extend(names)
    else:
      out.append((names, depth))
  return out, single


def _containers(
  open_: Mapping[str, list[Candidate]],
  decided: Mapping[str, tuple[str, ...]],
  blocks: Mapping[str, Block],
  hinted: frozenset[str],
) -> list[tuple[str, list[str]]]:
  """``(container, its leaves)``: the nearest target container above each open leaf outside
  the layers that holds decided leaves. Never the top level, never one where a hint decided a
  leaf."""
  found: list[tuple[str, list[str]]] = []
  tried: set[str] = set()
  for name in [n for n in open_ if not blocks.get(n)]:
    parts = name.split("/")
    for depth in range(len(parts) - 2, 0, -1):
      container = "/".join(parts[:depth])
      members = [n for n in blocks if n.startswith(container + "/") and not blocks[n]]
      if not any(n in decided for n in members):
        continue
      if container not in tried and not hinted & {*members}:
        tried.add(container)
        found.append((container, members))
      break
  return found


def _close_stack(
  members: list[str],
  open_: Mapping[str, list[Candidate]],
  decided: Mapping[str, tuple[str, ...]],
  ck: Checkpoint,
  used: set[str],
  depth: int = 1,
) -> dict[str, tuple[Candidate, str]]:
  """Closure inside a stacked block (``nn.scan``, ``nnx.vmap``: one leaf holds a tensor of
  every layer): a container whose decided leaves each stack the same layers is those layers;
  when in each of them the tensors left are as many as its open leaves, the leaves left take
  the stacks left (a stack: the tensors named alike in every layer) as in a layer."""
  layers = {_stacked_layers(decided[n], ck, depth) for n in members if n in decided}
  if len(layers) != 1:
    return {}
  (stack,) = layers
  if len(stack) < 2 or len(set(stack)) != len(stack):
    return {}
  left = [n for n in members if n not in decided]
  stacks: dict[str, list[str]] = {}
  for layer in stack:
    free = [k for k in ck.by_layer.get(layer, ()) if k not in used]
    if len(free) != len(left):
      return {}
    for k in free:
      stacks.setdefault(coherence.template(k), []).append(k)
  if any(len(keys) != len(stack) for keys in stacks.values()):
    return {}  # a tensor some layer lacks: the layers are not alike
  ids = {tuple(keys): "{i}".join(t.split("#", 1)) for t, keys in stacks.items()}
  if len(left) != len(ids) or any(n not in open_ for n in left):
    return {}
  edges = {n: _stack_edges(open_[n], ids) for n in left}
  first, last = (_layer_name(stack[i]) for i in (0, -1))
  why = f"the last stack of layers {first}..{last} that fits it"
  return {n: (c, why) for n, c in _forced(edges).items()}


def _layers(keys: tuple[str, ...], ck: Checkpoint) -> list[Block]:
  """The layer of each of a stacked leaf's tensors, in its order (none: not a stack)."""
  return [ck.concepts[k].indices for k in keys if k in ck.concepts and ck.concepts[k].indices]


def _layer_name(layer: Block) -> str:
  return str(layer[0]) if len(layer) == 1 else str(layer)


def _stacked_layers(keys: tuple[str, ...], ck: Checkpoint, depth: int = 1) -> tuple[Block, ...]:
  """The layers a stacked leaf's tensors come from, in order, each once: a leaf that joins
  several tensors of every layer (Gemma's ``gating_einsum``: gate and up) or stacks its
  experts takes each layer as often as the others; anything else is returned as read (and
  its repeats stop closure)."""
  seq = [c[:depth] for c in _layers(keys, ck)]
  once = tuple(dict.fromkeys(seq))
  if once and len(set(collections.Counter(seq).values())) == 1:
    return once
  return tuple(seq)


def _stack_edges(
  cands: list[Candidate], ids: Mapping[tuple[str, ...], str]
) -> dict[str, list[Candidate]]:
  """``{stack: [the leaf's ways to be it]}``: whole tensors stacked, one per layer."""
  out: dict[str, list[Candidate]] = {}
  for c in cands:
    if c.fused is None and c.claims is None and c.keys in ids:
      if all(c.reason != d.reason for d in out.get(ids[c.keys], [])):
        out.setdefault(ids[c.keys], []).append(c)
  return out


def _modules_in_layers(
  members: Mapping[Block, list[str]],
  open_: Mapping[str, list[Candidate]],
  decided: Mapping[str, tuple[str, ...]],
  ck: Checkpoint,
  hinted: Collection[Block],
  used: set[str],
  closed: Mapping[str, tuple[Candidate, str]],
) -> dict[str, tuple[Candidate, str]]:
  """Closure inside a module of a layer, where the layer as a whole left leaves open: two
  attentions of one layer (``attn1``, ``attn2``) each with its output projection left, and
  two such tensors left in the layer. Each module holding decided leaves aligns with the
  checkpoint module their tensors share; its leaves left take its tensors left."""
  out: dict[str, tuple[Candidate, str]] = {}
  taken = used | {k for c, _ in closed.values() for k in c.keys}
  for block, names in members.items():
    left = [n for n in names if n not in decided and n not in closed]
    if block in hinted or not left:
      continue
    pool = list(ck.by_layer.get(block, ()))
    seen: set[str] = set()
    for name in left:
      container = name.rsplit("/", 2)[0]
      if container in seen:
        continue
      seen.add(container)
      inside = [n for n in names if n.startswith(container + "/")]
      out.update(_close_container(container, inside, open_, decided, taken, pool))
  return out


def _close_container(
  container: str,
  members: list[str],
  open_: Mapping[str, list[Candidate]],
  decided: Mapping[str, tuple[str, ...]],
  used: set[str],
  pool: list[str],
) -> dict[str, tuple[Candidate, str]]:
  """Closure inside a module (a stem, the embeddings, one attention of a layer): a
  container that holds decided leaves aligns with the checkpoint module their tensors share
  (``stem`` with ``embeddings`` when ``stem/0`` is ``embeddings.patch_embeddings``); its
  leaves left take its tensors left (of ``pool``) as in a layer."""
  parents = [
    coherence.checkpoint_module(k).split(".")[:-1]
    for n in members
    if n in decided
    for k in decided[n]
  ]
  where = ".".join(common_start(parents))
  if not where:
    return {}
  left = [n for n in members if n not in decided]
  free = [k for k in pool if k.startswith(where + ".") and k not in used]
  return _close(left, free, open_, f"the last tensor of {where} that fits it")


def _close(
  left: list[str], free: list[str], open_: Mapping[str, list[Candidate]], why: str
) -> dict[str, tuple[Candidate, str]]:
  """The pairs forced between a block's leaves left and its tensors left; nothing unless
  they are as many and every leaf left is open."""
  if not left or len(left) != len(free) or any(n not in open_ for n in left):
    return {}
  edges = {n: _edges(open_[n], free) for n in left}
  return {n: (c, why) for n, c in _forced(edges).items()}


def _edges(cands: list[Candidate], free: list[str]) -> dict[str, list[Candidate]]:
  """``{free tensor: [the leaf's ways to be it]}``: single, whole tensors only."""
  out: dict[str, list[Candidate]] = {}
  for c in cands:
    if len(c.keys) == 1 and c.fused is None and c.claims is None and c.keys[0] in free:
      if all(c.reason != d.reason for d in out.get(c.keys[0], [])):
        out.setdefault(c.keys[0], []).append(c)
  return out


def _forced(edges: dict[str, dict[str, list[Candidate]]]) -> dict[str, Candidate]:
  """The pairs every perfect pairing of ``edges`` makes (of one layout each); nothing when
  there is no perfect pairing."""
  graph = {n: set(ts) for n, ts in edges.items()}
  if not _perfect(graph):
    return {}
  out: dict[str, Candidate] = {}
  while True:
    pair = _one_forced(graph)
    if pair is None:
      return out
    name, key = pair
    if len(edges[name][key]) == 1:
      out[name] = edges[name][key][0]
    del graph[name]
    for ts in graph.values():
      ts.discard(key)


def _one_forced(graph: dict[str, set[str]]) -> tuple[str, str] | None:
  """A leaf with one tensor left, or a tensor only one leaf fits."""
  for name, ts in graph.items():
    if len(ts) == 1:
      return name, next(iter(ts))
  takers: dict[str, list[str]] = {}
  for name, ts in graph.items():
    for t in ts:
      takers.setdefault(t, []).append(name)
  for t, names in takers.items():
    if len(names) == 1:
      return names[0], t
  return None


def _perfect(graph: Mapping[str, set[str]]) -> bool:
  """Whether every leaf can take a tensor of its own at once (Kuhn's augmenting paths)."""
  owner: dict[str, str] = {}

  def place(name: str, seen: set[str]) -> bool:
    for t in sorted(graph[name]):
      if t in seen:
        continue
      seen.add(t)
      if t not in owner or place(owner[t], seen):
        owner[t] = name
        return True
    return False

  return all(place(n, set()) for n in graph)
