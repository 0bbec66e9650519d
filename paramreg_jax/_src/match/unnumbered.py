"""haiku's first layer has no number: a target's names as ``match`` reads them.

haiku names the modules of one class in the order they are made: the first ``block``, then
``block_1``, ``block_2``. A model that builds its layers in a loop without naming them
(``for _ in range(n): x = Block()(x)``) therefore has layers ``block``, ``block_1``, ...:
layer 0 carries no number, and would be read as a module outside the layers, looking for
its tensors among the checkpoint's unnumbered ones (the final norm, the embeddings).

Where a target module ``X`` has a sibling ``X_1`` that numbers layers (``block_1``,
``decoder_layer_1``) and none ``X_0``, ``match`` reads ``X`` as ``X_0``: every rule then
sees layer 0 as it sees the others. The reading is internal: everything ``match`` returns
or raises names the target's own leaves (``block/~/linear``), and hints may use either,
the target's names or ``{i}`` templates (``block_{i}/~/linear/w`` covers ``block``).

A checkpoint key that holds the name read (``block_0``) keeps the target's names as they
are: the reading would be ambiguous in what ``match`` says.

Only layers are read so: haiku's other unnumbered modules (``linear``, ``linear_1``) are
ordered as they are (:mod:`order`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from paramreg_jax._src import errors
from paramreg_jax._src.match import vocabulary
from paramreg_jax._src.match.proposal import Match
from paramreg_jax._src.match.refusal import Problem

# a target name's module separators: "/", haiku's "/~/" escaped in one key, an escaped "/"
_SEPARATOR = re.compile(r"(~1~0~1|/|~1)")
_NUMBERED = re.compile(r"_\d+$")


@dataclasses.dataclass(frozen=True)
class Reading:
  """``{target prefix: prefix as read}`` (``net~1~0~1block`` -> ``net~1~0~1block_0``) and back."""

  read: Mapping[str, str]

  def __bool__(self) -> bool:
    return bool(self.read)

  def name(self, name: str) -> str:
    """A target name (or a hint's key) as read: ``block~1~0~1linear/w`` -> ``block_0~1~0~1linear/w``."""
    for original, read in self.read.items():
      name = re.sub(rf"(?<![\w~]){re.escape(original)}(?=~1|/|$)", read, name)
    return name

  def back(self, text: str) -> str:
    """``text`` (a message, a name, a hint's key) with the target's own names."""
    for original, read in self.read.items():
      text = re.sub(rf"(?<![\w~]){re.escape(read)}(?![\w])", original, text)
    return text

  def slots(self, slots: list[Any]) -> list[Any]:
    return [dataclasses.replace(s, name=self.name(s.name)) for s in slots] if self else slots

  def hints(self, hints: Mapping[Any, Any] | None) -> Mapping[Any, Any] | None:
    if not self or not hints:
      return hints
    return {self.name(k) if isinstance(k, str) else k: v for k, v in hints.items()}

  def match(self, m: Match) -> Match:
    """``m`` with the target's own names."""
    if not self:
      return m
    b = self.back
    proposals = [
      dataclasses.replace(
        p,
        target=b(p.target),
        reason=b(p.reason),
        alias_of=None if p.alias_of is None else b(p.alias_of),
      )
      for p in m.proposals
    ]
    return Match(
      proposals,
      m.ignored_keys,
      m.source,
      m.facts,
      [(b(t), b(before), b(after)) for t, before, after in m.hint_effects],
      m.facts_from,
      [(b(t), c) for t, c in m.towers],
      m.layers,
      [(b(r), spans) for r, spans in m.stacks],
    )

  def error(self, e: errors.MatchError) -> errors.MatchError:
    """``e`` with the target's own names (its problems, their choices, its partial match)."""
    b = self.back
    problems = tuple(
      Problem(b(p), [b(t) for t in p.targets], {b(k): v for k, v in p.choices.items()})
      if isinstance(p, Problem)
      else b(p)
      for p in e.problems
    )
    partial = self.match(e.partial) if isinstance(e.partial, Match) else e.partial
    return errors.MatchError(b(str(e)), problems, partial, b(e.hints_code))


def reading(names: Iterable[str], keys: Sequence[str]) -> Reading:
  """How ``match`` reads the target's ``names`` over a checkpoint of ``keys``.

  Examples:
    >>> names = ["block~1~0~1linear/w", "block_1~1~0~1linear/w", "linear/w"]
    >>> r = reading(names, ["h.0.fc.weight", "h.1.fc.weight"])
    >>> r.name(names[0]), r.back("block_0~1~0~1linear/w: ambiguous")
    ('block_0~1~0~1linear/w', 'block~1~0~1linear/w: ambiguous')
    >>> bool(reading(["linear/w", "linear_1/w"], []))  # not layers: read as they are
    False
  """
  children: dict[str, set[str]] = {}
  for name in names:
    parts = _SEPARATOR.split(name)
    for j in range(0, len(parts) - 1, 2):  # every module, not the leaf
      children.setdefault("".join(parts[:j]), set()).add(parts[j])
  read = {}
  for parent, kids in children.items():
    for kid in kids:
      first = f"{kid}_1"
      if (
        not _NUMBERED.search(kid)
        and first in kids
        and f"{kid}_0" not in kids
        and vocabulary.is_container(first)
      ):
        read[parent + kid] = f"{parent}{kid}_0"
  clash = [
    r for r in read.values() if any(re.search(rf"(?<![\w~]){re.escape(r)}(?!\w)", k) for k in keys)
  ]
  return Reading({o: r for o, r in read.items() if r not in clash})
