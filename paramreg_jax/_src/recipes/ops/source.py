"""``source(key, selection)``: reads a checkpoint tensor, or a ``Range``/``Indices`` of it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.recipes.ops import base
from paramreg_jax._src.sources import checkpoint_source as source_lib
from paramreg_jax._src.sources import selection as sel_lib


@dataclasses.dataclass(frozen=True)
class Source(base.Recipe):
  key: str
  selection: sel_lib.Selection = sel_lib.Full()  # noqa: RUF009 (immutable)

  def __str__(self) -> str:
    sel = "" if isinstance(self.selection, sel_lib.Full) else f", {self.selection}"
    return f"source({self.key!r}{sel})"

  def infer(self, inputs: list[base.Meta], src: source_lib.CheckpointSource) -> base.Meta:
    if not self.key.strip():
      raise errors.EmptySourceKeyError(f"{self}: the key must be a non-empty string")
    if self.key not in src:
      raise errors.UnknownSourceKeyError(
        f"{self}: the checkpoint has no tensor {self.key!r}"
        + errors.did_you_mean(self.key, src.keys())
      )
    stored = source_lib.metadata_of(src, self.key)
    base.check_dtype(stored.dtype, self)
    shape = self.selection.apply_shape(stored.shape, where=self)
    return base.Meta.of(shape, np.dtype(stored.dtype))

  def program(self, region: sel_lib.Region, build: base.Building) -> base.Run:
    return base.selected(lambda r: build.read(self.key, r), self.selection, region)

  def invert(self, region: base.InverseRegion, steps: base.Steps, walk: base.Walking) -> None:
    stored = walk.stored(self.key)
    walk.place(self.key, walk.compose(region, self.selection, tuple(stored.shape)), steps)

  def code(self, code_of: Callable[[base.Recipe], str]) -> str:
    sel = base.selection_code(self.selection)
    return f"R.source({self.key!r}, {sel})" if sel else f"R.source({self.key!r})"


def source(key: str, selection: Any = None) -> Source:
  """Reads checkpoint tensor ``key`` (optionally ``Range``/``Indices`` of it).

  Args:
    key: the tensor's name in the checkpoint (``"model.layers.0.mlp.up_proj.weight"``).
    selection: ``None`` (or ``Full()``) for the whole tensor, or a
      :class:`~paramreg_jax.Range`/:class:`~paramreg_jax.Indices` along one axis: only
      those rows are read.

  Returns:
    A recipe; nothing is read until a restore (or :func:`evaluate`) runs it.

  Raises:
    EmptySourceKeyError: ``key`` is empty or whitespace.
    SelectionError: ``selection`` is not a selection, or (against a source) does not fit the
      tensor's shape.
    UnknownSourceKeyError: (against a source) the checkpoint has no tensor ``key``.

  Examples:
    >>> from paramreg_jax import recipes
    >>> from paramreg_jax import Range
    >>> print(recipes.source("qkv", Range(0, 0, 64)))
    source('qkv', Range(axis=0, 0:64))
  """
  if not isinstance(key, str) or not key.strip():
    raise errors.EmptySourceKeyError(f"source({key!r}): the key must be a non-empty string")
  return Source(key, sel_lib.check_selection(selection))


def recorded_format_problem(
  node: base.Recipe, fmt: str, src: source_lib.CheckpointSource, where: Any
) -> str | None:
  """Why reading ``node``'s bytes as ``fmt`` blocks contradicts the source, or None: a
  tensor the source records in another format (a GGUF file's Q8_0 read as Q4_0) would be
  decoded into garbage of the right shape."""
  if isinstance(node, Source):
    recorded = src.quantization(node.key)
    if recorded is not None and recorded != fmt:
      return (
        f"{where}: the checkpoint records {node.key!r} as {recorded} blocks, not {fmt}; "
        f"read it with {recorded!r}"
      )
    return None
  for child in node.children():
    problem = recorded_format_problem(child, fmt, src, where)
    if problem:
      return problem
  return None


def map_sources(recipe: base.Recipe, fn: Callable[[Source], base.Recipe]) -> base.Recipe:
  """``recipe`` with every ``source`` node replaced by ``fn(node)`` (a recipe), the rest of its
  structure unchanged.

  Examples:
    >>> from paramreg_jax import recipes as R
    >>> print(map_sources(R.transpose(R.source("w"), (1, 0)), lambda s: R.source("v")))
    transpose(source('v'), (1, 0))
  """
  if isinstance(recipe, Source):
    return fn(recipe)
  fields = {}
  for f in dataclasses.fields(recipe):  # type: ignore[arg-type]
    value = getattr(recipe, f.name)
    if isinstance(value, base.Recipe):
      value = map_sources(value, fn)
    elif isinstance(value, tuple) and value and isinstance(value[0], base.Recipe):
      value = tuple(map_sources(v, fn) for v in value)
    fields[f.name] = value
  return type(recipe)(**fields)


def rekey(recipe: base.Recipe, key_fn: Callable[[str], str]) -> base.Recipe:
  """``recipe`` with every source key ``k`` read as ``key_fn(k)`` (a layer's recipe from layer
  0's, a hint's ``{i}`` filled in); the structure and selections unchanged."""
  return map_sources(recipe, lambda s: Source(key_fn(s.key), s.selection))
