"""Where a target leaf keeps its axes, next to the stored tensor's: a linear weight ``[in,
out]`` or ``[out, in]`` (its *orientation*: the transpose a candidate needs), and which axis a
stacked leaf keeps its layers on. Read from the config and the target's own shapes, never
guessed: a ``kernel`` is ``[in, out]`` (flax, haiku), anything else (a torch-style ``weight``,
equinox's) is what its shapes say; a square one nothing orients is a question.
"""

from __future__ import annotations

import itertools
from typing import Any

from paramreg_jax._src.match.evidence import Checkpoint
from paramreg_jax._src.match.evidence import is_linear
from paramreg_jax._src.match.evidence import linear_target
from paramreg_jax._src.match.vocabulary import Concepts
from paramreg_jax._src.match.vocabulary import concepts
from paramreg_jax._src.match.vocabulary import is_container


def orientation(
  ck: Checkpoint, target: str, hinted: bool = False, *, decided: bool = True, bare: bool = False
) -> str | None:
  """How a target leaf's linear weight relates to the stored one: ``"t"`` (transposed),
  ``"same"``, ``"conflict"``, or None (unknown: only its shape can orient it, and a square one
  is ambiguous, never guessed).

  The checkpoint's layout (its config, or the non-square ``[in, out]`` leaves' shapes) orients
  a leaf named as flax and haiku name an ``[in, out]`` weight (``kernel``, ``w``); any other
  leaf (a ``weight`` may be ``[out, in]``) is oriented by the other non-square leaves' shapes,
  else by those that evidence already decided (``decided``). A name hint's pairs say it for
  the hinted leaves. A ``bare`` stored parameter (no ``.weight``: CLIP's ``text_projection``,
  used as ``x @ p``) is laid out as its author chose: only the bare ones decided orient it.
  """
  if hinted and ck.hinted_convention:
    return ck.hinted_convention  # what the hinted pairs' own shapes show
  if bare and not hinted:
    return ck.bare_relations.get(in_out_leaf(target))
  if in_out_leaf(target):
    return ck.convention
  if ck.other_relation is not None:
    return ck.other_relation
  return ck.decided_relation if decided else None


def linear_convention(
  slots: list[Any], ck: Checkpoint, hinted: frozenset[str] = frozenset()
) -> tuple[str | None, str | None, str | None, str | None]:
  """How the checkpoint's linear weights relate to the target's: ``(stored, by, other,
  problem)``.

  ``stored`` is the checkpoint's own layout, as the relation to an ``[in, out]`` leaf (flax's
  and haiku's ``kernel``/``w``): ``"t"`` (PyTorch ``[out, in]``) or ``"same"`` (``Conv1D``);
  the config says it for a Hugging Face checkpoint, and those leaves' non-square shapes
  (compared with the tensors of the same name) say it too (``by``: ``"config"``,
  ``"shapes"``). ``other`` is the relation the rest of the target's non-square weights show
  (a leaf named ``weight`` or ``wq`` may be ``[out, in]``: equinox's is), which no config can
  say. ``problem`` if either's evidence disagrees. Only the parameters still undecided vote:
  a hinted one (``hinted``) is the user's to lay out.
  """
  votes: dict[bool, dict[str, list[str]]] = {g: {"t": [], "same": []} for g in (True, False)}
  for slot in slots:
    if slot.name in hinted:
      continue
    tc = concepts(slot.name)
    shape: tuple[int, ...] | None = tuple(slot.shape)
    indices = tc.indices
    if not indices and "layers" in tc.tokens and len(slot.shape) == 3:
      shape, indices = one_layer(tuple(slot.shape), tc, ck), (0,)  # compare with layer 0
    if shape is None or not linear_target(tc, shape) or shape[0] == shape[1]:
      continue
    said: dict[str, list[str]] = {"t": [], "same": []}
    for k in ck.by_layer.get(indices, ()):
      sc, sshape = ck.concepts[k], ck.shapes[k]
      # a bare parameter (CLIP's ``text_projection``, used as ``x @ p``) is no module's weight:
      # its layout is its author's and says nothing of the checkpoint's linear modules
      if not is_linear(sc, sshape) or sc.bare or sc.similarity(tc) < 0.75:
        continue
      if sshape == shape:
        said["same"].append(f"{k} {sshape} = {slot.name}")
      elif sshape[::-1] == shape:
        said["t"].append(f"{k} {sshape} = transposed {slot.name}")
    if said["t"] and said["same"]:
      continue  # named alike both ways (equinox's mlp/layers/0: c_fc as stored, c_proj turned)
    for relation, pairs in said.items():
      votes[in_out_leaf(slot.name)][relation] += pairs
  stored, by, problem = _agreed(votes[True], ck.facts.convention, ck.facts.model_type)
  other, _, other_problem = _agreed(votes[False], None, None)
  return stored, by, other, problem or other_problem


def scan_axis(
  slots: list[Any], ck: Checkpoint, per_layer: frozenset[str] = frozenset()
) -> int | None:
  """Where the target's stacked leaves keep their layers: 0 (``nnx.scan``, ``nn.scan``'s
  default) or 1 (MaxText's ``param_scan_axis``, experts in front), as every stacked leaf
  (named ``layers``, or hinted one tensor per layer: ``per_layer``) whose sizes allow only one
  reading says, or, first, the one axis on which all the leaves of each stack have one size;
  None if none does or they disagree (both are then offered, and a leaf both fit is a
  question, never a pick)."""
  counts = {1 + max(i[0] for i in by_index) for by_index in ck.templates.values()}
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
  counts = {1 + max(i[0] for i in by_index) for by_index in ck.templates.values()} - {0, 1}
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


