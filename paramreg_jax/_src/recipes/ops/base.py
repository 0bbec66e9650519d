"""What every recipe op is: a frozen value with its four rules in one place.

An op (one file each in this folder) is a frozen, hashable dataclass deriving from
:class:`Recipe`. It defines, beside its fields and ``__str__``:

* ``infer(inputs, src)``: its output's metadata from its inputs' (and, for ``source``, the
  checkpoint's catalog); an invalid node raises its own error class, naming the node;
* ``program(region, build)``: the reads and the host function that compute one box of its
  output (:mod:`paramreg_jax._src.recipes.compiler` drives it);
* ``invert(region, steps, walk)``: where its output goes in the stored tensors
  (:mod:`paramreg_jax._src.export.invert` drives it), with the :class:`InverseStep` values it
  emits in ``inverse_steps``;
* ``code(code_of)``: Python that builds it with ``paramreg_jax.recipes as R`` (``match``'s
  ``to_python``).

The drivers pass the small interfaces below (:class:`Building`, :class:`Walking`), so an op
file imports nothing of theirs. A new op is one new file plus its line in ``op_table.py``
(``OPS``) and its export in ``__init__.py``; ``tests/test_op_contract.py`` then asks for a sample.
"""

from __future__ import annotations

import abc
import dataclasses
import re
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any
from typing import ClassVar
from typing import Protocol

import ml_dtypes
import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.sources import checkpoint_source as source_lib
from paramreg_jax._src.sources import selection as sel_lib

Meta = source_lib.TensorMetadata


@dataclasses.dataclass(frozen=True)
class Read:
  """One box of one stored tensor (in the stored tensor's coordinates)."""

  key: str
  box: sel_lib.Region


Fetch = Callable[[Read], np.ndarray]
Run = Callable[[Fetch], np.ndarray]
"""A compiled box: ``run(fetch)`` is its value; ``fetch(read)`` returns the buffer of a read."""

# One axis of an inverse region: None (all of it), ("range", start, stop) or ("indices", (i, ...)).
InverseRegion = tuple[Any, ...]
Steps = tuple[tuple[Any, ...], ...]


class Building(Protocol):
  """What :meth:`Recipe.program` gets from the compiler."""

  def meta(self, node: Recipe) -> Meta:
    """``node``'s inferred metadata."""
    ...

  def child(self, node: Recipe, region: sel_lib.Region) -> Run:
    """The program of ``region`` of ``node`` (an input of the op)."""
    ...

  def read(self, key: str, region: sel_lib.Region) -> Run:
    """A leaf: ``region`` of stored tensor ``key``, recorded as a read."""
    ...


class Walking(Protocol):
  """What :meth:`Recipe.invert` gets from the inverter."""

  def meta(self, node: Recipe) -> Meta: ...

  def walk(self, node: Recipe, region: InverseRegion, steps: Steps) -> None:
    """Continues the inversion into ``node`` (an input of the op)."""
    ...

  def stored(self, key: str) -> Meta:
    """The stored tensor ``key``'s metadata."""
    ...

  def place(self, key: str, region: InverseRegion, steps: Steps) -> None:
    """``steps`` applied to the parameter give ``region`` of stored tensor ``key``."""
    ...

  def compose(self, region: InverseRegion, selection: Any, shape: tuple[int, ...]) -> Any:
    """``region`` (in ``selection``'s output coordinates) in its input's coordinates."""
    ...


class NotInvertible(Exception):
  """A recipe node that cannot be run backwards; ``str`` says which and why."""


@dataclasses.dataclass(frozen=True, repr=False)
class InverseStep:
  """One step from a parameter's value towards a stored tensor: ``(step, *args)`` in a
  placement's ``ops``, run by ``step.apply(value, *args)`` and shown by
  ``step.describe(*args)``. It prints as its name."""

  name: str
  apply: Callable[..., np.ndarray]
  describe: Callable[..., str]

  def __repr__(self) -> str:
    return self.name


