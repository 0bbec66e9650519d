"""The refusal: what ``match`` could not decide, one question per concept, paste-ready.

A problem that is the same in every layer (the same words and the same choices once the layer
number is read as ``{i}``) is asked once, under a ``{i}`` target name. Each problem carries its
choices as data (:class:`Problem`), and the refusal ends with a Python ``hints = {...}`` literal:
every choice on its own commented line, best evidence first, none active (its reason after
it, or on the line under it where the two would pass 88 columns). Choosing is
uncommenting one line per entry; pasting the literal unchanged is ``hints = {}``.

Examples:
  >>> import jax, numpy as np
  >>> import paramreg_jax as prj
  >>> src = prj.MemorySource({f"h.{i}.ln_{j}.weight": np.ones(4, np.float32)
  ...                         for i in range(2) for j in (1, 2)})
  >>> target = {f"block_{i}": {n: {"scale": jax.ShapeDtypeStruct((4,), np.float32)}
  ...                          for n in ("norm_a", "norm_b")} for i in range(2)}
  >>> try:
  ...   prj.match(target, src)
  ... except prj.MatchError as e:
  ...   err = e
  >>> print(err.hints_code)
  hints = {
    # block_{i}/norm_a/scale (4,), in 2 layers: ambiguous; uncomment one:
    # "block_{i}/norm_a/scale": "h.{i}.ln_1.weight",  # name (0.60)
    # "block_{i}/norm_a/scale": "h.{i}.ln_2.weight",  # name (0.60)
    # block_{i}/norm_b/scale (4,), in 2 layers: ambiguous; uncomment one:
    # "block_{i}/norm_b/scale": "h.{i}.ln_1.weight",  # name (0.60)
    # "block_{i}/norm_b/scale": "h.{i}.ln_2.weight",  # name (0.60)
  }
  >>> err.problems[0].choices["block_{i}/norm_a/scale"][0].hint
  'h.{i}.ln_1.weight'
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src import text_width
from paramreg_jax._src.match import coherence
from paramreg_jax._src.match import evidence
from paramreg_jax._src.match import hints as hints_lib
from paramreg_jax._src.match import vocabulary
from paramreg_jax._src.match.candidates import Candidate
from paramreg_jax._src.match.candidates import distinct
from paramreg_jax._src.match.proposal import code
from paramreg_jax._src.match.vocabulary import concepts
from paramreg_jax._src.recipes import inference
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource

_CHOICES = 12  # choices an entry lists
_EXPERTS = re.compile(r"(?i)experts?[._/]?\{i\}")  # a template over a layer's experts


def _counted(template: str) -> str:
  """What a ``{i}`` template counts: ``Expert_{i}``, ``experts/{i}`` experts, else layers."""
  return "experts" if _EXPERTS.search(template) else "layers"


_NOTE = ("  # ", "  #   ")  # an entry's heading, and where it goes on when it is wide


@dataclasses.dataclass(frozen=True)
class Choice:
  """One answer to a problem: ``hint`` is the value to pass (a checkpoint name, or a recipe
  where a name cannot say the layout), ``code`` the same as Python source."""

  hint: str | ops.Recipe
  code: str
  reason: str
  score: float | None  # by name; None where no name was compared (a fused tensor's layout)


class Problem(str):
  """One problem of a :class:`~paramreg_jax.errors.MatchError`: its message (a ``str``) and,
  as data, ``targets`` (every leaf it is about: one leaf, or the same leaf in several layers)
  and ``choices`` (``{hints key: (Choice, ...)}``, best evidence first; the key holds ``{i}``
  when it answers every layer at once). Problems no hint answers have no choices."""

  targets: tuple[str, ...]
  choices: dict[str, tuple[Choice, ...]]

  def __new__(
    cls,
    message: str,
    targets: Sequence[str] = (),
    choices: dict[str, tuple[Choice, ...]] | None = None,
  ) -> Problem:
    self = super().__new__(cls, message)
    self.targets = tuple(targets)
    self.choices = dict(choices or {})
    return self


def refuse(
  problems: list[str],
  ranked: dict[str, list[Candidate]],
  slots: list[Any],
  source: CheckpointSource,
  ck: evidence.Checkpoint,
) -> errors.MatchError:
  """The :class:`MatchError` for ``problems``: grouped by concept, with their choices."""
  by_name = {s.name: s for s in slots}
  singles: list[Problem] = []
  for p in problems:
    if isinstance(p, Problem) and p.choices:  # choices its rule wrote out (a fused layout)
      choices = {  # keyed by a leaf (its recipes cast to its dtype) or a fused tensor (layouts)
        t: tuple(_cast_choice(c, by_name[t], source) for c in cs) if t in by_name else cs
        for t, cs in p.choices.items()
      }
      singles.append(Problem(p, p.targets, choices))
    else:
      targets = [t for t in heads(p) if t in by_name]
      singles.append(
        Problem(p, targets, {t: _choices(by_name[t], ranked, source, ck) for t in targets})
      )
  out = _grouped(_followed(singles, ranked), frozenset(by_name))
  out.sort(key=lambda p: p.targets[:1])
  literal = hints_literal(out, by_name)
  leaves = sum(max(1, len(p.targets)) for p in out)
  # a problem's candidates are the literal's lines: its bullet is its first line
  said = [_first_line(p) if any(p.choices.values()) else str(p) for p in out]
  message = errors.collected(
    "match the checkpoint to the target",
    said,
    f"{leaves} leaves; nothing was chosen" if leaves != len(out) else "nothing was chosen",
  )
  if literal != "hints = {\n}":  # no line to choose (each problem says its own fix)
    message += (
      "\nChoose one line per entry (uncomment it) and pass match(..., hints=hints); "
      "unchanged it is hints = {} (a recipe needs `import paramreg_jax as prj` and "
      "`from paramreg_jax import recipes as R`):\n" + literal
    )
  return errors.MatchError(message, tuple(out), hints_code=literal)


def _followed(problems: list[Problem], ranked: dict[str, list[Candidate]]) -> list[Problem]:
  """``problems`` with each module asked once: where a module's weight is asked and its other
  leaves (a bias, a norm's statistics) choose only among tensors of the checkpoint modules
  the weight's choices come from, the weight's choice settles them (module coherence), so
  they are not asked apart; the weight's problem says so.

  Examples:
    >>> import jax, numpy as np
    >>> import paramreg_jax as prj
    >>> ck = {f"{h}.{k}": np.ones((5, 4) if k == "weight" else (5,), np.float32)
    ...       for h in ("cls_head", "dist_head") for k in ("weight", "bias")}
    >>> sds = lambda *s: jax.ShapeDtypeStruct(s, np.float32)
    >>> try:
    ...   prj.match({"head": {"kernel": sds(4, 5), "bias": sds(5)}}, prj.MemorySource(ck))
    ... except prj.MatchError as e:
    ...   err = e
    >>> [p.targets for p in err.problems]
    [('head/kernel',)]
    >>> "its choice settles head/bias too" in err.problems[0]
    True
  """
  asked = {p.targets[0]: p for p in problems if len(p.targets) == 1 and p.choices}
  by_module: dict[str, list[str]] = {}
  for name in asked:
    if (module := coherence.target_module(name)) is not None:
      by_module.setdefault(module, []).append(name)
  folded: dict[str, list[str]] = {}
  for names in by_module.values():
    leads = [n for n in names if n.rpartition("/")[2].lower() in vocabulary.WEIGHT_LEAVES]
    if len(names) < 2 or len(leads) != 1:
      continue
    (lead,) = leads
    offered = _modules_offered(lead, ranked)
    rest = [n for n in names if n != lead]
    if offered and all(_modules_offered(n, ranked) <= offered for n in rest):
      folded[lead] = sorted(rest)
  gone = {n for rest in folded.values() for n in rest}
  out = []
  for p in problems:
    if p.targets and p.targets[0] in gone and len(p.targets) == 1:
      continue
    if p.targets and p.targets[0] in folded and len(p.targets) == 1:
      first, nl, more = str(p).partition("\n")
      note = f"; its choice settles {', '.join(folded[p.targets[0]])} too"
      first = first[:-1] + note + ":" if first.endswith(":") else first + note
      p = Problem(f"{first}{nl}{more}", p.targets, p.choices)
    out.append(p)
  return out


def _modules_offered(name: str, ranked: dict[str, list[Candidate]]) -> frozenset[str]:
  return frozenset(
    m
    for c in distinct(ranked.get(name, []))[:_CHOICES]
    if c.build is not None
    for m in coherence.modules(c.keys)
  )


def _first_line(problem: str) -> str:
  first, more, _ = problem.partition("\n")
  first = first.rstrip(":").removesuffix("; its candidates")
  return f"{first} (its choices: hints below)" if more else first


def heads(problem: str) -> list[str]:
  """The target names a problem starts with (every problem starts ``a, b (shape): ...``)."""
  head = problem.split(":", 1)[0]
  return [part.split(" ")[0] for part in head.split(", ")]


def _choices(
  slot: Any, ranked: dict[str, list[Candidate]], source: CheckpointSource, ck: evidence.Checkpoint
) -> tuple[Choice, ...]:
  """The leaf's candidates as hints: its checkpoint name (``{i}`` over a stack's layers)
  where that names one candidate, else the recipe (cast to the leaf's dtype)."""
  cands = distinct(ranked.get(slot.name, []))[:_CHOICES] or as_many_values(slot, ck)
  out = []
  for c in cands:
    if c.build is None:
      continue
    name = None
    if c.fused is None and c.claims is None and "joined" not in c.reason:
      name = c.keys[0] if len(c.keys) == 1 else _one_template(c.keys)
    hint: str | ops.Recipe = _cast(c.build(), slot, source)
    if name is not None and _names_only(name, c, slot, ck):
      hint = name
    text = json.dumps(hint) if isinstance(hint, str) else code(hint)
    out.append(Choice(hint, text, c.reason, c.score))
  return tuple(out)


def as_many_values(slot: Any, ck: evidence.Checkpoint) -> list[Candidate]:
  """Where no tensor fits a leaf's name, kind and level: the tensors of as many values, each
  in the layouts a hint naming it would take, those at the leaf's level first, then those of
  its shape. Its name said nothing a tensor's did (an opaque ``p7`` beside a
  ``relative_position_bias_table``; a sequential's ``stem/0`` read as a layer): size is all
  that is left, and uncommenting a line is the user's choice, never ``match``'s."""
  shape = tuple(slot.shape)
  level = evidence.target_indices(slot.name, concepts(slot.name).indices, ck)
  alike = sorted(
    ck.by_size.get(math.prod(shape), ()),
    key=lambda k: (ck.concepts[k].indices != level, tuple(ck.shapes[k]) != shape),
  )
  out: list[Candidate] = []
  for k in alike:
    for c in hints_lib.candidates_of(slot, [k], ck):
      how = c.reason.removeprefix("hint, ").removeprefix("name").lstrip(" +")
      why = "its size only" + (f" + {how}" if how else "")
      out.append(dataclasses.replace(c, score=c.score - 1.0, reason=why))
    if len(out) >= _CHOICES:
      break
  return distinct(out)[:_CHOICES]


def _names_only(name: str, c: Candidate, slot: Any, ck: evidence.Checkpoint) -> bool:
  """Whether ``name`` as the hint gives exactly ``c``: the one layout its tensors fit."""
  keys = hints_lib.named_keys(name, list(ck.concepts))
  if set(keys) != set(c.keys):
    return False
  built = {code(x.build()) for x in hints_lib.candidates_of(slot, keys, ck) if x.build is not None}
  return built == {code(c.build())}


def _one_template(keys: tuple[str, ...]) -> str | None:
  """``model.layers.{i}.mlp.weight`` when ``keys`` are that name at consecutive layers."""
  split = [re.split(r"(?<=[._/])(\d+)(?=[._/]|$)", k) for k in keys]
  if len({len(s) for s in split}) != 1:
    return None
  varying = [j for j in range(1, len(split[0]), 2) if len({s[j] for s in split}) > 1]
  if len(varying) != 1 or any(len({s[j] for s in split}) > 1 for j in range(0, len(split[0]), 2)):
    return None
  j = varying[0]
  parts = list(split[0])
  parts[j] = "{i}"
  return "".join(parts)


def _cast_choice(c: Choice, slot: Any, source: CheckpointSource) -> Choice:
  if isinstance(c.hint, str):
    return c
  hint = _cast(c.hint, slot, source)
  return dataclasses.replace(c, hint=hint, code=code(hint))


def _cast(recipe: ops.Recipe, slot: Any, source: CheckpointSource) -> ops.Recipe:
  want = np.dtype(slot.dtype)
  try:
    stored = inference.infer(recipe, source).dtype
  except errors.RecipeError:  # shown as built: the hint's own check says why it cannot be
    return recipe
  return recipe if stored == want else ops.cast(recipe, want)


def _grouped(problems: list[Problem], names: frozenset[str]) -> list[Problem]:
  """The problems, those asked alike in several layers as one problem under ``{i}`` names:
  alike is the same words and the same choices once the layer number reads ``{i}``, each
  layer's choices in its own layer (``proj_0`` and ``proj_1`` rivals for one tensor are not
  one question)."""
  forms: dict[tuple[Any, ...], list[tuple[Problem, str]]] = {}
  for p in problems:
    for keys, n, j in _templates(p.targets):
      for loose in (False, True):  # h.{i}.ln_1 before layers_{i}/ln
        text = _targets_templated(str(p), n, j, names, loose)
        codes = tuple(
          tuple(_templated(c.code, n, loose) for c in p.choices.get(t, ())) for t in p.targets
        )
        fused = tuple(  # choices keyed by a fused checkpoint tensor (its layout): by the key
          (_templated(f'"{k}"', n, loose), tuple(c.code for c in cs))
          for k, cs in p.choices.items()
          if k not in p.targets
        )
        if (
          all("{i}" in c for cs in codes for c in cs)
          and all("{i}" in k for k, _ in fused)
          and (any(codes) or fused or "{i}" in text.partition(":")[2])
        ):
          forms.setdefault((keys, text, codes + fused, loose), []).append((p, n))
          break
  done: set[int] = set()
  out = []
  for (keys, said, _, loose), members in sorted(forms.items(), key=lambda kv: -len(kv[1])):
    members = [(p, n) for p, n in members if id(p) not in done]
    if len(members) < 2:
      continue
    done.update(id(p) for p, _ in members)
    first, n = members[0]
    choices = {
      key: tuple(
        dataclasses.replace(
          c, hint=_templated_hint(c.hint, n, loose), code=_templated(c.code, n, loose)
        )
        for c in first.choices.get(t, ())
      )
      for t, key in zip(first.targets, keys)
    }
    layouts = {
      str(_templated_hint(k, n, loose)): cs
      for k, cs in first.choices.items()
      if k not in first.targets
    }
    if layouts:  # one layout hint answers every layer's parts
      choices = {**{k: cs for k, cs in choices.items() if cs}, **layouts}
    head, _, rest = said.partition(":")
    layers = ", ".join(n for _, n in members)
    message = f"{head}, in {len(members)} {_counted(keys[0])} ({layers}), each alike:{rest}"
    out.append(Problem(message, [t for p, _ in members for t in p.targets], choices))
  return out + [p for p in problems if id(p) not in done]


def _templates(targets: tuple[str, ...]) -> list[tuple[tuple[str, ...], str, int]]:
  """``(the targets with one number as {i}, that number, its position)`` for each position
  of a number in the first target's name where every target has that same number."""
  if not targets:
    return []
  out = []
  for j, (_, n) in enumerate(_layer_templates(targets[0])):
    keys = [_at(t, j, n) for t in targets]
    if all(keys):
      out.append((tuple(k for k in keys if k), n, j))
  return out


def _at(name: str, j: int, n: str) -> str | None:
  """``name`` with its ``j``-th number component as ``{i}`` if that number is ``n``."""
  found = _layer_templates(name)
  return found[j][0] if j < len(found) and found[j][1] == n else None


def _targets_templated(text: str, n: str, j: int, names: frozenset[str], loose: bool) -> str:
  """``text`` with every target name in it whose ``j``-th number component is ``n`` written
  with ``{i}`` there (``layers_3/norm_0`` as ``layers_{i}/norm_0``; a sequential's module
  number that equals the layer's stays: ``layers_0/3/0`` is ``layers_{i}/3/0``), and the layer
  number in every other name as ``{i}`` (:func:`_templated`)."""

  def one(m: re.Match[str]) -> str:
    name = m.group(0)
    return (_at(name, j, n) or name) if name in names else _templated(name, n, loose)

  return re.sub(r"[\w./~-]+", one, text).replace(f"layer ({n},)", "layer ({i},)")


def _layer_templates(name: str) -> list[tuple[str, str]]:
  """``(name with one number as {i}, that number)`` for each number component of ``name``
  (``layers_3``, ``blocks/3``: what a ``{i}`` hint key can stand for), in order."""
  parts = re.split(r"(?<=[_/])(\d+)(?=/|~1|$)", name)  # ~1: haiku's "layer_3/~/mlp"
  out = []
  for j in range(1, len(parts), 2):
    key = [*parts[:j], "{i}", *parts[j + 1 :]]
    out.append(("".join(key), parts[j]))
  return out


def _templated(text: str, n: str, loose: bool = False) -> str:
  """``text`` with the layer number ``n`` as ``{i}`` wherever it is a name's component
  (``.3.``, ``/3/``; ``loose``: ``layers_3`` too)."""
  before = r"._/'\"" if loose else r"./'\""
  text = re.sub(rf"(?<=[{before}]){n}(?=[._/'\"]|$)", "{i}", text)
  return text.replace(f"layer ({n},)", "layer ({i},)")


def _templated_hint(hint: str | ops.Recipe, n: str, loose: bool) -> str | ops.Recipe:
  if isinstance(hint, str):
    return _templated(f'"{hint}"', n, loose)[1:-1]
  return ops.rekey(hint, lambda key: _templated(f'"{key}"', n, loose)[1:-1])


def hints_literal(problems: Sequence[Problem], by_name: dict[str, Any]) -> str:
  """``hints = {...}`` with every choice of every problem on its own commented line."""
  lines = ["hints = {"]
  written = set()
  for p in problems:
    layers = len(p.targets) // max(1, len(p.choices))
    for key, choices in p.choices.items():
      if key in written:  # one fused tensor's layout, asked by its kernels and its biases
        continue
      written.add(key)
      fits = [key] if key in p.targets else [n for n, _ in hints_lib.layers_of(key, p.targets)]
      if not fits and choices and all(hints_lib.is_layout(c.hint) for c in choices):
        every = " in every layer" if "{i}" in key else ""
        lines += text_width.prose(f"the layout of fused {key}{every}; uncomment one:", *_NOTE)
        lines += _entries(key, choices)
        continue
      shape = tuple(by_name[fits[0]].shape) if fits else ""
      first = str(p).split("\n", 1)[0]
      kind = next((w for w in ("ambiguous", "unmatched") if w in first), "refused")
      where = f", in {layers} {_counted(key)}" if "{i}" in key else ""
      if not choices:
        lines += text_width.prose(f"{key} {shape}{where}: no tensor fits; give a recipe:", *_NOTE)
        lines.append(f"  # {json.dumps(key)}: R.source('<checkpoint name>'),")
        continue
      lines += text_width.prose(f"{key} {shape}{where}: {kind}; uncomment one:", *_NOTE)
      lines += _entries(key, choices)
  lines.append("}")
  return "\n".join(lines)


def _entries(key: str, choices: Sequence[Choice]) -> list[str]:
  """One commented line per choice, its reason after it (or under it, where too wide)."""
  lines = []
  for c in choices:
    entry = f"  # {json.dumps(key)}: {c.code},"
    why = c.reason + (f" ({c.score:.2f})" if c.score is not None else "")
    if len(line := f"{entry}  # {why}") <= text_width.WIDTH:
      lines.append(line)
    else:  # the entry stays one line (uncommenting it is the choice); its reason goes under
      lines += [entry, *text_width.prose(why, "  #     ^ ", "  #       ")]
  return lines
