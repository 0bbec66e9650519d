"""``scale_blocks(x, scale)``: values times a scale per block (FP8 checkpoints: per tensor, per
channel, or per 128 x 128 block as DeepSeek-V3's ``weight_scale_inv``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence

import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.recipes.ops import base
from paramreg_jax._src.sources import selection as sel_lib
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource


def blocks_of(
  node: base.Recipe, x: base.Meta, s: base.Meta, block: tuple[int, ...] | None
) -> tuple[int, ...]:
  """The block each scale covers: ``block`` when given, else ``x / s`` per axis (which must
  divide); every axis must need exactly its number of scales."""
  if s.shape in ((), (1,)):
    return tuple(x.shape)
  if len(s.shape) != len(x.shape):
    raise errors.QuantizedLayoutError(
      f"{node}: a scale of shape {s.shape} for values of shape {x.shape}: give one scale, or "
      "one per block with the values' rank (per channel: (rows, 1))"
    )
  if block is None:
    if any(n % k for n, k in zip(x.shape, s.shape)):
      raise errors.QuantizedLayoutError(
        f"{node}: {s.shape} scales do not divide values of shape {x.shape} evenly, so the "
        "block size is not known; pass block= (DeepSeek-V3's FP8: block=(128, 128))"
      )
    block = tuple(n // k for n, k in zip(x.shape, s.shape))
  if len(block) != len(x.shape) or any(-(-n // b) != k for n, b, k in zip(x.shape, block, s.shape)):
    raise errors.QuantizedLayoutError(
      f"{node}: {s.shape} scales do not tile values of shape {x.shape} in blocks of {block}"
    )
  return block


@dataclasses.dataclass(frozen=True)
class ScaleBlocks(base.Recipe):
  input: base.Recipe
  scale: base.Recipe
  block: tuple[int, ...] | None = None

  def children(self) -> tuple[base.Recipe, ...]:
    return (self.input, self.scale)

  def __str__(self) -> str:
    block = "" if self.block is None else f", block={self.block}"
    return f"scale_blocks({self.input}, {self.scale}{block})"

  def infer(self, inputs: list[base.Meta], src: CheckpointSource) -> base.Meta:
    x, s = inputs
    for m, what in ((x, "values"), (s, "scale")):
      if m.dtype.kind in "biuc":  # float8 and bfloat16 are ml_dtypes ('V' kind)
        raise errors.UnsupportedDtypeError(
          f"{self}: the {what} must be floating (float8, bfloat16, float32), got {m.dtype.name}"
        )
    blocks_of(self, x, s, self.block)
    return base.Meta.of(x.shape, np.dtype(np.float32))

  def program(self, region: sel_lib.Region, build: base.Building) -> base.Run:
    """The values of the box and the scales of the blocks it touches, repeated over them."""
    x, s = build.meta(self.input), build.meta(self.scale)
    values = build.child(self.input, region)
    if s.shape in ((), (1,)):
      one = build.child(self.scale, tuple((0, d) for d in s.shape))
      return lambda fetch: values(fetch).astype(np.float32) * one(fetch).astype(np.float32)
    block = blocks_of(self, x, s, self.block)
    touched = tuple((a // b, -(-e // b)) for (a, e), b in zip(region, block))
    scales = build.child(self.scale, touched)

    def run(fetch: base.Fetch) -> np.ndarray:
      full = scales(fetch).astype(np.float32)
      for axis, b in enumerate(block):
        full = np.repeat(full, b, axis=axis)
      index = tuple(
        slice(a - t * b, e - t * b) for (a, e), (t, _), b in zip(region, touched, block)
      )
      return values(fetch).astype(np.float32) * full[index]

    return run

  def invert(self, region: base.InverseRegion, steps: base.Steps, walk: base.Walking) -> None:
    raise base.NotInvertible(
      f"{self}: the checkpoint holds scaled low-precision values, and writing them is not "
      "supported; export to a float checkpoint instead"
    )

  def code(self, code_of: Callable[[base.Recipe], str]) -> str:
    block = "" if self.block is None else f", block={self.block}"
    return f"R.scale_blocks({code_of(self.input)}, {code_of(self.scale)}{block})"


def scale_blocks(
  x: base.Recipe, scale: base.Recipe, block: Sequence[int] | None = None
) -> ScaleBlocks:
  """``x`` (float8, or any float) times its scales, as float32.

  Args:
    x: the stored values (float8 ``e4m3``/``e5m2``, or any float).
    scale: a recipe of one value (per tensor), or of ``x``'s rank with one value per block:
      ``(rows, 1)`` per channel; ``(ceil(rows / 128), ceil(cols / 128))`` with
      ``block=(128, 128)`` for the ``weight_scale_inv`` of DeepSeek-V3 style FP8
      checkpoints (which multiplies).
    block: the block shape each scale covers (the last block of an axis may be partial);
      without it, the scales must divide the values evenly.

  Returns:
    A float32 recipe of ``x``'s shape.

  Raises:
    TypeError: ``x`` or ``scale`` is not a recipe, or ``block`` is not a sequence of ints.
    ValueError: a ``block`` size is not positive.
    QuantizedLayoutError: (against a source) scales that do not tile the values in ``block``.

  Errors found against a source's metadata are raised by :func:`infer` and listed by
  :func:`~paramreg_jax.plan_restore` in its ``RestorePlanError``.

  Examples:
    >>> import ml_dtypes, numpy as np
    >>> import paramreg_jax as prj
    >>> from paramreg_jax import recipes as R
    >>> w = np.ones((4, 4), ml_dtypes.float8_e4m3fn)
    >>> src = prj.MemorySource({"w": w, "s": np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)})
    >>> R.evaluate(R.scale_blocks(R.source("w"), R.source("s")), src)[:, ::2].tolist()
    [[1.0, 2.0], [1.0, 2.0], [3.0, 4.0], [3.0, 4.0]]
  """
  blocks = None if block is None else base.check_ints(block, "block")
  if blocks is not None and not all(blocks):
    raise ValueError(f"scale_blocks: block sizes must be positive, got {blocks}")
  return ScaleBlocks(
    base.check_recipe(x, "scale_blocks's values"), base.check_recipe(scale, "its scale"), blocks
  )
