"""``block_values``, ``block_scales`` and ``block_mins``: a block-quantized tensor kept
quantized, as a quantized model holds it (integer values, and a scale, and for the formats
that have one a minimum, per group of values), with no dequantization."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.recipes.ops import base
from paramreg_jax._src.recipes.ops import source as source_op
from paramreg_jax._src.recipes.quant import formats as quant_formats
from paramreg_jax._src.sources import selection as sel_lib
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource


def kept_formats() -> list[str]:
  """The formats a quantized model can hold as they are."""
  return sorted(n for n, f in quant_formats.FORMATS.items() if f.kept is not None)


def _splittable(name: str, where: Any, part: str = "values") -> Any:
  fmt = quant_formats.FORMATS.get(name)
  if fmt is None or fmt.kept is None:
    raise errors.UnknownQuantizationError(
      f"{where}: {name!r} blocks cannot be kept as values and scales (kept: "
      f"{', '.join(kept_formats())}); dequantize them instead"
    )
  if part == "mins" and not fmt.kept.mins:
    with_mins = [n for n, f in quant_formats.FORMATS.items() if f.kept is not None and f.kept.mins]
    raise errors.UnknownQuantizationError(
      f"{where}: {name!r} has no minimums (x = scale * q; the formats with minimums are "
      f"{', '.join(with_mins)})"
    )
  return fmt


@dataclasses.dataclass(frozen=True)
class BlockPart(base.Unary):
  input: base.Recipe
  format: str
  part: str  # "values", "scales" or "mins"

  def __str__(self) -> str:
    return f"block_{self.part}({self.input}, {self.format!r})"

  def infer(self, inputs: list[base.Meta], src: CheckpointSource) -> base.Meta:
    (m,) = inputs
    fmt = _splittable(self.format, self, self.part)
    problem = source_op.recorded_format_problem(self.input, fmt.name, src, self)
    if problem:
      raise errors.QuantizedLayoutError(problem)
    if m.dtype != np.uint8 or not m.shape or m.shape[-1] % fmt.nbytes:
      raise errors.QuantizedLayoutError(
        f"{self}: needs rows of whole {fmt.name} blocks (uint8 [..., k * {fmt.nbytes}]), got {m}"
      )
    n = m.shape[-1] // fmt.nbytes
    if self.part == "values":
      return base.Meta.of((*m.shape[:-1], n * fmt.block), fmt.kept.values_dtype)
    return base.Meta.of((*m.shape[:-1], n * fmt.kept.groups), fmt.kept.scales_dtype)

  def program(self, region: sel_lib.Region, build: base.Building) -> base.Run:
    fmt = _splittable(self.format, self, self.part)
    span = base.BlockSpan.of(region, fmt.block if self.part == "values" else fmt.kept.groups)
    bytes_ = (span.first * fmt.nbytes, span.last * fmt.nbytes)
    raw = build.child(self.input, (*span.lead, bytes_))
    part = self.part

    def run(fetch: base.Fetch) -> np.ndarray:
      blocks = np.ascontiguousarray(raw(fetch)).reshape((-1, fmt.nbytes))
      values = getattr(fmt.kept.split(blocks), part)
      return span.trim(values.reshape((*span.rows, -1)))

    return run

  def invert(self, region: base.InverseRegion, steps: base.Steps, walk: base.Walking) -> None:
    raise base.NotInvertible(
      f"{self}: writing {self.format} blocks is not supported; export to a float checkpoint"
    )

  def code(self, code_of: Callable[[base.Recipe], str]) -> str:
    return f"R.block_{self.part}({code_of(self.input)}, {self.format!r})"


def block_values(x: base.Recipe, format: str) -> BlockPart:
  """The quantized values of block-quantized rows, as integers.

  With :func:`block_scales` (and :func:`block_mins` for the formats that have minimums), a
  quantized model restores from a GGUF at its quantized size, without dequantizing. Each
  scale and minimum covers a group of consecutive values along the last axis; with each
  repeated over its group, ``scales * values`` (``scales * values - mins``), in float32, is
  ``dequantize(x, format)``:

  ======  =====================  ==================  =================
  format  values                 group (per scale)   minimums
  ======  =====================  ==================  =================
  Q8_0    int8                   32 (float16 scale)  no
  Q4_0    int4 (``q - 8``)       32 (float16 scale)  no
  Q2_K    uint4 (0..3)           16                  yes
  Q3_K    int4 (-4..3)           16                  no
  Q4_K    uint4 (0..15)          32                  yes
  Q5_K    uint8 (0..31)          32                  yes
  Q6_K    int8 (-32..31)         16                  no
  ======  =====================  ==================  =================

  The k-quants' scales and minimums are float32 with the super-block's ``d`` and ``dmin``
  folded in (``d * sc``, ``dmin * m``), as the reference dequantizer computes them.

  Args:
    x: the stored rows: a recipe of ``uint8`` whose last axis is a whole number of blocks.
    format: one of the formats above.

  Returns:
    A recipe of the format's values, ``[..., values]``.

  Raises:
    TypeError: ``x`` is not a recipe.
    UnknownQuantizationError: ``format`` is unknown, or cannot be kept (MXFP4, Q4_1, ...).
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
  """The scale of each group of block-quantized rows (see :func:`block_values`).

  Args:
    x: the stored rows: a recipe of ``uint8`` whose last axis is a whole number of blocks.
    format: a format :func:`block_values` keeps.

  Returns:
    A recipe of float16 (Q8_0, Q4_0) or float32 (the k-quants) scales, ``[..., groups]``.

  Raises:
    TypeError: ``x`` is not a recipe.
    UnknownQuantizationError: ``format`` is unknown, or cannot be kept.
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


def block_mins(x: base.Recipe, format: str) -> BlockPart:
  """The minimum of each group of block-quantized rows, for the formats that subtract one
  (Q2_K, Q4_K, Q5_K): ``x = scales * values - mins`` (see :func:`block_values`).

  Args:
    x: the stored rows: a recipe of ``uint8`` whose last axis is a whole number of blocks.
    format: ``"Q2_K"``, ``"Q4_K"`` or ``"Q5_K"``.

  Returns:
    A float32 recipe, ``[..., groups]``.

  Raises:
    TypeError: ``x`` is not a recipe.
    UnknownQuantizationError: ``format`` is unknown, cannot be kept, or has no minimums.
    QuantizedLayoutError: (against a source) ``x`` is not ``uint8`` rows of whole blocks.

  Examples:
    >>> import numpy as np
    >>> import paramreg_jax as prj
    >>> from paramreg_jax import recipes as R
    >>> blocks = np.random.default_rng(0).integers(0, 256, (2, 144), dtype=np.uint8)
    >>> blocks[:, :4] = np.array([0.5, 0.25], np.float16).view(np.uint8)  # d, dmin
    >>> src = prj.MemorySource({"w": blocks})
    >>> q, s, m = (R.evaluate(f(R.source("w"), "Q4_K"), src) for f in (R.block_values, R.block_scales, R.block_mins))
    >>> q.shape, s.shape, m.shape
    ((2, 256), (2, 8), (2, 8))
    >>> x = np.repeat(s, 32, axis=1) * q.astype(np.float32) - np.repeat(m, 32, axis=1)
    >>> bool((x == R.evaluate(R.dequantize(R.source("w"), "Q4_K"), src)).all())
    True
  """
  x = base.check_recipe(x, "block_mins's input")
  return BlockPart(x, _splittable(format, f"block_mins({x}, {format!r})", "mins").name, "mins")
