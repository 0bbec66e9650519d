"""Layouts: the ways one stored tensor's shape becomes one leaf's, and which of them an
orientation allows.

Each way is a reading ``(how, build)``: ``build`` turns the stored tensor's recipe into the
leaf's. The same shape; a transpose (``[out, in]`` -> ``[in, out]``, a table kept the other way
round); heads split or merged (a reshape, before or after a transpose); a conv kernel ``OIHW ->
HWIO`` (1-D, 3-D, depthwise, 1x1 as a linear weight, transposed convolutions); a square
relative-position table either way round; a projection's heads permuted into the model's own
axis order. Which readings a leaf may take is :func:`oriented`'s say, from the orientation
:mod:`axes` decided; :mod:`candidates` makes them candidates.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

from paramreg_jax._src.match.axes import IN_OUT_LEAVES
from paramreg_jax._src.match.evidence import Checkpoint
from paramreg_jax._src.match.evidence import is_linear
from paramreg_jax._src.match.evidence import linear_target
from paramreg_jax._src.match.vocabulary import Concepts
from paramreg_jax._src.match.vocabulary import components
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.sources.selection import Indices

# a recipe -> the recipe of the leaf
Build = Any


def _reshapes(src: tuple[int, ...], dst: tuple[int, ...]) -> bool:
  """Whether a row-major reshape ``src -> dst`` only splits or merges adjacent axes."""
  if math.prod(src) != math.prod(dst):
    return False
  a = set(itertools.accumulate(src, lambda x, y: x * y))
  b = set(itertools.accumulate(dst, lambda x, y: x * y))
  return a <= b or b <= a


def readings(src: tuple[int, ...], dst: tuple[int, ...], linear: bool) -> list[tuple[str, Build]]:
  """The ways ``src`` becomes ``dst``: ``[(reason, recipe builder)]`` (``"t"`` = transposed)."""
  out: list[tuple[str, Any]] = []
  pointwise = len(src) >= 3 and all(d == 1 for d in src[2:]) and len(dst) == 2
  if src == dst:
    out.append(("same", lambda r: r))
  if len(src) == 4 and dst == (src[2], src[3], src[1], src[0]) and src != dst:
    out.append(("conv", lambda r: ops.transpose(r, (2, 3, 1, 0))))  # OIHW -> HWIO
  if len(src) == 5 and dst == (*src[2:], src[1], src[0]) and src != dst:
    out.append(("conv3d", lambda r: ops.transpose(r, (2, 3, 4, 1, 0))))  # OIDHW -> DHWIO
  if len(src) == 3 and dst == (src[2], src[1], src[0]) and src != dst:
    out.append(("conv1d", lambda r: ops.transpose(r, (2, 1, 0))))  # Conv1d OIK -> flax KIO
  if len(src) == 3 and src[1] == 1 and dst == (src[2], src[0]) and src[0] != src[2]:
    # a depthwise Conv1d [C, 1, K] kept as [K, C] (one filter per channel: recurrentgemma)
    out.append(("depthwise", lambda r: ops.transpose(ops.reshape(r, (src[0], src[2])), (1, 0))))
  if linear and len(src) == 2 and src[::-1] == dst:
    out.append(("t", lambda r: ops.transpose(r, (1, 0))))
  if not linear and len(src) == 2 and src[::-1] == dst and src != dst:
    # a table kept the other way round (t5x's relative bias [heads, buckets])
    out.append(("table-t", lambda r: ops.transpose(r, (1, 0))))
  if linear and len(src) == 3 and dst == (src[0], src[2], src[1]):
    # experts [E, out, in]; square ones too (the orientation chooses between the two)
    out.append(("t", lambda r: ops.transpose(r, (0, 2, 1))))
  if len(src) == 2 and src != dst and src[::-1] != dst:
    if _reshapes(src[::-1], dst):
      out.append(("t+heads", lambda r: ops.reshape(ops.transpose(r, (1, 0)), dst)))
    if _reshapes(src, dst):
      out.append(("heads", lambda r: ops.reshape(r, dst)))
    # its first axis split and each item transposed: DBRX's experts [E * out, in] as
    # [E, in, out]; where the items are square this is the other reading of "heads" (of one
    # item, it is "t+heads"). A square tensor's other orientation would split its other
    # axis, which no reading here does: that one is the config's (``_heads_permuted``)
    square = len(dst) == 3 and src[0] == src[1] and dst[1] != dst[2]
    if len(dst) == 3 and dst[0] > 1 and not square and src == (dst[0] * dst[2], dst[1]):
      split = (dst[0], dst[2], dst[1])
      out.append(("heads+t", lambda r: ops.transpose(ops.reshape(r, split), (0, 2, 1))))
  elif len(src) != 2 and src != dst and not out and not pointwise:
    # (a 1x1 conv's [o, i, 1, 1] -> [1, 1, i, o] is the conv layout, not a reshape; as a
    # linear weight it is oriented by the leaf's word: see _pointwise)
    if _reshapes(src, dst):
      out.append(("heads", lambda r: ops.reshape(r, dst)))
    # heads merged, then the matrix transposed: an einsum's [hidden, heads, head_dim] as a
    # torch-style [heads * head_dim, hidden] (Funnel's r_kernel); into a square leaf both fit
    if len(src) == 3 and len(dst) == 2 and _reshapes(src, dst[::-1]):
      out.append(("heads-t", lambda r: ops.transpose(ops.reshape(r, dst[::-1]), (1, 0))))
  return out


# a transposed convolution's module: flax's ConvTranspose_0, haiku's conv2_d_transpose, deconv1
TRANSPOSED_CONV = re.compile(r"(?i)conv\w*?transpose|transposed?_?conv|deconv")


def conv_transpose(
  stored: tuple[int, ...], shape: tuple[int, ...], flag: bool | None
) -> list[tuple[str, Build]]:
  """A transposed convolution's kernel: torch stores ``ConvTranspose2d``'s ``[in, out, h,
  w]``; flax's ``ConvTranspose`` keeps ``[h, w, in, out]`` and, by default
  (``transpose_kernel=False``), applies it unflipped, so torch's is flipped in ``h`` and
  ``w``; with ``transpose_kernel=True`` it keeps ``[h, w, out, in]`` and flips it itself.
  Where in and out are as many, both fit, and the module's flag, which no parameter holds,
  says which: an NNX module's ``flag``, or else asked."""
  spatial = tuple(range(2, len(stored)))
  out = []
  if tuple(shape) == (*stored[2:], stored[0], stored[1]) and flag is not True:

    def flipped(r: ops.Recipe) -> ops.Recipe:
      r = ops.transpose(r, (*spatial, 0, 1))
      for axis, size in enumerate(stored[2:]):
        r = ops.select(r, Indices(axis, tuple(range(size - 1, -1, -1))))
      return r

    why = "name + ConvTranspose kernel [in, out, h, w] -> [h, w, in, out], flipped in h and w"
    out.append((why + " (flax's transpose_kernel=False)", flipped))
  if tuple(shape) == (*stored[2:], stored[1], stored[0]) and flag is not False:
    why = "name + ConvTranspose kernel [in, out, h, w] -> [h, w, out, in]"
    build = lambda r: ops.transpose(r, (*spatial, 1, 0))  # noqa: E731
    out.append((why + " (flax's transpose_kernel=True)", build))
  return out


