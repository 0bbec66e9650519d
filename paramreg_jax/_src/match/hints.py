"""Hints: what the user says about the mapping, checked before anything is decided.

A hint maps a target name to a checkpoint name (or a part of one: ``"input_layernorm"``,
``"model.layers.{i}.ln_1"``), from which ``match`` derives the layout, or to a recipe, used as
given. A target name may hold ``{i}`` (``"layers_{i}/attn_norm/scale"``): one hint for that
leaf in every per-layer module (linen ``layers_0``, ``nnx.List``, a Python list), with ``{i}``
in the value standing for the same layer.

A fused checkpoint tensor's layout is a hint of its own, keyed by that tensor or its module
(``{"model.layers.{i}.attn.Wqkv": "contiguous"}``): it splits every part of it, kernels and
biases, in every layer.

A hint settles the leaf it names, and only that leaf: a name that stands for several tensors
(``"input_layernorm"`` names a weight and a bias) gives the leaf the one of its own kind, and
the other leaves are decided by the same rules as without hints (a kernel's hint carries its
bias only through module coherence, as any decided kernel does).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.match import axes
from paramreg_jax._src.match import config_facts
from paramreg_jax._src.match import evidence
from paramreg_jax._src.match.candidates import Candidate
from paramreg_jax._src.match.candidates import candidates
from paramreg_jax._src.match.coherence import checkpoint_module as coherence_module
from paramreg_jax._src.match.vocabulary import concepts
from paramreg_jax._src.recipes import inference
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource

# a fused tensor's layout: a key of config_facts.LAYOUTS, with the head size where nothing else
# gives the head count (``"per_head:64"``)
_LAYOUT = re.compile(rf"^({'|'.join(config_facts.LAYOUTS)})(?::([1-9]\d{{0,5}}))?$")


def is_layout(hint: Any) -> bool:
  """Whether a hint's value is a fused tensor's layout (``"contiguous"``, ``"per_head:64"``)."""
  return isinstance(hint, str) and _LAYOUT.match(hint) is not None


def split_layouts(hints: dict[Any, Any], names: list[str]) -> tuple[dict[Any, Any], dict[str, str]]:
  """``(the other hints, the layout hints)``: a layout hint is keyed by a fused checkpoint
  tensor or its module (``"model.layers.{i}.attn.Wqkv"``, no target name) and valued by its
  layout. One keyed by a target name stays with the others, refused by :func:`layouts`."""
  known = set(names)
  layouts = {
    str(k): v
    for k, v in hints.items()
    if is_layout(v) and str(k).removeprefix("n:") not in known and not layers_of(str(k), names)
  }
  return {k: v for k, v in hints.items() if str(k) not in layouts}, layouts


def layouts(
  given: dict[str, str], hinted: dict[str, Any], ck: evidence.Checkpoint
) -> dict[str, tuple[str, int | None]]:
  """``{fused checkpoint key: (layout, head size or None)}`` of the layout hints ``given``,
  each checked: it names fused tensors (a ``qkv`` or a ``gate_up``, by name or module, ``{i}``
  for every layer), and a gate_up's layout is ``contiguous`` (the only one known). A layout
  given as a parameter's hint (``hinted``) is refused with the key to use instead."""
  fused = [k for k, c in ck.concepts.items() if c.tokens & {"qkv", "gate_up"}]
  example = layer_template(coherence_module(fused[0])) if fused else "model.layers.{i}.attn.qkv"
  bad = [
    f"hint for {name!r}: {hint!r} is the layout of a fused checkpoint tensor, not a parameter's "
    f"hint: key it by that tensor or its module, e.g. hints={{{example!r}: {hint!r}}}"
    for name, hint in hinted.items()
    if is_layout(hint)
  ]
  out: dict[str, tuple[str, int | None]] = {}
  for key, hint in given.items():
    m = _LAYOUT.match(hint)
    assert m is not None
    layout, size = m.group(1), int(m.group(2)) if m.group(2) else None
    rx = re.compile(_pattern(key) + "$")
    named = [k for k in ck.concepts if rx.match(k) or rx.match(coherence_module(k))]
    if not named:
      parts = sorted({coherence_module(k) for k in fused}) or sorted(ck.concepts)
      bad.append(
        f"layout hint {key!r}: no checkpoint tensor or module is {key!r}"
        f"{errors.did_you_mean(key, parts)}"
      )
      continue
    not_fused = [k for k in named if k not in fused]
    if not_fused:
      bad.append(
        f"layout hint {key!r}: {not_fused[0]!r} is no fused qkv or gate_up tensor (a layout "
        "says how one fused tensor holds its parts)"
      )
      continue
    gate_up = any("gate_up" in ck.concepts[k].tokens for k in named)
    if gate_up and layout not in config_facts.GATE_UP_LAYOUTS:
      bad.append(
        f"layout hint {key!r}: a fused gate_up is laid out [gate | up] ('contiguous') or "
        f"alternating ('interleaved'), not {hint!r}"
      )
      continue
    if not gate_up and layout == "interleaved":
      *rest, last = (repr(x) for x in config_facts.LAYOUTS if x != "interleaved")
      bad.append(
        f"layout hint {key!r}: 'interleaved' alternates a gate and an up; a fused qkv is "
        f"{', '.join(rest)} or {last}"
      )
      continue
    out.update({k: (layout, size) for k in named})
  if bad:
    raise errors.MatchError(
      errors.collected("use the hints", bad, "nothing was chosen"), tuple(bad)
    )
  return out


