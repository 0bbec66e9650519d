"""``dequantize(x, format)``: rows of block-quantized bytes (GGUF's Q8_0, Q4_K, MXFP4, ...) to
float32 values; a box of the output reads only the blocks that hold it."""

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

# blocks are dequantized this many bytes at a time (each format's kernel makes a few temporaries
# of the chunk's size)
_CHUNK_BYTES = 1 << 16


@dataclasses.dataclass(frozen=True)
class Dequantize(base.Unary):
  input: base.Recipe
  format: str

  def __str__(self) -> str:
    return f"dequantize({self.input}, {self.format!r})"

  def infer(self, inputs: list[base.Meta], src: CheckpointSource) -> base.Meta:
    (m,) = inputs
    fmt = _format(self.format, self)
    if m.dtype != np.uint8 or not m.shape:
      raise errors.QuantizedLayoutError(
        f"{self}: dequantize reads rows of raw bytes (uint8 [..., bytes]), got {m}"
      )
    problem = source_op.recorded_format_problem(self.input, fmt.name, src, self)
    if problem:
      raise errors.QuantizedLayoutError(problem)
    if m.shape[-1] % fmt.nbytes:
      raise errors.QuantizedLayoutError(
        f"{self}: rows of {m.shape[-1]} bytes are not whole {fmt.name} blocks of {fmt.nbytes} "
        "bytes; the tensor is truncated or not in this format"
      )
    values = m.shape[-1] // fmt.nbytes * fmt.block
    return base.Meta.of((*m.shape[:-1], values), np.dtype(np.float32))

  def program(self, region: sel_lib.Region, build: base.Building) -> base.Run:
    """The bytes of the blocks that cover the box's columns, dequantized, then trimmed."""
    fmt = _format(self.format, self)
    span = base.BlockSpan.of(region, fmt.block)
    bytes_ = (span.first * fmt.nbytes, span.last * fmt.nbytes)
    raw = build.child(self.input, (*span.lead, bytes_))

    def run(fetch: base.Fetch) -> np.ndarray:
      blocks = np.ascontiguousarray(raw(fetch)).reshape((-1, fmt.nbytes))
      values = np.empty((len(blocks), fmt.block), np.float32)
      step = max(1, _CHUNK_BYTES // fmt.nbytes)  # the kernels' temporaries stay small
      for i in range(0, len(blocks), step):
        values[i : i + step] = fmt.dequantize(blocks[i : i + step])
      return span.trim(values.reshape((*span.rows, -1)))

    return run

  def invert(self, region: base.InverseRegion, steps: base.Steps, walk: base.Walking) -> None:
    raise base.NotInvertible(
      f"{self}: the checkpoint holds {self.format} blocks, and writing quantized tensors is not "
      "supported; export to a float checkpoint instead (a safetensors layout without "
      "dequantize)"
    )

  def code(self, code_of: Callable[[base.Recipe], str]) -> str:
    return f"R.dequantize({code_of(self.input)}, {self.format!r})"


def _format(name: str, where: Any) -> Any:
  fmt = quant_formats.FORMATS.get(name)
  if fmt is None:
    raise errors.UnknownQuantizationError(
      f"{where}: unknown block format {name!r}; known: {', '.join(sorted(quant_formats.FORMATS))}"
      + errors.did_you_mean(str(name), quant_formats.FORMATS)
    )
  return fmt


def dequantize(x: base.Recipe, format: str) -> Dequantize:
  """Block-quantized rows (``uint8 [..., bytes]``) to float32 values (``[..., values]``).

  The values equal the ``gguf`` package's reference dequantizers bit for bit.

  Args:
    x: the stored rows: a recipe of ``uint8`` whose last axis is a whole number of blocks.
    format: a GGUF block format: ``Q8_0``, ``Q4_0``, ``Q4_1``, ``Q5_0``, ``Q5_1``,
      ``Q2_K``, ``Q3_K``, ``Q4_K``, ``Q5_K``, ``Q6_K`` or ``MXFP4``.

  Returns:
    A float32 recipe whose last axis holds the block's values (a sharded restore reads only
    the blocks each shard needs).

  Raises:
    TypeError: ``x`` is not a recipe.
    UnknownQuantizationError: an unknown ``format`` (at construction).
    QuantizedLayoutError: (against a source) ``x`` is not ``uint8`` rows of whole blocks, or
      reads a tensor the source records in another format (``GGUFSource.quantization``).

  Errors found against a source's metadata are raised by :func:`infer` and listed by
  :func:`~paramreg_jax.plan_restore` in its ``RestorePlanError``.

  Examples:
    >>> import numpy as np
    >>> import paramreg_jax as prj
    >>> from paramreg_jax import recipes as R
    >>> block = np.zeros(34, np.uint8); block[:2] = np.array([0.5], np.float16).view(np.uint8); block[2:] = 3
    >>> src = prj.MemorySource({"w": block.reshape(1, 34)})
    >>> R.evaluate(R.dequantize(R.source("w"), "Q8_0"), src)[0, :4].tolist()
    [1.5, 1.5, 1.5, 1.5]
  """
  x = base.check_recipe(x, "dequantize's input")
  return Dequantize(x, _format(format, f"dequantize({x}, {format!r})").name)
