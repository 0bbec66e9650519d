"""Which of the checkpoint's layers each of the target's stacks holds, where two or more hold
them between them: the ways :func:`stacks.layer_splits` finds, narrowed by the share hints
(``{"decoder/moe_layers": range(1, 61)}``), then the one way under which the stacks' leaves
find their tensors (and a group's word agrees with the config's ``layer_types``); else a
problem that offers each way as a hint to paste.
"""

from __future__ import annotations

import itertools
from typing import Any

from paramreg_jax._src.match import candidates as cand_lib
from paramreg_jax._src.match import evidence
from paramreg_jax._src.match import hints as hints_lib
from paramreg_jax._src.match import stacks


def split_layers(slots: list[Any], ck: evidence.Checkpoint, given: dict[str, Any]) -> None:
  """Gives each of the target's stacks that hold the checkpoint's layers between them its
  layers (``ck.layer_sets``): what the share hints ``given`` say, then the one way the
  stacks' sizes and the layers' kinds allow, or of several the one under which most of the
  stacks' leaves find a tensor, if one does; else a problem (``ck.split_problem``) with the
  hints to choose from."""
  roots, count, options, ck.layer_at = stacks.layer_splits(slots, ck)
  hinted = hints_lib.shares(given, roots, count)
  if options is None and not hinted:
    return
  options = [o for o in options or [] if all(o[r] == ls for r, ls in hinted.items())]
  left = [r for r in roots if r not in hinted]
  rest = tuple(sorted(set(range(count)) - {i for ls in hinted.values() for i in ls}))
  if not options and len(left) <= 1 and len(rest) == sum(roots[r] for r in left):
    options = [{**hinted, **{r: rest for r in left}}]  # the hints say all, or all but one
  if len(options) == 1:  # nothing to choose between: no candidates to count
    ck.layer_sets = options[0]
    return
  names = [s.name for s in slots]
  stacked = [s for s in slots if any(evidence.in_stack(s.name, r) for r in roots)]

  def found(option: dict[str, tuple[int, ...]]) -> int:
    ck.layer_sets = option
    return sum(
      bool(cand_lib.candidates(evidence.target_concepts(s.name, names, ck), tuple(s.shape), ck))
      for s in stacked
    )

  kinds = ck.facts.layer_types

  def agreed(option: dict[str, tuple[int, ...]]) -> int:  # a group named for its layers' kind
    said = {r: stacks.GROUP_KINDS.get(r.partition("/*_")[2]) for r in option}
    return sum(bool(kinds) and all(kinds[i] == said[r] for i in ls) for r, ls in option.items())

  scores = [(found(o), agreed(o)) for o in options]
  best = [o for o, n in zip(options, scores) if n == max(scores)]
  ck.layer_sets = best[0] if len(best) == 1 else {}
  if len(best) == 1:
    return
  ck.unsplit = tuple(roots)
  held = ", ".join(f"{r!r} ({n})" for r, n in roots.items())
  head = f"the target's stacks {held} hold the checkpoint's {count} layers between them, and "
  if best:
    ways = " or ".join(_share_hints(o) for o in best[:4])
    ck.split_problem = head + f"nothing says which layers each holds: pass one of {ways}"
  elif interleaved := _interleaved(roots, count):
    ways = " or ".join(_share_hints(o) for o in interleaved)
    ck.split_problem = head + (
      "its layers are alike in their tensors and nothing says which group takes which (a "
      f"config.json with layer_types would): pass one of {ways}"
    )
  else:
    order = {}
    at = 0
    for r, n in roots.items():
      order[r] = tuple(range(at, at + n))
      at += n
    ck.split_problem = (
      head + "no grouping of its layers by their tensors fits the stacks' sizes: pass which "
      f"layers each holds, e.g. {_share_hints(order)} if they hold them in that order"
    )


def _interleaved(roots: dict[str, int], count: int) -> list[dict[str, tuple[int, ...]]]:
  """The ways groups of one stack (``layers/*_local``, ``layers/*_global``: each stacked
  layer holds one of each, in turn) take the checkpoint's layers: every order of the groups,
  each taking every g-th layer; none for other stacks."""
  stacks = list(roots)
  if len({r.partition("/*_")[0] for r in stacks}) != 1 or "/*_" not in stacks[0]:
    return []
  g = len(stacks)
  if any(n * g != count for n in roots.values()) or g > 3:
    return []
  return [
    {r: tuple(range(j, count, g)) for j, r in enumerate(order)}
    for order in itertools.permutations(stacks)
  ]


def _share_hints(option: dict[str, tuple[int, ...]]) -> str:
  """``hints={'decoder/dense_layers': range(0, 1), ...}``: the share hints of ``option``."""
  return (
    "hints={" + ", ".join(f"{r!r}: {hints_lib.share_literal(ls)}" for r, ls in option.items()) + "}"
  )


def spans(layers: tuple[int, ...]) -> str:
  """``0..3, 8`` for (0, 1, 2, 3, 8); ``1, 3, ..., 59`` for every other layer."""
  steps = {b - a for a, b in zip(layers, layers[1:])}
  if len(layers) > 3 and len(steps) == 1 and steps != {1}:
    return f"{layers[0]}, {layers[1]}, ..., {layers[-1]}"
  runs: list[list[int]] = []
  for i in layers:
    if runs and i == runs[-1][-1] + 1:
      runs[-1].append(i)
    else:
      runs.append([i])
  return ", ".join(f"{r[0]}..{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