def is_share(hint: Any) -> bool:
  """Whether a hint's value gives a stack its checkpoint layers (``range(1, 61)``, or the
  layer numbers, ``(0, 2, 4)``)."""
  if isinstance(hint, range):
    return True
  return (
    isinstance(hint, (tuple, list))
    and bool(hint)
    and all(isinstance(i, int) and not isinstance(i, bool) for i in hint)
  )


def split_shares(hints: dict[Any, Any]) -> tuple[dict[Any, Any], dict[str, Any]]:
  """``(the other hints, the layer shares)``: a share is keyed by a target stack (the subtree
  that holds some of the checkpoint's layers: ``"decoder/moe_layers"``) and valued by its
  layers (:func:`is_share`)."""
  shares = {str(k).removeprefix("n:"): v for k, v in hints.items() if is_share(v)}
  return {k: v for k, v in hints.items() if not is_share(v)}, shares


def shares(given: dict[str, Any], roots: dict[str, int], count: int) -> dict[str, tuple[int, ...]]:
  """``{stack: its layers}`` of the share hints ``given``, each checked against the target's
  stacks (``roots``: ``{stack: layers it holds}``) and the checkpoint's ``count`` layers."""
  out: dict[str, tuple[int, ...]] = {}
  bad = []
  for key, hint in given.items():
    layers = tuple(hint)
    if key not in roots:
      stacks = ", ".join(repr(r) for r in roots) or "none"
      bad.append(
        f"hint for {key!r}: {hint!r} gives a stack of layers its checkpoint layers, but "
        f"{key!r} is not one of the target's stacks (they are: {stacks})"
        f"{errors.did_you_mean(key, list(roots))}"
      )
    elif len(layers) != roots[key]:
      bad.append(
        f"hint for {key!r}: the stack holds {roots[key]} layers, the hint gives "
        f"{len(layers)} ({hint!r})"
      )
    elif len(set(layers)) != len(layers) or not all(0 <= i < count for i in layers):
      bad.append(
        f"hint for {key!r}: {hint!r} is not {len(layers)} distinct layers of the "
        f"checkpoint's {count} (0..{count - 1})"
      )
    else:
      out[key] = layers
  taken: dict[int, str] = {}
  for key, layers in out.items():
    for i in layers:
      if i in taken:
        bad.append(f"hints for {taken[i]!r} and {key!r} both take checkpoint layer {i}")
      taken.setdefault(i, key)
  if bad:
    raise errors.MatchError(
      errors.collected("use the hints", bad, "nothing was chosen"), tuple(bad)
    )
  return out


def share_literal(layers: tuple[int, ...]) -> str:
  """A share as a hint's value: ``range(1, 61)`` where the layers are evenly spaced (``range(
  1, 48, 2)``), else their numbers."""
  if len(layers) > 1:
    step = layers[1] - layers[0]
    if step > 0 and all(b - a == step for a, b in zip(layers, layers[1:])):
      end = layers[-1] + 1
      return f"range({layers[0]}, {end})" if step == 1 else f"range({layers[0]}, {end}, {step})"
  return f"range({layers[0]}, {layers[0] + 1})" if len(layers) == 1 else repr(layers)


