"""``match``: propose the recipes that restore a target from a foreign checkpoint.

From names, shapes and dtypes only (no payload read), ``match`` pairs every target parameter
with the checkpoint tensor(s) it comes from and derives the layout change. The package follows
the concept (data flows down the list):

1. ``vocabulary``: **names** become *concepts*: separators, layer and expert numbers and the
   model's own prefix are split off, and the field's vocabularies are folded (``q_proj``/
   ``query``/``wq`` -> ``q``, ``weight``/``kernel``/``scale``/``embedding`` -> ``w``,
   ``input_layernorm`` -> ``attn norm`` ...). Two names are compared by their overlap.
2. ``evidence``: what the checkpoint says about itself (``config.json``: model type, head
   counts, tied embeddings, fused layouts) and the orientation of its linear weights.
3. ``candidates``: the tensors a layout change can turn into each target: the same shape, a
   transpose, heads split or merged, a conv kernel, one part of a fused tensor, the parts
   joined, each stacked over layers (and experts).
4. ``decide``: **it never guesses**. A target gets a tensor only when that tensor is its single
   best candidate; a fused tensor is split only in a layout known for that checkpoint; a head
   is tied only on evidence; conflicting orientation evidence refuses.
5. ``report``: the :class:`Match` (a ``RecipeSet``): table, HTML, facts, ``to_python``.

``hints`` (checkpoint names, or recipes) settle what the evidence cannot; every proposal is
validated by :func:`plan_restore` before it is returned.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from paramreg_jax._src import api_types
from paramreg_jax._src import errors
from paramreg_jax._src import plan as plan_lib
from paramreg_jax._src import source as source_lib
from paramreg_jax._src import target as target_lib
from paramreg_jax._src.match import candidates as cand_lib
from paramreg_jax._src.match import decide
from paramreg_jax._src.match import evidence
from paramreg_jax._src.match.report import Match
from paramreg_jax._src.match.report import Proposal
from paramreg_jax._src.match.vocabulary import Concepts
from paramreg_jax._src.match.vocabulary import concepts
from paramreg_jax._src.recipes import ops

__all__ = ["Concepts", "Match", "Proposal", "concepts", "match"]


def match(
  target: api_types.PyTree,
  source: source_lib.CheckpointSource,
  *,
  hints: api_types.Hints | None = None,
  config: Mapping[str, Any] | None = None,
) -> Match:
  """Proposes the complete recipe set that restores ``target`` from ``source``, from metadata.

  Args:
    target: an abstract tree, linen params, an ``nnx.State``/``nnx.Module`` or an equinox
      module (as :func:`plan_restore` takes).
    source: a checkpoint source (``SafetensorsSource``, ``OrbaxSource``, ...).
    hints: ``{target name: hint}`` for what names and shapes cannot settle. A hint is a
      checkpoint name (``"model.norm.weight"``), a part of one that names it in every layer
      (``"input_layernorm"``, ``"layers.{i}.ln_1"``), and ``match`` derives the transpose,
      stack or split; or a recipe, used as given (checked against the parameter's shape,
      dtype and the checkpoint's orientation). Hinted keys are not offered to other
      parameters.
    config: the checkpoint's ``config.json`` as a dict, when the source does not carry it
      (``SafetensorsSource`` reads the one beside its file). It says the fused-tensor layouts,
      head counts and whether the head is tied.

  Returns:
    A :class:`Match`: ``restore(target, source, recipes=match(...))`` works; ``print`` it for
    the table, ``.to_python()`` for the code.

  Raises:
    MatchError: some parameters are unmatched or ambiguous (each listed with its ranked
      candidates; ``.partial`` holds what was matched), or the proposal does not plan.

  Examples:
    >>> import jax, numpy as np
    >>> import paramreg_jax as prj
    >>> from paramreg_jax.sources import MemorySource
    >>> src = MemorySource({f"model.layers.{i}.mlp.up_proj.weight": np.zeros((8, 4), np.float32)
    ...                     for i in range(3)})
    >>> target = {"layers": {"mlp": {"up": {"kernel": jax.ShapeDtypeStruct((3, 4, 8), np.float32)}}}}
    >>> print(prj.match(target, src))
    Match: 1 parameters from MemorySource(3 tensors)
      layers/mlp/up/kernel  <- stack(3 × transpose(source('model.layers.{i}.mlp.up_proj.weight'), (1, 0)), axis=0)   [name + transpose, stacked 3 layers]
  """
  source_lib.check_source(source, "match")
  slots = _slots(target)
  if hints is not None and not isinstance(hints, Mapping):
    raise TypeError(
      f"match: hints must be a mapping {{target name: recipe or checkpoint name}}, got "
      f"{type(hints).__name__} {hints!r:.60}"
    )
  keys = list(source.keys())
  full = _read_checkpoint(slots, source, keys, config)
  recipe_hints, name_hints = _check_hints(dict(hints or {}), slots, source, full)
  hinted = {k for r in recipe_hints.values() for k in ops.source_keys(r)}
  hinted |= {k for ks in name_hints.values() for k in ks}
  ck = full.restricted(set(keys) - hinted)
  proposals = {n: Proposal(n, r, "hint", ops.source_keys(r)) for n, r in recipe_hints.items()}
  ranked: dict[str, list[cand_lib.Candidate]] = {}
  for slot in slots:
    if slot.name in name_hints:
      ranked[slot.name] = [
        dataclasses.replace(c, score=1.0 + c.score, reason=f"hint, {c.reason}")
        for c in cand_lib.candidates(
          concepts(slot.name), tuple(slot.shape), full.restricted(set(name_hints[slot.name]))
        )
      ]
    elif slot.name not in proposals:
      ranked[slot.name] = cand_lib.candidates(concepts(slot.name), tuple(slot.shape), ck)
  problems = [full.conflict] if full.conflict else []
  problems += decide.choose(slots, ranked, proposals, ck)
  used = {k for p in proposals.values() for k in p.keys} | hinted
  decide.tie_heads(slots, ranked, proposals, problems, ck, [k for k in keys if k not in used])
  decide.cast_to_targets(slots, proposals, source)
  used = {k for p in proposals.values() for k in p.keys} | hinted
  ordered = [proposals[s.name] for s in slots if s.name in proposals]
  ignored = [k for k in keys if k not in used]
  extra = sorted(
    {ck.concepts[k].indices for k in ignored if k in ck.concepts and ck.concepts[k].indices}
  )
  if extra and not problems:
    layer_keys = [k for k in ignored if k in ck.concepts and ck.concepts[k].indices]
    problems.append(
      f"the checkpoint has layer tensors the target does not use ({len(layer_keys)}, at "
      f"{', '.join(str(list(i)) for i in extra[:6])}): {', '.join(layer_keys[:4])}"
      f"{', ...' if len(layer_keys) > 4 else ''}; a model with fewer layers than the "
      "checkpoint? Pass the unused ones as hints or restore into the full model"
    )
  result = Match(ordered, ignored, source, full.facts.rows())
  if problems:
    raise errors.MatchError(
      errors.collected("match the checkpoint to the target", problems, "nothing was chosen")
      + "\nResolve each with hints={target name: checkpoint name or recipe} (or rename the "
      "target's modules).",
      tuple(problems),
      result,
    )
  try:
    plan_lib.plan_restore(target, source, recipes=result)
  except errors.RestorePlanError as e:
    raise errors.MatchError(
      f"the proposed mapping does not plan (a bug in match, or a checkpoint it misreads): {e}",
      e.problems,
      result,
    ) from e
  return result


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
  slots: list[Any], source: Any, keys: list[str], config: Mapping[str, Any] | None
) -> evidence.Checkpoint:
  """Every key folded to concepts once, its shape, and the evidence (config, orientation)."""
  if config is None:
    config = getattr(source, "config", None)
  if config is not None and not isinstance(config, Mapping):
    raise TypeError(
      f"match: config must be a mapping (a parsed config.json), got {type(config).__name__}"
    )
  noise = evidence.model_prefix(keys)
  folded = {k: concepts(k, noise) for k in keys}
  evidence.gemma2_norms(folded)
  ck = evidence.Checkpoint(
    folded,
    {k: source_lib.metadata_of(source, k).shape for k in keys},
    evidence.facts_from_config(config),
  )
  ck.convention, ck.conflict = evidence.linear_convention(slots, ck)
  return ck


def _check_hints(
  hints: dict[Any, Any], slots: list[Any], source: Any, ck: evidence.Checkpoint
) -> tuple[dict[str, ops.Recipe], dict[str, list[str]]]:
  """Splits hints into recipes (checked: they plan, fit the parameter, and orient linear
  weights as the checkpoint stores them) and checkpoint names (the keys each one names)."""
  hints = {str(k).removeprefix("n:"): v for k, v in hints.items()}
  names = [s.name for s in slots]
  unknown = [h for h in hints if h not in set(names)]
  if unknown:
    raise errors.MatchError(
      "hints name parameters the target does not have: "
      + "; ".join(f"{h!r}{errors.did_you_mean(h, names)}" for h in unknown),
      tuple(unknown),
    )
  by_name = {s.name: s for s in slots}
  recipes: dict[str, ops.Recipe] = {}
  named: dict[str, list[str]] = {}
  bad = []
  for name, hint in hints.items():
    slot = by_name[name]
    if isinstance(hint, str):
      found = _named_keys(hint, list(ck.concepts))
      if not found:
        parts = {p for k in ck.concepts for p in re.split(r"[./]", k)} | set(ck.concepts)
        bad.append(
          f"hint for {name!r}: no checkpoint key is or contains {hint!r}"
          f"{errors.did_you_mean(hint, sorted(parts))}"
        )
      named[name] = found
      continue
    try:
      recipe = ops._check_recipe(hint, f"hint for {name!r}")
      meta = ops.infer(recipe, source)
    except errors.RecipeError as e:
      bad.append(f"hint for {name!r}: {e}")
      continue
    if (meta.shape, meta.dtype) != (tuple(slot.shape), np.dtype(slot.dtype)):
      bad.append(
        f"hint for {name!r}: {recipe} produces {meta}, the parameter is "
        f"{tuple(slot.shape)} {np.dtype(slot.dtype).name}"
      )
      continue
    wrong = _misoriented(name, tuple(slot.shape), recipe, ck)
    if wrong:
      bad.append(wrong)
      continue
    recipes[name] = recipe
  if bad:
    raise errors.MatchError(
      errors.collected("use the hints", bad, "nothing was chosen"), tuple(bad)
    )
  return recipes, named


def _named_keys(hint: str, keys: list[str]) -> list[str]:
  """The checkpoint keys a name hint stands for: the key itself, or every key containing it
  as whole components (``input_layernorm``, ``model.layers.{i}.input_layernorm``)."""
  if hint in keys:
    return [hint]
  pattern = re.escape(hint).replace(re.escape("{i}"), r"\d+")
  rx = re.compile(rf"(^|[./]){pattern}([./]|$)")
  return [k for k in keys if rx.search(k)]


def _misoriented(
  name: str, shape: tuple[int, ...], recipe: ops.Recipe, ck: evidence.Checkpoint
) -> str | None:
  """A hint that reads a linear weight against the checkpoint's orientation (a forgotten
  transpose on a square kernel loads silently wrong)."""
  if ck.convention not in ("t", "same") or not evidence.is_linear(concepts(name), shape[-2:]):
    return None
  linear = [
    k
    for k in ops.source_keys(recipe)
    if k in ck.concepts and evidence.is_linear(ck.concepts[k], ck.shapes[k])
  ]
  if not linear:
    return None
  transposed = _has_transpose(recipe)
  if transposed == (ck.convention == "t"):
    return None
  stored = "[out, in]" if ck.convention == "t" else "[in, out]"
  fix = "wrap it in R.transpose(..., (1, 0))" if ck.convention == "t" else "drop the transpose"
  return (
    f"hint for {name!r}: {recipe} reads {linear[0]!r} {'transposed' if transposed else 'as stored'}, "
    f"but this checkpoint stores its linear weights {stored} and the parameter is [in, out]; "
    f"{fix}, or give the checkpoint name as the hint ({{{name!r}: {linear[0]!r}}}) and match "
    "orients it"
  )


def _has_transpose(recipe: ops.Recipe) -> bool:
  return isinstance(recipe, ops.Transpose) or any(_has_transpose(c) for c in recipe.children())
