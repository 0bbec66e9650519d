"""``match()``: the pipeline of the package (see ``__init__``), with its hints and checks."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from paramreg_jax._src import api_types
from paramreg_jax._src import errors
from paramreg_jax._src.match import axes
from paramreg_jax._src.match import candidates as cand_lib
from paramreg_jax._src.match import config_facts
from paramreg_jax._src.match import decide
from paramreg_jax._src.match import evidence
from paramreg_jax._src.match import hints as hints_lib
from paramreg_jax._src.match import kept
from paramreg_jax._src.match import layer_mismatch
from paramreg_jax._src.match import numbering
from paramreg_jax._src.match import order
from paramreg_jax._src.match import quantized
from paramreg_jax._src.match import refusal
from paramreg_jax._src.match import shares as shares_lib
from paramreg_jax._src.match import stacks
from paramreg_jax._src.match import towers
from paramreg_jax._src.match import unnumbered
from paramreg_jax._src.match import vocabulary
from paramreg_jax._src.match.proposal import Match
from paramreg_jax._src.match.proposal import Proposal
from paramreg_jax._src.match.vocabulary import concepts
from paramreg_jax._src.recipes import inference
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.restore import planning
from paramreg_jax._src.restore import target as target_lib
from paramreg_jax._src.sources import checkpoint_source as source_lib


def match(
  target: api_types.PyTree,
  source: source_lib.CheckpointSource,
  *,
  hints: api_types.Hints | None = None,
  config: Mapping[str, Any] | None = None,
  **unexpected: Any,
) -> Match:
  """Proposes the complete recipe set that restores ``target`` from ``source``, from metadata.

  Args:
    target: an abstract tree, linen params, an ``nnx.State``/``nnx.Module`` or an equinox
      module (as :func:`plan_restore` takes).
    source: a checkpoint source (``SafetensorsSource``, ``OrbaxSource``, ...).
    hints: ``{target name: hint}`` for what names and shapes cannot settle. A hint is a
      checkpoint name (``"model.norm.weight"``), a part of one that names it in every layer
      (``"input_layernorm"``, ``"layers.{i}.ln_1"``), and ``match`` derives the transpose,
      stack or split; or a recipe, used as given (checked against the parameter's shape, dtype
      and, where the evidence determines it, the orientation). A target name with ``{i}``
      (``"layers_{i}/norm/scale"``) serves every per-layer module. A fused checkpoint tensor's
      layout is a hint keyed by that tensor or its module, ``{"blocks.{i}.attn.qkv":
      "contiguous"}`` (or ``"per_head"``, ``"per_head:64"`` with its head size,
      ``"grouped"``, ``"blocked_qvk4"``; a gate_up's ``"interleaved"``). The checkpoint layers of a stack that holds some of
      them (MaxText's ``dense_layers`` beside ``moe_layers``) are a hint keyed by the stack,
      ``{"decoder/moe_layers": range(1, 61)}`` (or the layer numbers, ``(1, 3, 5)``), where
      the layers' tensors do not say it. A hint settles the leaf it names and only that: the
      others are decided by the same rules (a kernel's module decides its bias), a tensor a
      hint uses is never given to another leaf by elimination, and ``Match.hint_effects``
      lists what the hints changed elsewhere.
    config: the checkpoint's ``config.json`` as a dict, when the source does not carry it
      (``SafetensorsSource`` reads the one beside its file). It says the fused-tensor layouts,
      head counts and whether the head is tied.

  Returns:
    A :class:`Match`: ``restore(target, source, recipes=match(...))`` works; ``print`` it for
    the table, ``.to_python()`` for the code.

  Raises:
    MatchError: parameters unmatched or ambiguous (each with its ranked candidates;
      ``.partial`` holds what was matched), or the proposal does not plan.

  Examples:
    >>> import jax, numpy as np
    >>> import paramreg_jax as prj
    >>> from paramreg_jax import MemorySource
    >>> src = MemorySource({f"model.layers.{i}.mlp.up_proj.weight": np.zeros((8, 4), np.float32)
    ...                     for i in range(3)})
    >>> target = {"layers": {"mlp": {"up": {"kernel": jax.ShapeDtypeStruct((3, 4, 8), np.float32)}}}}
    >>> print(prj.match(target, src))
    Match: 1 parameters from MemorySource(3 tensors)
      layers/mlp/up/kernel   [name + transpose, stacked 3 layers]
        <- stack(
          3 × transpose(source('model.layers.{i}.mlp.up_proj.weight'), (1, 0)),
          axis=0
        )
  """
  errors.refuse_arguments("match", unexpected, ("hints", "config"))
  source_lib.check_source(source, "match")
  stored = source
  forms = quantized.stored_forms(source, config)
  if forms.values_differ:  # decided on values, read as stored (match/quantized.py)
    quantized.check_forms(forms, source)
    source = quantized.ValuesView(source, forms)
  _check_hints(hints)
  every = _slots(target)
  keys = list(source.keys())
  read = unnumbered.reading([s.name for s in every], keys)
  convs = {read.name(n): flag for n, flag in target_lib.transposed_convs(target).items()}
  try:
    result = _propose(
      read.slots(every), source, stored, forms, keys, read.hints(hints), config, convs
    )
  except errors.MatchError as e:
    if read:
      raise read.error(e) from e
    raise
  result = read.match(result)
  try:
    planning.plan_restore(target, stored, recipes=result)
  except errors.RestorePlanError as e:
    raise errors.MatchError(
      f"the proposed mapping does not plan (a bug in match, or a checkpoint it misreads): {e}",
      e.problems,
      result,
    ) from e
  return result


def _propose(
  every: list[Any],
  source: source_lib.CheckpointSource,
  stored: source_lib.CheckpointSource,
  forms: Any,
  keys: list[str],
  hints: api_types.Hints | None,
  config: Mapping[str, Any] | None,
  convs: dict[str, bool],
) -> Match:
  """The :class:`Match` of the target's slots ``every`` (as :mod:`unnumbered` reads them):
  ``source`` is what is decided on, ``stored`` what the recipes read; ``convs``: how the
  target's transposed convolutions apply their kernels, where the module says it."""
  slots, quantized_weights = kept.collapse(every)
  names = [s.name for s in slots]
  rest, share_hints = hints_lib.split_shares(dict(hints or {}))
  rest, layout_hints = hints_lib.split_layouts(rest, names)
  given = hints_lib.expand(rest, names)
  per_layer = frozenset(n for n, h in given.items() if isinstance(h, str) and "{i}" in h)
  # a counter no parameter stands for (num_batches_tracked) is not evidence: left unused
  weights = [k for k in keys if not vocabulary.bookkeeping(k)]
  ck = _read_checkpoint(slots, source, weights, config, frozenset(given), per_layer, share_hints)
  ck.layouts = hints_lib.layouts(layout_hints, given, ck)
  ck.transposed_convs = convs
  recipe_hints, name_hints = hints_lib.check(given, slots, source, ck)
  ck.hinted_convention = axes.hinted_convention(slots, ck, name_hints)
  proposals, problems, ranked = _oriented(slots, source, ck, recipe_hints, name_hints)
  problems += _heads_against_config(proposals, source, ck, frozenset(given))
  problems[:0] = layer_mismatch.scanned(slots, ck, problems)
  aligned = tuple(sorted(ck.towers.items()))
  changed = (
    _hint_effects(slots, source, ck, proposals, problems, given) if given or ck.layouts else ()
  )
  used = {k for p in proposals.values() for k in p.keys}
  ordered = [proposals[s.name] for s in slots if s.name in proposals]
  if stored is not source:
    ordered = _read_stored(ordered, source, problems)
  ordered = kept.expand(ordered, quantized_weights, stored, problems)
  ignored = [k for k in keys if k not in used]
  if stored is not source:  # what the weights read is used; activation scales are not
    reads = {k for p in ordered if p.recipe is not None for k in inference.source_keys(p.recipe)}
    ignored += sorted(k for k in forms.hidden if k not in reads)
  if not problems:
    problems += layer_mismatch.unused(ignored, ck)
  result = _report(ordered, ignored, stored, ck, changed, aligned, config is not None)
  if problems:
    error = refusal.refuse(problems, ranked, slots, source, ck)
    error.partial = result
    raise error
  return result


def _report(
  ordered: list[Proposal],
  ignored: list[str],
  stored: source_lib.CheckpointSource,
  ck: evidence.Checkpoint,
  changed: tuple[tuple[str, str, str], ...],
  aligned: tuple[tuple[str, str], ...],
  configured: bool,
) -> Match:
  """The :class:`Match` of the proposals, with the evidence it shows."""
  origin = "match(config=...)" if configured else stored.config_origin
  stacks = tuple((r, shares_lib.spans(ls)) for r, ls in sorted(ck.layer_sets.items()))
  facts = ck.facts.rows()
  return Match(ordered, ignored, stored, facts, changed, origin, aligned, ck.numbered, stacks)


def _check_hints(hints: Any) -> None:
  if hints is not None and not isinstance(hints, Mapping):
    raise TypeError(
      f"match: hints must be a mapping {{target name: recipe or checkpoint name}}, got "
      f"{type(hints).__name__} {hints!r:.60}"
    )


# the words of an attention's tensors: a split of theirs into heads is the config's to say
_ATTENTION = frozenset({"q", "k", "v", "o", "qkv", "attn", "xattn"})


def _heads_against_config(
  proposals: dict[str, Proposal],
  source: source_lib.CheckpointSource,
  ck: evidence.Checkpoint,
  hinted: frozenset[str],
) -> list[str]:
  """The problems of the proposals that split an attention tensor into heads other than
  the config's (a target built with 8 heads of 4 over a checkpoint of 4 heads of 8: every
  value lands, and the attention computes something else); those proposals are dropped.
  A leaf the user hinted is theirs."""
  facts = ck.facts
  if not (facts.heads and facts.head_dim):
    return []
  out = []
  for name, p in list(proposals.items()):
    if p.recipe is None or name in hinted:
      continue
    for node in (n for n in ops.nodes(p.recipe) if isinstance(n, ops.Reshape)):
      keys = inference.source_keys(node.input)
      if not any(ck.concepts[k].tokens & _ATTENTION for k in keys if k in ck.concepts):
        continue
      stored = tuple(inference.infer(node.input, source).shape)
      if why := config_facts.heads_split(stored, tuple(node.shape), facts):
        del proposals[name]
        kv = f", {facts.kv_heads} kv heads" if facts.kv_heads not in (None, facts.heads) else ""
        out.append(
          f"{name}: {why}: the target model's head count is not the checkpoint's; build it "
          f"with {facts.heads} heads of {facts.head_dim}{kv} (or, if this split is right, "
          "choose its line below)"
        )
        break
  return out


def _read_stored(ordered: list[Proposal], view: Any, problems: list[str]) -> list[Proposal]:
  """The proposals made on a quantized source's values, reading what it stores."""
  out = []
  for p in ordered:
    if p.recipe is None:
      out.append(p)
      continue
    try:
      recipe = quantized.to_stored(p.recipe, view)
      out.append(dataclasses.replace(p, recipe=recipe, keys=inference.source_keys(recipe)))
    except ValueError as e:
      problems.append(f"{p.target}: {e}")
  return out


def _oriented(
  slots: list[Any],
  source: source_lib.CheckpointSource,
  ck: evidence.Checkpoint,
  recipe_hints: dict[str, ops.Recipe],
  name_hints: dict[str, list[str]],
) -> tuple[dict[str, Proposal], list[str], dict[str, list[cand_lib.Candidate]]]:
  """:func:`_decide`, again where the weights it decided orient the rest: the non-square
  ``kernel``s the checkpoint's layout (without a config or names close enough to vote), the
  other non-square weights the square ones no config can orient."""
  proposals, problems, ranked = _decide(slots, source, ck, recipe_hints, name_hints)
  if problems and ck.convention is None and ck.conflict is None:
    ck.convention = axes.decided_relation(slots, proposals, ck, in_out=True)
    if ck.convention is not None:
      ck.convention_by = "decided"
      proposals, problems, ranked = _decide(slots, source, ck, recipe_hints, name_hints)
  if problems and ck.other_relation is None:
    ck.decided_relation = axes.decided_relation(slots, proposals, ck)
    if ck.decided_relation is not None:
      proposals, problems, ranked = _decide(slots, source, ck, recipe_hints, name_hints)
  if problems and not ck.bare_relations:  # bare parameters by the bare ones decided
    for in_out in (True, False):
      relation = axes.decided_relation(slots, proposals, ck, in_out=in_out, bare=True)
      if relation is not None:
        ck.bare_relations[in_out] = relation
    if ck.bare_relations:
      proposals, problems, ranked = _decide(slots, source, ck, recipe_hints, name_hints)
  return proposals, problems, ranked


def _decide(
  slots: list[Any],
  source: source_lib.CheckpointSource,
  ck: evidence.Checkpoint,
  recipe_hints: dict[str, ops.Recipe],
  name_hints: dict[str, list[str]],
) -> tuple[dict[str, Proposal], list[str], dict[str, list[cand_lib.Candidate]]]:
  """The proposals, the problems and each leaf's candidates, from the evidence and the hints
  (a pure function of them: ``match`` runs it once more without hints to report what the
  hints changed)."""
  proposals = {n: Proposal(n, r, "hint", inference.source_keys(r)) for n, r in recipe_hints.items()}
  names = [s.name for s in slots]
  roles = order.fused_roles(names, ck, {s.name: tuple(s.shape) for s in slots})
  ck.towers = {}
  ranked = _ranked(slots, ck, proposals, name_hints, roles)
  ck.towers = decide.align_towers(slots, ranked, proposals, frozenset(name_hints), ck)
  if ck.towers:  # each tower's leaves again, among their own tower's tensors
    ranked = _ranked(slots, ck, proposals, name_hints, roles)
  problems = [p for p in (ck.conflict, ck.split_problem) if p]
  problems += [
    hints_lib.misfit(s, name_hints[s.name], ck)
    for s in slots
    if s.name in name_hints and not ranked[s.name]
  ]
  problems += decide.choose(slots, ranked, proposals, ck, frozenset(name_hints), roles)
  used = {k for p in proposals.values() for k in p.keys}
  decide.tie_heads(
    slots, ranked, proposals, problems, ck, [k for k in ck.concepts if k not in used]
  )
  _cast_to_targets(slots, proposals, source)
  # the leaves of stacks not given their layers: the one problem is which layers they hold
  problems = [
    x
    for x in problems
    if not any(evidence.in_stack(h, r) for r in ck.unsplit for h in refusal.heads(x))
  ]
  return proposals, problems, ranked


def _ranked(
  slots: list[Any],
  ck: evidence.Checkpoint,
  proposals: dict[str, Proposal],
  name_hints: dict[str, list[str]],
  roles: dict[str, str],
) -> dict[str, list[cand_lib.Candidate]]:
  """Each leaf's candidates; a leaf of a tower aligned with one of the checkpoint's
  (``ck.towers``) among that tower's tensors and those outside every tower, its name read with
  the checkpoint tower's words for its own tower's."""
  ranked: dict[str, list[cand_lib.Candidate]] = {}
  names = [s.name for s in slots]
  views = towers.views(names, ck)
  for slot in slots:
    if slot.name in name_hints:
      ranked[slot.name] = hints_lib.candidates_of(slot, name_hints[slot.name], ck)
    elif slot.name not in proposals:
      view, out, in_ = views.get(slot.name, (ck, frozenset(), frozenset()))
      tc = evidence.target_concepts(slot.name, names, view)
      tokens = tc.tokens - out | in_
      if slot.name in roles:  # Dense_0..3 of an attention over a fused qkv: q, k, v, o
        tokens |= {roles[slot.name].rstrip("?")}
      tc = evidence.gate_and_up(dataclasses.replace(tc, tokens=tokens), tuple(slot.shape), names)
      ranked[slot.name] = cand_lib.candidates(tc, tuple(slot.shape), view)
  return ranked


def _hint_effects(
  slots: list[Any],
  source: source_lib.CheckpointSource,
  ck: evidence.Checkpoint,
  proposals: dict[str, Proposal],
  problems: list[str],
  given: dict[str, Any],
) -> tuple[tuple[str, str, str], ...]:
  """``(target, without the hints, with them)`` for every leaf the hints did not name whose
  outcome they changed."""
  layouts, ck.layouts = ck.layouts, {}
  try:
    base, base_problems, _ = _decide(slots, source, ck, {}, {})
  finally:
    ck.layouts = layouts

  def outcome(props: dict[str, Proposal], probs: list[str], name: str) -> str:
    p = props.get(name)
    if p is not None:
      return f"alias of {p.alias_of}" if p.alias_of else str(p.recipe)
    return "refused" if any(decide.names(x, name) for x in probs) else "undecided"

  out = []
  for s in slots:
    if s.name in given:
      continue
    before, after = outcome(base, base_problems, s.name), outcome(proposals, problems, s.name)
    if before != after:
      out.append((s.name, before, after))
  return tuple(out)


def _slots(target: Any) -> list[Any]:
  _, _, slots = target_lib.slots(target)
  if not slots:
    raise errors.MatchError(
      f"match: the target holds no array parameters (got {type(target).__name__} "
      f"{target!r:.60}); pass an abstract tree (jax.eval_shape or nnx.eval_shape output), "
      "linen params, an nnx.State or nnx.Module, or an equinox module"
    )
  return slots


def _read_checkpoint(
  slots: list[Any],
  source: source_lib.CheckpointSource,
  keys: list[str],
  config: Mapping[str, Any] | None,
  hinted: frozenset[str],
  per_layer: frozenset[str] = frozenset(),
  shares: dict[str, Any] | None = None,
) -> evidence.Checkpoint:
  """Every key folded to concepts once, its shape, and the evidence (config, orientation;
  the orientation from the parameters no hint names; where the stacked leaves keep their
  layers, from those named so and those a ``{i}`` hint stacks, ``per_layer``; which layers
  each stack holds, where stacks split them, and the ``shares`` hints say some)."""
  if config is None:
    config = source.config
  if config is not None and not isinstance(config, Mapping):
    raise TypeError(
      f"match: config must be a mapping (a parsed config.json), got {type(config).__name__}"
    )
  noise = evidence.model_prefix(keys)
  spelled = numbering.spelled_as_target(keys, [s.name for s in slots])
  folded = {k: concepts(k, noise) for k in keys if k not in spelled}
  folded.update({k: dataclasses.replace(concepts(s, noise), name=k) for k, s in spelled.items()})
  folded = numbering.in_lists({k: folded[k] for k in keys})  # in the checkpoint's order
  shapes = {k: source_lib.metadata_of(source, k).shape for k in keys}
  targets = [(s.name, tuple(s.shape)) for s in slots]
  folded, numbered = numbering.across_stages(folded, shapes, targets)
  facts = config_facts.facts_from_config(config)
  folded, grouped, unsplit = numbering.in_groups(folded, targets, facts.layer_types)
  evidence.norm_roles(folded, facts)
  evidence.three_norms(folded)
  evidence.fused_inputs(folded, shapes)
  ck = evidence.Checkpoint(folded, shapes, facts, numbered=numbered)
  templates = collections.Counter(hints_lib.layer_template(s.name) for s in slots)
  ck.target_layers = {s.name: templates[hints_lib.layer_template(s.name)] for s in slots}
  # a target's list of lists numbers layers only where the checkpoint's layers have two
  # numbers too (a stage's and a block's); over layers of one number, the inner list is the
  # layer's own sequence of modules (equinox's ``blocks/3/1/conv``)
  if any(len(c.indices) >= 2 and not c.tokens & {"experts", "heads"} for c in folded.values()):
    ck.listed = numbering.lists_of_lists([s.name for s in slots])
  ck.split_problem, ck.unsplit = grouped, unsplit
  ck.stacks = stacks.stacks(slots, ck)
  stacked = {s.name for s in slots if any(s.name.startswith(f"{p}/") for p in ck.stacks)}
  ck.scan_axis = stacks.scan_axis(slots, ck, per_layer | stacked)
  orientation = axes.linear_convention(slots, ck, hinted)
  ck.convention, ck.convention_by, ck.other_relation, ck.conflict = orientation
  shares_lib.split_layers(slots, ck, shares or {})
  return ck


def _cast_to_targets(
  slots: list[Any], proposals: dict[str, Proposal], source: source_lib.CheckpointSource
) -> None:
  """A stored dtype other than the parameter's becomes an explicit, reported cast (a recipe
  given as a hint is used as given; a name hint's tensor is cast like any other)."""
  for slot in slots:
    p = proposals.get(slot.name)
    if p is None or p.recipe is None or p.reason == "hint":
      continue
    want = np.dtype(slot.dtype)
    if inference.infer(p.recipe, source).dtype != want:
      recipe = ops.cast(p.recipe, want)
      proposals[slot.name] = dataclasses.replace(
        p, recipe=recipe, reason=f"{p.reason}, cast to {want.name}"
      )