def layer_template(name: str) -> str:
  """``name`` with its first layer number as ``{i}`` (``model.layers.{i}.attn.qkv``): the
  key of a hint that stands for every layer."""
  return re.sub(r"(?<=[._/])\d+(?=[._/]|$)", "{i}", name, count=1)


def _pattern(template: str, layer: str = r"\d+") -> str:
  """A regex for ``template`` with ``{i}`` standing for any layer number (``layer``)."""
  return re.escape(template).replace(re.escape("{i}"), layer)


def expand(hints: dict[Any, Any], names: list[str]) -> dict[str, Any]:
  """``{target name: hint}`` with the ``n:`` prefix dropped and every ``{i}`` template
  expanded over the target's names; names the target lacks are refused (did-you-mean)."""
  plain = {str(k).removeprefix("n:"): v for k, v in hints.items()}
  known = set(names)
  out: dict[str, Any] = {}
  unknown = []
  for key, hint in plain.items():
    if "{i}" not in key:
      if key not in known:
        unknown.append(f"{key!r}{errors.did_you_mean(key, names)}")
      continue
    hits = layers_of(key, names)
    if not hits:
      unknown.append(f"{key!r} (no target name fits the template)")
    for name, i in hits:
      out.setdefault(name, _at_layer(hint, i))
  if unknown:
    raise errors.MatchError(
      "hints name parameters the target does not have: "
      + "; ".join(unknown)
      + _swapped(plain, names),
      tuple(unknown),
    )
  out.update({k: v for k, v in plain.items() if "{i}" not in k})  # an exact name wins
  return out


def layers_of(template: str, names: Sequence[str]) -> list[tuple[str, str]]:
  """``(name, layer)`` of each target name a ``{i}`` template fits (none without ``{i}``)."""
  if "{i}" not in template:
    return []
  rx = re.compile(_pattern(template, r"(\d+)") + "$")
  return [(n, m.group(1)) for n in names if (m := rx.match(n))]


def _swapped(plain: dict[str, Any], names: list[str]) -> str:
  """The hints written checkpoint -> target (a value that is a target name, a key that is
  not), with the dict to paste; empty if none is."""

  known = set(names)
  turned = {
    v: k
    for k, v in plain.items()
    if isinstance(v, str) and k not in known and (v in known or layers_of(v, names))
  }
  if not turned:
    return ""
  return (
    f"; swapped? hints map target name -> checkpoint name (as rename maps checkpoint -> "
    f"target the other way round): hints={turned!r}"
  )


def _at_layer(hint: Any, i: str) -> Any:
  if isinstance(hint, str):
    return hint.replace("{i}", i)
  if isinstance(hint, ops.Recipe):
    return ops.rekey(hint, lambda key: key.replace("{i}", i))
  return hint  # refused with its type by check()


def check(
  hints: dict[str, Any], slots: list[Any], source: CheckpointSource, ck: evidence.Checkpoint
) -> tuple[dict[str, ops.Recipe], dict[str, list[str]]]:
  """Splits hints into recipes (checked: they plan, fit the parameter, and orient linear
  weights as the evidence says) and checkpoint names (the keys each one names)."""
  by_name = {s.name: s for s in slots}
  recipes: dict[str, ops.Recipe] = {}
  named: dict[str, list[str]] = {}
  bad = []
  for name, hint in hints.items():
    slot = by_name[name]
    if isinstance(hint, str):
      found = named_keys(hint, list(ck.concepts))
      if not found:
        parts = {p for k in ck.concepts for p in re.split(r"[./]", k)} | set(ck.concepts)
        bad.append(
          f"hint for {name!r}: no checkpoint key is or contains {hint!r}"
          f"{errors.did_you_mean(hint, sorted(parts))}"
        )
      named[name] = found
      continue
    try:
      recipe = ops.check_recipe(hint, f"hint for {name!r}")
      meta = inference.infer(recipe, source)
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


