"""Which checkpoint layers a stacked target leaf holds, read from the target's structure: the
subtrees that stack layers (named ``layers``, found by their sizes, a stage's stacked blocks),
the axis they keep them on, and where two or more stacks hold the layers between them (split
stacks, groups of a stacked layer, a stacked pattern and its remainder) every way they may.
Choosing among those ways is :mod:`shares`'s.
"""

from __future__ import annotations

import itertools
from typing import Any

from paramreg_jax._src.match.evidence import Checkpoint
from paramreg_jax._src.match.vocabulary import concepts
from paramreg_jax._src.match.vocabulary import is_container


def layer_counts(ck: Checkpoint) -> set[int]:
  """How many layers the checkpoint has, as each of its per-layer name templates numbers them
  and as a scanned checkpoint stacks them (``Checkpoint.scanned``)."""
  counts = {1 + max(i[0] for i in by_index) for by_index in ck.templates.values()}
  return counts | {layers for _, layers in ck.scanned}


def scan_axis(
  slots: list[Any], ck: Checkpoint, per_layer: frozenset[str] = frozenset()
) -> int | None:
  """Where the target's stacked leaves keep their layers: 0 (``nnx.scan``, ``nn.scan``'s
  default) or 1 (MaxText's ``param_scan_axis``, experts in front), as every stacked leaf
  (named ``layers``, or hinted one tensor per layer: ``per_layer``) whose sizes allow only one
  reading says, or, first, the one axis on which all the leaves of each stack have one size;
  None if none does or they disagree (both are then offered, and a leaf both fit is a
  question, never a pick)."""
  counts = layer_counts(ck)
  votes = set()
  by_stack: dict[str, set[tuple[int, ...]]] = {}
  for slot in slots:
    tc, shape = concepts(slot.name), tuple(slot.shape)
    root = stack_root(slot.name, ck)
    stacked = slot.name in per_layer or (not tc.indices and "layers" in tc.tokens)
    if not (stacked or root is not None) or len(shape) < 2:
      continue
    fits = [a for a in (0, 1) if shape[a] in counts]
    if len(fits) == 1 and stacked:
      votes.add(fits[0])
    if root is not None:
      by_stack.setdefault(root, set()).add(shape)
  # a stack keeps its layers where all its leaves have one size: the stronger word (a stack
  # may hold some of the layers only, and an expert count may equal the layer count)
  same = set()
  for shapes in by_stack.values():
    one = [a for a in (0, 1) if len({s[a] for s in shapes}) == 1]
    if len(one) == 1:
      same.add(one[0])
  if same:
    return same.pop() if len(same) == 1 else None
  return votes.pop() if len(votes) == 1 else None


def stacks(slots: list[Any], ck: Checkpoint) -> frozenset[str]:
  """The target subtrees that hold every layer on a leading axis although no word in their
  names says so (``nn.scan(Block, name="decoder")``, ``nnx.vmap``-built stacks named for what
  they are): the largest subtrees of two or more leaves, none numbered or named as layers,
  whose every leaf leads with the same size, a layer count of the checkpoint (2 or more)."""
  counts = layer_counts(ck) - {0, 1}
  if not counts:
    return frozenset()
  leads: dict[str, set[int | None]] = {}
  sizes: dict[str, int] = {}
  for slot in slots:
    tc, shape = concepts(slot.name), tuple(slot.shape)
    known = bool(tc.indices) or "layers" in tc.tokens
    parts = slot.name.split("/")
    for j in range(1, len(parts)):
      prefix = "/".join(parts[:j])
      leads.setdefault(prefix, set()).add(None if known or not shape else shape[0])
      sizes[prefix] = sizes.get(prefix, 0) + 1
  found = {
    p for p, ls in leads.items() if sizes[p] >= 2 and len(ls) == 1 and next(iter(ls)) in counts
  }
  return frozenset(p for p in found if not any(p.startswith(q + "/") for q in found))


