"""Coherence: evidence that spans parameters.

- **Module coherence.** The leaves of one target module (``attn/o/kernel`` and
  ``attn/o/bias``; a norm's ``scale`` and ``bias``) come from one checkpoint module
  (``self_attn.o_proj.weight`` and ``self_attn.o_proj.bias``). A leaf its name leaves open is
  settled by a sibling that was decided (by name, by shape, or by a hint); siblings decided from
  different checkpoint modules are a refusal.
- **Layer consistency.** The relative choice made in one layer holds in every layer: a leaf
  left open in one layer takes the choice the other layers agree on; layers that disagree are
  a refusal.

Both only ever pick among a leaf's own candidates, and only when the other leaves' choice
singles one out: that is evidence, never elimination.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from collections.abc import Collection
from collections.abc import Hashable
from collections.abc import Iterable
from collections.abc import Mapping

from paramreg_jax._src.match import vocabulary
from paramreg_jax._src.match.candidates import Candidate
from paramreg_jax._src.match.candidates import distinct

# The last component of a leaf that only says its kind: its module is its parent.
KIND_WORDS = frozenset(
  {
    "weight",
    "kernel",
    "scale",
    "embedding",
    "bias",
    "beta",
    "gamma",
    "g",
    "w",
    "b",
    "offset",
    "shift",
    # a batch norm's running statistics (torch, keras; flax's batch_stats)
    *("running_mean", "running_var", "moving_mean", "moving_variance", "mean", "var"),
  }
)
_SPLIT = re.compile(r"[./]")
_PARTS = re.compile(r"([./]|~1)")  # ~1: an escaped "/" inside a component (haiku's "/~/")


def target_module(name: str) -> str | None:
  """``layers/0/attn/o`` for ``layers/0/attn/o/kernel``; None for a leaf named for itself. A
  haiku batch norm keeps its statistics in moving averages under it
  (``bn/~/mean_ema/average``): they are the norm's own.

  Examples:
    >>> target_module("net/~/bn_0/~/mean_ema/average") == target_module("net/~/bn_0/scale")
    True
  """
  head, _, last = name.rpartition("/")
  if last == "average":
    for ema in ("/~/mean_ema", "/~/var_ema", "~1~0~1mean_ema", "~1~0~1var_ema"):
      if head.endswith(ema):
        return head[: -len(ema)]
  return head if head and last.lower() in KIND_WORDS else None


# the collections flax keeps beside a module's parameters, under the same module path
_COLLECTIONS = frozenset({"params", "batch_stats"})


def without_collection(path: str) -> str:
  """A target path without its flax collection: ``batch_stats/Block_0/BatchNorm_0`` is the
  module ``params/Block_0/BatchNorm_0`` is (a batch norm's statistics and its scale)."""
  first, _, rest = path.partition("/")
  return rest if first in _COLLECTIONS and rest else path


def _one_module(name: str) -> str | None:
  module = target_module(name)
  return None if module is None else without_collection(module)


def checkpoint_module(key: str) -> str:
  """``model.layers.0.self_attn.o_proj`` for ``model.layers.0.self_attn.o_proj.weight``; a
  weight stored under its module's own name has its bias as a ``_bias`` sibling (gpt-oss's
  and transformers 5's fused experts: ``experts.gate_up_proj`` and
  ``experts.gate_up_proj_bias``), one module. A ``_bias`` named for no module the vocabulary
  knows is its parent's (DeepSeek-V3's router ``mlp.gate.e_score_correction_bias``)."""
  if ".parametrizations." in key:  # torch's weight norm: conv.parametrizations.weight.original1
    return key.split(".parametrizations.")[0]
  if key.endswith((".weight_g", ".weight_v")):  # the same, as older torch saves it
    return key[: -len(".weight_g")]
  parts = _SPLIT.split(key)
  if len(parts) > 1 and parts[-1].lower() in KIND_WORDS:
    return key[: -len(parts[-1]) - 1]
  stripped = _SIBLING_KIND.sub("", key)
  if stripped != key and len(parts) > 1 and not vocabulary.known(_SPLIT.split(stripped)[-1]):
    return key[: -len(parts[-1]) - 1]
  return stripped


_SIBLING_KIND = re.compile(r"_(bias|weight)$", re.IGNORECASE)


def modules(keys: Iterable[str]) -> frozenset[str]:
  """The checkpoint modules of ``keys``, each module's own word read as its concept: BEiT's
  and VideoMAE's ``attention.q_bias`` is the bias of ``attention.query``.

  Examples:
    >>> modules(["a.attention.q_bias"]) == modules(["a.attention.query.weight"])
    True
    >>> modules(["a.attention.q_bias"]) == modules(["a.attention.key.weight"])
    False
  """
  return frozenset(_as_concept(checkpoint_module(k)) for k in keys)


def _literal(keys: Iterable[str]) -> frozenset[str]:
  return frozenset(checkpoint_module(k) for k in keys)


@functools.lru_cache(maxsize=65536)
def _as_concept(module: str) -> str:
  parent, _, last = module.rpartition(".")
  tokens = vocabulary.concepts(last).tokens - {"w", "b"} if vocabulary.known(last) else None
  return f"{parent}.<{'+'.join(sorted(tokens))}>" if tokens else module


@functools.lru_cache(maxsize=262144)
def template(name: str) -> str:
  """A name with its layer and expert numbers as ``#`` (``layers/3``, ``layers_3``,
  ``experts.7``, torchvision's stage and block ``layer2.1``: ``layer#.#``; not the ``1`` of
  ``conv1`` or ``norm_1``, nor a sequential's module number after the layer's: ``h_0/2/scale``
  is ``h_#/2/scale``)."""
  parts = _PARTS.split(name)
  seen, inside, previous, staged = False, False, "", False
  stacked = False  # under a stack no number names (vocabulary's rule)
  for i, part in enumerate(parts):
    if part in (".", "/", "~1"):
      continue
    if part.isdigit() and (
      not previous or staged or vocabulary.indexes(previous, not seen and not inside, inside)
    ):
      parts[i], seen, inside = "#", True, False
    elif vocabulary.is_container(part, seen) or (not seen and vocabulary.is_stage(part)):
      # layers_3, DecoderLayer_0; torchvision's stage layer2 (its next number: a block's)
      staged = not seen and vocabulary.is_stage(part)
      parts[i], seen, inside, previous = part.rstrip("0123456789") + "#", True, False, part
      continue
    else:
      inside = inside or ((seen or stacked) and vocabulary.in_role(part))
      stacked = stacked or "layers" in vocabulary.concepts(part).tokens
    previous, staged = part, False
  return "".join(parts)


def settle_by_module(
  open_: Mapping[str, list[Candidate]],
  decided: Mapping[str, tuple[str, ...]],
) -> dict[str, tuple[Candidate, str]]:
  """Open leaves (``{name: every candidate}``) that a decided sibling settles:
  ``{name: (candidate, sibling)}``. ``decided`` maps every decided leaf to its keys. A
  module's leaves are its variables in every flax collection (``params/bn/scale`` and
  ``batch_stats/bn/mean``); of several candidates in the sibling's checkpoint module, the
  one best named is taken."""
  siblings: dict[str, list[str]] = {}
  for name, keys in decided.items():
    module = _one_module(name)
    if module is not None and keys:
      siblings.setdefault(module, []).append(name)
  out = {}
  for name, cands in open_.items():
    module = _one_module(name)
    if module is None or module not in siblings:
      continue
    wanted = {modules(decided[s]) for s in siblings[module]}
    if len(wanted) != 1:
      continue  # the siblings disagree: reported by module_conflicts
    (want,) = wanted
    fits = distinct([c for c in cands if modules(c.keys) == want])
    # a module of the very sibling's path before one only its concept makes the same (a
    # conv module's batch_norm and layer_norm are both its norm; q_bias is query's)
    literal = {_literal(decided[s]) for s in siblings[module]}
    same = [c for c in fits if len(literal) == 1 and _literal(c.keys) in literal]
    fits = same or fits
    # in one module, the name tells its parameters apart (a batch norm's ``scale`` is its
    # ``weight``, not its ``running_mean`` of the same shape)
    if len(fits) > 1 and (best := _best_named(fits)) is not None:
      fits = [best]
    if len(fits) == 1:
      out[name] = (fits[0], sorted(siblings[module])[0])
  return out


def settle_by_subtree(
  open_: Mapping[str, list[Candidate]],
  decided: Mapping[str, tuple[str, ...]],
  top: Callable[[list[Candidate]], list[Candidate]],
  hinted: Collection[str] = (),
) -> dict[str, tuple[Candidate, str]]:
  """Open leaves that the decided leaves around their module settle: ``{name: (candidate,
  a decided leaf)}``.

  A leaf whose own module has no decided leaf (``blocks/3/dw/bn/scale``) is aligned by its
  nearest enclosing module that has (``blocks/3/dw``, whose ``conv/kernel`` came from
  ``layer.3.conv_3x3.convolution.weight``): the leaves of one target subtree come from one
  checkpoint subtree. Of its candidates outside the decided leaves' own checkpoint modules
  (those are other target modules'), the ones that lie deepest inside the checkpoint subtree
  of each decided leaf (under ``layer.3.conv_3x3``, not ``layer.3.expand_1x1``) are kept, and
  the one best named among them is taken (``normalization.weight`` for a ``scale``). Decided
  leaves that point into different subtrees, candidates all as deep, or a tie by name among
  the deepest single out nothing; a leaf a hint decided (``hinted``) is the user's word
  about that leaf, not an anchor for the rest.

  Where that settles nothing, a sibling module named alike (``initial_conv`` beside
  ``initial_batchnorm``: a word no other sibling has) anchors it, but only where every
  candidate is of one checkpoint module beside the sibling's in their unit
  (``embedder.normalization`` beside ``embedder.convolution``).

  Examples:
    >>> from paramreg_jax._src.match.candidates import Candidate
    >>> def cand(k):
    ...   return Candidate(0.5, (k,), "name", None)
    >>> open_ = {"b/dw/bn/scale": [cand("l.conv_3x3.norm.weight"), cand("l.expand.norm.weight")]}
    >>> decided = {"b/dw/conv/kernel": ("l.conv_3x3.conv.weight",)}
    >>> got = settle_by_subtree(open_, decided, lambda c: c)
    >>> got["b/dw/bn/scale"][0].keys, got["b/dw/bn/scale"][1]
    (('l.conv_3x3.norm.weight',), 'b/dw/conv/kernel')
    >>> open_ = {"net/initial_bn/scale": [cand("stem.unit.norm.weight")]}
    >>> decided = {"net/initial_conv/w": ("stem.unit.conv.weight",), "net/head/w": ("fc.weight",)}
    >>> settle_by_subtree(open_, decided, lambda c: c)["net/initial_bn/scale"][1]
    'net/initial_conv/w'
  """
  out = {}
  anchored = {unescaped(n): n for n, k in decided.items() if k and n not in hinted}
  every_module = {unescaped(target_module(n) or n) for n in (*decided, *open_)}
  for name, cands in open_.items():
    module = unescaped(target_module(name) or name)  # a bare leaf (time_mix_k) is its own
    pick = _inside(cands, _nearest_decided(module, anchored), decided, top)
    if pick is None and target_module(name) is not None:
      # a sibling named alike says only which module of its unit, not where in a subtree
      pick = _inside(cands, _named_sibling(module, anchored, every_module), decided, None)
    if pick is not None:
      out[name] = pick
  return out


def _inside(
  cands: list[Candidate],
  anchors: list[str],
  decided: Mapping[str, tuple[str, ...]],
  top: Callable[[list[Candidate]], list[Candidate]] | None,
) -> tuple[Candidate, str] | None:
  """The candidate the decided leaves ``anchors`` single out (see :func:`settle_by_subtree`),
  with the anchor to name; with no ``top``, only one of the module beside theirs in a unit."""
  if not anchors:
    return None
  keys = [_components(k) for a in anchors for k in decided[a]]
  taken = {_components(m) for a in anchors for m in modules(decided[a])}
  every = distinct(cands)
  depth = [
    (min(_shared(_components(k), d) for k in c.keys for d in keys), c)
    for c in every
    if not any(_components(m)[: len(t)] == t for m in modules(c.keys) for t in taken)
  ]
  if len({d for d, _ in depth}) < 2:
    # nothing outside to narrow away; where every candidate is of one module beside the
    # decided leaves' in their unit (a conv's unit: the norm beside it; not a layer, whose
    # modules are many), it is that module's best named tensor, as in module coherence
    pick = _best_named([c for _, c in depth])
    if pick is not None and _beside_in_unit(depth, taken):
      return pick, sorted(anchors)[0]
    return None
  if top is None:
    return None
  best = max(d for d, _ in depth)
  inside = top([c for d, c in depth if d == best])  # the best names among them
  if len(inside) != 1:
    return None
  (pick,) = inside
  # the subtree decides only what the names left open: some other candidate is named as
  # well, and every such one lies outside or in a decided leaf's own module (a leaf open
  # for another reason, two leaves wanting its best name, is no question of where)
  rivals = {id(c) for c in every if c is not pick and c.score >= pick.score}
  inside_too = [d for d, c in depth if id(c) in rivals and d >= best]
  if rivals and not inside_too:
    return pick, sorted(anchors)[0]
  return None


def _beside_in_unit(depth: list[tuple[float, Candidate]], taken: set[tuple[str, ...]]) -> bool:
  """Whether the candidates are all of one checkpoint module, in the unit (below a layer's
  number and the model's own prefix) that holds the decided leaves' modules."""
  units = {t[:-1] for t in taken}
  owners = {modules(c.keys) for _, c in depth}
  if len(units) != 1 or len(owners) != 1:
    return False
  (unit,) = units
  (owner,) = owners
  inside = all(_components(m)[:-1] == unit for m in owner)
  return inside and len(unit) >= 2 and unit[-1] != "#"


def _best_named(cands: list[Candidate]) -> Candidate | None:
  """The one candidate named better than every other (``cands`` best first), or None."""
  if not cands or (len(cands) > 1 and cands[1].score >= cands[0].score):
    return None
  return cands[0]


def _nearest_decided(module: str, decided: Mapping[str, str]) -> list[str]:
  """The decided leaves (``{path: name}``) under the nearest module enclosing ``module`` that
  has any, below a layer (not the whole model, nor a layer: they enclose every kind of
  module, and the ones decided first say little of where the rest are)."""
  parts = module.split("/")
  for up in range(len(parts) - 1, 0, -1):
    here, outer = "/".join(parts[:up]), "/".join(parts[: up - 1])
    if vocabulary.concepts(here).indices != vocabulary.concepts(outer).indices:
      return []  # a layer (its number just read): above the modules of one unit
    prefix = here + "/"
    found = [n for path, n in decided.items() if path.startswith(prefix)]
    if found:
      return found
  return []


def _named_sibling(module: str, decided: Mapping[str, str], every: Collection[str]) -> list[str]:
  """The decided leaves (``{path: name}``) of the one sibling module that shares a word with
  ``module`` that no other module among ``every`` beside them has (``initial_conv`` for
  ``initial_batchnorm``; not ``batchnorm_0`` for ``batchnorm_1``: numbers pair nothing, nor
  do two of one kind, and a word three siblings share pairs none of them)."""
  parent, _, own = module.rpartition("/")
  prefix = parent + "/" if parent else ""
  siblings = {m[len(prefix) :].partition("/")[0] for m in every if m.startswith(prefix)}
  mine = _plain_words(own)
  pairs = set()
  for word in mine:
    # a sibling of the same words is another of its kind (batchnorm_0), not its partner
    having = [s for s in siblings if s != own and word in _plain_words(s) != mine]
    if len(having) == 1:
      pairs.add(having[0])
  if len(pairs) != 1:
    return []
  (sibling,) = pairs
  return [n for path, n in decided.items() if path.startswith(prefix + sibling + "/")]


def _plain_words(component: str) -> frozenset[str]:
  """A module name's words that are not numbers: ``initial_batchnorm`` -> initial, batchnorm."""
  return frozenset(w.lower() for w in re.split(r"[_\-\d]+", component) if len(w) > 1)


def unescaped(name: str) -> str:
  """A target name with haiku's ``/~/`` module separators (escaped in one key: ``~1~0~1``) as
  plain ones: ``net~1~0~1initial_batchnorm/scale`` is ``net/initial_batchnorm/scale``."""
  return name.replace("~1~0~1", "/").replace("/~/", "/")


def _components(key: str) -> tuple[str, ...]:
  """A key's components with its layer numbers as ``#`` (one stack's keys alike)."""
  return tuple(_SPLIT.split(template(key)))


def _shared(a: tuple[str, ...], b: tuple[str, ...]) -> float:
  """How deep ``a`` lies in ``b``'s subtree: the components they share, and half a level more
  where ``a`` goes on in a module named for ``b``'s next one (``ffn1_layer_norm`` beside
  ``ffn1``, ``self_attn_layer_norm`` beside ``self_attn``: that module's own norm)."""
  n = 0
  while n < min(len(a), len(b)) and a[n] == b[n]:
    n += 1
  named_for = n < min(len(a), len(b)) - 1 and a[n].startswith(b[n] + "_")
  return n + 0.5 if named_for else n


def module_conflicts(decided: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
  """``{leaf: problem}`` for the leaves of a target module decided from different checkpoint
  modules."""
  by_module: dict[str, list[str]] = {}
  for name, keys in decided.items():
    module = _one_module(name)
    if module is not None and keys:
      by_module.setdefault(module, []).append(name)
  out = {}
  for module, names in by_module.items():
    if len(names) < 2 or len({modules(decided[n]) for n in names}) < 2:
      continue
    said = "; ".join(f"{n} <- {_shown_modules(decided[n])}" for n in sorted(names))
    for n in names:
      out[n] = (
        f"{n}: the leaves of {module!r} would come from different checkpoint modules ({said}); "
        "the leaves of one module come from one checkpoint module: give a hint for the one "
        "that is wrong"
      )
  return out


def settle_by_layer(
  open_: Mapping[str, list[Candidate]],
  decided: Mapping[str, tuple[str, ...]],
  offered: Callable[[str], Hashable] = lambda name: None,
) -> dict[str, tuple[Candidate, str]]:
  """Open leaves of per-layer targets that the agreed choice of the other layers settles,
  those ``offered`` the same choices (a block without the module the others have chooses
  among other tensors): ``{name: (candidate, a layer's leaf that made that choice)}``."""
  groups = _by_template(decided)
  out = {}
  for name, cands in open_.items():
    alike = [n for n in groups.get(template(name), ()) if offered(n) == offered(name)]
    choice = _choices(alike, decided)
    if len(choice) != 1:
      continue
    (want,) = choice
    fits = distinct([c for c in cands if key_template(c.keys) == want])
    if len(fits) == 1:
      out[name] = (fits[0], alike[0])
  return out


def layer_conflicts(
  decided: Mapping[str, tuple[str, ...]],
  offered: Callable[[str], Hashable] = lambda name: None,
) -> dict[str, str]:
  """``{leaf: problem}`` for per-layer leaves whose layers chose differently, among the
  layers that ``offered`` the leaf the same choices (the templates of its candidates): where
  a block lacks a module the others have (EfficientNet's first, without an expansion), its
  ``BatchNorm_0`` has other tensors to choose from, and is another module's norm, rightly."""
  out = {}
  for every in _by_template(decided).values():
    if len(_choices(every, decided)) < 2:
      continue
    kinds: dict[Hashable, list[str]] = {}
    for n in every:
      kinds.setdefault(offered(n), []).append(n)
    for names in kinds.values():
      if len(_choices(names, decided)) >= 2:
        out.update(_disagree(names, decided))
  return out


def _disagree(names: list[str], decided: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
  said = "; ".join(f"{n} <- {', '.join(decided[n][:2])}" for n in sorted(names)[:4])
  return {
    n: (
      f"{n}: the layers chose differently ({said}); a choice made in one layer holds in "
      f"every layer: give one hint for all of them, hints={{{template(n).replace('#', '{i}')!r}"
      ": '<checkpoint name with {i}>'}"
    )
    for n in names
  }


def key_template(keys: tuple[str, ...]) -> tuple[str, ...]:
  return tuple(sorted({template(k) for k in keys}))


def _by_template(decided: Mapping[str, tuple[str, ...]]) -> dict[str, list[str]]:
  """The decided per-layer leaves by their template (``layers_#/attn/q/kernel``)."""
  groups: dict[str, list[str]] = {}
  for name, keys in decided.items():
    if keys and template(name) != name:
      groups.setdefault(template(name), []).append(name)
  return groups


def _choices(names: list[str], decided: Mapping[str, tuple[str, ...]]) -> set[tuple[str, ...]]:
  """The checkpoint templates the layers of one leaf chose."""
  return {key_template(decided[n]) for n in names}


def _shown_modules(keys: tuple[str, ...]) -> str:
  mods = sorted(modules(keys))
  return ", ".join(repr(m) for m in mods[:2]) + (f" .. ({len(mods)})" if len(mods) > 2 else "")


def offered_by(
  ranked: Mapping[str, list[Candidate]],
) -> Callable[[str], frozenset[tuple[str, ...]]]:
  """A leaf's choices, each as its layer template: what layers offered alike have in
  common (``coherence.settle_by_layer``, ``layer_conflicts``)."""

  @functools.cache
  def offered(name: str) -> frozenset[tuple[str, ...]]:
    return frozenset(key_template(c.keys) for c in ranked.get(name, ()))

  return offered
