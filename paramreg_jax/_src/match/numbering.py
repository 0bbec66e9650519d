"""Layers numbered two ways: a target that counts its blocks across the stages, over a
checkpoint that numbers them within each stage.

flax's ResNet example names its blocks ``ResNetBlock_0`` .. ``ResNetBlock_15`` one after the
other; transformers stores the same blocks as ``encoder.stages.{s}.layers.{b}``, timm as
``layer{s}.{b}``. The numbers do not align, but the order does: block ``n`` of the target is
the ``n``-th ``(stage, block)`` of the checkpoint. That is read as evidence only when

- every numbered target leaf has one layer number, and they are ``0 .. N-1`` (N >= 2);
- every numbered checkpoint tensor has at least two (no expert or head numbers), and its
  ``(first, second)`` pairs are exactly N;
- the shapes agree in that order: every block's target leaves find tensors of their sizes,
  each a distinct one, under the checkpoint's block of the same rank.

Then each checkpoint tensor is read at the target's layer number, and a number below the
block (transformers' ``layers.{b}.layer.{j}``: the block's own sequence of conv units) becomes
the token ``#j``: ``order`` pairs the target's numbered siblings (``Conv_0``, ``Conv_1``) with
tensors named alike but for it, in that order. Anything else is left as it was: the leaves
find no tensor at their layer and are refused as before.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Mapping
from collections.abc import Sequence

from paramreg_jax._src.match.vocabulary import Concepts
from paramreg_jax._src.match.vocabulary import concepts


def position(token: str) -> int | None:
  """The number of a ``#j`` token (a module's place in its block's sequence), else None."""
  if token.startswith("#") and token[1:].isdigit():
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
  blocks: dict[int, list[tuple[int, ...]]] = {}
  for name, shape in targets:
    indices = concepts(name).indices
    if len(indices) > 1:
      return folded, ()
    if indices:
      blocks.setdefault(indices[0], []).append(shape)
  n = len(blocks)
  if n < 2 or sorted(blocks) != list(range(n)):
    return folded, ()
  numbered = {k: c for k, c in folded.items() if c.indices}
  if not numbered or any(
    len(c.indices) < 2 or c.tokens & {"experts", "heads"} for c in numbered.values()
  ):
    return folded, ()
  theirs = sorted({c.indices[:2] for c in numbered.values()})
  if len(theirs) != n:
    return folded, ()
  rank = {pair: i for i, pair in enumerate(theirs)}
  under: dict[int, list[int]] = {}
  for k, c in numbered.items():
    under.setdefault(rank[c.indices[:2]], []).append(math.prod(shapes[k]))
  for i, shapes_of_block in blocks.items():
    want = collections.Counter(math.prod(s) for s in shapes_of_block)
    if want - collections.Counter(under[i]):
      return folded, ()
  out = dict(folded)
  for k, c in numbered.items():
    below = c.indices[2:]
    tokens = c.tokens | {"#" + ".".join(map(str, below))} if below else c.tokens
    out[k] = dataclasses.replace(c, indices=(rank[c.indices[:2]],), tokens=frozenset(tokens))
  return out, tuple((str(i), str(pair)) for i, pair in enumerate(theirs))
