"""``block_values(x, format)`` and ``block_scales(x, format)``: a block-quantized tensor kept
quantized, as a quantized model holds it (int8/int4 values and one scale per block), with
no dequantization."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.recipes.ops import base
from paramreg_jax._src.recipes.ops import source as source_op
from paramreg_jax._src.recipes.quant import catalog
from paramreg_jax._src.sources import selection as sel_lib


def _splittable(name: str, where: Any) -> Any:
  fmt = catalog.FORMATS.get(name)
  if fmt is None or fmt.split is None:
    kept = sorted(n for n, f in catalog.FORMATS.items() if f.split is not None)
    raise errors.UnknownQuantizationError(
      f"{where}: {name!r} blocks cannot be kept as values and one scale per block (kept: "
      f"{', '.join(kept)}); dequantize them instead"
    )
  return fmt


@dataclasses.dataclass(frozen=True)
class BlockPart(base.Unary):
  input: base.Recipe
  format: str
  part: str  # "values" or "scales"

  def __str__(self) -> str:
    return f"block_{self.part}({self.input}, {self.format!r})"

  def infer(self, inputs: list[base.Meta], src: Any) -> base.Meta:
    (m,) = inputs
    fmt = _splittable(self.format, self)
    problem = source_op.recorded_format_problem(self.input, fmt.name, src, self)
    if problem:
      raise errors.QuantizedLayoutError(problem)
    if m.dtype != np.uint8 or not m.shape or m.shape[-1] % fmt.nbytes:
      raise errors.QuantizedLayoutError(
        f"{self}: needs rows of whole {fmt.name} blocks (uint8 [..., k * {fmt.nbytes}]), got {m}"
      )
    n = m.shape[-1] // fmt.nbytes
    if self.part == "values":
      return base.Meta.of((*m.shape[:-1], n * fmt.block), fmt.values_dtype)
    return base.Meta.of((*m.shape[:-1], n), np.dtype(np.float16))

  def program(self, region: sel_lib.Region, build: base.Building) -> base.Run:
    fmt = _splittable(self.format, self)
    span = base.BlockSpan.of(region, fmt.block if self.part == "values" else 1)
    bytes_ = (span.first * fmt.nbytes, span.last * fmt.nbytes)
    raw = build.child(self.input, (*span.lead, bytes_))
    which = 0 if self.part == "values" else 1

    def run(fetch: base.Fetch) -> np.ndarray:
      blocks = np.ascontiguousarray(raw(fetch)).reshape((-1, fmt.nbytes))
      return span.trim(fmt.split(blocks)[which].reshape((*span.rows, -1)))

    return run

  def invert(self, region: base.InverseRegion, steps: base.Steps, walk: base.Walking) -> None:
    raise base.NotInvertible(
      f"{self}: writing {self.format} blocks is not supported; export to a float checkpoint"
    )

  def code(self, code_of: Callable[[base.Recipe], str]) -> str:
    return f"R.block_{self.part}({code_of(self.input)}, {self.format!r})"


def block_values(x: base.Recipe, format: str) -> BlockPart:
  """The quantized values of block-quantized rows, as stored (Q8_0: int8; Q4_0: int4).

  With :func:`block_scales`, a quantized model (int8/int4 values and one scale per block, as
  a qwix- or AQT-quantized model holds them) restores from a GGUF without dequantizing:
  ``values * scales`` (each scale repeated over its block) is ``dequantize(x, format)``.

  Args:
    x: the stored rows: a recipe of ``uint8`` whose last axis is a whole number of blocks.
    format: ``"Q8_0"`` or ``"Q4_0"`` (formats with one scale per block).

  Returns:
    A recipe of int8 (Q8_0) or int4 (Q4_0) values, ``[..., values]``.

  Raises:
    TypeError: ``x`` is not a recipe.
    UnknownQuantizationError: ``format`` is unknown, or has more than one scale per block.
    QuantizedLayoutError: (against a source) ``x`` is not ``uint8`` rows of whole blocks.

  Errors found against a source's metadata are raised by :func:`infer` and listed by
  :func:`~paramreg_jax.plan_restore` in its ``RestorePlanError``.

  Examples:
    >>> import numpy as np
    >>> import paramreg_jax as prj
    >>> from paramreg_jax import recipes as R
    >>> block = np.zeros(34, np.uint8); block[:2] = np.array([0.5], np.float16).view(np.uint8)
    >>> block[2:] = np.arange(32, dtype=np.int8).view(np.uint8)
    >>> src = prj.MemorySource({"w": block.reshape(1, 34)})
    >>> R.evaluate(R.block_values(R.source("w"), "Q8_0"), src)[0, :4].tolist()
    [0, 1, 2, 3]
    >>> R.evaluate(R.block_scales(R.source("w"), "Q8_0"), src).tolist()
    [[0.5]]
  """
  x = base.check_recipe(x, "block_values's input")
  return BlockPart(x, _splittable(format, f"block_values({x}, {format!r})").name, "values")


def block_scales(x: base.Recipe, format: str) -> BlockPart:
  """The scale of each block of block-quantized rows (see :func:`block_values`).

  Args:
    x: the stored rows: a recipe of ``uint8`` whose last axis is a whole number of blocks.
    format: ``"Q8_0"`` or ``"Q4_0"``.

  Returns:
    A float16 recipe, ``[..., blocks]``.

  Raises:
    TypeError: ``x`` is not a recipe.
    UnknownQuantizationError: ``format`` is unknown, or has more than one scale per block.
    QuantizedLayoutError: (against a source) ``x`` is not ``uint8`` rows of whole blocks.

  Errors found against a source's metadata are raised by :func:`infer` and listed by
  :func:`~paramreg_jax.plan_restore` in its ``RestorePlanError``.

  Examples:
    >>> import numpy as np
    >>> import paramreg_jax as prj
    >>> from paramreg_jax import recipes as R
    >>> block = np.zeros(18, np.uint8); block[:2] = np.array([2.0], np.float16).view(np.uint8)
    >>> src = prj.MemorySource({"w": np.stack([block, block])})
    >>> R.infer(R.block_scales(R.source("w"), "Q4_0"), src).shape
    (2, 1)
  """
  x = base.check_recipe(x, "block_scales's input")
  return BlockPart(x, _splittable(format, f"block_scales({x}, {format!r})").name, "scales")
