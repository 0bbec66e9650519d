"""``JaxBackend``: every weight built directly as a sharded ``jax.Array``.

The data flow ``source -> plan -> materialize -> bind``, on this side of the contract
(:mod:`paramreg_jax._src.restore.contract`):

1. every distinct box this process's devices hold (``sharding.addressable_devices_indices_map``)
   is compiled with the weight's recipe into reads and one function
   (:mod:`paramreg_jax._src.recipes.compiler`);
2. the reads are widened to storage granules and merged into blocks, packed into windows that
   fit the host-memory budget (:mod:`paramreg_jax._src.restore.jax_backend.reads`): a chunk is read once
   per process, whatever number of shards need it;
3. while the next windows are read, the current window's shards are built by a thread pool
   (:mod:`paramreg_jax._src.restore.jax_backend.windows`); a shard that is exactly one read is handed over
   as read;
4. each weight becomes its global array in batched transfers
   (:mod:`paramreg_jax._src.restore.jax_backend.handover`, :mod:`paramreg_jax._src.restore.jax_backend.transfer`; on
   CPU the devices adopt the aligned buffers: no copy).

Small stored tensors restored as they are take a direct path instead
(:mod:`paramreg_jax._src.restore.jax_backend.direct`): read stacked, copied into grid order, one transfer.

Under ``jax.distributed`` each process only ever sees its own devices, so it only reads its own
bytes. No XLA program runs: no compile, no collective, and no device holds more than its shard.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.recipes import compiler
from paramreg_jax._src.recipes import inference
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.restore import target as target_lib
from paramreg_jax._src.restore.contract import Materialization
from paramreg_jax._src.restore.contract import MaterializationContext
from paramreg_jax._src.restore.jax_backend import budget as budget_lib
from paramreg_jax._src.restore.jax_backend import direct
from paramreg_jax._src.restore.jax_backend import reads as reads_lib
from paramreg_jax._src.restore.jax_backend import windows
from paramreg_jax._src.sources import selection as sel_lib
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource


def default() -> JaxBackend:
  """The backend used where none is given (``restore``, ``plan_restore``, ``materialize``,
  ``bind``, ``recipes.evaluate``): chosen here and nowhere else."""
  return JaxBackend()


class JaxBackend:
  """The JAX implementation: weights are sharded ``jax.Array`` objects built from block reads.

  A parameter slot is a target leaf (``jax.Array`` or ``jax.ShapeDtypeStruct`` with a
  ``.sharding``). ``bind`` is functional: it returns the value to put in the new tree.

  Args:
    threads: host threads that build shards (strided copies release the GIL); default: the
      number of cores, at most 8.
    whole_bytes: a weight up to this size that spans several devices is built whole on the
      host, and a stored tensor up to this size restored as it is takes the direct path (read
      stacked with its neighbours, one transfer). ``0`` builds every weight shard by shard.

  Examples:
    >>> import jax, numpy as np
    >>> from paramreg_jax import JaxBackend, MaterializationContext, recipes
    >>> from paramreg_jax import MemorySource
    >>> src = MemorySource({"w": np.arange(8, dtype=np.float32)})
    >>> slot = jax.ShapeDtypeStruct((8,), np.float32, sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    >>> ctx = MaterializationContext("n:w", slot.shape, slot.dtype, slot.sharding)
    >>> backend = JaxBackend()
    >>> [weight] = backend.finish_all(backend.materialize_all(src, [(recipes.source("w"), ctx)]))
    >>> backend.validate_bind(slot, weight)
    >>> backend.bind(slot, weight).tolist()
    [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
  """

  def __init__(self, threads: int | None = None, whole_bytes: int = 1 << 18):
    if threads is None:
      threads = max(1, min(8, os.cpu_count() or 1))
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
      raise ValueError(f"JaxBackend(threads=...) must be a positive int, got {threads!r}")
    if not isinstance(whole_bytes, int) or isinstance(whole_bytes, bool) or whole_bytes < 0:
      raise ValueError(f"JaxBackend(whole_bytes=...) must be an int >= 0, got {whole_bytes!r}")
    self.threads = threads
    self.whole_bytes = whole_bytes

  def preflight_recipe(self, recipe: ops.Recipe, source: CheckpointSource) -> None:
    """Metadata-only: the recipe infers, and JAX can hold its dtype as it is."""
    meta = inference.infer(recipe, source)
    canonical = jax.dtypes.canonicalize_dtype(meta.dtype)
    if canonical != meta.dtype:
      raise errors.UnsupportedDtypeError(
        f"{recipe}: produces {meta.dtype.name}, which JAX stores as {np.dtype(canonical).name} "
        "unless jax_enable_x64 is set; cast it explicitly or enable x64"
      )

  def materialize_all(
    self, source: CheckpointSource, requests: Sequence[tuple[ops.Recipe, MaterializationContext]]
  ) -> list[Materialization]:
    """Builds several weights of one source together (a plain tensor is ``source(key)``).

    Their reads share windows, so a block two weights need (q, k and v split from one fused
    tensor) is read once when they fall in the same window. Host memory beyond the restored
    arrays stays within ``max_inflight_bytes``, or the blocks of one shard when those alone
    are larger. Any failure raises :class:`MaterializationError` naming the target key.
    """
    if not requests:
      return []
    empty = [_empty_tensor(source, recipe, context) for recipe, context in requests]
    if any(e is not None for e in empty):  # zero-size tensors: nothing to read, built here
      nonempty = [r for r, e in zip(requests, empty) if e is None]
      others = iter(self.materialize_all(source, nonempty))
      return [e if e is not None else next(others) for e in empty]
    first = requests[0][1]
    remote = source.remote  # a source at a URL
    budget = first.max_inflight_bytes or budget_lib.default_max_inflight_bytes(remote)
    layouts = direct.layouts(requests, source, self.whole_bytes)
    small = [i for i, lay in enumerate(layouts) if lay is not None]
    if not small:
      return windows.materialize(source, requests, budget, self.threads, self.whole_bytes)
    out: list[Materialization | None] = [None] * len(requests)
    for i, m in direct.materialize(source, requests, small, layouts, budget):
      out[i] = m
    general = [i for i, lay in enumerate(layouts) if lay is None]
    rest = [requests[i] for i in general]
    built = windows.materialize(source, rest, budget, self.threads, self.whole_bytes)
    for i, m in zip(general, built):
      out[i] = m
    return out  # type: ignore[return-value]

  def finish_all(self, materializations: Sequence[Materialization]) -> list[jax.Array]:
    """Waits for every weight's transfers (one call for a whole unit)."""
    jax.block_until_ready([m.weight for m in materializations if not m.adopted])
    return [m.weight for m in materializations]

  def evaluate(self, recipe: ops.Recipe, source: CheckpointSource, index: Any) -> np.ndarray:
    """A recipe's value (the region ``index`` of it, ``None`` for all) on the host, compiled
    and read as one shard of a restore is (``recipes.evaluate``)."""
    metas: inference.Metas = {}
    inference.infer(recipe, source, memo=metas)
    region = sel_lib.normalize_index(index, metas[id(recipe)].shape, where=str(recipe))
    program = compiler.compile_shard(recipe, metas, region)
    (window,) = reads_lib.plan_windows([reads_lib.Task(0, [], program)], source, 1 << 62)
    requests = window.requests()
    blocks = dict(zip(requests, source.read_many(requests)))
    return np.ascontiguousarray(program.run(lambda read: window.view(blocks, read)))

  def share_materialized_weight(self, weight: jax.Array) -> jax.Array:
    """The same array: JAX arrays are immutable, so a tied weight is one array at two paths."""
    return weight

  def problems(self, parameter: Any, weight: Any) -> list[str]:
    """Every reason ``weight`` cannot replace ``parameter`` (empty when it can)."""
    out = []
    shape, dtype = tuple(parameter.shape), np.dtype(parameter.dtype)
    if not (hasattr(weight, "shape") and hasattr(weight, "dtype")):
      return [f"a {type(weight).__name__} ({weight!r:.40}), the target expects a jax.Array"]
    if tuple(weight.shape) != shape:
      out.append(f"shape {tuple(weight.shape)}, the target expects {shape}")
    if np.dtype(weight.dtype) != dtype:
      out.append(f"dtype {np.dtype(weight.dtype).name}, the target expects {dtype.name}")
    want = getattr(parameter, "sharding", None)
    if not isinstance(want, jax.sharding.Sharding):
      want = target_lib.default_sharding()
    have = getattr(weight, "sharding", None)
    if have is want and not out and isinstance(weight, jax.Array):  # built for this slot
      return out
    if not isinstance(weight, jax.Array) or have is None:
      out.append(f"a {type(weight).__name__}, the target expects a jax.Array")
    elif not out and not have.is_equivalent_to(want, len(shape)):
      out.append(
        f"sharding {target_lib.describe_sharding(have)}, the target expects "
        f"{target_lib.describe_sharding(want)}"
      )
    return out

  def validate_bind(self, parameter: Any, weight: Any) -> None:
    """Shape, dtype and sharding must match; raises ``BindError`` naming each mismatch."""
    found = self.problems(parameter, weight)
    if found:
      raise errors.BindError("; ".join(found), tuple(found))

  def bind(self, parameter: Any, weight: jax.Array) -> jax.Array:
    """The new value of the slot (functional replacement; nothing is mutated)."""
    del parameter
    return weight


def _empty_tensor(
  source: CheckpointSource, recipe: ops.Recipe, context: MaterializationContext
) -> Materialization | None:
  """A plain checkpoint tensor with a zero-size axis, as the empty array it is (no read), or
  None for anything else (a recipe that produces zero bytes stays an error, at plan time)."""
  shape = tuple(context.shape)
  if not (isinstance(recipe, ops.Source) and 0 in shape and recipe.key in source):
    return None
  meta = source.metadata(recipe.key)
  if not isinstance(recipe.selection, sel_lib.Full) or (meta.shape, meta.dtype) != (
    shape,
    np.dtype(context.dtype),
  ):
    return None  # the general path reports the mismatch
  return Materialization(context.key, jax.device_put(np.zeros(shape, meta.dtype), context.sharding))
