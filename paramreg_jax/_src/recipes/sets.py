"""Declarations over many recipes: fused splits, rename rules, and recipe sets with aliases."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from typing import Any

from paramreg_jax._src import errors
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.sources import checkpoint_source as source_lib
from paramreg_jax._src.sources import selection as sel_lib


class FusedSplit(Mapping[str, ops.Recipe]):
  """``{target: recipe}`` for the parts of a fused tensor, remembering the width they must sum to.

  Built by :func:`fused_split`; planning checks ``sum(widths)`` against the stored axis length.
  Looking up a part it does not have raises ``UnknownPartError`` (a ``KeyError``) with the parts
  it has and the closest name.

  Attributes:
    key: the fused checkpoint tensor.
    axis: the axis it is fused along.
    widths: ``(target, width)`` pairs, in the tensor's physical order.
    total: ``sum`` of the widths: the length the stored axis must have.

  Examples:
    >>> from paramreg_jax import recipes
    >>> split = recipes.fused_split("mlp/gate_up", 0, {"gate": 8, "up": 8})
    >>> list(split), split.total
    (['gate', 'up'], 16)
  """

  def __init__(self, key: str, axis: int, widths: tuple[tuple[str, int], ...]):
    self.key, self.axis, self.widths = key, axis, widths
    self._recipes: dict[str, ops.Recipe] = {}
    start = 0
    for target, width in widths:
      self._recipes[target] = ops.source(key, sel_lib.Range(axis, start, start + width))
      start += width
    self.total = start

  def __getitem__(self, target: str) -> ops.Recipe:
    recipe = self._recipes.get(target)
    if recipe is None:
      raise errors.UnknownPartError(
        f"{self!r} has no part {target!r} (its parts: {', '.join(map(repr, self._recipes))})"
        + errors.did_you_mean(str(target), self._recipes)
      )
    return recipe

  def __iter__(self) -> Iterator[str]:
    return iter(self._recipes)

  def __len__(self) -> int:
    return len(self._recipes)

  def check(self, src: source_lib.CheckpointSource) -> None:
    """Raises ``FusedSplitWidthMismatch``-style ``RecipeSetError`` if widths do not cover the axis."""
    meta = source_lib.metadata_of(src, self.key) if self.key in src else None
    if meta is None:
      raise errors.UnknownSourceKeyError(
        f"fused_split({self.key!r}): the checkpoint has no tensor {self.key!r}"
        + errors.did_you_mean(self.key, src.keys())
      )
    if self.axis >= len(meta.shape):
      raise errors.InvalidSelectionAxisError(
        f"fused_split({self.key!r}): axis {self.axis} is out of range for {meta.shape}"
      )
    if self.total != meta.shape[self.axis]:
      raise errors.RecipeSetError(
        f"fused_split({self.key!r}, axis={self.axis}): widths {dict(self.widths)} sum to "
        f"{self.total}, but the axis has length {meta.shape[self.axis]}"
      )

  def __repr__(self) -> str:
    return f"fused_split({self.key!r}, axis={self.axis}, widths={dict(self.widths)})"


def fused_split(
  key: str,
  axis: int,
  widths: Mapping[str, int] | Iterable[tuple[str, int]],
  *,
  source: source_lib.CheckpointSource | None = None,
) -> FusedSplit:
  """Splits a fused tensor (qkv, gate/up) into consecutive ``Range`` reads, one per target.

  Args:
    key: the fused checkpoint tensor.
    axis: the axis it is fused along.
    widths: ordered ``{target: width}`` (or pairs), in the tensor's physical order.
    source: if given, the widths are checked against the stored axis length now; otherwise
      planning checks them.

  Returns:
    A :class:`FusedSplit`: ``{target: source(key, Range(axis, start, stop))}``, to pass in
    ``recipes=`` (alone, or with other mappings in a list).

  Raises:
    EmptySourceKeyError: ``key`` is empty.
    RecipeSetError: no outputs, an empty target name, a width that is not positive, or (with
      ``source``) widths that do not sum to the axis length.
    InvalidSelectionAxisError: (with ``source``) ``axis`` is beyond the tensor's rank.

  Examples:
    >>> from paramreg_jax import recipes
    >>> split = recipes.fused_split("attn/qkv", 1, {"q": 4, "k": 2, "v": 2})
    >>> print(split["k"])
    source('attn/qkv', Range(axis=1, 4:6))
  """
  if not isinstance(key, str) or not key.strip():
    raise errors.EmptySourceKeyError(f"fused_split({key!r}): the key must be a non-empty string")
  axis = ops.check_axis(axis, "axis")
  items = tuple(widths.items() if isinstance(widths, Mapping) else widths)
  if not items:
    raise errors.RecipeSetError(f"fused_split({key!r}): no outputs; give {{target: width}}")
  seen = set()
  for target, width in items:
    if not isinstance(target, str) or not target.strip():
      raise errors.RecipeSetError(
        f"fused_split({key!r}): target names must be non-empty strings, got {target!r}"
      )
    if target in seen:
      raise errors.RecipeSetError(f"fused_split({key!r}): target {target!r} appears twice")
    seen.add(target)
    if isinstance(width, bool) or not isinstance(width, int) or width <= 0:
      raise errors.RecipeSetError(
        f"fused_split({key!r}): width of {target!r} must be a positive int, got {width!r}"
      )
  split = FusedSplit(key, axis, items)
  if source is not None:
    split.check(source)
  return split


@dataclasses.dataclass(frozen=True)
class Rename:
  """Ordered ``(regex, replacement)`` rules from checkpoint keys to target names.

  ``re.fullmatch``, first matching rule wins, backrefs (``\\1``) in the replacement; a
  replacement of ``None`` drops the key. Built by :func:`rename`.

  Attributes:
    rules: the ``(regex, replacement)`` pairs, in order.
    require_all: whether every checkpoint key must match a rule.

  Examples:
    >>> from paramreg_jax import recipes
    >>> recipes.rename({r"(.*)\\.weight": r"\\1/kernel"})("fc.weight")
    'fc/kernel'
  """

  rules: tuple[tuple[str, str | None], ...]
  require_all: bool = True

  def __call__(self, key: str) -> str | None:
    for pattern, repl in self.rules:
      m = re.fullmatch(pattern, key)
      if m:
        return None if repl is None else m.expand(repl)
    return key

  def apply(self, keys: Iterable[str]) -> dict[str, str]:
    """``{target name: checkpoint key}`` for ``keys``; reports every problem at once.

    Raises:
      RecipeSetError: keys no rule covers (when ``require_all``), rules that match no key,
        or two keys renamed to the same target.
    """
    compiled = [(re.compile(p), r) for p, r in self.rules]
    used = [False] * len(compiled)
    out: dict[str, str] = {}
    problems = []
    for key in keys:
      for i, (regex, repl) in enumerate(compiled):
        m = regex.fullmatch(key)
        if m:
          used[i] = True
          target = None if repl is None else m.expand(repl)
          break
      else:
        if self.require_all:
          problems.append(
            f"{key!r}: no rule covers it (add a rule, or build the rules with "
            "recipes.rename(rules, require_all=False) to keep uncovered keys as they are)"
          )
        target = key
      if target is None:
        continue
      if target in out:
        problems.append(f"{out[target]!r} and {key!r} both rename to {target!r}")
      out[target] = key
    problems += [
      f"rule {self.rules[i][0]!r}: matches no checkpoint key" for i, u in enumerate(used) if not u
    ]
    if problems:
      raise errors.RecipeSetError(
        f"{len(problems)} rename problem(s):" + errors.bullet_list(problems)
      )
    return out


def rename(
  rules: Mapping[str, str | None] | Iterable[tuple[str, str | None]], *, require_all: bool = True
) -> Rename:
  """Checkpoint-key → target-name rules (t5x's "every key needs a rule" discipline).

  Args:
    rules: ordered ``{regex: replacement}`` or pairs; ``re.fullmatch``; first match wins;
      backrefs allowed; ``None`` drops the key.
    require_all: every checkpoint key must match a rule (default); ``False`` keeps unmatched
      keys as they are.

  Returns:
    A :class:`Rename`: call it on a key, or pass it as ``rename=`` (``plan_restore``,
    ``restore``, ``match``).

  Raises:
    RecipeSetError: an invalid regex (at once), or when applied: uncovered keys, unused rules,
      two keys onto one target.

  Examples:
    >>> from paramreg_jax import recipes
    >>> r = recipes.rename([(r"model\\.layers\\.(\\d+)\\.weight", r"layers/\\1/kernel"), (r"lm_head\\..*", None)])
    >>> r("model.layers.3.weight"), r("lm_head.weight")
    ('layers/3/kernel', None)
    >>> r.apply(["model.layers.0.weight", "lm_head.weight"])
    {'layers/0/kernel': 'model.layers.0.weight'}
  """
  items = tuple(rules.items() if isinstance(rules, Mapping) else rules)
  for item in items:
    if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
      raise errors.RecipeSetError(f"rename rules must be (regex, replacement) pairs, got {item!r}")
    try:
      re.compile(item[0])
    except re.error as e:
      raise errors.RecipeSetError(f"rename rule {item[0]!r} is not a valid regex: {e}") from None
  return Rename(items, require_all)


class RecipeSet(Mapping[str, ops.Recipe]):
  """Targets → recipes, plus aliases (tied weights) resolved to their canonical owner.

  Args:
    outputs: ``{target: recipe}`` (or pairs, to detect duplicates); a :class:`FusedSplit`
      may be given as one of several mappings in a sequence.
    aliases: ``{alias: destination}``; a destination may itself be an alias.
    ignore: checkpoint keys deliberately not loaded (buffers, heads the model lacks);
      :func:`plan_restore` does not report them as unused.

  Raises:
    RecipeSetError: empty or duplicate target names.
    AliasError: empty alias, unknown destination, alias that is also an output, repeated
      alias, or a cycle.

  Examples:
    >>> from paramreg_jax import recipes
    >>> rs = recipes.RecipeSet({"embed": recipes.source("wte")}, aliases={"lm_head": "tied", "tied": "embed"})
    >>> rs.owner("lm_head"), list(rs), rs.aliases
    ('embed', ['embed'], {'lm_head': 'embed', 'tied': 'embed'})
  """

  def __init__(
    self,
    outputs: Any = (),
    aliases: Mapping[str, str] | None = None,
    ignore: Iterable[str] = (),
  ):
    pairs: list[tuple[str, ops.Recipe]] = []
    parts = [outputs] if isinstance(outputs, Mapping) else list(outputs)
    for part in parts:
      if isinstance(part, Mapping):
        pairs.extend(part.items())
      else:
        pairs.append(part)
    self._outputs: dict[str, ops.Recipe] = {}
    self.splits = tuple(p for p in parts if isinstance(p, FusedSplit))
    for target, recipe in pairs:
      if not isinstance(target, str) or not target.strip():
        raise errors.RecipeSetError(
          f"recipe target names must be non-empty strings, got {target!r}"
        )
      if target in self._outputs:
        raise errors.RecipeSetError(
          f"target {target!r} has two recipes; give each target one recipe"
        )
      self._outputs[target] = ops.check_recipe(recipe, f"the recipe for {target!r}")
    self.aliases = resolve_aliases(aliases or {}, set(self._outputs))
    if isinstance(ignore, str):
      raise errors.RecipeSetError(f"ignore= takes a list of checkpoint keys, got {ignore!r}")
    self.ignored_keys = tuple(sorted(ignore))

  def __getitem__(self, target: str) -> ops.Recipe:
    return self._outputs[target]

  def __iter__(self) -> Iterator[str]:
    return iter(self._outputs)

  def __len__(self) -> int:
    return len(self._outputs)

  def owner(self, name: str) -> str:
    """The canonical owner of ``name`` (itself if it is not an alias)."""
    return self.aliases.get(name, name)

  def __repr__(self) -> str:
    return f"RecipeSet({len(self._outputs)} outputs, {len(self.aliases)} aliases)"


def resolve_aliases(aliases: Mapping[str, str], owners: set[str]) -> dict[str, str]:
  """Resolves alias chains to canonical owners in ``owners``; every problem raises ``AliasError``."""
  if not isinstance(aliases, Mapping):
    raise errors.AliasError(f"aliases must be a mapping alias -> destination, got {aliases!r}")
  for alias, dest in aliases.items():
    if not isinstance(alias, str) or not alias.strip():
      raise errors.AliasError(f"alias names must be non-empty strings, got {alias!r}")
    if not isinstance(dest, str) or not dest.strip():
      raise errors.AliasError(
        f"alias {alias!r}: destination must be a non-empty string, got {dest!r}"
      )
    if alias in owners:
      raise errors.AliasError(
        f"alias {alias!r} is also a target with its own weight; drop one of them"
      )
  out = {}
  for alias in aliases:
    seen = [alias]
    dest = aliases[alias]
    while dest in aliases:
      if dest in seen:
        raise errors.AliasError(f"alias cycle: {' -> '.join([*seen, dest])}")
      seen.append(dest)
      dest = aliases[dest]
    if dest not in owners:
      raise errors.AliasError(
        f"alias {alias!r} points to {aliases[alias]!r}, which resolves to {dest!r}: not a known "
        "target. Aliases must end at a target that has a weight"
      )
    out[alias] = dest
  return out
