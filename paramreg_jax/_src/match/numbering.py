"""Layers numbered two ways: a target that counts its blocks across the stages, over a
checkpoint that numbers them within each stage.

flax's ResNet example names its blocks ``ResNetBlock_0`` .. ``ResNetBlock_15`` one after the
other; transformers stores the same blocks as ``encoder.stages.{s}.layers.{b}``, timm as
``layer{s}.{b}``. The numbers do not align, but the order does: block ``n`` of the target is
the ``n``-th ``(stage, block)`` of the checkpoint. That is read as evidence only when

- every numbered target leaf has one layer number, and they are ``0 .. N-1`` (N >= 2);
- every numbered checkpoint tensor has at least two (no expert or head numbers), and its
  ``(first, second)`` pairs are exactly N (or, in a model whose other layers have one
  number, DETR's transformer beside its ResNet backbone, the target's two-number blocks and
  the checkpoint's tensors of two numbers or more, alone: haiku's
  ``block_group_{s}/~/block_{b}``, a linen ``ResidualStage_{s}/BasicBlock_{b}``);
- the shapes agree in that order: every block's target leaves find tensors of their sizes,
  each a distinct one, under the checkpoint's block of the same rank.

Then each checkpoint tensor is read at the target's layer number, and a number below the
block (transformers' ``layers.{b}.layer.{j}``: the block's own sequence of conv units) becomes
the token ``@j`` (never equal to ``conv1``'s ``#1``: a list counts from 0): ``order`` pairs the target's numbered siblings (``Conv_0``, ``Conv_1``) with
tensors named alike but for it, in that order. Anything else is left as it was: the leaves
find no tensor at their layer and are refused as before.

The other way round, a target layer may hold several of the checkpoint's, as groups of
modules named alike but for a last word (MaxText's Gemma 2 unscanned: ``layers_0`` holds
``self_attention_local`` and ``self_attention_global``): :func:`in_groups` reads the
checkpoint's ``j``-th layer of a kind (the config's ``layer_types``) as the target's layer
``j``, with the group's word.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from collections.abc import Mapping
from collections.abc import Sequence

from paramreg_jax._src.match import evidence
from paramreg_jax._src.match import stacks
from paramreg_jax._src.match.vocabulary import Concepts
from paramreg_jax._src.match.vocabulary import components
from paramreg_jax._src.match.vocabulary import concepts
from paramreg_jax._src.match.vocabulary import is_container
from paramreg_jax._src.match.vocabulary import numbers_items


def position(token: str) -> int | None:
  """The number of a ``#j`` token (a module's place in its block's sequence: ``conv2``'s, from
  its own name) or an ``@j`` one (a list's item below a block, ``layer.{j}``), else None. The
  two never equal each other: ``conv1`` counts from 1, a list from 0; only their order within
  one kind is evidence."""
  if token[:1] in ("#", "@") and token[1:].isdigit():
    return int(token[1:])
  return None


def across_stages(
  folded: dict[str, Concepts],
  shapes: Mapping[str, tuple[int, ...]],
  targets: Sequence[tuple[str, tuple[int, ...]]],
) -> tuple[dict[str, Concepts], tuple[tuple[str, str], ...]]:
  """``folded`` with the checkpoint's ``(stage, block)`` read as the target's flat layer
  numbers where the conditions above hold, and the pairs ``(target layer, checkpoint
  (stage, block))`` (``()`` if not). ``targets``: ``(name, shape)`` of every target leaf.

  Examples:
    >>> from paramreg_jax._src.match.vocabulary import concepts
    >>> keys = [f"stages.{s}.layers.{b}.conv.weight" for s in (0, 1) for b in (0, 1)]
    >>> folded = {k: concepts(k) for k in keys}
    >>> shapes = {k: (4 * (1 + int(k[7])), 3) for k in keys}
    >>> targets = [(f"Block_{n}/Conv_0/kernel", (3, 4 * (1 + n // 2))) for n in range(4)]
    >>> out, pairs = across_stages(folded, shapes, targets)
    >>> out["stages.1.layers.0.conv.weight"].indices, pairs[2]
    ((2,), ('2', '(1, 0)'))
  """
  blocks: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
  for name, shape in targets:
    if indices := concepts(name).indices:
      blocks.setdefault(indices, []).append(shape)
  numbered = {k: c for k, c in folded.items() if c.indices}
  read = _read(blocks, numbered, shapes)
  if read is None:
    # a model with one-number layers beside a stage-numbered backbone (DETR): the target's
    # two-number blocks against the checkpoint's tensors of two numbers or more, alone
    deep: dict[tuple[int, ...], list[tuple[int, ...]]] = {
      b: s for b, s in blocks.items() if len(b) == 2
    }
    theirs = {k: c for k, c in numbered.items() if len(c.indices) >= 2}
    if deep and theirs and len(deep) < len(blocks) and len(theirs) < len(numbered):
      read = _read(deep, theirs, shapes)
  if read is None:
    return folded, ()
  out, pairs = read
  return {**folded, **out}, pairs


def _read(
  blocks: Mapping[tuple[int, ...], list[tuple[int, ...]]],
  numbered: Mapping[str, Concepts],
  shapes: Mapping[str, tuple[int, ...]],
) -> tuple[dict[str, Concepts], tuple[tuple[str, str], ...]] | None:
  """The checkpoint's ``numbered`` tensors read at the target's ``blocks`` (``{layer: its
  leaves' shapes}``) in order, and the pairs; None where the conditions above do not hold."""
  ours = sorted(blocks)
  depth = {len(i) for i in ours}
  if len(ours) < 2 or len(depth) != 1 or not depth <= {1, 2}:
    return None
  if depth == {1} and ours != [(j,) for j in range(len(ours))]:
    return None
  if not numbered or any(
    len(c.indices) < 2 or c.tokens & {"experts", "heads"} for c in numbered.values()
  ):
    return None
  theirs = sorted({c.indices[:2] for c in numbered.values()})
  below = any(len(c.indices) > 2 for c in numbered.values())
  if len(theirs) != len(ours) or (depth == {2} and theirs == ours and not below):
    return None  # (a stage's blocks numbered alike on both sides: nothing to read)
  rank = {pair: i for i, pair in enumerate(theirs)}
  under: dict[int, list[int]] = {}
  for k, c in numbered.items():
    under.setdefault(rank[c.indices[:2]], []).append(math.prod(shapes[k]))
  for i, block in enumerate(ours):
    want = collections.Counter(math.prod(s) for s in blocks[block])
    if want - collections.Counter(under[i]):
      return None
  out = {}
  for k, c in numbered.items():
    rest = c.indices[2:]
    tokens = c.tokens | {"@" + ".".join(map(str, rest))} if rest else c.tokens
    out[k] = dataclasses.replace(c, indices=ours[rank[c.indices[:2]]], tokens=frozenset(tokens))
  return out, tuple((_said(ours[i]), str(pair)) for i, pair in enumerate(theirs))


def _said(block: tuple[int, ...]) -> str:
  return str(block[0]) if len(block) == 1 else str(block)


# two numbers in a row (``block.0.1``): is any name a list of lists?
_TWO_NUMBERS = re.compile(r"[0-9][./~][0-9]")


def lists_of_lists(names: Sequence[str]) -> dict[str, tuple[int, int]]:
  """``{name: (k, b)}``: the names whose number right after a layer's (``block.{s}.{b}``)
  numbers the items of a list in that layer, its ``b`` read as an index after the first
  ``k``. A list of lists (SegFormer's ``encoder.block.{stage}.{block}``, timm's EfficientNet
  ``blocks.{stage}.{block}``) holds alike items: for two or more ``b`` under one ``s``, the
  same names below. A layer's sequential (``layers.0.0`` a conv, ``layers.0.1`` a norm) does
  not, and its number stays a module's place.

  Examples:
    >>> names = [f"block.0.{b}.{m}.weight" for b in (0, 1) for m in ("fc1", "norm")]
    >>> lists_of_lists(names)["block.0.1.norm.weight"]
    (1, 1)
    >>> lists_of_lists(["layers.0.0.weight", "layers.0.1.weight", "layers.0.1.bias"])
    {}
  """
  below: dict[tuple[str, ...], dict[str, set[tuple[str, ...]]]] = {}
  at: dict[str, tuple[tuple[str, ...], str]] = {}
  if not _TWO_NUMBERS.search("\n".join(names)):  # most checkpoints: 50,000 keys in ms
    return {}
  for name in names:
    parts = components(name)
    for j in range(2, len(parts) - 1):
      word = parts[j - 2].rsplit("_", 1)[-1]
      if parts[j - 1].isdigit() and parts[j].isdigit() and numbers_items(word):
        items = below.setdefault(tuple(parts[:j]), {})
        items.setdefault(parts[j], set()).add(tuple(parts[j + 1 :]))
        at[name] = (tuple(parts[:j]), parts[j])
        break
  alike = {
    prefix
    for prefix, items in below.items()
    if len(items) >= 2 and len({frozenset(rest) for rest in items.values()}) == 1
  }
  return {
    name: (len(concepts("/".join(prefix)).indices), int(b))
    for name, (prefix, b) in at.items()
    if prefix in alike
  }


# a lowercase word and its item's number in one component: a list attribute of a linen module
# set up in ``setup`` (``self.resnets = [...]`` is named ``resnets_0``, ``resnets_1``)
_ITEM = re.compile(r"^([a-z][a-z0-9]*(?:_[a-z][a-z0-9]*)*)_(\d+)$")


def item_words(names: Sequence[str]) -> frozenset[str]:
  """The words a target numbers its list's items with in the same component (``resnets_0``),
  and never apart (``resnets/0``); not the words already read as numbering layers there
  (``layers_3``, ``blocks_1``).

  Examples:
    >>> sorted(item_words(["mid/resnets_0/conv1/kernel", "layers_1/mlp/kernel", "blocks_1/x"]))
    ['resnets']
  """
  words, apart = set(), set()
  for name in names:
    parts = name.split("/")
    for j, part in enumerate(parts):
      if m := _ITEM.match(part):
        words.add(m.group(1))
      elif part.isdigit() and j:
        apart.add(parts[j - 1])
  return frozenset(w for w in words - apart if not is_container(f"{w}_0"))


def spelled_as_target(keys: Sequence[str], names: Sequence[str]) -> dict[str, str]:
  """``{key: the key as the target spells its lists}``, for the keys that number the items of
  a list the target numbers in one component (``decoder.mid_block.resnets.1.norm1.weight``
  read as ``decoder.mid_block.resnets_1.norm1.weight`` beside a target's ``resnets_1``): the
  checkpoint's names are then folded as the target's are, the item's number a place on both
  sides, and the key whose path is the leaf's own tells alike items apart
  (``vocabulary.same_path``).

  Examples:
    >>> keys = ["vae.resnets.1.norm1.weight", "vae.attentions.0.to_out.0.weight", "vae.conv.weight"]
    >>> spelled = spelled_as_target(keys, ["resnets_1/norm1/scale", "attentions_0/proj_attn/kernel"])
    >>> spelled["vae.resnets.1.norm1.weight"], spelled["vae.attentions.0.to_out.0.weight"]
    ('vae.resnets_1.norm1.weight', 'vae.attentions_0.to_out_0.weight')
    >>> "vae.conv.weight" in spelled
    False
  """
  words = item_words(names)
  if not words:
    return {}
  alternatives = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
  item = re.compile(rf"(?:^|(?<=[./]))({alternatives})\.(\d+)(?=[./]|$)")
  out = {}
  for k in keys:
    if m := item.search(k):
      # below the item, a number is a module's place, as it was (diffusers' ``to_out.0``)
      out[k] = k[: m.start()] + _PLACE.sub(r"\1_\2", k[m.start() :])
  return out


_PLACE = re.compile(r"(?:^|(?<=[./]))([A-Za-z][A-Za-z0-9_]*)\.(\d+)(?=[./]|$)")


def in_lists(folded: dict[str, Concepts]) -> dict[str, Concepts]:
  """``folded`` with each list of lists' item number read as an index (:func:`lists_of_lists`:
  ``encoder.block.0.1`` is stage 0's block 1, layer ``(0, 1)``)."""
  items = lists_of_lists(list(folded))
  if not items:
    return folded
  out = dict(folded)
  for k, item in items.items():
    out[k] = dataclasses.replace(out[k], indices=evidence.with_item(out[k].indices, item))
  return out


def in_groups(
  folded: dict[str, Concepts],
  targets: Sequence[tuple[str, tuple[int, ...]]],
  layer_types: Sequence[str],
) -> tuple[dict[str, Concepts], str | None, tuple[str, ...]]:
  """``folded`` with each checkpoint layer read as the target layer and group that hold it,
  where every numbered target layer (``0 .. N-1``) holds the same groups (``stacks.groups``),
  each group's word names a kind of layer (``local``: sliding attention, ``global``: full),
  and the config's ``layer_types`` gives the checkpoint N layers of each: its ``j``-th layer
  of a kind is layer ``j``, with the group's word among its concepts. Returns that, a
  problem where only the kinds are missing (no ``layer_types``), and the target layers the
  problem is about; ``folded`` unchanged otherwise.

  Examples:
    >>> from paramreg_jax._src.match.vocabulary import concepts
    >>> keys = [f"layers.{i}.attn.q.weight" for i in range(4)] + [f"layers.{i}.mlp.up.weight" for i in range(4)]
    >>> targets = [(f"layers_{j}/{m}_{w}/kernel", (4, 4)) for j in (0, 1) for m in ("attn", "mlp") for w in ("local", "global")]
    >>> kinds = ["sliding_attention", "full_attention"] * 2
    >>> out, _, _ = in_groups({k: concepts(k) for k in keys}, targets, kinds)
    >>> out["layers.3.attn.q.weight"].indices, "global" in out["layers.3.attn.q.weight"].tokens
    ((1,), True)
  """
  at: dict[str, str] = {}
  for name, _ in targets:
    parts = name.split("/")
    for j in range(len(parts)):
      if concepts("/".join(parts[: j + 1])).indices:
        at[name] = "/".join(parts[: j + 1])
        break
  layers = {concepts(name).indices for name in at}
  if any(len(i) != 1 for i in layers) or sorted(layers) != [(j,) for j in range(len(layers))]:
    return folded, None, ()
  found = stacks.groups(at)
  words = set(found.values())
  if len(found) != len(layers) or len(words) != 1:
    return folded, None, ()
  (word_set,) = words
  kind_of = {w: stacks.GROUP_KINDS.get(w) for w in word_set}
  numbered = {k: c for k, c in folded.items() if c.indices}
  count = 1 + max((c.indices[0] for c in numbered.values()), default=-1)
  kinds = set(kind_of.values())
  n = len(layers)
  if None in kinds or len(kinds) != len(word_set) or count != n * len(word_set):
    return folded, None, ()
  if len(layer_types) != count:
    roots = tuple(sorted(set(at.values())))
    return (
      folded,
      f"the target's layers ({roots[0]}, ...) each hold {len(word_set)} of the "
      f"checkpoint's {count} layers, as modules named *_{' and *_'.join(sorted(word_set))}, "
      "and nothing says which layers are which kind: pass the model's config.json, whose "
      "layer_types says it (match(..., config=...))",
      roots,
    )
  rank: dict[int, tuple[int, str]] = {}
  for w, kind in kind_of.items():
    of_kind = [i for i, t in enumerate(layer_types) if t == kind]
    if len(of_kind) != n:
      return folded, None, ()
    rank.update({i: (j, w) for j, i in enumerate(of_kind)})
  if len(rank) != count:
    return folded, None, ()
  out = dict(folded)
  for k, c in numbered.items():
    j, w = rank[c.indices[0]]
    out[k] = dataclasses.replace(c, indices=(j, *c.indices[1:]), tokens=c.tokens | {w})
  return out, None, ()
