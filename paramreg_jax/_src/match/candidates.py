"""Candidates: the ways a checkpoint tensor (or several) can become one target parameter.

One tensor in one of the readings :mod:`layouts` allows it (the same shape, a transpose, heads
split or merged, a conv kernel's layout); one part of a fused ``qkv``/``gate_up`` tensor; the
separate parts joined into a fused target; one expert of an experts-stacked tensor; and each
of these repeated over the layers of a stacked target.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Iterable
from typing import Any

from paramreg_jax._src.match import layouts
from paramreg_jax._src.match.axes import orientation
from paramreg_jax._src.match.config_facts import layout_by_name
from paramreg_jax._src.match.evidence import Checkpoint
from paramreg_jax._src.match.evidence import is_linear
from paramreg_jax._src.match.stacks import nested_stack
from paramreg_jax._src.match.vocabulary import Concepts
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.sources.selection import Range


@dataclasses.dataclass
class Candidate:
  """One way to build a target parameter: from ``keys``, scored by name ``score``."""

  score: float
  keys: tuple[str, ...]
  reason: str
  build: Any  # () -> recipe
  # (key, axis) of a fused tensor this is a part of; (layer keys, axis) when stacked
  fused: tuple[str | tuple[str, ...], int] | None = None
  # what it takes of its keys, when not all of them: two candidates clash only if they claim
  # the same (one expert's part of a fused [E, 2I, D] is its own claim)
  claims: tuple[Any, ...] | None = None

  @property
  def claimed(self) -> tuple[Any, ...]:
    return self.claims if self.claims is not None else self.keys


def _read(score: float, key: str, reason: str, build: layouts.Build, base: Any = None) -> Candidate:
  """The candidate that reads ``key`` (or ``base()``, a part of it) as one of :mod:`layouts`'
  readings."""
  stored = base if base is not None else functools.partial(ops.source, key)
  return Candidate(score, (key,), reason, lambda: build(stored()))


def candidates(
  tc: Concepts, shape: tuple[int, ...], ck: Checkpoint, *, hinted: bool = False
) -> list[Candidate]:
  """Every way ``ck``'s tensors can become the target ``tc`` of ``shape``, best name first.

  ``hinted``: ``ck`` holds only the tensors a hint named, so the target's own name does not
  gate them (its kind, its layer tokens), and a linear weight is offered in both orientations
  unless the undecided parameters' shapes (or a flax ``kernel``, always ``[in, out]``) say which.
  """
  out = []
  # one tensor per target (same layer; a hint may name a tensor at any level: a list index in
  # the leaf's path, ``stem/0/kernel``, is no layer of the tensor it names)
  singles = own = ck.by_layer.get(tc.indices, ())
  if hinted and (not tc.indices or not singles):
    singles = list(ck.concepts)
  for k in singles:
    out.extend(_single(tc, shape, k, ck, hinted))
  # a tensor that only one layer has (T5's relative position bias) may sit outside the layers
  # (a stack that holds some of the layers stacks its own, one or more: below)
  if not tc.indices and not hinted and ck.share(tc.name) is None:
    for k in ck.single_layer_keys:
      out.extend(_single(tc, shape, k, ck))
  # a fused target (qkv, gate_up) from its separate parts
  out.extend(_joined(tc, shape, ck.by_layer.get(tc.indices, []), ck))
  # a stacked target: (L, ...) from the L per-layer tensors of one name template (and experts)
  if len(shape) >= 2 and (hinted or tc.tokens & {"layers", "experts"}):
    stacked = _stacked(tc, shape, ck, hinted)
    # a stack of one layer is that layer's tensor: one candidate per order of its values,
    # not also a reshape of it to ask about (the better named of two alike; the stack if
    # they tie)
    alone = {_values(c): c.score for c in stacked if len(c.keys) == 1 and c.fused is None}
    out = [c for c in out if c.fused is not None or alone.get(_values(c), -1.0) < c.score]
    kept = {_values(c) for c in out if c.fused is None}
    out.extend(c for c in stacked if c.fused is not None or _values(c) not in kept)
  if not tc.indices and "layers" in tc.tokens and len(shape) >= 2:
    out.extend(_stacked_joined(tc, shape, ck))
    out.extend(_restacked(tc, shape, ck))
  # one expert's leaf (experts/{e}/w1) from its layer's experts-stacked tensor
  if tc.indices and "experts" in tc.tokens:
    out.extend(_per_expert(tc, shape, ck))
  # a layer's leaf from a checkpoint that stacks its layers (a scanned one)
  if len(tc.indices) == 1 and not own:
    out.extend(_unstacked(tc, shape, ck))
  out.sort(key=lambda c: -c.score)
  return out


# a fused tensor's parts, in the order its layouts name them
FUSED_PARTS = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}
# and the parts a target may join (a fused kv exists only in targets: Gemma's kv_einsum)
JOINED_PARTS = {**FUSED_PARTS, "kv": ("k", "v")}


def _values(c: Candidate) -> tuple[tuple[str, ...], str]:
  """What a candidate of one tensor holds: its key and how its values are reordered (a
  transpose, a conv layout; a reshape, or a stack of one, keeps their order)."""
  how = c.reason.partition(", stacked ")[0]
  return c.keys, " ".join(w for w in ("transpose", "OIHW", "OIDHW", "OIK", "1x1") if w in how)


def _per_expert(tc: Concepts, shape: tuple[int, ...], ck: Checkpoint) -> list[Candidate]:
  """Expert ``e``'s leaf from an ``[E, ...]`` tensor of its layer (transformers 5's fused
  experts): the stacked candidate, then ``select`` expert ``e``. A fused ``gate_up`` is split
  only where its name says its layout (``[gate | up]``)."""
  e, outer = tc.indices[-1], tc.indices[:-1]
  item = Concepts(tc.name, tc.tokens, outer, tc.kind, tc.bare)
  out = []
  for key in ck.by_layer.get(outer, ()):
    sc, sshape = ck.concepts[key], ck.shapes[key]
    if "experts" not in sc.tokens or len(sshape) != 3 or not 0 <= e < sshape[0]:
      continue
    for c in _single(item, (sshape[0], *shape), key, ck):
      build = c.build
      if c.fused is not None:
        build = _expert_part(tc, shape, key, c.fused[1], ck)
        if build is None:
          continue
      pick = functools.partial(_pick_expert, build, e, shape)
      part = tuple(sorted(tc.tokens & {"gate", "up"})) if c.fused is not None else ()
      claims = ((key, e, part),)
      out.append(Candidate(c.score, c.keys, f"{c.reason}, expert {e}", pick, claims=claims))
  return out


def _pick_expert(build: Any, e: int, shape: tuple[int, ...]) -> ops.Recipe:
  return ops.reshape(ops.select(build(), Range(0, e, e + 1)), shape)


def _expert_part(tc: Concepts, shape: tuple[int, ...], key: str, axis: int, ck: Checkpoint) -> Any:
  """The builder of one part (gate or up) of a fused ``[E, 2I, D]`` over all experts (where
  its layout is not known, the one of its last two axes that is twice the part's width)."""
  part = tc.tokens & {"gate", "up"}
  stored = ck.shapes[key]
  width = shape[-1]  # the part's output size ([in, out] target)
  if axis == FUSED_AXIS_BY_WIDTHS:
    tiled = out_axes_of_width(stored, 2 * width)
    axis = tiled[0] if len(tiled) == 1 else axis
  if len(part) != 1 or axis == FUSED_AXIS_BY_WIDTHS or stored[axis] != 2 * width:
    return None
  if layout_by_name(key, stored, axis) != "contiguous":
    return None
  start = 0 if part == {"gate"} else width

  def build() -> ops.Recipe:
    r: ops.Recipe = ops.source(key, Range(axis, start, start + width))
    return ops.transpose(r, (0, 2, 1)) if axis == len(stored) - 2 else r

  return build


def _joined(
  tc: Concepts, shape: tuple[int, ...], keys: Iterable[str], ck: Checkpoint
) -> list[Candidate]:
  """A fused target (``qkv``, ``gate_up``) as the concatenation of its separate parts."""
  fused = next((f for f in JOINED_PARTS if f in tc.tokens), None)
  if fused is None or (len(shape) not in (1, 2) and shape[0] != len(JOINED_PARTS[fused])):
    return []
  base = tc.tokens - {fused}
  chosen, scores = [], []
  for part in JOINED_PARTS[fused]:
    want = Concepts("", base | {part}, (), tc.kind)
    src = ck.concepts
    ranked = sorted(
      (
        (want.similarity(src[k]), k)
        for k in keys
        if src[k].kind == tc.kind and src[k].tokens & set(JOINED_PARTS[fused]) == {part}
      ),
      reverse=True,
    )
    if not ranked or (len(ranked) > 1 and ranked[0][0] == ranked[1][0]):
      return []
    scores.append(ranked[0][0])
    chosen.append(ranked[0][1])
  shapes = [ck.shapes[k] for k in chosen]
  # stacked on a new leading axis: weights, or biases ([2, f]: recurrentgemma's ffw_up/b)
  if len(shape) > 2 or (len(shape) == 2 and all(len(s) == 1 for s in shapes)):
    return _stacked_parts(tc, shape, chosen, scores, fused, ck)
  relation = orientation(ck, tc.name, decided=False)
  transpose = len(shape) == 2 and relation == "t"
  if len(shape) == 1:
    if any(len(s) != 1 for s in shapes) or sum(s[0] for s in shapes) != shape[0]:
      return []
    axis = 0
  else:
    if relation not in ("t", "same") or any(len(s) != 2 for s in shapes):
      return []
    parts = [s[::-1] if transpose else s for s in shapes]  # each in the target's layout
    # joined along its output axis: the one the parts' sizes add up along ([in, out] or not)
    fits = [
      a
      for a in (0, 1)
      if {p[1 - a] for p in parts} == {shape[1 - a]} and sum(p[a] for p in parts) == shape[a]
    ]
    if len(fits) != 1:
      return []
    axis = fits[0]

  def build() -> ops.Recipe:
    parts: list[ops.Recipe] = [ops.source(k) for k in chosen]
    if transpose:
      parts = [ops.transpose(p, (1, 0)) for p in parts]
    return ops.concatenate(parts, axis=axis)

  score = sum(scores) / len(scores)
  # the parts one after the other, in the name's order, as ``jnp.split(x, 3, -1)`` reads them:
  # said, since a model that splits its fused output per head reads other rows
  reason = f"joined {'+'.join(JOINED_PARTS[fused])}, one after the other"
  return [Candidate(score, tuple(chosen), reason, build)]


def _stacked_parts(
  tc: Concepts,
  shape: tuple[int, ...],
  chosen: list[str],
  scores: list[float],
  fused: str,
  ck: Checkpoint,
) -> list[Candidate]:
  """A fused target that keeps its parts on a new leading axis (Gemma's ``kv_einsum``
  ``[2, kv_heads, hidden, head_dim]``, ``gating_einsum`` ``[2, ffw, hidden]``): each part in
  the one layout it takes alone, stacked (a part that is not square fits one way whatever
  the model's other weights do: Gemma keeps ``gating_einsum`` ``[out, in]`` and ``linear``
  ``[in, out]``). A part that fits more than one way: not offered."""
  parts = []
  for key, part in zip(chosen, JOINED_PARTS[fused]):
    alone = Concepts(tc.name, (tc.tokens - {fused}) | {part}, tc.indices, tc.kind)
    stored = ck.shapes[key]
    if len(stored) == 2 and stored[0] != stored[1]:
      fits = layouts.readings(stored, shape[1:], True)
      ways = {layouts.REASONS[how]: _read(0.0, key, layouts.REASONS[how], b) for how, b in fits}
      if not ways and len(shape) == 4:
        fits = layouts.heads_permuted(alone, shape[1:], stored, ck)
        ways = {why: _read(0.0, key, why, b) for why, b in fits}
    else:
      ways = {c.reason: c for c in _single(alone, shape[1:], key, ck)}
    if len(ways) != 1:
      return []
    parts.append(next(iter(ways.values())))

  def build() -> ops.Recipe:
    return ops.stack([c.build() for c in parts], axis=0)

  how = parts[0].reason.removeprefix("name").lstrip(" +,")
  reason = f"stacked {'+'.join(JOINED_PARTS[fused])}" + (f" ({how})" if how else "")
  return [Candidate(sum(scores) / len(scores), tuple(chosen), reason, build)]


def _stacked_joined(tc: Concepts, shape: tuple[int, ...], ck: Checkpoint) -> list[Candidate]:
  """A stacked fused target: layer 0's joined parts, repeated for every layer."""
  axis = ck.scan_axis
  if axis is None:
    return []  # where its layers are is not known: nothing to join them by
  layers = ck.stack_layers(tc.name, shape[axis])
  per_layer = Concepts(tc.name, tc.tokens, (), tc.kind)
  item = shape[:axis] + shape[axis + 1 :]
  firsts = _joined(per_layer, item, ck.by_layer.get((layers[0],), []), ck)
  if not firsts:
    return []
  first = firsts[0]
  src = ck.concepts
  template = {src[k].tokens: k for k in first.keys}
  keys_by_layer = []
  for i in layers:
    at = {src[k].tokens: k for k in ck.by_layer.get((i,), []) if src[k].kind == tc.kind}
    if not all(t in at for t in template):
      return []
    keys_by_layer.append([at[t] for t in template])
  zero = first.build()

  def build() -> ops.Recipe:
    layer_recipes = []
    for keys in keys_by_layer:
      r = zero
      for old, new in zip(first.keys, keys):
        r = _rekey(r, old, new)
      layer_recipes.append(r)
    return ops.stack(layer_recipes, axis=axis)

  all_keys = tuple(k for keys in keys_by_layer for k in keys)
  reason = f"{first.reason}, stacked {len(layers)} layers"
  return [Candidate(first.score, all_keys, reason, build)]


def _unstacked(tc: Concepts, shape: tuple[int, ...], ck: Checkpoint) -> list[Candidate]:
  """A layer's leaf from a tensor that stacks every layer of the checkpoint (a scanned one:
  ``[L, ...]``, or MaxText's layers on axis 1, ``[.., L, ..]``): its layer selected, then
  read as one tensor is. Only for a leaf whose layer the checkpoint has no tensors of, from
  a tensor named for the layers, on the axis where the checkpoint keeps as many layers as
  the target has of that leaf (``ck.scanned``; both axes, where both could be: asked)."""
  (i,) = tc.indices
  layers = ck.target_layers.get(tc.name, 0)
  out = []
  for key in ck.by_layer.get((), ()):
    sc, stored = ck.concepts[key], ck.shapes[key]
    if sc.kind != tc.kind or "layers" not in sc.tokens or layers < 2 or i >= layers:
      continue
    for axis in (a for a in (0, 1) if (a, layers) in ck.scanned):
      item = stored[:axis] + stored[axis + 1 :]
      picked = functools.partial(_layer_of, key, axis, i, item)
      for c in _single(tc, shape, key, ck, item=(item, picked)):
        reason = f"{c.reason}, layer {i} of {layers} stacked on axis {axis}"
        out.append(dataclasses.replace(c, reason=reason, claims=((key, i),)))
  return out


def _restacked(tc: Concepts, shape: tuple[int, ...], ck: Checkpoint) -> list[Candidate]:
  """A stacked leaf from a tensor that stacks the checkpoint's layers on the other of axes 0
  and 1 (MaxText's ``[.., L, ..]`` into an ``nnx.scan`` target's ``[L, ...]``, or back): each
  layer read as :func:`_unstacked` reads it, stacked on the leaf's axis."""
  per_item = Concepts(tc.name, tc.tokens, (), tc.kind, tc.bare)
  out = []
  for key in ck.by_layer.get((), ()):
    sc, stored = ck.concepts[key], ck.shapes[key]
    if sc.kind != tc.kind or "layers" not in sc.tokens or len(stored) < 3:
      continue  # (a stacked vector, [d, L] into [L, d], is a transpose: read as one tensor)
    for (at,) in _placements(("layers",), ck.scan_axis, 1):
      layers = shape[at] if at < len(shape) else 0
      axis = 1 - at
      if (axis, layers) not in ck.scanned:
        continue
      item = stored[:axis] + stored[axis + 1 :]
      first = functools.partial(_layer_of, key, axis, 0, item)
      for c in _single(per_item, shape[:at] + shape[at + 1 :], key, ck, item=(item, first)):
        build: Any = functools.partial(_build_restack, c.build(), axis, at, layers)
        if c.reason == layouts.REASONS["same"]:  # the layers' axis moved, nothing else
          order = [a for a in range(len(stored)) if a != axis]
          order.insert(at, axis)
          build = functools.partial(ops.transpose, ops.source(key), tuple(order))
        reason = f"{c.reason}, stacked {layers} layers, moved from axis {axis} to {at}"
        out.append(Candidate(c.score, (key,), reason, build))
  return out


def _build_restack(first: ops.Recipe, axis: int, at: int, layers: int) -> ops.Recipe:
  """``first`` (layer 0 of a tensor stacked on ``axis``) for every layer, stacked on ``at``."""

  def layer(i: int) -> ops.Recipe:
    return ops.map_sources(first, lambda s: ops.Source(s.key, Range(axis, i, i + 1)))

  return ops.stack([layer(i) for i in range(layers)], axis=at)


def _layer_of(key: str, axis: int, i: int, item: tuple[int, ...]) -> ops.Recipe:
  """Layer ``i`` of ``key``, its layers on ``axis``, as one tensor of shape ``item``."""
  return ops.reshape(ops.source(key, Range(axis, i, i + 1)), item)


def _single(
  tc: Concepts,
  shape: tuple[int, ...],
  key: str,
  ck: Checkpoint,
  hinted: bool = False,
  item: tuple[tuple[int, ...], Any] | None = None,
) -> list[Candidate]:
  """Every way the one tensor ``key`` becomes the leaf; ``item``: ``(shape, recipe builder)``
  of the part of it that does (a layer of a stacked tensor), not a fused tensor's part."""
  sc, sshape, convention = ck.concepts[key], ck.shapes[key], ck.convention
  base = functools.partial(ops.source, key)
  if item is not None:
    sshape, base = item
  if sc.kind != tc.kind and not hinted:
    return []
  relation = orientation(ck, tc.name, hinted, bare=sc.bare)
  out = []
  score = tc.similarity(sc)
  linear = is_linear(sc, sshape[1:] if len(sshape) == 3 and "experts" in sc.tokens else sshape)
  untied = ck.facts.tied is False and "embed" in sc.tokens and "embed" not in tc.tokens
  flag = ck.transposed_convs.get(tc.name)  # an nnx.ConvTranspose's transpose_kernel
  transposed_conv = len(sshape) >= 3 and (
    flag is not None or layouts.TRANSPOSED_CONV.search(tc.name) is not None
  )
  merged = layouts.merged_relation(sc, sshape, relation, convention)
  for how, build in layouts.readings(sshape, shape, linear):
    if how == "table-t" and untied:
      continue  # an embedding read transposed is a tied head: the config says there is none
    if transposed_conv and how.startswith("conv"):
      continue  # its kernel is [in, out, ...], not [out, in, ...]: below
    if layouts.oriented(how, relation, tc, sc, sshape, shape, merged):
      out.append(_read(score, key, layouts.REASONS[how], build, base))
  if transposed_conv:
    turned = layouts.conv_transpose(sshape, shape, flag)
    out.extend(_read(score, key, why, b, base) for why, b in turned)
  if layouts.square_relative_table(tc, sc, sshape, shape, linear):
    why = "name + transpose (kept [heads, buckets], as t5x keeps it)"
    out.append(_read(score, key, why, lambda r: ops.transpose(r, (1, 0)), base))
  if not out and linear and len(shape) == 3:
    permuted = layouts.heads_permuted(tc, shape, sshape, ck)
    out.extend(_read(score, key, w, b, base) for w, b in permuted)
  if not out and (pointwise := layouts.pointwise(tc, sshape, shape)) is not None:
    out.append(_read(score, key, layouts.REASONS[pointwise[0]], pointwise[1], base))
  if item is None:  # (a fused tensor's part is cut from the whole tensor: not from a layer)
    out.extend(_fused_part(tc, shape, key, ck))
  return out


def _fused_part(tc: Concepts, shape: tuple[int, ...], key: str, ck: Checkpoint) -> list[Candidate]:
  """``key`` as the fused tensor (qkv, gate_up) the leaf is one part of: the leaf's own concept
  stands for the fused one; the axis its parts are cut along (``fused``), where known."""
  sc, sshape, convention = ck.concepts[key], ck.shapes[key], ck.convention
  out = []
  part = tc.tokens & {"q", "k", "v", "gate", "up"}
  fused = "qkv" if part & {"q", "k", "v"} else "gate_up"
  # per expert: a weight [E, out, in], a bias [E, out] (GPT-OSS's gate_up_proj_bias)
  per_expert = "experts" in sc.tokens and len(sshape) == (2 if sc.kind == "b" else 3)
  rank = len(sshape) - per_expert
  # (a leaf as large as the fused tensor is that tensor, kept fused: no part of it)
  whole = math.prod(shape) == math.prod(sshape)
  if len(part) == 1 and fused in sc.tokens and rank in (1, 2) and not whole:
    rest_t = Concepts("", tc.tokens - part, (), "")
    score = rest_t.similarity(Concepts("", sc.tokens - {fused}, (), ""))
    # the fused axis: out (``t``: [.., out, in]) or the last (``same``: [.., in, out]); a
    # bare parameter is laid out as its author chose (GPT-OSS's experts [E, in, out], where
    # transformers 5's are [E, out, in]): only the bare ones decided say it, not the config
    if sc.bare:
      convention = ck.bare_relations.get(True)
    axis = len(sshape) - 1 if rank == 2 and convention == "same" else len(sshape) - rank
    if rank == 2 and convention not in ("t", "same"):
      axis = FUSED_AXIS_BY_WIDTHS  # the axis the parts' widths tile, found when they are known
    if rank == 1 or convention in ("t", "same") or axis == FUSED_AXIS_BY_WIDTHS:
      out.append(Candidate(score, (key,), f"part of fused {fused}", None, fused=(key, axis)))
  return out


# a fused [out, in] or [in, out] weight of unknown convention: its parts' widths say the axis
FUSED_AXIS_BY_WIDTHS = -1


def out_axes_of_width(stored: tuple[int, ...], width: int) -> list[int]:
  """The axes a fused tensor's parts, ``width`` wide in all, may be cut along: those of its
  last two (``[.., out, in]`` or ``[.., in, out]``; experts and layers stay whole) that are
  ``width`` long. Two are a question, never a pick."""
  return [a for a in range(max(len(stored) - 2, 0), len(stored)) if stored[a] == width]


def _stacked(
  tc: Concepts, shape: tuple[int, ...], ck: Checkpoint, hinted: bool = False
) -> list[Candidate]:
  """A target whose axes stack per-layer (``layers``) and/or per-expert (``experts``) or
  per-head (``heads``: StableLM's one norm module per head) tensors of one name template:
  ``[L, ...]``, ``[E, ...]`` in a layer, ``[L, E, ...]``, ``[H, ...]``, ``[L, H, ...]``; with
  the layers on axis 1 (MaxText's ``param_scan_axis``) ``[.., L, ...]`` and ``[E, L, ...]``;
  a numbered stage's stacked blocks (``stages/1/blocks/fc1/kernel``, :func:`nested_stack`)
  ``[B, ...]`` from that stage's ``B`` blocks. A hint's tensors stack whatever the target is
  called (``ScanBlock_0/...``)."""
  out = []
  per_item = Concepts(tc.name, tc.tokens, (), tc.kind, tc.bare)
  n = len(tc.indices)
  nested = bool(n) and nested_stack(tc.name) is not None
  for (tokens, kind, _), by_index in ck.templates.items():
    if kind != tc.kind and not hinted:
      continue
    inner = "heads" if "heads" in tokens else "experts"
    for depth in (1, 2):
      outer = ("layers",) if not n or nested else ()
      levels = outer + (inner,) * (depth - len(outer))
      if len(levels) != depth or len(shape) <= depth or not set(levels) <= tokens | {"layers"}:
        continue
      # a target names its layer and expert axes (a MoE block's weights are its experts'),
      # not heads
      named = set(levels) - {"heads"} - ({"experts"} if "moe" in tc.tokens else set())
      if not hinted and not (named <= tc.tokens and set(levels) <= tokens):
        continue
      entries = {
        idx[n:]: k for idx, k in by_index.items() if idx[:n] == tc.indices and len(idx) == n + depth
      }
      # a leaf not named as stacked (a hint's) is stacked on axis 1 only where the target says
      # (a stage's stacked blocks: on axis 0 unless the target said otherwise)
      named_layers = "layers" in tc.tokens and not nested
      scan = ck.scan_axis if ck.scan_axis is not None or named_layers else 0
      for axes in _placements(levels, scan, depth):
        held = [
          ck.stack_layers(tc.name, shape[a]) if lv == "layers" else range(shape[a])
          for a, lv in zip(axes, levels)
        ]
        grid = list(itertools.product(*held))
        # a stack that holds some of the layers takes its own; any other, every tensor
        split = levels[0] == "layers" and ck.share(tc.name) is not None
        if sorted(ix for ix in entries if not split or ix[0] in held[0]) != grid:
          continue
        keys = [entries[ix] for ix in grid]
        out.extend(_stacked_items(per_item, shape, axes, levels, keys, ck, hinted))
  return out


def _placements(
  levels: tuple[str, ...], scan_axis: int | None, depth: int
) -> list[tuple[int, ...]]:
  """Where a stacked leaf keeps each of its ``levels``: leading, or (MaxText) the layers on
  axis 1 with experts in front; both where the target's leaves did not say which."""
  if levels[0] != "layers":
    return [tuple(range(depth))]
  at = (0, 1) if scan_axis is None else (scan_axis,)
  return [(a,) if depth == 1 else ((0, 1) if a == 0 else (1, 0)) for a in at]


def _stacked_items(
  per_item: Concepts,
  shape: tuple[int, ...],
  axes: tuple[int, ...],
  levels: tuple[str, ...],
  keys: list[str],
  ck: Checkpoint,
  hinted: bool,
) -> list[Candidate]:
  """Every way the first key becomes one item, repeated over ``keys`` and stacked on
  ``axes``."""
  out = []
  item = tuple(size for a, size in enumerate(shape) if a not in axes)
  where = "" if axes == tuple(range(len(axes))) else f" on axis {axes[0]}"
  for single in _single(per_item, item, keys[0], ck, hinted):
    if single.fused is not None:
      if len(axes) == 1 and axes[0] == (ck.scan_axis or 0):
        fused = (tuple(keys), single.fused[1])
        out.append(Candidate(single.score, tuple(keys), single.reason, None, fused=fused))
      continue
    what = " × ".join(f"{shape[a]} {lv}" for a, lv in zip(axes, levels))
    build = functools.partial(_build_stack, single.build(), keys, axes, shape)
    reason = f"{single.reason}, stacked {what}{where}"
    out.append(Candidate(single.score, tuple(keys), reason, build))
  return out


def _build_stack(
  first: ops.Recipe, keys: list[str], axes: tuple[int, ...], shape: tuple[int, ...]
) -> ops.Recipe:
  """``first`` (built from ``keys[0]``) for every key, stacked on ``axes`` (the outer level's
  axis first; an inner level always leads its outer one's items)."""
  items = [_rekey(first, keys[0], k) for k in keys]
  if len(axes) == 2:
    inner = shape[axes[1]]
    rows = [items[i * inner : (i + 1) * inner] for i in range(shape[axes[0]])]
    return ops.stack([ops.stack(r, axis=0) for r in rows], axis=axes[0])
  return ops.stack(items, axis=axes[0])


def _rekey(recipe: ops.Recipe, old: str, new: str) -> ops.Recipe:
  return ops.rekey(recipe, lambda k: new if k == old else k)


def distinct(cands: list[Candidate]) -> list[Candidate]:
  """The candidates with duplicates (same tensors, same layout) removed, order kept."""
  seen, out = set(), []
  for c in cands:
    if (c.keys, c.reason) not in seen:
      seen.add((c.keys, c.reason))
      out.append(c)
  return out
