"""The recipe compiler: a recipe and one output region become reads plus one function.

Every way a weight is built goes through :func:`compile_shard`. Given a recipe (a plain
checkpoint tensor is ``source(key)``), the metadata of its nodes and the box of the output a
device holds, it returns a :class:`ShardProgram`:

* ``reads``: the minimal boxes of stored tensors that box needs (selection pushdown), and
* ``run(fetch)``: one function from those buffers to the box's value, or ``handoff``: the box
  *is* one read, so the read buffer becomes the device buffer with no copy at all.

Each op's ``program`` rule (its file in ``recipes/ops/``) says what it reads for a box: a
source, select, cast or elementwise op exactly the box; a transpose the box permuted back; a
concatenate or stack only the inputs the box covers; a reshape or view the input rows that
span the box's flat range.

The function is numpy on the host, run by the backend's thread pool: a transpose, slice, gather
or cast is one strided copy straight into the shard's (64-byte aligned) buffer, which
``jax.device_put`` then adopts. There is no XLA program, so nothing to compile per device, no
collective and no device temporary: a device only ever receives its own shard.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from paramreg_jax._src.recipes import inference
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.recipes.ops import base
from paramreg_jax._src.sources import selection as sel_lib

Read = base.Read
Fetch = base.Fetch


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


class _Building:
  """The compiler's side of :class:`base.Building`: metadata lookups and the reads so far."""

  def __init__(self, metas: inference.Metas):
    self.metas = metas
    self.reads: list[Read] = []

  def meta(self, node: ops.Recipe) -> base.Meta:
    return self.metas[id(node)]

  def child(self, node: ops.Recipe, region: sel_lib.Region) -> base.Run:
    if any(a == b for a, b in region):  # an empty box: nothing to read
      shape, dtype = sel_lib.region_shape(region), self.meta(node).dtype
      return lambda fetch: np.empty(shape, dtype)
    return node.program(region, self)

  def read(self, key: str, region: sel_lib.Region) -> base.Run:
    read = Read(key, region)
    self.reads.append(read)
    return lambda fetch: fetch(read)


def compile_shard(
  recipe: ops.Recipe, metas: inference.Metas, region: sel_lib.Region
) -> ShardProgram:
  """The reads and the function that build ``region`` of ``recipe``'s value.

  Args:
    recipe: a recipe.
    metas: the metadata of every node of ``recipe`` (``inference.infer(recipe, src,
      memo=metas)``; kept alive with it: keyed by node identity).
    region: a box of the recipe's output shape.

  Examples:
    >>> import numpy as np
    >>> from paramreg_jax import recipes as R
    >>> from paramreg_jax import MemorySource
    >>> from paramreg_jax._src.recipes import compiler, inference
    >>> src = MemorySource({"w": np.arange(6.0).reshape(2, 3)})
    >>> r = R.transpose(R.source("w"), (1, 0))
    >>> metas = {}
    >>> _ = inference.infer(r, src, memo=metas)
    >>> program = compiler.compile_shard(r, metas, ((1, 3), (0, 2)))
    >>> program.reads
    (Read(key='w', box=((0, 2), (1, 3))),)
    >>> program.run(lambda read: src.read_region(read.key, read.box)).tolist()
    [[1.0, 4.0], [2.0, 5.0]]
  """
  meta = metas[id(recipe)]
  shape = sel_lib.region_shape(region)
  if (
    type(recipe) is ops.Source
    and type(recipe.selection) is sel_lib.Full
    and all(b > a for a, b in region)
  ):  # a plain tensor (most of a checkpoint): one read, handed over as read
    read = Read(recipe.key, region)
    return ShardProgram(region, shape, meta.dtype, (read,), _fetch_one(read), read)
  build = _Building(metas)
  run = build.child(recipe, region)
  handoff = None
  if isinstance(recipe, ops.Source) and not isinstance(recipe.selection, sel_lib.Indices):
    handoff = build.reads[0] if len(build.reads) == 1 else None
  return ShardProgram(region, shape, meta.dtype, tuple(dict.fromkeys(build.reads)), run, handoff)


def _fetch_one(read: Read) -> Callable[[Fetch], np.ndarray]:
  return lambda fetch: fetch(read)
