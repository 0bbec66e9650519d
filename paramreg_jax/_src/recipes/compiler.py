"""The recipe compiler: a recipe and one output region become reads plus one function.

Every way a weight is built goes through :func:`compile_shard`. Given a recipe (a plain
checkpoint tensor is ``source(key)``), the checkpoint's metadata and the box of the output a
device holds, it returns a :class:`ShardProgram`:

* ``reads``: the minimal boxes of stored tensors that box needs (selection pushdown), and
* ``run(fetch)``: one function from those buffers to the box's value, or ``handoff``: the box
  *is* one read, so the read buffer becomes the device buffer with no copy at all.

How much each operation reads, for an output box R:
  * source / select / cast / neg_log / subtract_one: exactly the elements of R (for ``Indices``,
    each distinct selected index once, in runs);
  * transpose: exactly R, permuted back;
  * concatenate: for each input, only its part of R (inputs outside R are not read);
  * stack: only the stacked inputs R covers, each on R without the stacked axis;
  * reshape / view: the input's leading-axis rows spanning R's flat (byte) range: at most R's
    flat span plus two input rows.

The backend then widens and merges the reads of all shards (:mod:`paramreg_jax._src.restore.reads`)
and runs the functions (:mod:`paramreg_jax._src.restore.backend`, which also holds ``evaluate``).

The function is numpy on the host, run by the backend's thread pool: a transpose, slice, gather
or cast is one strided copy straight into the shard's (64-byte aligned) buffer, which
``jax.device_put`` then adopts. There is no XLA program, so nothing to compile per device, no
collective and no device temporary: a device only ever receives its own shard (docs/benchmarks.md has
the measurements behind this choice).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from paramreg_jax._src.recipes import ops
from paramreg_jax._src.sources import selection as sel_lib


@dataclasses.dataclass(frozen=True)
class Read:
  """One box of one stored tensor (in the stored tensor's coordinates)."""

  key: str
  box: sel_lib.Region


Fetch = Callable[[Read], np.ndarray]


@dataclasses.dataclass(frozen=True, eq=False)
class ShardProgram:
  """How to build one box of a weight.

  Attributes:
    region: the box of the output this program builds.
    shape, dtype: the box's shape and the weight's dtype.
    reads: the distinct stored boxes it needs, in first-use order.
    run: ``run(fetch)`` is the box's value; ``fetch(read)`` returns the buffer of a read
      (any array holding exactly ``read.box``). The result may be a view of those buffers.
    handoff: the read whose buffer already is the box, when no transform is needed.
  """

  region: sel_lib.Region
  shape: tuple[int, ...]
  dtype: np.dtype
  reads: tuple[Read, ...]
  run: Callable[[Fetch], np.ndarray]
  handoff: Read | None = None


Metas = dict[int, Any]


def infer_all(recipe: ops.Recipe, source: Any) -> Metas:
  """Metadata of every node of ``recipe`` (by ``id``), for :func:`compile_shard`; reads nothing."""
  memo: Metas = {}
  ops._infer(ops._check_recipe(recipe, "recipe"), source, memo)
  stack: list[ops.Recipe] = [recipe]
  while stack:  # nodes below a cached inference are not in the memo yet
    node = stack.pop()
    if id(node) not in memo:
      ops._infer(node, source, memo)
    stack.extend(node.children())
  return memo


def compile_shard(recipe: ops.Recipe, metas: Metas, region: sel_lib.Region) -> ShardProgram:
  """The reads and the function that build ``region`` of ``recipe``'s value.

  Args:
    recipe: a recipe.
    metas: :func:`infer_all` of ``recipe`` (kept alive with it: keyed by node identity).
    region: a box of the recipe's output shape.

  Examples:
    >>> import numpy as np
    >>> from paramreg_jax import recipes as R
    >>> from paramreg_jax.sources import MemorySource
    >>> from paramreg_jax._src.recipes import compiler
    >>> src = MemorySource({"w": np.arange(6.0).reshape(2, 3)})
    >>> r = R.transpose(R.source("w"), (1, 0))
    >>> program = compiler.compile_shard(r, compiler.infer_all(r, src), ((1, 3), (0, 2)))
    >>> program.reads
    (Read(key='w', box=((0, 2), (1, 3))),)
    >>> program.run(lambda read: src.read_region(read.key, read.box)).tolist()
    [[1.0, 4.0], [2.0, 5.0]]
  """
  meta = metas[id(recipe)]
  if (
    type(recipe) is ops.Source
    and type(recipe.selection) is sel_lib.Full
    and all(b > a for a, b in region)
  ):  # a plain tensor (most of a checkpoint): one read, handed over as read
    read = Read(recipe.key, region)
    return ShardProgram(
      region, sel_lib.region_shape(region), meta.dtype, (read,), _fetch_one(read), read
    )
  reads: list[Read] = []
  run = _compile(recipe, region, metas, reads)
  handoff = None
  if isinstance(recipe, ops.Source) and not isinstance(recipe.selection, sel_lib.Indices):
    handoff = reads[0] if len(reads) == 1 else None
  return ShardProgram(
    region,
    sel_lib.region_shape(region),
    meta.dtype,
    tuple(dict.fromkeys(reads)),
    run,
    handoff,
  )


def _compile(
  node: ops.Recipe, region: sel_lib.Region, metas: Metas, reads: list[Read]
) -> Callable[[Fetch], np.ndarray]:
  """Appends ``node``'s reads for ``region`` to ``reads``; returns the function computing it."""
  meta = metas[id(node)]
  if any(a == b for a, b in region):
    shape = sel_lib.region_shape(region)
    return lambda fetch: np.empty(shape, meta.dtype)
  if isinstance(node, ops.Source):
    return _selected(lambda r: _leaf(Read(node.key, r), reads), node.selection, region)
  if isinstance(node, ops.Select):
    return _selected(lambda r: _compile(node.input, r, metas, reads), node.selection, region)
  if isinstance(node, ops.Concatenate):
    parts, offset, (a, b) = [], 0, region[node.axis]
    for child in node.inputs:
      length = metas[id(child)].shape[node.axis]
      lo, hi = max(a, offset), min(b, offset + length)
      if lo < hi:
        sub = list(region)
        sub[node.axis] = (lo - offset, hi - offset)
        parts.append(_compile(child, tuple(sub), metas, reads))
      offset += length
    if len(parts) == 1:
      return parts[0]
    return lambda fetch: np.concatenate([p(fetch) for p in parts], axis=node.axis)
  if isinstance(node, ops.Stack):
    a, b = region[node.axis]
    rest = region[: node.axis] + region[node.axis + 1 :]
    layers = [_compile(node.inputs[i], rest, metas, reads) for i in range(a, b)]
    return lambda fetch: np.stack([f(fetch) for f in layers], axis=node.axis)
  if isinstance(node, ops.Transpose):
    inner: list[Any] = [None] * len(region)
    for out_axis, in_axis in enumerate(node.axes):
      inner[in_axis] = region[out_axis]
    permuted = _compile(node.input, tuple(inner), metas, reads)
    return lambda fetch: np.transpose(permuted(fetch), node.axes)  # a view: copied once, later
  if isinstance(node, (ops.Reshape, ops.View)):
    return _flat(node, region, metas, reads)
  operand = _compile(node.children()[0], region, metas, reads)
  if isinstance(node, ops.Cast):
    return lambda fetch: operand(fetch).astype(node.dtype)
  if isinstance(node, ops.NegLog):
    return lambda fetch: _neg_log(operand(fetch))
  if isinstance(node, ops.SubtractOne):
    return lambda fetch: _subtract_one(operand(fetch))
  raise TypeError(f"unknown recipe node {node!r}")


def _fetch_one(read: Read) -> Callable[[Fetch], np.ndarray]:
  return lambda fetch: fetch(read)


def _leaf(read: Read, reads: list[Read]) -> Callable[[Fetch], np.ndarray]:
  reads.append(read)
  return lambda fetch: fetch(read)


def _selected(
  compile_region: Callable[[sel_lib.Region], Callable[[Fetch], np.ndarray]],
  selection: sel_lib.Selection,
  region: sel_lib.Region,
) -> Callable[[Fetch], np.ndarray]:
  """``region`` of a selected tensor through ``compile_region(unselected_region)``, minimally."""
  regions, gather, axis = sel_lib.selection_regions(selection, region)
  parts = [compile_region(r) for r in regions]
  return lambda fetch: sel_lib.join_selected([p(fetch) for p in parts], gather, axis)


def _neg_log(x: np.ndarray) -> np.ndarray:
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.log(-x).astype(x.dtype)


def _subtract_one(x: np.ndarray) -> np.ndarray:
  return (x - np.asarray(1, x.dtype)).astype(x.dtype)


def _flat(
  node: ops.Reshape | ops.View, region: sel_lib.Region, metas: Metas, reads: list[Read]
) -> Callable[[Fetch], np.ndarray]:
  """Reshape/view: the input rows spanning the region's flat byte range, then a gather."""
  out_meta, in_meta = metas[id(node)], metas[id(node.input)]
  out_shape, in_shape = out_meta.shape, in_meta.shape
  corners = [tuple(a for a, _ in region), tuple(b - 1 for _, b in region)]
  first, last = (int(np.ravel_multi_index(c, out_shape)) if out_shape else 0 for c in corners)
  osz, isz = out_meta.dtype.itemsize, in_meta.dtype.itemsize
  byte_lo, byte_hi = first * osz, (last + 1) * osz
  elem_lo, elem_hi = byte_lo // isz, -(-byte_hi // isz)  # input elements spanning the bytes
  if in_shape:
    row = math.prod(in_shape[1:])
    r0, r1 = elem_lo // row, -(-elem_hi // row)
    in_region: sel_lib.Region = ((r0, r1), *((0, d) for d in in_shape[1:]))
    base = r0 * row
  else:
    in_region, base = (), 0
  child = _compile(node.input, in_region, metas, reads)
  grid = np.ix_(*(np.arange(a, b) for a, b in region)) if region else ()
  positions = np.ravel_multi_index(grid, out_shape) - first if region else np.zeros((), int)

  def run(fetch: Fetch) -> np.ndarray:
    flat = np.ascontiguousarray(child(fetch)).reshape(-1)
    raw = flat.view(np.uint8)[byte_lo - base * isz : byte_hi - base * isz]
    return np.asarray(raw.view(out_meta.dtype)[positions], out_meta.dtype)

  return run