class Recipe(abc.ABC):
  """Base of every recipe node (frozen dataclasses; compare and hash by value).

  Examples:
    >>> from paramreg_jax import recipes
    >>> isinstance(recipes.transpose(recipes.source("w"), (1, 0)), recipes.Recipe)
    True
  """

  #: the steps :meth:`invert` may emit
  inverse_steps: ClassVar[tuple[InverseStep, ...]] = ()

  def children(self) -> tuple[Recipe, ...]:
    return ()

  @abc.abstractmethod
  def __str__(self) -> str:
    """The recipe as it prints (``transpose(source('w'), (1, 0))``)."""

  @abc.abstractmethod
  def infer(self, inputs: list[Meta], src: source_lib.CheckpointSource) -> Meta:
    """The output's metadata from the inputs' (raises the op's error, naming the node)."""

  @abc.abstractmethod
  def program(self, region: sel_lib.Region, build: Building) -> Run:
    """The reads and the host function that compute ``region`` of the output."""

  @abc.abstractmethod
  def invert(self, region: InverseRegion, steps: Steps, walk: Walking) -> None:
    """Where ``region`` of the output goes in the stored tensors (or ``NotInvertible``)."""

  @abc.abstractmethod
  def code(self, code_of: Callable[[Recipe], str]) -> str:
    """Python that builds the recipe with ``paramreg_jax.recipes as R``."""


class Unary(Recipe):
  """An op with one input, ``self.input``."""

  input: Recipe

  def children(self) -> tuple[Recipe, ...]:
    return (self.input,)


class Elementwise(Unary):
  """An op applied value by value, with one exact inverse step (as jax's ``standard_unop``):
  a subclass gives its ``name`` (its ``R.`` constructor), ``apply`` (on NumPy values, the
  node passed for its errors), ``check`` (of its input's metadata) and ``inverse_steps``;
  the four rules are these."""

  name: ClassVar[str]

  @abc.abstractmethod
  def apply(self, x: np.ndarray) -> np.ndarray:
    """The op on a box of NumPy values."""

  def check(self, m: Meta) -> None:
    """Raises the op's error for an input it is not defined for (by dtype)."""

  def __str__(self) -> str:
    return f"{self.name}({self.input})"

  def infer(self, inputs: list[Meta], src: source_lib.CheckpointSource) -> Meta:
    (m,) = inputs
    self.check(m)
    return m

  def program(self, region: sel_lib.Region, build: Building) -> Run:
    operand = build.child(self.input, region)
    return lambda fetch: self.apply(operand(fetch))

  def invert(self, region: InverseRegion, steps: Steps, walk: Walking) -> None:
    (step,) = self.inverse_steps
    walk.walk(self.input, region, (*steps, (step,)))

  def code(self, code_of: Callable[[Recipe], str]) -> str:
    return f"R.{self.name}({code_of(self.input)})"


def whole(rank: int) -> InverseRegion:
  """The inverse region of a whole tensor of ``rank``."""
  return (None,) * rank


def require_whole(node: Recipe, region: InverseRegion) -> None:
  """Refuses to invert part of a reshape/view/join: that part has no place in storage."""
  if any(r is not None for r in region):
    raise NotInvertible(
      f"{node}: a select above it keeps part of its output, and part of a "
      f"{type(node).__name__.lower()} has no place in the stored tensor (select the stored "
      "tensor before reshaping or joining instead)"
    )


# --- argument checks shared by the constructors --------------------------------------------

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


def nodes(recipe: Recipe) -> Iterator[Recipe]:
  """Every node of ``recipe``, itself first (depth first; a node reached twice comes twice).

  Examples:
    >>> from paramreg_jax import recipes as R
    >>> [type(n).__name__ for n in nodes(R.transpose(R.source("w"), (1, 0)))]
    ['Transpose', 'Source']
  """
  stack = [recipe]
  while stack:
    node = stack.pop()
    yield node
    stack.extend(node.children())