def candidates_of(slot: Any, keys: list[str], ck: evidence.Checkpoint) -> list[Candidate]:
  """A name hint's candidates: the named tensors in every layout that fits, whatever the leaf
  is called; of a name that stands for several kinds (a module), the leaf's own kind."""
  tc = concepts(slot.name)  # at the layer the checkpoint counts (a pattern's remainder)
  tc = dataclasses.replace(tc, indices=evidence.target_indices(slot.name, tc.indices, ck))
  found = candidates(tc, tuple(slot.shape), ck.restricted(set(keys)), hinted=True)
  if len(keys) > 1:
    own = [c for c in found if all(ck.concepts[k].kind == tc.kind for k in c.keys)]
    found = own or found
  return [dataclasses.replace(c, score=1.0 + c.score, reason=f"hint, {c.reason}") for c in found]


def misfit(slot: Any, keys: list[str], ck: evidence.Checkpoint) -> str:
  """The problem of a name hint whose tensors no layout turns into the leaf: both shapes."""
  shape = tuple(slot.shape)
  named = ", ".join(f"{k!r} {ck.shapes[k]}" for k in keys[:4]) + (", ..." if len(keys) > 4 else "")
  return (
    f"{slot.name} {shape}: its hint names {named}, which no transpose, reshape, stack or "
    f"split turns into {shape}; is it the hint of another leaf? Name a tensor that fits, or "
    "give the recipe that builds the leaf"
  )


def named_keys(hint: str, keys: list[str]) -> list[str]:
  """The checkpoint keys a name hint stands for: the key itself, or every key containing it
  as whole components (``input_layernorm``, ``model.layers.{i}.input_layernorm``)."""
  if hint in keys:
    return [hint]
  rx = re.compile(rf"(^|[./]){_pattern(hint)}([./]|$)")
  return [k for k in keys if rx.search(k)]


def _misoriented(
  name: str, shape: tuple[int, ...], recipe: ops.Recipe, ck: evidence.Checkpoint
) -> str | None:
  """A hint that reads a linear weight against the orientation the evidence determines (a
  forgotten transpose on a square kernel loads silently wrong). The evidence: the config or
  the undecided ``[in, out]`` leaves' shapes for a ``kernel``/``w``; the other undecided
  leaves' shapes for any other (a torch-style ``weight`` may be ``[out, in]``). A bare
  stored parameter (DBRX's experts) is laid out as its author chose: only the bare ones
  decided say it."""
  in_out = axes.in_out_leaf(name)
  if not evidence.linear_target(concepts(name), shape[-2:]):
    return None
  linear = [
    k
    for k in inference.source_keys(recipe)
    if k in ck.concepts and evidence.is_linear(ck.concepts[k], ck.shapes[k])
  ]
  bare = {ck.concepts[k].bare for k in linear}
  if len(bare) != 1:
    return None
  relation = axes.orientation(ck, name, decided=False, bare=bare.pop())
  if relation not in ("t", "same"):
    return None
  transposed = _has_transpose(recipe)
  if transposed == (relation == "t"):
    return None
  turn = (*range(len(shape) - 2), len(shape) - 1, len(shape) - 2)
  fix = f"wrap it in R.transpose(..., {turn})" if relation == "t" else "drop the transpose"
  how = "transposed" if transposed else "as stored"
  if in_out or ck.convention in ("t", "same"):
    stored = "[out, in]" if ck.convention == "t" else "[in, out]"
    flipped = "[in, out]" if ck.convention == "t" else "[out, in]"
    mine = stored if relation == "same" else flipped
    why = f"this checkpoint stores its linear weights {stored} and the parameter is {mine}"
    if not in_out:
      why += " (as the target's other linear weights' shapes show)"
  else:
    why = (
      "the target's other linear weights are the stored ones "
      + ("transposed" if relation == "t" else "as stored")
      + " (their shapes say so)"
    )
  return (
    f"hint for {name!r}: {recipe} reads {linear[0]!r} {how}, but {why}; {fix}, or give the "
    f"checkpoint name as the hint ({{{name!r}: {linear[0]!r}}}) and match orients it"
  )


def _has_transpose(recipe: ops.Recipe) -> bool:
  return any(isinstance(n, ops.Transpose) for n in ops.nodes(recipe))