def square_relative_table(
  tc: Concepts, sc: Concepts, stored: tuple[int, ...], shape: tuple[int, ...], linear: bool
) -> bool:
  """Whether a square relative-position table may be kept either way round: transformers'
  T5 stores ``[buckets, heads]``, t5x ``[heads, buckets]``, and T5-XL has 32 of each, so
  its shape says nothing (read as stored, it was silently transposed). A flax or haiku
  ``Embed``'s ``embedding`` is ``[num, features]`` as torch's is: not asked."""
  square = len(stored) == 2 and stored[0] == stored[1] and tuple(shape) == tuple(stored)
  if not square or linear:
    return False  # every leaf meets every tensor here: the shapes first
  relative = any(
    "relpos" in c.tokens or ({"rel", "relative"} & c.tokens and "pos" in c.tokens) for c in (tc, sc)
  )
  embed = tc.name.rpartition("/")[2] in ("embedding", "embeddings")
  return relative and not embed


def pointwise(tc: Concepts, stored: tuple[int, ...], shape: tuple[int, ...]) -> Any:
  """``(how, build)`` of a 1x1 conv's weight ``[o, i, 1..]`` as the linear weight it is: a
  flax or haiku ``kernel``/``w`` ``[i, o]`` or a torch-style ``weight`` ``[o, i]``, by the
  leaf's own word (a square one is otherwise either way round); None otherwise."""
  if len(stored) < 3 or any(d != 1 for d in stored[2:]) or len(shape) != 2:
    return None
  leaf = tc.name.rpartition("/")[2].lower()
  o, i = stored[:2]
  if leaf in IN_OUT_LEAVES and shape == (i, o):
    return "pointwise-t", lambda r: ops.transpose(ops.reshape(r, (o, i)), (1, 0))
  if leaf == "weight" and shape == (o, i):
    return "pointwise", lambda r: ops.reshape(r, (o, i))
  return None