def check_recipe(x: Any, what: str) -> Recipe:
  """``x`` if it is a recipe, else a ``TypeError`` naming ``what``."""
  if not isinstance(x, Recipe):
    raise TypeError(f"{what} must be a recipe (source(...), transpose(...), ...), got {x!r}")
  return x


def check_axis(x: Any, what: str) -> int:
  if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 0:
    raise TypeError(f"{what} must be a non-negative int, got {x!r}")
  return int(x)


def check_ints(xs: Any, what: str) -> tuple[int, ...]:
  if isinstance(xs, (str, bytes)) or not isinstance(xs, Sequence):
    raise TypeError(f"{what} must be a sequence of ints, got {xs!r}")
  return tuple(check_axis(x, f"each entry of {what}") for x in xs)


def listing(inputs: Sequence[Recipe]) -> str:
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


def indices_code(indices: tuple[int, ...]) -> str:
  """Python for ``indices``: equal runs at a fixed stride (how every per-head, grouped or
  blocked fused layout selects its rows) as one comprehension, else the list.

  Examples:
    >>> from paramreg_jax._src.recipes.ops.base import indices_code
    >>> indices_code((0, 1, 6, 7, 12, 13))
    '[r + c for r in range(0, 18, 6) for c in range(2)]'
  """
  runs: list[tuple[int, int]] = []  # (start, length)
  for i in indices:
    if runs and i == runs[-1][0] + runs[-1][1]:
      runs[-1] = (runs[-1][0], runs[-1][1] + 1)
    else:
      runs.append((i, 1))
  lengths = {n for _, n in runs}
  strides = {b[0] - a[0] for a, b in zip(runs, runs[1:])}
  if len(runs) > 1 and len(lengths) == 1 and len(strides) == 1 and min(strides) > 0:
    (n,), (stride,) = lengths, strides
    stop = runs[-1][0] + stride
    return f"[r + c for r in range({runs[0][0]}, {stop}, {stride}) for c in range({n})]"
  return str(list(indices))


def selection_code(sel: Any) -> str | None:
  """Python for a ``Range``/``Indices`` selection, None for ``Full``."""
  if isinstance(sel, sel_lib.Range):
    return f"prj.Range({sel.axis}, {sel.start}, {sel.stop})"
  if isinstance(sel, sel_lib.Indices):
    return f"prj.Indices({sel.axis}, {indices_code(sel.indices)})"
  return None


@dataclasses.dataclass(frozen=True)
class BlockSpan:
  """The blocks of ``per`` values that cover a box's last axis: ``lead`` (the box's other
  axes), blocks ``first:last``, and the values to ``skip`` in the first block."""

  lead: tuple[tuple[int, int], ...]
  first: int
  last: int
  skip: int
  width: int  # the box's values along the last axis

  @classmethod
  def of(cls, region: sel_lib.Region, per: int) -> BlockSpan:
    *lead, (c0, c1) = region
    first, last = c0 // per, -(-c1 // per)
    return cls(tuple(lead), first, last, c0 - first * per, c1 - c0)

  @property
  def rows(self) -> tuple[int, ...]:
    return tuple(b - a for a, b in self.lead)

  def trim(self, values: np.ndarray) -> np.ndarray:
    """The box's values out of the covering blocks' (along the last axis)."""
    return values[..., self.skip : self.skip + self.width]


def selected(
  compile_region: Callable[[sel_lib.Region], Run],
  selection: sel_lib.Selection,
  region: sel_lib.Region,
) -> Run:
  """``region`` of a selected tensor through ``compile_region(unselected_region)``, minimally."""
  regions, gather, axis = sel_lib.selection_regions(selection, region)
  parts = [compile_region(r) for r in regions]
  return lambda fetch: sel_lib.join_selected([p(fetch) for p in parts], gather, axis)