def one_layer(shape: tuple[int, ...], tc: Concepts, ck: Checkpoint) -> tuple[int, ...] | None:
  """One layer's shape of a stacked target leaf (``shape`` itself for any other), or None when
  where its layers are is not known."""
  if tc.indices or "layers" not in tc.tokens or len(shape) < 2:
    return shape
  if ck.scan_axis is None:
    return None
  return shape[: ck.scan_axis] + shape[ck.scan_axis + 1 :]


def in_out_leaf(name: str) -> bool:
  """Whether a target leaf's name says it is ``[in, out]`` (flax's ``kernel``, haiku's ``w``)."""
  return name.rsplit("/", 1)[-1] in IN_OUT_LEAVES


IN_OUT_LEAVES = frozenset({"kernel", "w"})  # flax's and haiku's [in, out] linear weights


def _agreed(
  votes: dict[str, list[str]], said: str | None, model_type: str | None
) -> tuple[str | None, str | None, str | None]:
  """``(relation, by, problem)`` from the shapes' votes and what the config ``said``."""
  shapes_say = [c for c in ("t", "same") if votes[c]]
  if said and (not shapes_say or shapes_say == [said]):
    return said, ("shapes" if shapes_say else "config"), None
  if not said and len(shapes_say) <= 1:
    return (shapes_say[0] if shapes_say else None), ("shapes" if shapes_say else None), None
  against = votes["same" if said == "t" else "t"] if said else votes["same"]
  problem = (
    "the checkpoint's linear weights have no single orientation: "
    + (f"its config.json ({model_type}) says {_ORIENT[said]}, but " if said else "")
    + f"{'; '.join(against[:2])}"
    + (f"; while {'; '.join(votes['t'][:2])}" if not said else "")
    + ". No linear weight is assigned; check the target's kernel layouts, or pass hints"
  )
  return "conflict", "shapes", problem


_ORIENT = {"t": "[out, in] (torch.nn.Linear)", "same": "[in, out] (Conv1D)"}


def decided_relation(
  slots: list[Any],
  decided: dict[str, Any],
  ck: Checkpoint,
  *,
  in_out: bool = False,
  bare: bool = False,
) -> str | None:
  """How the target's non-square linear weights that evidence or a name hint decided relate
  to their stored tensors, if they all agree: ``"t"`` (transposed) or ``"same"``; what orients
  the square ones no config can. ``in_out``: of the leaves named ``kernel``/``w`` (then it is
  the checkpoint's own layout, for a checkpoint without a config whose names matched too
  loosely to vote), else of the others. Only decided leaves of that kind count, never
  candidates still open (nor a recipe given as a hint: it is the user's to lay out). ``bare``:
  of the stored parameters with no kind word (laid out as their author chose), else of the
  linear modules' weights."""
  said = set()
  for slot in slots:
    if in_out_leaf(slot.name) != in_out:
      continue
    p = decided.get(slot.name)
    if p is None or p.recipe is None or p.reason == "hint" or not p.keys:
      continue
    if len({ck.shapes.get(k) for k in p.keys}) != 1:
      continue  # one tensor, or one per layer of one shape
    tc = concepts(slot.name)
    stored = ck.shapes.get(p.keys[0])
    shape = tuple(slot.shape) if len(slot.shape) != 3 else one_layer(tuple(slot.shape), tc, ck)
    if stored is not None and len(stored) == len(slot.shape) == 3:
      if "experts" in ck.concepts[p.keys[0]].tokens:  # [E, out, in] per expert, as one tensor
        shape, stored = tuple(slot.shape)[1:], stored[1:]
    if shape is None:
      continue  # a stacked kernel whose layers' axis is not known
    if stored is None or len(shape) != 2 or shape[0] == shape[1] or not linear_target(tc, shape):
      continue
    if not is_linear(ck.concepts[p.keys[0]], stored) or ck.concepts[p.keys[0]].bare != bare:
      continue
    if stored == shape:
      said.add("same")
    elif stored[::-1] == shape:
      said.add("t")
  return said.pop() if len(said) == 1 else None


def hinted_convention(slots: list[Any], ck: Checkpoint, named: dict[str, list[str]]) -> str | None:
  """The orientation the name-hinted pairs show by their non-square shapes, if they agree."""
  said = set()
  for slot in slots:
    keys = named.get(slot.name)
    shape = tuple(slot.shape)
    if keys and len(keys) > 1 and len(shape) >= 3:  # one tensor per layer, stacked
      at = ck.scan_axis
      if at is None or shape[at] != len(keys):
        continue
      shape = shape[:at] + shape[at + 1 :]
    shape = shape[-2:]
    if not keys or len(shape) < 2 or shape[0] == shape[1]:
      continue
    if not linear_target(concepts(slot.name), shape):
      continue
    for k in keys:
      if is_linear(ck.concepts[k], ck.shapes[k]):
        if ck.shapes[k] == shape:
          said.add("same")
        elif ck.shapes[k][::-1] == shape:
          said.add("t")
  return said.pop() if len(said) == 1 else None
