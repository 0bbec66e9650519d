"""Order as evidence: auto-numbered siblings follow the checkpoint's roles in order.

flax names the modules a ``@nn.compact`` block creates ``RMSNorm_0``, ``RMSNorm_1``, ``Dense_0``
..., and haiku ``linear``, ``linear_1``, in the order the block calls them; a ``Sequential``
numbers its children. Transformer blocks call their parts in one order: the attention's
q, k, v, o before the MLP's gate, up, down; a norm before the sublayer it normalizes, the
attention's before the MLP's, a post-norm after its pre-norm. So when siblings numbered so are
left open among exactly as many checkpoint tensors, each of a distinct role in that order,
the numbers pair with the roles in order.

Where the checkpoint keeps each conv with its norm in a unit of its own (MobileNet's
``layer.3.expand_1x1.{convolution,normalization}``), a compact block's ``Conv_0`` ..
``Conv_2``, decided by their shapes, give the units their order, and ``BatchNorm_0`` ..
``BatchNorm_2`` take the units' norms in it (``in order: BatchNorm_1 of 3 is the one in
conv_3x3``); flax's ``batch_stats`` collection is the same module as ``params``.

It decides only then: every open sibling has the same candidate tensors, as many as there are
open siblings; the roles are distinct and known (``concepts`` folds ``input_layernorm``,
``ln_1``, ``fc1``, ``wi_0`` to them); the siblings decided by other evidence sit in the same
order; and the leaf's candidates for its tensor are one layout. Anything else stays open.

Examples:
  >>> import jax, numpy as np
  >>> import paramreg_jax as prj
  >>> src = prj.MemorySource({f"h.0.ln_{j}.weight": np.full(4, j, np.float32) for j in (1, 2)})
  >>> target = {"h_0": {f"LayerNorm_{j}": {"scale": jax.ShapeDtypeStruct((4,), np.float32)}
  ...                   for j in (0, 1)}}
  >>> for row in prj.match(target, src).rows():
  ...   print(row)
  ('h_0/LayerNorm_0/scale', "source('h.0.ln_1.weight')", 'name, in order: LayerNorm_0 of 2 is the attn norm')
  ('h_0/LayerNorm_1/scale', "source('h.0.ln_2.weight')", 'name, in order: LayerNorm_1 of 2 is the mlp norm')
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

from paramreg_jax._src.match import coherence
from paramreg_jax._src.match import numbering
from paramreg_jax._src.match.candidates import Candidate
from paramreg_jax._src.match.candidates import distinct
from paramreg_jax._src.match.evidence import Checkpoint
from paramreg_jax._src.match.vocabulary import concepts
from paramreg_jax._src.match.vocabulary import is_container
from paramreg_jax._src.match.vocabulary import own_number

_PATH = re.compile(r"/|~1~0~1|~1")  # haiku's "layer_0/~/linear_1" module is one escaped key
_NUMBERED = re.compile(r"^(?P<base>.*?)(?:_(?P<n>\d+))?$")
# call order; gate and up share a rank: code calls them either way round; a decoder's
# cross-attention's q, k, v, o come after its self-attention's (4 .. 7), the MLP's after both
_RANKS = {"q": 0, "k": 1, "v": 2, "o": 3, "gate": 8, "up": 8, "down": 9}


def _sibling(name: str) -> tuple[tuple[str, str, str], int] | None:
  """``((parent, base, leaf), number)`` of ``parent/Base_N/leaf`` (haiku's ``base`` is 0, a
  ``Sequential``'s ``parent/N/leaf`` has base ``""``, torch's ``conv2`` is ``conv``'s 2)."""
  parts = _PATH.split(name)
  if len(parts) < 2:
    return None
  module, leaf = parts[-2], parts[-1]
  m = _NUMBERED.match(module)
  if m is None:
    return None
  base, n = m.group("base"), m.group("n")
  if module.isdigit():
    base, n = "", module
  elif n is None and (own := own_number(module)):  # torch's conv1, conv2, bn1
    base, n = own[0], str(own[1])
  return ("/".join(parts[:-2]), base, leaf), int(n or 0)


# words that place a module before or after its sibling named alike but for them
_BEFORE_AFTER = {"pre": ("pre/post", 0), "post": ("pre/post", 1)}
_BEFORE_AFTER |= {"before": ("before/after", 0), "after": ("before/after", 1)}
_BEFORE_AFTER |= {"start": ("start/end", 0), "end": ("start/end", 1)}  # lingvo's fflayer_start


def _before_after(name: str) -> tuple[tuple[str, str, str], int] | None:
  """``((pattern, pair, ""), 0 or 1)`` of a name whose module or leaf says it comes before
  or after a sibling named alike but for that word (``attn_pre_gamma``/``attn_post_gamma``,
  ``pre_ffw_norm/scale``/``post_ffw_norm/scale``, ``layernorm_before``/``_after``)."""
  parts = _PATH.split(name)
  for at in range(len(parts) - 1, max(len(parts) - 4, -1), -1):
    words = parts[at].split("_")
    hits = [i for i, w in enumerate(words) if w.lower() in _BEFORE_AFTER]
    if len(hits) == 1:
      pair, n = _BEFORE_AFTER[words[hits[0]].lower()]
      words[hits[0]] = "{" + pair + "}"
      return ("/".join([*parts[:at], "_".join(words), *parts[at + 1 :]]), pair, ""), n
  return None


def _numbered_module(name: str) -> tuple[tuple[str, str, str], int] | None:
  """``((parent, base, "module/leaf"), number)`` of ``parent/Base_N/module/leaf``: a leaf of
  a numbered module's own module (a compact decoder layer's
  ``MultiHeadDotProductAttention_0/query/kernel`` and ``..._1/query/kernel``: the
  self-attention's and the cross-attention's, in call order). Not under a numbered layer."""
  parts = _PATH.split(name)
  if len(parts) < 3 or is_container(parts[-3], True):
    return None
  m = _NUMBERED.match(parts[-3])
  if m is None or not m.group("base"):
    return None
  # haiku's first is unnumbered (multi_head_attention, multi_head_attention_1): alone, it
  # is a family of one, which pairs nothing
  return ("/".join(parts[:-3]), m.group("base"), "/".join(parts[-2:])), int(m.group("n") or 0)


# a numbered module's numbered modules count in its own scope: Attention_1/Dense_0 follows
# Attention_0/Dense_3 (as a number, each outer number is this many of the inner)
_NESTED = 1000


def _nested(name: str) -> tuple[tuple[str, str, str], int] | None:
  """``((parent, "Outer/Inner", leaf), outer * _NESTED + inner)`` of
  ``parent/Outer_N/Inner_j/leaf``: flax numbers a compact module's modules in its own scope,
  and calls them in that order, so a decoder layer's ``MultiHeadAttention_0/Dense_0..3`` and
  ``MultiHeadAttention_1/Dense_0..3`` are its self-attention's q, k, v, o, then its
  cross-attention's: one sequence across both. Not under a numbered layer."""
  found = _numbered_module(name)
  if found is None:
    return None
  (parent, outer, rest), n = found
  module, _, leaf = rest.partition("/")
  inner = _NUMBERED.match(module)
  if inner is None or inner.group("n") is None or not inner.group("base"):
    return None
  return (parent, f"{outer}/{inner.group('base')}", leaf), n * _NESTED + int(inner.group("n"))


def _families(names: list[str], nested: bool = True) -> dict[tuple[str, str, str], dict[int, str]]:
  """``{(parent, base, leaf): {number: name}}``: the numbered siblings among ``names`` (and
  numbered modules' leaves alike: :func:`_numbered_module`; with ``nested``, the leaves of
  numbered modules' numbered modules in one sequence: :func:`_nested`), and the pairs a
  pre/post (before/after) word orders (``(pattern, pair, "")``: 0 the first)."""
  families: dict[tuple[str, str, str], dict[int, str]] = {}
  kinds = (_sibling, _numbered_module, _before_after, *((_nested,) if nested else ()))
  for name in names:
    for found in (kind(name) for kind in kinds):
      if found is not None:
        families.setdefault(found[0], {})[found[1]] = name
  return families


def _label(name: str, members: Mapping[int, str]) -> str:
  """The part of ``name`` its family's members differ in (``Dense_1``, ``attn_pre_gamma``,
  ``MultiHeadAttention_1/Dense_0``)."""
  split = [_PATH.split(m) for m in members.values()]
  parts = _PATH.split(name)
  differ = [
    at
    for at in range(len(parts))
    if len({p[at] if len(p) == len(parts) else None for p in split}) > 1
  ]
  return "/".join(parts[differ[0] : differ[-1] + 1]) if differ else parts[-1]


_ENDS = {"pre": ("pre-norm", -1), "embed": ("embeddings' norm", -1)}
_ENDS |= {"post": ("post-norm", 99), "final": ("final norm", 99)}


def role(tokens: frozenset[str]) -> tuple[str, int] | None:
  """A tensor's place in a block's call order: ``(what, rank)``, or None if not known."""
  if "layerscale" in tokens and len({"attn", "mlp"} & tokens) == 1:  # scales what it follows
    return ("attn layer scale", 8) if "attn" in tokens else ("mlp layer scale", 9)
  if "norm" in tokens:
    sublayers = [s for s in ("attn", "xattn", "mlp") if s in tokens]
    # of no sublayer: CLIP's pre_layrnorm and post_layernorm around its blocks, BLOOM's
    # word_embeddings_layernorm before them and ln_f after: first or last of all
    if not sublayers and len(ends := tokens & _ENDS.keys()) == 1:
      return _ENDS[next(iter(ends))]
    if len(sublayers) != 1:
      return None
    (sublayer,) = sublayers
    if sublayer == "attn" and len({"q", "k"} & tokens) == 1:  # q_norm, k_norm: q's first
      which = "q" if "q" in tokens else "k"
      return f"{which} norm", 1 if which == "q" else 2
    post = "post" in tokens
    # the self-attention's norms (q and k norms between), a decoder's cross-attention's,
    # then the MLP's, each pre-norm before its post-norm
    rank = {"attn": 0, "xattn": 4, "mlp": 6}[sublayer] + (3 if sublayer == "attn" else 1) * post
    return f"{sublayer} {'post-norm' if post else 'norm'}", rank
  found = [r for r in _RANKS if r in tokens]
  if len(found) != 1:
    return None
  (r,) = found
  if "xattn" in tokens and _RANKS[r] <= 3:
    return f"cross-attention {r}", _RANKS[r] + 4
  return r, _RANKS[r]


def settle(
  open_: Mapping[str, list[Candidate]],
  decided: Mapping[str, tuple[str, ...]],
  ck: Checkpoint,
  top: Any,
  by_hint: frozenset[str] = frozenset(),
) -> dict[str, tuple[Candidate, str]]:
  """``{open leaf: (candidate, why)}`` for the numbered siblings the order pairs with roles.
  ``decided``: the keys of each decided leaf; ``top``: a leaf's candidates evidence may pick;
  ``by_hint``: leaves a hint decided. A whole tensor that evidence gave another leaf is no
  sibling's candidate (``norm_proj`` took the shortcut's norm: ``BatchNorm_0`` and
  ``BatchNorm_1`` pair with the two left); one a hint took stops the pairing."""
  families = _families([*open_, *decided])
  out: dict[str, tuple[Candidate, str]] = {}
  taken = {*decided.values()}
  by_evidence = {keys for name, keys in decided.items() if name not in by_hint}
  evidence = {n: k for n, k in decided.items() if n not in by_hint}
  for family, members in families.items():
    units = functools.cache(functools.partial(_unit_ranks, family, families, evidence))
    waiting = {n: name for n, name in members.items() if name in open_}
    if len(waiting) < 2 or len(members) != len({*members.values()}):
      continue
    sets = {
      n: [
        c
        for c in _named(open_[name], top, waiting, open_, ck)
        if c.fused is not None or c.keys not in by_evidence
      ]
      for n, name in waiting.items()
    }
    # the open siblings that want the same tensors, as many as they are, pair in order
    groups: dict[frozenset[tuple[str, ...]], list[int]] = {}
    for n, cands in sets.items():
      groups.setdefault(frozenset(c.keys for c in cands), []).append(n)
    assigned: dict[int, tuple[tuple[str, ...], str, int]] = {}
    for tensors, ns in groups.items():
      ranked = _ranked(tensors, ck, units) if len(tensors) == len(ns) >= 2 else None
      if ranked is not None and not taken & {k for k, _, _ in ranked}:
        assigned.update(zip(sorted(ns), ranked))
    if not assigned or not _in_order(members, assigned, decided, ck, units):
      continue
    for n, (tensor, what, _) in assigned.items():
      picks = [c for c in sets[n] if c.keys == tensor]
      if len(picks) == 1 and waiting[n] not in out:
        module = _label(waiting[n], members)
        out[waiting[n]] = (picks[0], f"in order: {module} of {len(members)} is the {what}")
  return out


def _named(
  cands: list[Candidate],
  top: Any,
  waiting: Mapping[int, str],
  open_: Mapping[str, list[Candidate]],
  ck: Checkpoint,
) -> list[Candidate]:
  """What the order may pair a sibling with: its best by name (``top``) or, where ``k``
  siblings are named alike to the last score (``attn_pre_gamma``, ``attn_post_gamma``: the
  names say nothing of which is which), the ``k`` best named (with ties: more); where the
  ties are more, the ``k`` of them of the best's own role in the best's own layer, if exactly
  ``k`` are (a compact decoder layer's two attentions' ``query``: the self-attention's q and
  the cross-attention's, not the encoder's)."""
  profile = [(c.keys, c.score) for c in distinct(cands)]
  k = sum(profile == [(c.keys, c.score) for c in distinct(open_[w])] for w in waiting.values())
  best = top(cands)
  if k < 2 or len(distinct(best)) >= k or len(profile) < k:
    return best
  wide = [c for c in cands if c.score >= profile[k - 1][1]]
  if len({c.keys for c in wide}) > k and len(keys := profile[0][0]) == 1:
    own = _role_of(keys[0], ck)
    block = _BLOCK.match(keys[0])
    alike = [
      c
      for c in wide
      if len(c.keys) == 1
      and _same_role(_role_of(c.keys[0], ck), own)
      and (block is None or c.keys[0].startswith(block.group(0)))
    ]
    if len({c.keys for c in alike}) == k:
      return alike
  return wide


_BLOCK = re.compile(r"^.*?[./]\d+[./]")  # a key's layer: model.decoder.layers.0.


def _same_role(a: tuple[str, int] | None, b: tuple[str, int] | None) -> bool:
  """Whether two roles are one role of two sublayers (``q`` and ``cross-attention q``)."""
  return a is not None and b is not None and a[0].split()[-1] == b[0].split()[-1]


def _ranked(
  tensors: frozenset[tuple[str, ...]], ck: Checkpoint, units: Callable[[], Mapping[str, int]]
) -> list[tuple[tuple[str, ...], str, int]] | None:
  """``(tensor, role, rank)`` in call order, or None if any role is unknown or shared.
  Tensors named alike but for their place in a block's sequence (``#j``, ``@j``: ``numbering``)
  are in the order of those places; tensors each in a unit another numbered family's
  members came from (``units``), in the order of those members."""
  placed = _in_sequence(tensors, ck)
  if placed is not None:
    return placed
  placed = _in_units(tensors, units())
  if placed is not None:
    return placed
  placed = []
  for keys in tensors:
    roles = {_role_of(k, ck) for k in keys}
    if len(roles) != 1 or None in roles:
      return None
    (r,) = roles
    assert r is not None
    placed.append((keys, r[0], r[1]))
  if len({rank for _, _, rank in placed}) != len(placed):
    return None
  return sorted(placed, key=lambda p: p[2])


def _in_sequence(
  tensors: frozenset[tuple[str, ...]], ck: Checkpoint
) -> list[tuple[tuple[str, ...], str, int]] | None:
  """``(tensor, role, place)`` of single tensors whose names differ only in their ``#j`` or
  ``@j`` place, in that order; None if they differ in anything else."""
  placed, rest = [], set()
  for keys in tensors:
    c = ck.concepts.get(keys[0]) if len(keys) == 1 else None
    places = [(t, p) for t in c.tokens if (p := numbering.position(t)) is not None] if c else []
    if c is None or len(places) != 1:
      return None
    ((token, place),) = places
    placed.append((keys, f"one in its block's module {place}", place))
    rest.add(c.tokens - {token})
  if len(rest) != 1 or len({p for _, _, p in placed}) != len(placed):
    return None
  return sorted(placed, key=lambda p: p[2])


def _unit(key: str) -> str:
  """The checkpoint unit that holds a tensor's module: ``layer.3.expand_1x1`` for
  ``layer.3.expand_1x1.convolution.weight`` and ``...normalization.running_mean``."""
  return coherence.checkpoint_module(key).rpartition(".")[0]


def _unit_ranks(
  family: tuple[str, str, str],
  families: Mapping[tuple[str, str, str], dict[int, str]],
  decided: Mapping[str, tuple[str, ...]],
) -> dict[str, int]:
  """``{checkpoint unit: number}`` from another numbered family in the same module whose
  members evidence decided, each from a unit of its own (a compact block's ``Conv_0`` ..
  ``Conv_2`` from ``expand_1x1``, ``conv_3x3``, ``reduce_1x1``): the k-th ``BatchNorm`` is
  the norm of the k-th conv's unit, where the checkpoint groups each conv with its norm."""
  parent, base, _ = family
  out: dict[str, int] = {}
  for (p, b, _), members in families.items():
    if b == base or coherence.without_collection(p) != coherence.without_collection(parent):
      continue
    units = {n: {_unit(k) for k in decided[m]} for n, m in members.items() if m in decided}
    if len(units) < 2 or any(len(u) != 1 for u in units.values()):
      continue
    found = {next(iter(u)): n for n, u in units.items()}
    if len(found) != len(units) or any(out.get(u, n) != n for u, n in found.items()):
      return {}  # two partners disagree, or one unit for two members: no order
    out.update(found)
  return out


def _in_units(
  tensors: frozenset[tuple[str, ...]], units: Mapping[str, int]
) -> list[tuple[tuple[str, ...], str, int]] | None:
  """``(tensor, role, rank)`` of single tensors each in a distinct ranked unit, in that
  order; None otherwise."""
  if not units:
    return None
  placed = []
  for keys in tensors:
    where = {_unit(k) for k in keys}
    if len(where) != 1 or next(iter(where)) not in units:
      return None
    (u,) = where
    placed.append((keys, f"one in {u.rpartition('.')[2]}", units[u]))
  if len({p for _, _, p in placed}) != len(placed):
    return None
  return sorted(placed, key=lambda p: p[2])


def _role_of(key: str, ck: Checkpoint) -> tuple[str, int] | None:
  return role(ck.concepts[key].tokens) if key in ck.concepts else None


def _in_order(
  members: dict[int, str],
  assigned: dict[int, tuple[tuple[str, ...], str, int]],
  decided: Mapping[str, tuple[str, ...]],
  ck: Checkpoint,
  units: Callable[[], Mapping[str, int]],
) -> bool:
  """Whether every sibling decided by other evidence or paired now sits in call order (a
  decided one of no known role or unit leaves the order unproven)."""
  ranks = []
  for n in sorted(members):
    if n in assigned:
      ranks.append(assigned[n][2])
      continue
    keys = decided.get(members[n])
    if not keys:
      continue  # still open: it contradicts nothing
    r = _role_of(keys[0], ck)
    if r is None and (placed := units()):
      unit = placed.get(_unit(keys[0]))
      r = None if unit is None else ("", unit)
    if r is None:
      return False
    ranks.append(r[1])
  return all(a < b for a, b in zip(ranks, ranks[1:]))


_ATTENTION_ROLES = {3: ("q", "k", "v"), 4: ("q", "k", "v", "o")}
# gate and up come in either order (``?``: one of the two, the user says which); down is last
_MLP_ROLES = {2: ("gate?", "up?"), 3: ("gate?", "up?", "down")}


def fused_roles(names: list[str], ck: Checkpoint, shapes: Mapping[str, Any]) -> dict[str, str]:
  """``{leaf: role}`` for numbered siblings in an attention module (q, k, v, o) or an MLP
  (gate and up, each only ``gate?``/``up?``: either one; down), in call order, where their
  layer of the checkpoint holds a fused qkv or gate_up: nothing names the part each one is,
  and only its role can say which rows of the fused tensor it takes (separate tensors are
  paired by :func:`settle` instead, from their own names).

  The order is that of the numbered modules that multiply (those with a ``kernel``/``w``): a
  ``Sequential`` numbers its activations and norms too (``0, 1, 2`` q, k, v; ``3, 4`` the q
  and k norms; ``5`` o), and a module without a bias is still counted for the others. A module
  is an attention when its name says so or, unnamed (a ``Sequential``'s ``1``), when its
  kernels split heads as only an attention does (``shapes``: q, k, v ``[in, heads,
  head_dim]``, o ``[heads, head_dim, out]``); an MLP when its name says so or its kernels are
  gate and up of one shape and down their transpose."""
  groups: dict[tuple[str, str], dict[str, dict[int, str]]] = {}
  for (parent, base, leaf), members in _families(names, nested=False).items():
    groups.setdefault((parent, base), {})[leaf] = members
  out = {}
  for (parent, _), leaves in groups.items():
    kernels = next((leaves[w] for w in ("kernel", "w") if w in leaves), None)
    if kernels is None:
      continue
    linear = sorted(kernels)  # call order of the modules that multiply
    got = [tuple(shapes.get(kernels[n], ())) for n in linear]
    where = concepts(parent)
    if "attn" in where.tokens or _splits_heads(got):
      fused, roles = "qkv", _ATTENTION_ROLES.get(len(linear))
    elif "mlp" in where.tokens or _gated(got):
      fused, roles = "gate_up", _MLP_ROLES.get(len(linear))
    else:
      continue
    layer = ck.by_layer.get(where.indices, ())
    if roles is None or not any(fused in ck.concepts[k].tokens for k in layer):
      continue
    for members in leaves.values():
      for n, name in members.items():
        if n in kernels:
          out[name] = roles[linear.index(n)]
  return out


def _splits_heads(kernels: list[tuple[int, ...]]) -> bool:
  """Whether an attention's kernels, by their shapes: three or four, q, k, v ``[in, heads,
  head_dim]`` of one ``in`` and ``head_dim``, and o ``[heads, head_dim, out]``."""
  if len(kernels) not in (3, 4) or any(len(s) != 3 for s in kernels):
    return False
  qkv, o = kernels[:3], kernels[3:]
  same = len({s[0] for s in qkv}) == 1 and len({s[2] for s in qkv}) == 1
  return same and all(s[:2] == qkv[0][1:] for s in o)


def _gated(kernels: list[tuple[int, ...]]) -> bool:
  """Whether a gated MLP's kernels, by their shapes: gate and up ``[in, hidden]``, down
  ``[hidden, in]`` (as stored by the target, either orientation)."""
  if len(kernels) != 3 or any(len(s) != 2 for s in kernels):
    return False
  return (
    kernels[0] == kernels[1] and kernels[2] == kernels[0][::-1] and kernels[0][0] != kernels[0][1]
  )
