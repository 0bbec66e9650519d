"""Where a target leaf keeps its axes, next to the stored tensor's: a linear weight ``[in,
out]`` or ``[out, in]`` (its *orientation*: the transpose a candidate needs). Read from the config and the target's own shapes, never
guessed: a ``kernel`` is ``[in, out]`` (flax, haiku), anything else (a torch-style ``weight``,
equinox's) is what its shapes say; a square one nothing orients is a question.
"""

from __future__ import annotations

import math
from typing import Any

from paramreg_jax._src.match.evidence import Checkpoint
from paramreg_jax._src.match.evidence import is_linear
from paramreg_jax._src.match.evidence import linear_target
from paramreg_jax._src.match.vocabulary import Concepts
from paramreg_jax._src.match.vocabulary import concepts
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.sources.selection import Indices
from paramreg_jax._src.sources.selection import Range


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
  ``"shapes"``), else its conv kernels' (:func:`_conv_votes`). ``other`` is the relation the
  rest of the target's non-square weights show (a leaf named ``weight`` or ``wq`` may be
  ``[out, in]``: equinox's is), which no config can say. ``problem`` if either's evidence disagrees. Only the parameters still undecided vote:
  a hinted one (``hinted``) is the user's to lay out.
  """
  votes: dict[bool, dict[str, list[str]]] = {g: {"t": [], "same": []} for g in (True, False)}
  convs: dict[str, list[str]] = {"t": [], "same": []}  # heard where nothing else speaks
  for slot in slots:
    if slot.name in hinted:
      continue
    tc = concepts(slot.name)
    shape: tuple[int, ...] | None = tuple(slot.shape)
    indices = tc.indices
    if not indices and "layers" in tc.tokens and len(slot.shape) == 3:
      shape, indices = one_layer(tuple(slot.shape), tc, ck), (0,)  # compare with layer 0
    if in_out_leaf(slot.name) and shape is not None and len(shape) == 4:
      _conv_votes(convs, slot.name, shape, tc, indices, ck)
      continue
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
  if not ck.facts.convention and not any(votes[True].values()):
    votes[True] = convs
  stored, by, problem = _agreed(votes[True], ck.facts.convention, ck.facts.model_type)
  other, _, other_problem = _agreed(votes[False], None, None)
  return stored, by, other, problem or other_problem


def _conv_votes(
  votes: dict[str, list[str]],
  name: str,
  shape: tuple[int, ...],
  tc: Concepts,
  indices: tuple[int, ...],
  ck: Checkpoint,
) -> None:
  """What a conv kernel (flax's and haiku's ``[h, w, in, out]``, ``in != out``) says of the
  checkpoint's linear weights: stored ``[out, in, h, w]`` (PyTorch's and equinox's), the
  framework keeps its linear weights ``[out, in]`` too (``"t"``); stored as the kernel is (a
  JAX or TensorFlow checkpoint), ``[in, out]`` (``"same"``). Every framework lays out its
  convs and its linear weights alike, in or out first; this orients the square attention
  weights of a model whose only non-square weights are convs (a diffusion VAE). Heard only
  where neither the config nor a linear weight's shape says it (GPT-2's ``Conv1D`` keeps its
  linear weights ``[in, out]`` whatever a conv beside them would say)."""
  if shape[2] == shape[3]:
    return
  for k in ck.by_layer.get(indices, ()):
    sc, sshape = ck.concepts[k], ck.shapes[k]
    if sc.kind != "w" or sc.bare or sc.similarity(tc) < 0.75:
      continue
    if sshape == (shape[3], shape[2], shape[0], shape[1]):
      votes["t"].append(f"{k} {sshape} = {name} as [out, in, h, w]")
    elif sshape == shape:
      votes["same"].append(f"{k} {sshape} = {name}")


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
    if stored is not None and len(stored) == len(shape) + 1:  # a scanned checkpoint's
      layers = ck.target_layers.get(slot.name, 0)
      if len(slot.shape) == len(stored):  # into a stacked leaf: as many as it has
        layers = math.prod(slot.shape) // max(math.prod(shape), 1)
      stored = ck.one_layer(stored, layers)
    if stored is None or len(shape) != 2 or not linear_target(tc, shape):
      continue
    if not is_linear(ck.concepts[p.keys[0]], stored) or ck.concepts[p.keys[0]].bare != bare:
      continue
    if stored != shape and (part := _part_relation(p.recipe, len(ck.shapes[p.keys[0]]))):
      said.add(part)  # rows cut along the out axis: square or not, its place is known
    elif shape[0] == shape[1]:
      continue
    elif stored == shape:
      said.add("same")
    elif stored[::-1] == shape:
      said.add("t")
  return said.pop() if len(said) == 1 else None


def _part_relation(recipe: ops.Recipe, rank: int) -> str | None:
  """How a part of a fused tensor relates to it (``"t"``, ``"same"``), or None if ``recipe``
  is no such part: rows cut from each layer's tensor along one of its last two axes (its out
  axis: a part of a fused tensor is some of its outputs), turned or not, and nothing else."""
  cuts, turned = set(), False
  for node in ops.nodes(recipe):
    if isinstance(node, ops.Source):
      if not isinstance(node.selection, (Range, Indices)) or node.selection.axis < rank - 2:
        return None
      cuts.add(node.selection.axis)
    elif isinstance(node, ops.Transpose):
      turned = True
    elif not isinstance(node, (ops.Stack, ops.Cast)):
      return None
  return ("t" if turned else "same") if len(cuts) == 1 else None


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
