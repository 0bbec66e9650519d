"""What a recipe reads and produces, from the checkpoint's metadata alone.

:func:`infer` is the one way to infer a recipe: every op's ``infer`` rule, run bottom-up with
each node once. Inference against one of our sources is cached per source (its catalog never
changes): ``match`` infers a proposal, checks it with a plan, and the restore plans it again.
"""

from __future__ import annotations

from paramreg_jax._src import errors
from paramreg_jax._src.recipes.ops import base
from paramreg_jax._src.recipes.ops.source import Source
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource

Metas = dict[int, base.Meta]
"""Metadata by recipe node ``id`` (valid while the recipe is alive)."""

_LIMIT = 1_000_000
_CACHE_ATTR = "_paramreg_metas"  # per source: node id -> (node, meta), in the source itself


def infer(recipe: base.Recipe, src: CheckpointSource, *, memo: Metas | None = None) -> base.Meta:
  """The shape, dtype and bytes ``recipe`` produces, from ``src``'s metadata only.

  Reads no payload. Every invalid node raises its own error class naming the node.

  Args:
    recipe: a recipe.
    src: a checkpoint source.
    memo: when given, filled with the metadata of every node of ``recipe`` (by ``id``), as the
      compiler and the inverter need it.

  Returns:
    The output's :class:`~paramreg_jax.sources.TensorMetadata` (shape, dtype, nbytes).

  Raises:
    RecipeError: the subclass that names the problem (all in :mod:`paramreg_jax.errors`):
      ``EmptySourceKeyError``, ``UnknownSourceKeyError``, ``InvalidSelectionAxisError``,
      ``InvalidRangeError``, ``InvalidIndicesError``, ``EmptyInputsError``,
      ``DtypeMismatchError``, ``RecipeShapeMismatchError``, ``InvalidJoinAxisError``,
      ``ElementCountMismatchError``, ``InvalidPermutationError``, ``ByteCountMismatchError``,
      ``ZeroSizedOutputError``, ``UnsupportedDtypeError``, ``QuantizedLayoutError``.
    TypeError: ``recipe`` is not a recipe.

  Examples:
    >>> import numpy as np
    >>> from paramreg_jax import recipes
    >>> from paramreg_jax import MemorySource, Range
    >>> src = MemorySource({"left": np.zeros((2, 3), np.float16), "right": np.zeros((4, 3), np.float16)})
    >>> r = recipes.transpose(
    ...     recipes.concatenate([recipes.source("left"), recipes.source("right", Range(0, 0, 1))], 0), (1, 0))
    >>> recipes.infer(r, src), src.stats.reads
    (TensorMetadata(shape=(3, 3), dtype=dtype('float16'), nbytes=18), 0)
  """
  recipe = base.check_recipe(recipe, "recipe")
  every = memo is not None
  memo = {} if memo is None else memo
  cache = _cache(src)
  meta = _infer(recipe, src, memo, cache)
  if every:  # nodes below a cached node are not in the memo yet
    for node in base.nodes(recipe):
      if id(node) not in memo:
        _infer(node, src, memo, cache)
  return meta


def _infer(node: base.Recipe, src: CheckpointSource, memo: Metas, cache: dict | None) -> base.Meta:
  hit = memo.get(id(node))
  if hit is not None:
    return hit
  if cache is not None:
    entry = cache.get(id(node))
    if entry is not None and entry[0] is node:
      memo[id(node)] = entry[1]
      return entry[1]
  inputs = [_infer(c, src, memo, cache) for c in node.children()]
  meta = node.infer(inputs, src)
  if any(d == 0 for d in meta.shape) or meta.nbytes == 0:
    raise errors.ZeroSizedOutputError(f"{node}: produces {meta.shape}, zero bytes; nothing to load")
  memo[id(node)] = meta
  if cache is not None:
    if len(cache) > _LIMIT:
      cache.clear()
    cache[id(node)] = (node, meta)
  return meta


def _cache(src: CheckpointSource) -> dict[int, tuple[base.Recipe, base.Meta]] | None:
  """The metadata already inferred against ``src`` (a catalog never changes, so it holds for
  the source's life), kept in the source itself: it goes with the source, and threads that
  infer at once share one dict (``setdefault`` is atomic). Each entry holds its node, so an id
  is never mistaken for a reused one."""
  try:
    return src.__dict__.setdefault(_CACHE_ATTR, {})
  except AttributeError:  # a source of one's own with __slots__: no cache
    return None


def source_keys(recipe: base.Recipe) -> tuple[str, ...]:
  """The distinct checkpoint keys ``recipe`` reads, sorted.

  Args:
    recipe: a recipe.

  Returns:
    The keys of every ``source(...)`` node, each once, sorted.

  Raises:
    TypeError: ``recipe`` is not a recipe.

  Examples:
    >>> from paramreg_jax import recipes
    >>> r = recipes.concatenate([recipes.source("b"), recipes.source("a"), recipes.source("b")])
    >>> recipes.source_keys(r)
    ('a', 'b')
  """
  recipe = base.check_recipe(recipe, "recipe")
  hit = recipe.__dict__.get(_KEYS_ATTR)
  if hit is not None:
    return hit
  keys = tuple(sorted({n.key for n in base.nodes(recipe) if isinstance(n, Source)}))
  recipe.__dict__[_KEYS_ATTR] = keys  # a recipe never changes: its keys are kept with it
  return keys


# source_keys, kept in the recipe (a stacked MoE parameter has 16,000 sources, and the plan
# asks for its keys several times); not a field, so equality and hashing ignore it.
_KEYS_ATTR = "_paramreg_source_keys"