def stack_root(name: str, ck: Checkpoint) -> str | None:
  """The subtree of a stacked target leaf that holds its layers (``decoder/moe_layers``,
  a stack :func:`stacks` found), or None for a leaf no stack holds."""
  for p in ck.stacks:
    if name.startswith(f"{p}/"):
      return p
  tc = concepts(name)
  parts = name.split("/")
  if tc.indices:
    return _place(parts)
  if "layers" not in tc.tokens:
    return None
  for j in range(1, len(parts)):
    if "layers" in concepts(parts[j - 1]).tokens:
      return "/".join(parts[:j])
  return None


def nested_stack(name: str) -> str | None:
  """The stack of a leaf that stacks the blocks of one numbered stage
  (``stages/1/blocks/fc1/kernel``: ``nn.scan`` over a stage's blocks, the stage a list item),
  ``stages/1/blocks``: a word that says layers and nothing else after the name's last
  number; None for any other."""
  parts = name.split("/")
  last = max((j for j, p in enumerate(parts) if p.isdigit() or is_container(p)), default=None)
  if last is None:
    return None
  for j in range(last + 1, len(parts) - 1):
    word = concepts(parts[j])
    if word.tokens - {word.kind} == {"layers"}:  # ``blocks``, not ``attention_layer``
      return "/".join(parts[: j + 1])
  return None


def _place(parts: list[str]) -> str | None:
  """A place of a stacked pattern of layers: ``decoder/layers/layers_3`` (MaxText's Gemma 3
  scans blocks of 6 layers, each block's layers ``layers_0`` .. ``layers_5``), the numbered
  container right under an unnumbered stack of layers; None for any other name."""
  for j in range(1, len(parts) - 1):
    stack = concepts("/".join(parts[:j]))
    placed = "layers" in stack.tokens and "remainder" not in stack.tokens  # those: unstacked
    if placed and not stack.indices and is_container(parts[j]):
      return "/".join(parts[: j + 1])
  return None


def _pattern(
  roots: dict[str, int], names: list[str], count: int
) -> tuple[dict[str, tuple[int, ...]], dict[str, int]] | None:
  """Where the stacks are the places of one stacked pattern (``layers/layers_{r}``, ``p``
  places, ``S`` blocks each), place ``r`` holds layers ``p*j + r``, and a sibling
  ``*_remainder`` the ``q`` layers after them (``layers_remainder/layers_{r}``: layer
  ``p*S + r``); None unless ``p*S + q`` is the checkpoint's layer count."""
  if not all(_place(f"{r}/leaf".split("/")) == r for r in roots):
    return None
  stacks = {r.rpartition("/")[0] for r in roots}
  if len(stacks) != 1:
    return None
  (stack,) = stacks
  places = {_number(r.rpartition("/")[2]): r for r in roots}
  p, sizes = len(places), set(roots.values())
  if sorted(places) != list(range(p)) or len(sizes) != 1:
    return None
  (size,) = sizes
  parent, _, word = stack.rpartition("/")
  rest: dict[int, str] = {}
  depth = len(parent.split("/")) if parent else 0
  for name in names:
    below = name.split("/")[depth:]
    if (parent and not name.startswith(f"{parent}/")) or len(below) < 3:
      continue
    first, container = below[0], below[1]
    if first.startswith(f"{word}_") and "remainder" in first and is_container(container):
      rest[_number(container)] = "/".join(filter(None, (parent, first, container)))
  if sorted(rest) != list(range(len(rest))) or p * size + len(rest) != count:
    return None
  shares = {places[r]: tuple(p * j + r for j in range(size)) for r in places}
  return shares, {key: p * size + r for r, key in rest.items()}


def _number(container: str) -> int:
  return int(container.rpartition("_")[2])


