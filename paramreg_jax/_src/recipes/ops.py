"""The recipe vocabulary (frozen, hashable values) and metadata-only inference.

A recipe describes how to derive one weight from checkpoint tensors: ``source`` reads a key
(optionally a selection of it) and ``select``, ``concatenate``, ``stack``, ``reshape``,
``transpose``, ``cast``, ``view``, ``neg_log`` and ``subtract_one`` transform it. There is no
silent dequantize: packed data stays as it is (``view`` reinterprets bits). :func:`infer`
computes the result's shape/dtype/bytes from metadata alone and raises a distinct error for
every invalid node, naming it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.sources import base as source_lib
from paramreg_jax._src.sources import selection as sel_lib

SUPPORTED_DTYPES = frozenset(
  np.dtype(d)
  for d in (
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
    np.complex128,
    ml_dtypes.bfloat16,
    ml_dtypes.float8_e4m3fn,
    ml_dtypes.float8_e5m2,
  )
) | frozenset(
  np.dtype(getattr(ml_dtypes, n))
  for n in ("float8_e8m0fnu", "int4", "uint4")
  if hasattr(ml_dtypes, n)
)


def check_dtype(dtype: Any, where: Any) -> np.dtype:
  """``where`` (formatted only on an error) names the node."""
  if isinstance(dtype, np.dtype) and dtype in SUPPORTED_DTYPES:
    return dtype
  try:
    dt = np.dtype(dtype)
  except TypeError:
    raise errors.UnsupportedDtypeError(f"{where}: {dtype!r} is not a dtype") from None
  if dt not in SUPPORTED_DTYPES:
    raise errors.UnsupportedDtypeError(
      f"{where}: dtype {dt} is not supported by recipes (numeric and ml_dtypes types only)"
    )
  return dt


class Recipe:
  """Base of every recipe node (frozen dataclasses; compare and hash by value).

  Examples:
    >>> from paramreg_jax import recipes
    >>> isinstance(recipes.transpose(recipes.source("w"), (1, 0)), recipes.Recipe)
    True
  """

  def children(self) -> tuple[Recipe, ...]:
    return ()


def _check_recipe(x: Any, what: str) -> Recipe:
  if not isinstance(x, Recipe):
    raise TypeError(f"{what} must be a recipe (source(...), transpose(...), ...), got {x!r}")
  return x


def _axis(x: Any, what: str) -> int:
  if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 0:
    raise TypeError(f"{what} must be a non-negative int, got {x!r}")
  return int(x)


def _ints(xs: Any, what: str) -> tuple[int, ...]:
  if isinstance(xs, (str, bytes)) or not isinstance(xs, Sequence):
    raise TypeError(f"{what} must be a sequence of ints, got {xs!r}")
  return tuple(_axis(x, f"each entry of {what}") for x in xs)


@dataclasses.dataclass(frozen=True)
class Source(Recipe):
  key: str
  selection: sel_lib.Selection = sel_lib.Full()  # noqa: RUF009 (immutable)

  def __str__(self) -> str:
    sel = "" if isinstance(self.selection, sel_lib.Full) else f", {self.selection}"
    return f"source({self.key!r}{sel})"


@dataclasses.dataclass(frozen=True)
class Select(Recipe):
  input: Recipe
  selection: sel_lib.Selection

  def children(self) -> tuple[Recipe, ...]:
    return (self.input,)

  def __str__(self) -> str:
    return f"select({self.input}, {self.selection})"


def _listing(inputs: Sequence[Recipe]) -> str:
  """``[a, b]``, or for three or more inputs that differ only in one counting number (layer
  ``i`` of a checkpoint) ``32 × transpose(source('layers.{i}.w'), (1, 0))``, so a plan's line
  for a 32-layer stack stays readable."""
  parts = [str(x) for x in inputs]
  summary = _counted(parts) if len(parts) >= 3 else None
  return summary or f"[{', '.join(parts)}]"


def _counted(parts: list[str]) -> str | None:
  tokens = [re.split(r"(\d+)", p) for p in parts]  # odd positions hold the numbers
  if len({len(t) for t in tokens}) != 1:
    return None
  first = tokens[0]
  varying = [j for j in range(1, len(first), 2) if len({t[j] for t in tokens}) > 1]
  if not varying or any(t[j] != first[j] for t in tokens for j in range(0, len(first), 2)):
    return None
  if any(
    len({t[j] for j in varying}) != 1 or str(int(t[varying[0]])) != t[varying[0]] for t in tokens
  ):
    return None
  start = int(first[varying[0]])
  if [int(t[varying[0]]) for t in tokens] != list(range(start, start + len(parts))):
    return None
  template = "".join("{i}" if j in varying else tok for j, tok in enumerate(first))
  span = f" for i in {start}..{start + len(parts) - 1}" if start else ""
  return f"{len(parts)} × {template}{span}"


@dataclasses.dataclass(frozen=True)
class Concatenate(Recipe):
  inputs: tuple[Recipe, ...]
  axis: int

  def children(self) -> tuple[Recipe, ...]:
    return self.inputs

  def __str__(self) -> str:
    return f"concatenate({_listing(self.inputs)}, axis={self.axis})"


@dataclasses.dataclass(frozen=True)
class Stack(Recipe):
  inputs: tuple[Recipe, ...]
  axis: int

  def children(self) -> tuple[Recipe, ...]:
    return self.inputs

  def __str__(self) -> str:
    return f"stack({_listing(self.inputs)}, axis={self.axis})"


@dataclasses.dataclass(frozen=True)
class Reshape(Recipe):
  input: Recipe
  shape: tuple[int, ...]

  def children(self) -> tuple[Recipe, ...]:
    return (self.input,)

  def __str__(self) -> str:
    return f"reshape({self.input}, {self.shape})"


@dataclasses.dataclass(frozen=True)
class Transpose(Recipe):
  input: Recipe
  axes: tuple[int, ...]

  def children(self) -> tuple[Recipe, ...]:
    return (self.input,)

  def __str__(self) -> str:
    return f"transpose({self.input}, {self.axes})"


@dataclasses.dataclass(frozen=True)
class Cast(Recipe):
  input: Recipe
  dtype: np.dtype

  def children(self) -> tuple[Recipe, ...]:
    return (self.input,)

  def __str__(self) -> str:
    return f"cast({self.input}, {self.dtype.name})"


@dataclasses.dataclass(frozen=True)
class View(Recipe):
  input: Recipe
  dtype: np.dtype
  shape: tuple[int, ...]

  def children(self) -> tuple[Recipe, ...]:
    return (self.input,)

  def __str__(self) -> str:
    return f"view({self.input}, {self.dtype.name}, {self.shape})"


@dataclasses.dataclass(frozen=True)
class NegLog(Recipe):
  input: Recipe

  def children(self) -> tuple[Recipe, ...]:
    return (self.input,)

  def __str__(self) -> str:
    return f"neg_log({self.input})"


@dataclasses.dataclass(frozen=True)
class SubtractOne(Recipe):
  input: Recipe

  def children(self) -> tuple[Recipe, ...]:
    return (self.input,)

  def __str__(self) -> str:
    return f"subtract_one({self.input})"


# --- constructors (the public vocabulary) ------------------------------------------------


def source(key: str, selection: Any = None) -> Source:
  """Reads checkpoint tensor ``key`` (optionally ``Range``/``Indices`` of it).

  Raises:
    EmptySourceKeyError: ``key`` is empty or whitespace.

  Examples:
    >>> from paramreg_jax import recipes
    >>> from paramreg_jax.sources import Range
    >>> print(recipes.source("qkv", Range(0, 0, 64)))
    source('qkv', Range(axis=0, 0:64))
  """
  if not isinstance(key, str) or not key.strip():
    raise errors.EmptySourceKeyError(f"source({key!r}): the key must be a non-empty string")
  return Source(key, sel_lib.check_selection(selection))


def select(x: Recipe, selection: Any) -> Select:
  """A further ``Range``/``Indices`` selection of a derived value.

  Examples:
    >>> from paramreg_jax import recipes
    >>> from paramreg_jax.sources import Indices
    >>> print(recipes.select(recipes.source("w"), Indices(0, [2, 0])))
    select(source('w'), Indices(axis=0, [2, 0]))
  """
  return Select(_check_recipe(x, "select's input"), sel_lib.check_selection(selection))


def concatenate(xs: Sequence[Recipe], axis: int = 0) -> Concatenate:
  """Joins ``xs`` along an existing ``axis``.

  Examples:
    >>> from paramreg_jax import recipes
    >>> print(recipes.concatenate([recipes.source("a"), recipes.source("b")], axis=1))
    concatenate([source('a'), source('b')], axis=1)
  """
  return Concatenate(tuple(_check_recipe(x, "each input") for x in xs), _axis(axis, "axis"))


def stack(xs: Sequence[Recipe], axis: int = 0) -> Stack:
  """Joins ``xs`` along a new ``axis`` (unstacked layers → one scanned array).

  Examples:
    >>> from paramreg_jax import recipes
    >>> print(recipes.stack([recipes.source(f"layer{i}/w") for i in range(2)]))
    stack([source('layer0/w'), source('layer1/w')], axis=0)
  """
  return Stack(tuple(_check_recipe(x, "each input") for x in xs), _axis(axis, "axis"))


def reshape(x: Recipe, shape: Sequence[int]) -> Reshape:
  """Row-major reshape; the element count must not change.

  Examples:
    >>> from paramreg_jax import recipes
    >>> print(recipes.reshape(recipes.source("w"), (2, 8)))
    reshape(source('w'), (2, 8))
  """
  return Reshape(_check_recipe(x, "reshape's input"), _ints(shape, "shape"))


def transpose(x: Recipe, axes: Sequence[int]) -> Transpose:
  """Permutes axes: output axis ``i`` is input axis ``axes[i]`` (``[out, in]`` → ``[in, out]``).

  Examples:
    >>> from paramreg_jax import recipes
    >>> print(recipes.transpose(recipes.source("w"), (1, 0)))
    transpose(source('w'), (1, 0))
  """
  return Transpose(_check_recipe(x, "transpose's input"), _ints(axes, "axes"))


def cast(x: Recipe, dtype: Any) -> Cast:
  """Numeric conversion to ``dtype``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from paramreg_jax import recipes
    >>> print(recipes.cast(recipes.source("w"), jnp.bfloat16))
    cast(source('w'), bfloat16)
  """
  return Cast(_check_recipe(x, "cast's input"), check_dtype(dtype, "cast"))


def view(x: Recipe, dtype: Any, shape: Sequence[int]) -> View:
  """Reinterprets the bytes as ``dtype`` with ``shape`` (no numeric conversion).

  Examples:
    >>> import numpy as np
    >>> from paramreg_jax import recipes
    >>> print(recipes.view(recipes.source("packed"), np.uint8, (16,)))
    view(source('packed'), uint8, (16,))
  """
  return View(_check_recipe(x, "view's input"), check_dtype(dtype, "view"), _ints(shape, "shape"))


def neg_log(x: Recipe) -> NegLog:
  """Elementwise ``log(-x)`` (e.g. a stored ``A`` to the ``A_log`` a model expects).

  Examples:
    >>> from paramreg_jax import recipes
    >>> print(recipes.neg_log(recipes.source("A")))
    neg_log(source('A'))
  """
  return NegLog(_check_recipe(x, "neg_log's input"))


def subtract_one(x: Recipe) -> SubtractOne:
  """Elementwise ``x - 1`` (offset-normalised norm weights).

  Examples:
    >>> from paramreg_jax import recipes
    >>> print(recipes.subtract_one(recipes.source("norm")))
    subtract_one(source('norm'))
  """
  return SubtractOne(_check_recipe(x, "subtract_one's input"))


def source_keys(recipe: Recipe) -> tuple[str, ...]:
  """The distinct checkpoint keys ``recipe`` reads, sorted.

  Examples:
    >>> from paramreg_jax import recipes
    >>> r = recipes.concatenate([recipes.source("b"), recipes.source("a"), recipes.source("b")])
    >>> recipes.source_keys(r)
    ('a', 'b')
  """
  recipe = _check_recipe(recipe, "recipe")
  hit = _KEYS.get(id(recipe))
  if hit is not None and hit[0] is recipe:
    return hit[1]
  out: set[str] = set()
  stack_: list[Recipe] = [recipe]
  while stack_:
    node = stack_.pop()
    if isinstance(node, Source):
      out.add(node.key)
    stack_.extend(node.children())
  keys = tuple(sorted(out))
  if len(_KEYS) > 4096:
    _KEYS.clear()
  _KEYS[id(recipe)] = (recipe, keys)
  return keys


# source_keys of the latest large recipes (a stacked MoE parameter has 16,000 sources, and the
# plan asks for its keys several times); each entry holds its recipe, so ids are not reused.
_KEYS: dict[int, tuple[Recipe, tuple[str, ...]]] = {}


# --- inference ----------------------------------------------------------------------------


def infer(recipe: Recipe, src: Any) -> source_lib.TensorMetadata:
  """The shape, dtype and bytes ``recipe`` produces, from ``src``'s metadata only.

  Reads no payload. Every invalid node raises its own error class naming the node.

  Raises:
    EmptySourceKeyError, UnknownSourceKeyError, InvalidSelectionAxisError, InvalidRangeError,
    InvalidIndicesError, EmptyInputsError, DtypeMismatchError, RecipeShapeMismatchError,
    InvalidJoinAxisError, ElementCountMismatchError, InvalidPermutationError,
    ByteCountMismatchError, ZeroSizedOutputError, UnsupportedDtypeError.

  Examples:
    >>> import numpy as np
    >>> from paramreg_jax import recipes
    >>> from paramreg_jax.sources import MemorySource, Range
    >>> src = MemorySource({"left": np.zeros((2, 3), np.float16), "right": np.zeros((4, 3), np.float16)})
    >>> r = recipes.transpose(
    ...     recipes.concatenate([recipes.source("left"), recipes.source("right", Range(0, 0, 1))], 0), (1, 0))
    >>> recipes.infer(r, src), src.stats.reads
    (TensorMetadata(shape=(3, 3), dtype=dtype('float16'), nbytes=18), 0)
  """
  return _infer(_check_recipe(recipe, "recipe"), src, {})


def _infer(
  node: Recipe, src: Any, memo: dict[int, source_lib.TensorMetadata]
) -> source_lib.TensorMetadata:
  hit = memo.get(id(node))
  if hit is not None:
    return hit
  cache = _known(src)
  if cache is not None:
    entry = cache.get(id(node))
    if entry is not None and entry[0] is node:
      memo[id(node)] = entry[1]
      return entry[1]
  meta = _infer_node(node, src, memo)
  if any(d == 0 for d in meta.shape) or meta.nbytes == 0:
    raise errors.ZeroSizedOutputError(f"{node}: produces {meta.shape}, zero bytes; nothing to load")
  memo[id(node)] = meta
  if cache is not None:
    if len(cache) > _KNOWN_LIMIT:
      cache.clear()
    cache[id(node)] = (node, meta)
  return meta


_KNOWN_LIMIT = 1_000_000


def _known(src: Any) -> dict[int, tuple[Recipe, source_lib.TensorMetadata]] | None:
  """What was inferred against ``src`` (one of our sources: its catalog never changes), by
  recipe node; each entry holds its node, so an id is never reused while it is cached. ``match``
  infers a proposal, checks it with a plan, and the restore plans it again: each node once."""
  if not isinstance(src, source_lib.BaseSource):
    return None
  cache = src.__dict__.get("_inferred")
  if cache is None:
    cache = src.__dict__["_inferred"] = {}
  return cache


def _infer_node(node: Recipe, src: Any, memo: dict[int, Any]) -> source_lib.TensorMetadata:
  if isinstance(node, Source):
    if not node.key.strip():
      raise errors.EmptySourceKeyError(f"{node}: the key must be a non-empty string")
    if not source_lib.has_key(src, node.key):
      raise errors.UnknownSourceKeyError(
        f"{node}: the checkpoint has no tensor {node.key!r}"
        + errors.did_you_mean(node.key, src.keys())
      )
    stored = source_lib.metadata_of(src, node.key)
    check_dtype(stored.dtype, node)
    return source_lib.TensorMetadata.of(
      node.selection.apply_shape(stored.shape, where=node), np.dtype(stored.dtype)
    )
  inputs = [_infer(c, src, memo) for c in node.children()]
  if isinstance(node, Select):
    (m,) = inputs
    return source_lib.TensorMetadata.of(node.selection.apply_shape(m.shape, where=node), m.dtype)
  if isinstance(node, (Concatenate, Stack)):
    stacking = isinstance(node, Stack)
    if not inputs:
      raise errors.EmptyInputsError(f"{node}: needs at least one input")
    dtypes = {m.dtype for m in inputs}
    if len(dtypes) > 1:
      raise errors.DtypeMismatchError(
        f"{node}: inputs have dtypes {[m.dtype.name for m in inputs]}; cast them to one dtype first"
      )
    rank = len(inputs[0].shape)
    if node.axis > rank or (not stacking and node.axis >= rank):
      raise errors.InvalidJoinAxisError(
        f"{node}: axis {node.axis} is out of range for inputs of rank {rank} "
        f"({'stack allows 0..rank' if stacking else 'concatenate allows 0..rank-1'})"
      )
    first = inputs[0].shape
    for m in inputs[1:]:
      same = (
        m.shape == first
        if stacking
        else (
          len(m.shape) == rank
          and all(a == b for i, (a, b) in enumerate(zip(m.shape, first)) if i != node.axis)
        )
      )
      if not same:
        raise errors.RecipeShapeMismatchError(
          f"{node}: input shapes {[m.shape for m in inputs]} cannot be "
          f"{'stacked (all must be equal)' if stacking else f'concatenated along axis {node.axis}'}"
        )
    if stacking:
      shape = (*first[: node.axis], len(inputs), *first[node.axis :])
    else:
      shape = tuple(
        sum(m.shape[node.axis] for m in inputs) if i == node.axis else d
        for i, d in enumerate(first)
      )
    return source_lib.TensorMetadata.of(shape, inputs[0].dtype)
  (m,) = inputs
  if isinstance(node, Reshape):
    if math.prod(node.shape) != math.prod(m.shape):
      raise errors.ElementCountMismatchError(
        f"{node}: input {m.shape} has {math.prod(m.shape)} elements, {node.shape} has "
        f"{math.prod(node.shape)}"
      )
    return source_lib.TensorMetadata.of(tuple(node.shape), m.dtype)
  if isinstance(node, Transpose):
    if sorted(node.axes) != list(range(len(m.shape))):
      raise errors.InvalidPermutationError(
        f"{node}: axes {node.axes} are not a permutation of 0..{len(m.shape) - 1} (input {m.shape})"
      )
    return source_lib.TensorMetadata.of(tuple(m.shape[a] for a in node.axes), m.dtype)
  if isinstance(node, Cast):
    return source_lib.TensorMetadata.of(m.shape, check_dtype(node.dtype, node))
  if isinstance(node, View):
    out = source_lib.TensorMetadata(node.shape, check_dtype(node.dtype, str(node)))
    if out.nbytes != m.nbytes:
      raise errors.ByteCountMismatchError(
        f"{node}: input {m} is {m.nbytes} bytes, {node.shape} {out.dtype.name} is {out.nbytes}"
      )
    return out
  if isinstance(node, NegLog):
    if not np.issubdtype(m.dtype, np.floating) and m.dtype != np.dtype(ml_dtypes.bfloat16):
      raise errors.UnsupportedDtypeError(
        f"{node}: log needs a floating dtype, got {m.dtype.name}; cast first"
      )
    return m
  if isinstance(node, SubtractOne):
    if m.dtype == np.bool_:
      raise errors.UnsupportedDtypeError(f"{node}: cannot subtract one from bool; cast first")
    return m
  raise TypeError(f"unknown recipe node {node!r}")