def heads_permuted(
  tc: Concepts, shape: tuple[int, ...], stored: tuple[int, ...], ck: Checkpoint
) -> list[tuple[str, Build]]:
  """A projection with its heads split and its axes in an order of the model's own (Gemma's
  ``q_einsum`` ``[heads, hidden, head_dim]``, ``attn_vec_einsum`` ``[heads, head_dim,
  hidden]``): the stored heads axis split by the config's head count and size (without a
  config, as the leaf's own two axes beside the width, in its order: the reading a plain
  reshape to ``[hidden, heads, head_dim]`` makes), then the axes permuted into the leaf's.
  The heads axis is the output of q, k and v and the input of o, in the checkpoint's own
  orientation (its config or its linear weights' shapes); without that nothing is offered.
  Several splits or permutations that fit (sizes alike) are each a candidate: asked."""
  facts = ck.facts
  if ck.convention not in ("t", "same"):
    return []
  roles = tc.tokens & {"q", "k", "v", "o"}
  if len(roles) != 1:
    return []
  out_axis = 0 if ck.convention == "t" else 1
  axis = out_axis if roles != {"o"} else 1 - out_axis  # where the heads are
  splits: set[tuple[int, int]]
  if facts.heads and facts.head_dim:
    splits = {(h, facts.head_dim) for h in (facts.heads, facts.kv_heads or facts.heads)}
  else:  # no config: the leaf's two axes beside the width, in its order, as a reshape reads
    width = stored[1 - axis]
    splits = set()
    for i in (i for i in range(3) if shape[i] == width):
      a, b = (s for j, s in enumerate(shape) if j != i)
      splits.add((a, b))
  found = []
  for h, d in sorted(splits):
    if h * d != stored[axis]:
      continue
    split = (h, d, stored[1]) if axis == 0 else (stored[0], h, d)
    for perm in itertools.permutations(range(3)):
      if tuple(split[i] for i in perm) == tuple(shape) and perm != (0, 1, 2):
        found.append((split, perm))
  return [
    (
      f"name + heads split, axes {perm}",
      lambda r, split=split, perm=perm: ops.transpose(ops.reshape(r, split), perm),
    )
    for split, perm in found
  ]


REASONS = {
  "same": "name",
  "t": "name + transpose",
  "table-t": "name + transpose",
  "heads": "name + heads reshaped",
  "t+heads": "name + transpose + heads reshaped",
  "heads+t": "name + heads reshaped + each transposed",
  "heads-t": "name + heads merged + transpose",
  "conv": "name + conv kernel OIHW -> HWIO",
  "conv3d": "name + conv kernel OIDHW -> DHWIO",
  "conv1d": "name + conv kernel OIK -> KIO",
  "depthwise": "name + depthwise conv kernel [C, 1, K] transposed to [K, C]",
  "pointwise": "name + 1x1 conv as a linear weight",
  "pointwise-t": "name + 1x1 conv as a linear kernel [in, out]",
}