def layer_splits(
  slots: list[Any], ck: Checkpoint
) -> tuple[dict[str, int], int, list[dict[str, tuple[int, ...]]] | None, dict[str, int]]:
  """The target's stacks (``{root: layers it holds}``), the checkpoint's layer count, and,
  where two or more stacks hold the checkpoint's layers between them (MaxText's DeepSeek:
  ``dense_layers`` then ``moe_layers``; Llama 4's interleaved ones), every way to give each
  stack its layers: the checkpoint's layers alike in their tensors (names and shapes) go to
  one stack together, and each stack gets as many as it holds; layers keep their order in a
  stack. None where the stacks are no such split (one stack, or each holds every layer).
  The places of a stacked pattern (:func:`_place`) hold theirs by their number, and its
  remainder's layers (``{container: layer}``) come last."""
  if ck.scan_axis is None:
    return {}, 0, None, {}
  at = {s.name: r for s in slots if (r := stack_root(s.name, ck)) is not None}
  grouped = groups(at)
  sizes: dict[str, set[int]] = {}
  for slot in slots:
    root = at.get(slot.name)
    shape = tuple(slot.shape)
    if root is None:
      continue
    axis = 0 if root in ck.stacks else ck.scan_axis
    word = slot.name[len(root) + 1 :].split("/", 1)[0].rsplit("_", 1)[-1]
    stack = f"{root}/*_{word}" if word in grouped.get(root, ()) else root
    if len(shape) > axis:
      sizes.setdefault(stack, set()).add(shape[axis])
  roots = {r: next(iter(s)) for r, s in sizes.items() if len(s) == 1}
  signature: dict[int, set[tuple[Any, ...]]] = {}
  for k, c in ck.concepts.items():
    if c.indices:
      signature.setdefault(c.indices[0], set()).add((c.tokens, c.kind, ck.shapes[k]))
  count = len(signature)
  if len(ck.facts.layer_types) == count:  # the config's kind of each layer (sliding, full)
    for i, kind in enumerate(ck.facts.layer_types):
      signature.setdefault(i, set()).add(("layer_types", kind))
  leaves = [s.name for s in slots]
  pattern = _pattern(roots, leaves, count) if roots and len(roots) == len(sizes) else None
  if pattern is not None:
    return roots, count, [pattern[0]], pattern[1]
  split = len(roots) >= 2 and len(roots) == len(sizes) and sum(roots.values()) == count
  if not split or set(signature) != set(range(count)):
    return roots, count, None, {}
  alike: dict[frozenset[Any], list[int]] = {}
  for i in range(count):
    alike.setdefault(frozenset(signature[i]), []).append(i)
  kinds = list(alike.values())
  if len(kinds) > _MOST_GROUPS or len(roots) ** len(kinds) > 4096:
    return roots, count, [], {}
  options = []
  names = list(roots)
  for owners in itertools.product(names, repeat=len(kinds)):
    held = {r: sorted(i for g, o in zip(kinds, owners) if o == r for i in g) for r in names}
    if all(len(held[r]) == roots[r] for r in names):
      options.append({r: tuple(held[r]) for r in names})
  return roots, count, options, {}


_MOST_GROUPS = 8  # kinds of layers a checkpoint's split stacks are searched over


def groups(at: dict[str, str]) -> dict[str, frozenset[str]]:
  """``{stack: its group words}`` for the stacks whose modules come in groups named alike
  but for a last word (MaxText's Gemma 2: ``self_attention_local`` and
  ``self_attention_global``, ``mlp_local`` and ``mlp_global``, ...): every module of the
  stack in a group, each group with the same two or more names."""
  children: dict[str, set[str]] = {}
  for name, root in at.items():
    children.setdefault(root, set()).add(name[len(root) + 1 :].split("/", 1)[0])
  out = {}
  for root, names in children.items():
    stems: dict[str, set[str]] = {}
    for child in names:
      stem, _, word = child.rpartition("_")
      if stem and word and not word.isdigit():
        stems.setdefault(word, set()).add(stem)
    words = {w for w, st in stems.items() if len(st) >= 2}
    alike = len({frozenset(stems[w]) for w in words}) == 1
    covered = all(c.rpartition("_")[2] in words for c in names)
    if len(words) >= 2 and alike and covered:
      out[root] = frozenset(words)
  return out


# what a group's word says of its layers, in the config's ``layer_types`` words
GROUP_KINDS = {
  "local": "sliding_attention",
  "sliding": "sliding_attention",
  "global": "full_attention",
  "full": "full_attention",
}
