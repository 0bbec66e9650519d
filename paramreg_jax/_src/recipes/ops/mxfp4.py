"""``mxfp4(blocks, scales)``: MXFP4 as gpt-oss saves it (``*_blocks`` uint8 ``[..., G, 16]``
and ``*_scales`` E8M0 ``[..., G]``) to float32 ``[..., G * 32]``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.recipes.ops import base
from paramreg_jax._src.recipes.quant import microscaling
from paramreg_jax._src.sources import selection as sel_lib
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource


@dataclasses.dataclass(frozen=True)
class Mxfp4(base.Recipe):
  blocks: base.Recipe
  scales: base.Recipe

  def children(self) -> tuple[base.Recipe, ...]:
    return (self.blocks, self.scales)

  def __str__(self) -> str:
    return f"mxfp4({self.blocks}, {self.scales})"

  def infer(self, inputs: list[base.Meta], src: CheckpointSource) -> base.Meta:
    b, s = inputs
    if b.dtype != np.uint8 or len(b.shape) < 2 or b.shape[-1] != 16:
      raise errors.QuantizedLayoutError(
        f"{self}: blocks must be uint8 [..., groups, 16] (32 FP4 values per group), got {b}"
      )
    if s.dtype.itemsize != 1 or tuple(s.shape) != tuple(b.shape[:-1]):
      raise errors.QuantizedLayoutError(
        f"{self}: scales must be one E8M0 byte per group, shape {b.shape[:-1]}, got {s}"
      )
    return base.Meta.of((*b.shape[:-2], b.shape[-2] * 32), np.dtype(np.float32))

  def program(self, region: sel_lib.Region, build: base.Building) -> base.Run:
    """The groups that cover the box's columns, dequantized, then trimmed."""
    span = base.BlockSpan.of(region, 32)
    groups = (span.first, span.last)
    blocks = build.child(self.blocks, (*span.lead, groups, (0, 16)))
    scales = build.child(self.scales, (*span.lead, groups))

    def run(fetch: base.Fetch) -> np.ndarray:
      exps = np.ascontiguousarray(scales(fetch)).view(np.uint8)
      return span.trim(microscaling.dequantize_split(blocks(fetch), exps))

    return run

  def invert(self, region: base.InverseRegion, steps: base.Steps, walk: base.Walking) -> None:
    raise base.NotInvertible(
      f"{self}: the checkpoint holds MXFP4 blocks, and writing quantized tensors is not "
      "supported; export to a float checkpoint instead"
    )

  def code(self, code_of: Callable[[base.Recipe], str]) -> str:
    return f"R.mxfp4({code_of(self.blocks)}, {code_of(self.scales)})"


def mxfp4(blocks: base.Recipe, scales: base.Recipe) -> Mxfp4:
  """gpt-oss's MXFP4 tensors to float32: ``ldexp(FP4[nibble], scale - 127)``, low nibble first.

  Args:
    blocks: the ``*_blocks`` tensor: ``uint8 [..., groups, 16]``, two FP4 values a byte.
    scales: the ``*_scales`` tensor: ``uint8 [..., groups]``, one exponent a group.

  Returns:
    A float32 recipe ``[..., groups * 32]``.

  Raises:
    TypeError: ``blocks`` or ``scales`` is not a recipe.
    QuantizedLayoutError: (against a source) the tensors are not ``uint8``, or their groups
      do not agree.

  Errors found against a source's metadata are raised by :func:`infer` and listed by
  :func:`~paramreg_jax.plan_restore` in its ``RestorePlanError``.

  Examples:
    >>> import numpy as np
    >>> import paramreg_jax as prj
    >>> from paramreg_jax import recipes as R
    >>> blocks = np.full((1, 1, 16), 0x21, np.uint8)  # the values 0.5 (0x1) and 1.0 (0x2)
    >>> src = prj.MemorySource({"b": blocks, "s": np.full((1, 1), 128, np.uint8)})
    >>> R.evaluate(R.mxfp4(R.source("b"), R.source("s")), src)[0, :4].tolist()
    [1.0, 2.0, 1.0, 2.0]
  """
  return Mxfp4(base.check_recipe(blocks, "mxfp4's blocks"), base.check_recipe(scales, "its scales"))
