"""The report: a :class:`Match` is the proposed :class:`RecipeSet` that explains itself (a
table, HTML, the evidence it used, and equivalent code to pin)."""

from __future__ import annotations

import dataclasses
import html
import json
from collections.abc import Iterable

from paramreg_jax._src import html_table
from paramreg_jax._src import text_width
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.recipes import sets
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource


@dataclasses.dataclass(frozen=True)
class Proposal:
  """One target parameter's proposed recipe and why."""

  target: str
  recipe: ops.Recipe | None
  reason: str
  keys: tuple[str, ...]
  alias_of: str | None = None


class Match(sets.RecipeSet):
  """The proposed mapping: a :class:`RecipeSet` (pass it as ``recipes=``) that explains itself.

  Built by :func:`~paramreg_jax.match`; you do not construct one.

  Attributes:
    proposals: one proposal per target parameter, in target order (its target, recipe or
      refusal, confidence and the evidence for it).
    source: the checkpoint source the mapping was proposed from.
    ignored_keys: checkpoint keys no target parameter needs (``restore`` skips them).
    facts: ``(fact, value)`` pairs the checkpoint's ``config.json`` contributed (model type,
      head counts, tied embeddings, the layout of fused tensors); empty without a config.
    facts_from: where they came from (``"config.json"``, ``"the GGUF metadata"``, or
      ``"match(config=...)"``).
    hint_effects: ``(target, without the hints, with them)`` for every parameter the hints did
      not name whose outcome they changed (a recipe, ``"refused"`` or ``"undecided"``).
    towers: ``(target subtree, checkpoint subtree)`` for each tower the anchors aligned (a
      dual-tower or encoder-decoder model: each target tower reads only from its own).
    layers: ``(target layer, checkpoint layer)`` where the target numbers its blocks across
      the checkpoint's stages (``ResNetBlock_2`` is ``stages.1.layers.0``), read in order;
      empty where the numbers align as they are.
    stacks: ``(target stack, checkpoint layers)`` where stacks hold the checkpoint's layers
      between them (MaxText's ``dense_layers`` and ``moe_layers``, a group ``layers/*_local``,
      a pattern's place ``layers/layers_3``): ``"1..60"``, ``"0, 2, 4"``; empty otherwise.

  Examples:
    >>> import jax, numpy as np
    >>> import paramreg_jax as prj
    >>> from paramreg_jax import MemorySource
    >>> src = MemorySource({"attn.q_proj.weight": np.zeros((4, 2), np.float32), "step": np.zeros((), np.int32)})
    >>> m = prj.match({"attn": {"q": {"kernel": jax.ShapeDtypeStruct((2, 4), np.float32)}}}, src)
    >>> dict(m), m.ignored_keys
    ({'attn/q/kernel': Transpose(input=Source(key='attn.q_proj.weight', selection=Full()), axes=(1, 0))}, ('step',))
    >>> m.rows()
    [('attn/q/kernel', "transpose(source('attn.q_proj.weight'), (1, 0))", 'name + transpose')]
  """

  def __init__(
    self,
    proposals: list[Proposal],
    ignored_keys: Iterable[str],
    source: CheckpointSource,
    facts: Iterable[tuple[str, str]] = (),
    hint_effects: Iterable[tuple[str, str, str]] = (),
    facts_from: str = "config.json",
    towers: Iterable[tuple[str, str]] = (),
    layers: Iterable[tuple[str, str]] = (),
    stacks: Iterable[tuple[str, str]] = (),
  ):
    self.proposals = tuple(proposals)
    self.towers = tuple(towers)
    self.layers = tuple(layers)
    self.stacks = tuple(stacks)
    self.facts_from = facts_from
    self.source = source
    self.facts = tuple(facts)
    self.hint_effects = tuple(hint_effects)
    outputs = {p.target: p.recipe for p in proposals if p.recipe is not None}
    aliases = {p.target: str(p.alias_of) for p in proposals if p.alias_of is not None}
    super().__init__(outputs, aliases=aliases, ignore=ignored_keys)

  def __repr__(self) -> str:
    return f"Match({len(self.proposals)} parameters from {self.source!r}; print() it for the table)"

  def rows(self) -> list[tuple[str, str, str]]:
    """``(target, checkpoint expression, reason)`` per parameter."""
    return [
      (p.target, f"alias of {p.alias_of}" if p.alias_of else str(p.recipe), p.reason)
      for p in self.proposals
    ]

  def __str__(self) -> str:
    rows = self.rows()
    width = max((len(t) for t, _, _ in rows), default=0)
    lines = [f"Match: {len(rows)} parameters from {self.source!r}"]
    if self.facts:
      facts = [f"{k} = {v}" for k, v in self.facts]
      lines += text_width.items(f"  from {self.facts_from}: ", facts, sep="; ")
    if self.towers:
      towers = [f"{t} = {c}" for t, c in self.towers]
      lines += text_width.items("  towers (aligned by their anchors): ", towers)
    if self.layers:
      layers = [f"{t} = {c}" for t, c in self.layers]
      lines += text_width.items("  layers (numbered across stages, in order): ", layers)
    if self.stacks:
      stacks = [f"{t} = {c}" for t, c in self.stacks]
      lines += text_width.items("  stacks (the checkpoint layers each holds): ", stacks, sep="; ")
    for t, expr, why in rows:  # one line where it fits; else the recipe below, broken
      line = f"  {t:<{width}}  <- {expr}   [{why}]"
      fits = len(line) <= text_width.WIDTH
      lines += [line] if fits else [f"  {t}   [{why}]", *text_width.expression(f"<- {expr}", 4)]
    if self.hint_effects:
      lines.append("  changed by the hints (parameters they do not name):")
      lines += [f"    {t}: {a}  ->  {b}" for t, a, b in self.hint_effects]
    if self.ignored_keys:
      more = ["..."] if len(self.ignored_keys) > 6 else []
      lines += text_width.items("  not used: ", [*self.ignored_keys[:6], *more])
    return "\n".join(lines)

  def _repr_html_(self) -> str:
    body = [[html_table.code(t), html_table.code(e), html.escape(w)] for t, e, w in self.rows()]
    return (
      f"<p>Match: {len(self.proposals)} parameters</p>"
      + _paragraph(f"From {self.facts_from}", self.facts, "; ")
      + _paragraph("Towers (aligned by their anchors)", self.towers)
      + _paragraph("Layers (numbered across stages, in order)", self.layers)
      + _paragraph("Stacks (the checkpoint layers each holds)", self.stacks, "; ")
      + html_table.table(["target", "checkpoint", "why"], body, wrap=[1, 2])
    )

  def to_python(self, name: str = "recipes") -> str:
    """Equivalent hand-written code (pin it in your repository).

    Examples:
      >>> import jax, numpy as np
      >>> import paramreg_jax as prj
      >>> from paramreg_jax import MemorySource
      >>> src = MemorySource({"fc.weight": np.zeros((3, 2), np.float32)})
      >>> m = prj.match({"fc": {"kernel": jax.ShapeDtypeStruct((2, 3), np.float32)}}, src)
      >>> print(m.to_python())
      import paramreg_jax as prj
      from paramreg_jax import recipes as R
      <BLANKLINE>
      recipes = R.RecipeSet(
        {
          "fc/kernel": R.transpose(R.source('fc.weight'), (1, 0)),
        },
        aliases={},
      )
    """
    lines = [
      "import paramreg_jax as prj",
      "from paramreg_jax import recipes as R",
      "",
      f"{name} = R.RecipeSet(",
      "  {",
    ]
    for p in self.proposals:  # each entry broken at its brackets where it is too wide
      if p.recipe is not None:
        entry = f"{json.dumps(p.target)}: {code(p.recipe)},"
        lines += text_width.expression(entry, 4, code=True)
    lines.append("  },")
    aliases = {p.target: p.alias_of for p in self.proposals if p.alias_of}
    lines += text_width.expression(f"aliases={aliases!r},", 2, code=True)
    if self.ignored_keys:
      lines += text_width.expression(f"ignore={list(self.ignored_keys)!r},", 2, code=True)
    lines.append(")")
    return "\n".join(lines)


def code(r: ops.Recipe) -> str:
  """Python source that builds ``r`` with ``paramreg_jax.recipes as R``."""
  return r.code(code)


def _paragraph(title: str, pairs: tuple[tuple[str, str], ...], sep: str = ", ") -> str:
  """``<p>title: a = b, ...</p>`` of the evidence ``pairs`` (escaped); empty without any."""
  if not pairs:
    return ""
  said = sep.join(f"{html.escape(a)} = {html.escape(b)}" for a, b in pairs)
  return f"<p>{html.escape(title)}: {said}</p>"