def _is_conv(sc: Concepts, src: tuple[int, ...]) -> bool:
  """A conv's kernel: four axes or more, or three in a module named for a convolution (by its
  name as stored: the concepts may fold a checkpoint's only module word away)."""
  return len(src) >= 4 or _CONV.search(sc.name) is not None


_CONV = re.compile(r"(?i)conv")


def merged_relation(
  sc: Concepts, src: tuple[int, ...], relation: str | None, stored: str | None
) -> str | None:
  """How a stored tensor of three or more axes, merged into one linear leaf, relates to that
  leaf: as the checkpoint's linear weights do (``relation``) where its framework lays it out
  as them, else None (not known). A conv kernel is (torch's ``[out, in, ...]``, flax's
  ``[..., in, out]``: every framework keeps its convs and linear weights alike); so is a flax
  or haiku ``kernel``/``w`` (``DenseGeneral``'s ``[*in, *out]``), unless the checkpoint's
  linear weights are ``stored`` output first (``"t"``: then its word says nothing). An
  einsum's parameter is as its author chose: not known.

  Examples:
    >>> from paramreg_jax._src.match.vocabulary import concepts
    >>> k = concepts("params/attn/query/kernel")
    >>> merged_relation(k, (32, 4, 8), "t", None), merged_relation(k, (32, 4, 8), "t", "t")
    ('t', None)
    >>> merged_relation(concepts("attention.r_kernel"), (32, 4, 8), "t", "t") is None
    True
  """
  if _is_conv(sc, src):
    return relation
  if components(sc.name)[-1] in IN_OUT_LEAVES and stored != "t":
    return relation
  return None


def oriented(
  how: str,
  convention: str | None,
  tc: Concepts,
  sc: Concepts,
  src: tuple[int, ...],
  dst: tuple[int, ...],
  merged: str | None = None,
) -> bool:
  """Whether a layout fits the checkpoint's orientation of linear weights (an experts-stacked
  ``[E, out, in]`` is one linear weight per expert).

  A stored tensor of three or more axes merged into a square linear leaf fits it both ways
  (``[hidden, heads, head_dim]`` as ``[hidden, heads * head_dim]`` or transposed), and which
  of its axes is the input no shape says: ``merged`` is how it relates to the leaf where its
  framework says (:func:`merged_relation`), else both are offered and the leaf is asked (an
  einsum's parameter is laid out as its author chose: Funnel's ``r_kernel`` is input first,
  where torch's linear weights are output first). A convolution's kernel merged is never
  transposed (the order its window is flattened in, which a merge assumes, is its
  framework's; a transposed leaf is likely flattened in another), and into a square leaf it
  is taken only where ``merged`` says so."""
  if len(src) == 3 and "experts" in sc.tokens:
    if how == "heads-t":
      return False
    src = src[1:]
  if how in ("heads", "heads-t") and len(src) >= 3 and linear_target(tc, dst):
    conv = _is_conv(sc, src)
    if conv and how == "heads-t":
      return False
    if dst[0] != dst[1]:
      return True  # one reading fits
    if merged in ("t", "same"):
      return (how == "heads-t") == (merged == "t")
    return not conv  # both offered: asked (a conv's only reading is no guess either)
  if not (is_linear(sc, src) and linear_target(tc, (0, 0))):
    return how in ("same", "heads", "conv", "conv3d", "conv1d", "depthwise", "table-t")
  if convention == "conflict":
    return False  # the evidence disagrees: no linear weight is oriented by guess
  if convention is None:
    return True  # both offered: a square kernel is then ambiguous, never guessed
  transposed = how.startswith("t") or how == "heads+t"
  return transposed == (convention == "t")
