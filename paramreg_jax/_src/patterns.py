"""Glob rules over canonical names: weight-decay masks and ``optax.partition`` labels.

Patterns match parameter *names* (the key without ``n:``): ``*`` matches within one component,
``**`` any number of whole components (zero included), ``?`` one character, ``[ab]`` a class.
Rules are tried in order and the first match wins. A rule that matches nothing is an error (a
typo would otherwise silently leave weights decayed or trainable).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import TypeVar

import jax

from paramreg_jax._src import errors
from paramreg_jax._src.registry import assign as registry_lib

T = TypeVar("T")


@functools.lru_cache(maxsize=1024)
def glob_to_regex(pattern: str) -> re.Pattern[str]:
  """Compiles a glob over ``/``-separated names (``**`` spans components)."""
  if not isinstance(pattern, str) or not pattern:
    raise errors.PatternError(f"a pattern must be a non-empty string, got {pattern!r}")
  out = []
  i = 0
  while i < len(pattern):
    c = pattern[i]
    if pattern.startswith("**/", i):
      out.append("(?:.*/)?")
      i += 3
    elif pattern.startswith("/**", i) and i + 3 == len(pattern):
      out.append("(?:/.*)?")
      i += 3
    elif pattern.startswith("**", i):
      out.append(".*")
      i += 2
    elif c == "*":
      out.append("[^/]*")
      i += 1
    elif c == "?":
      out.append("[^/]")
      i += 1
    elif c == "[":
      j = pattern.find("]", i + 1)
      if j < 0:
        raise errors.PatternError(f"pattern {pattern!r}: '[' at {i} has no closing ']'")
      body = pattern[i + 1 : j]
      if body.startswith("!"):
        body = "^" + body[1:]
      out.append(f"[{body}]")
      i = j + 1
    else:
      out.append(re.escape(c))
      i += 1
  return re.compile("".join(out))


def _names(params: Any) -> tuple[Any, list[str]]:
  _, treedef = jax.tree_util.tree_flatten(params)
  _, names = registry_lib.tree_keys(params, treedef, by="name")
  return treedef, [n for n in names if n is not None]


def _rules(rules: Mapping[str, T] | Iterable[tuple[str, T]]) -> list[tuple[str, T]]:
  items = list(rules.items()) if isinstance(rules, Mapping) else list(rules)
  for item in items:
    if not (isinstance(item, tuple) and len(item) == 2):
      raise errors.PatternError(
        f"rules must be a mapping or (pattern, label) pairs, got the item {item!r}"
      )
  return items


def label_by_pattern(
  params: Any, rules: Mapping[str, T] | Iterable[tuple[str, T]], *, require_all_used: bool = True
) -> Any:
  """A tree of labels (for ``optax.partition``) chosen by the first matching glob rule.

  Args:
    params: the parameter tree (arrays or ``ShapeDtypeStruct`` objects).
    rules: ordered ``{pattern: label}`` or ``[(pattern, label), ...]``.
    require_all_used: a rule that labels no parameter is an error (default).

  Returns:
    ``params``' structure with a label at each leaf.

  Raises:
    PatternError: parameters no rule matches, or rules that match nothing (all listed).

  Examples:
    >>> import jax.numpy as jnp
    >>> from paramreg_jax import label_by_pattern
    >>> params = {"enc": {"w": jnp.ones(2), "b": jnp.ones(2)}, "head": {"w": jnp.ones(2)}}
    >>> label_by_pattern(params, {"enc/**": "frozen", "**": "train"})
    {'enc': {'b': 'frozen', 'w': 'frozen'}, 'head': {'w': 'train'}}
  """
  items = _rules(rules)
  compiled = [(glob_to_regex(p), p, label) for p, label in items]
  treedef, names = _names(params)
  labels: list[Any] = []
  used = [False] * len(compiled)
  unmatched = []
  for name in names:
    for i, (regex, _, label) in enumerate(compiled):
      if regex.fullmatch(name):
        labels.append(label)
        used[i] = True
        break
    else:
      unmatched.append(f"n:{name}")
      labels.append(None)
  problems = [f"{k}: no rule matches (add a rule, e.g. '**' last)" for k in unmatched]
  if require_all_used:
    problems += [
      f"rule {p!r}: matches no parameter (a typo? parameter names look like "
      f"{names[0] if names else '<none>'!r})"
      for (_, p, _), u in zip(compiled, used)
      if not u
    ]
  if problems:
    raise errors.PatternError(
      f"{len(problems)} problem(s) labelling parameters by pattern:" + errors.bullet_list(problems)
    )
  return treedef.unflatten(labels)


def mask_by_pattern(
  params: Any, patterns: Sequence[str] | Mapping[str, bool], *, require_all_used: bool = True
) -> Any:
  """A boolean mask tree (for ``optax.masked`` / ``add_decayed_weights``) from glob patterns.

  Args:
    params: the parameter tree.
    patterns: a list of globs (``True`` where any matches, ``False`` elsewhere), or ordered
      ``{pattern: bool}`` rules where the first match wins and every parameter must match.
    require_all_used: a pattern that matches no parameter is an error (default).

  Returns:
    ``params``' structure with a ``bool`` at each leaf.

  Raises:
    PatternError: unused patterns (and, for rules, unmatched parameters), all listed.

  Examples:
    >>> import jax.numpy as jnp
    >>> from paramreg_jax import mask_by_pattern
    >>> params = {"dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)}}
    >>> mask_by_pattern(params, ["*/kernel"])
    {'dense': {'bias': False, 'kernel': True}}
  """
  if isinstance(patterns, str):
    raise errors.PatternError(f"patterns must be a list of globs, not the string {patterns!r}")
  if isinstance(patterns, Mapping):
    for p, v in patterns.items():
      if not isinstance(v, bool):
        raise errors.PatternError(f"rule {p!r}: the mask value must be a bool, got {v!r}")
    return label_by_pattern(params, patterns, require_all_used=require_all_used)
  globs = list(patterns)
  compiled = [glob_to_regex(p) for p in globs]
  treedef, names = _names(params)
  used = [False] * len(compiled)
  mask = []
  for name in names:
    hit = False
    for i, regex in enumerate(compiled):
      if regex.fullmatch(name):
        used[i] = hit = True
    mask.append(hit)
  unused = [p for p, u in zip(globs, used) if not u]
  if require_all_used and unused:
    raise errors.PatternError(
      f"{len(unused)} pattern(s) match no parameter (a typo? parameter names look like "
      f"{names[0] if names else '<none>'!r}):" + errors.bullet_list(repr(p) for p in unused)
    )
  return treedef.unflatten(mask)


def exclude_matcher(exclude: Any) -> Callable[[str], bool]:
  """``exclude`` (globs over names, or a predicate on names) as a predicate."""
  if exclude is None:
    return lambda name: False
  if callable(exclude):
    return exclude
  if isinstance(exclude, str):
    exclude = [exclude]
  regexes = [glob_to_regex(p) for p in exclude]
  return lambda name: any(r.fullmatch(name) for r in regexes)
