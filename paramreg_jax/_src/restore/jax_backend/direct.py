"""The direct path: small stored tensors restored as they are, read stacked, one transfer each.

Small stored tensors restored as they are (no recipe, whole, up to ``whole_bytes``, a sharding
that tiles them as a grid) are grouped by shape, dtype and sharding, read stacked
(``source.read_stacked``: adjacent tensors of a safetensors file are one read), copied into
grid order by one vectorized copy per chunk (each device's shard one contiguous block), and
assembled by one transfer each. Planning, windows and programs per tensor are skipped: for
10,000 [64, 64] tensors over 8 devices that is most of the time.
"""

from __future__ import annotations

import collections
import concurrent.futures
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.restore.contract import Materialization
from paramreg_jax._src.restore.contract import MaterializationContext
from paramreg_jax._src.restore.jax_backend import budget as budget_lib
from paramreg_jax._src.restore.jax_backend import transfer
from paramreg_jax._src.sources import checkpoint_source as source_lib
from paramreg_jax._src.sources import host_memory
from paramreg_jax._src.sources import selection as sel_lib


def layouts(
  requests: Sequence[tuple[ops.Recipe, MaterializationContext]],
  source: source_lib.CheckpointSource,
  whole_bytes: int,
) -> list[transfer.DeviceSplit | None]:
  """For each request, the layout of a small stored tensor restored as it is, when it can take
  the direct path (read stacked with its neighbours, built in grid order, one transfer), else
  None (the general path: recipes, selections, large tensors, shardings without a grid)."""
  if not whole_bytes:
    return [None] * len(requests)
  seen: dict[tuple[Any, ...], transfer.DeviceSplit | None] = {}  # per (sharding, shape)
  out: list[transfer.DeviceSplit | None] = []
  for recipe, context in requests:
    lay = None
    if (
      type(recipe) is ops.Source and type(recipe.selection) is sel_lib.Full and recipe.key in source
    ):
      meta = source.metadata(recipe.key)
      shape = tuple(context.shape)
      if (
        shape  # (a scalar takes the general path: indexing a stack by one int gives a scalar)
        and meta.shape == shape
        and meta.dtype == context.dtype
        and 0 < meta.nbytes <= whole_bytes
      ):
        where = (id(context.sharding), shape)
        if where not in seen:
          sharding = context.sharding
          found = transfer.layout(sharding, shape) if sharding.is_fully_addressable else None
          seen[where] = found if found is not None and found.grid is not None else None
        lay = seen[where]
    out.append(lay)
  return out


def materialize(
  source: source_lib.CheckpointSource,
  requests: Sequence[tuple[ops.Recipe, MaterializationContext]],
  small: list[int],
  layouts: list[transfer.DeviceSplit | None],
  budget: int,
) -> list[tuple[int, Materialization]]:
  """Small stored tensors restored as they are, by chunks of one shape, dtype and sharding.

  A chunk is one ``source.read_stacked`` (adjacent tensors: one physical read) and one
  vectorized copy into grid order; then each weight is assembled by one batched transfer.
  A local source is read in this thread, a chunk at most half the budget (the scratch it is
  read into, and the chunk built from it): reading and copying a chunk is quick, and a reader
  thread would wait for the GIL while this one assembles. A remote source (``source.remote``) is read ahead by a thread,
  three chunks of a quarter of the budget each.
  """
  remote = source.remote
  chunks = _chunks(source, requests, small, budget, remote)
  source.prepare(sorted({requests[i][0].key for i in small}))  # type: ignore[attr-defined]
  scratch = _Scratch()  # stacked reads, reused: one chunk of source bytes in flight

  def read(chunk: list[int], scratch: _Scratch) -> np.ndarray:
    return _read_chunk(source, requests, chunk, layouts[chunk[0]], scratch)  # type: ignore[arg-type]

  reader = None
  reading: collections.deque[Any] = collections.deque()
  if remote:
    reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="paramreg-read")
  out: list[tuple[int, Materialization]] = []
  submitted = 0
  chunk: list[int] = chunks[0]
  try:
    transferring: list[jax.Array] = []
    for chunk in chunks:
      if reader is not None:
        while submitted < len(chunks) and len(reading) < budget_lib.DEPTH:
          # chunks read ahead each have their own scratch
          reading.append(reader.submit(read, chunks[submitted], _Scratch()))
          submitted += 1
        built = reading.popleft().result()
      else:
        built = read(chunk, scratch)
      transferring = _assemble(requests, chunk, layouts, built, transferring, out)
      del built
  except BaseException as e:
    if reader is not None:
      reader.shutdown(wait=False, cancel_futures=True)
    if isinstance(e, KeyboardInterrupt):
      errors.note_interrupted(e, requests[chunk[0]][1].key)
    raise
  if reader is not None:
    reader.shutdown(wait=True)
  return out


def _chunks(
  source: source_lib.CheckpointSource,
  requests: Sequence[tuple[ops.Recipe, MaterializationContext]],
  small: list[int],
  budget: int,
  remote: bool,
) -> list[list[int]]:
  """``small`` grouped by shape, dtype and sharding, in chunks that fit the budget."""
  groups: dict[tuple[Any, ...], list[int]] = {}
  for i in small:
    context = requests[i][1]
    groups.setdefault((context.shape, np.dtype(context.dtype), context.sharding), []).append(i)
  # alive at once: the chunk being read (scratch) and the one built from it (host memory until
  # its transfers finish, off CPU), or, read ahead, DEPTH built chunks and one being read
  limit = max(1, budget // (budget_lib.DEPTH + 1 if remote else 2))
  chunks: list[list[int]] = []
  for members in groups.values():
    size = source.metadata(requests[members[0]][0].key).nbytes  # type: ignore[attr-defined]
    per = max(1, limit // size)
    chunks.extend(members[k : k + per] for k in range(0, len(members), per))
  return chunks


def _assemble(
  requests: Sequence[tuple[ops.Recipe, MaterializationContext]],
  chunk: list[int],
  layouts: list[transfer.DeviceSplit | None],
  built: np.ndarray,
  transferring: list[jax.Array],
  out: list[tuple[int, Materialization]],
) -> list[jax.Array]:
  """Each weight of a built chunk put on its devices (one transfer each); appends them to
  ``out`` and returns the arrays still in transit."""
  lay = layouts[chunk[0]]
  assert lay is not None
  context = requests[chunk[0]][1]
  if context.on_bytes is not None:
    context.on_bytes(len(chunk) * source_lib.nbytes_of(context.shape, context.dtype))
  make = transfer.assembler(context.shape, context.dtype, context.sharding)
  devices = lay.devices
  on_cpu = all(d.platform == "cpu" for d in devices)
  adopted = on_cpu and lay.aligned(built[0])
  if not on_cpu:  # host buffers in transit: at most one chunk's (CPU devices adopt them)
    jax.block_until_ready(transferring)
  arrays = []
  for g, i in enumerate(chunk):
    array = make(devices, lay.shards(built[g]))
    arrays.append(array)
    out.append((i, Materialization(requests[i][1].key, array, adopted)))
  return arrays


class _Scratch:
  """A reusable aligned buffer for stacked reads (chunks read one after another share one)."""

  def __init__(self) -> None:
    self.raw = np.empty(0, np.uint8)

  def get(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    n = source_lib.nbytes_of(shape, dtype)
    if self.raw.size < n:
      self.raw = host_memory.aligned_empty((n,), np.uint8)
    return self.raw[:n].view(dtype).reshape(shape)


def _read_chunk(
  source: source_lib.CheckpointSource,
  requests: Sequence[tuple[ops.Recipe, MaterializationContext]],
  chunk: list[int],
  lay: transfer.DeviceSplit,
  scratch: _Scratch,
) -> np.ndarray:
  """The weights of ``chunk`` read stacked and copied into grid order: ``[n, *grid_shape]``,
  each weight starting 64-byte aligned (read into ``scratch`` first, unless the stack already
  is in grid order)."""
  keys = [requests[i][0].key for i in chunk]  # type: ignore[attr-defined]
  by_source = {k: requests[i][1].key for k, i in zip(keys, chunk)}
  context = requests[chunk[0]][1]
  want, dtype = (len(chunk), *context.shape), np.dtype(context.dtype)
  size = source_lib.nbytes_of(context.shape, dtype)
  in_place = math.prod(lay.grid) == 1 and size % host_memory.HOST_ALIGNMENT == 0  # type: ignore[arg-type]
  try:
    # a weight with one block per device is adopted as read; others are copied from scratch
    stacked = source.read_stacked(keys, None if in_place else scratch.get(want, dtype))
  except errors.SourceIOError as e:
    culprit = by_source.get(e.key or "", requests[chunk[0]][1].key)
    raise errors.MaterializationError(f"{culprit}: {e}", culprit) from e
  except KeyboardInterrupt as e:
    culprit = by_source.get(getattr(e, "paramreg_source_key", ""), requests[chunk[0]][1].key)
    errors.note_interrupted(e, culprit)
    raise
  if stacked.shape != want or stacked.dtype != dtype:
    raise errors.MaterializationError(
      f"{context.key}: {keys[0]!r} and {len(keys) - 1} more came back stacked as "
      f"{stacked.shape} {stacked.dtype}, expected {want} {dtype.name} (corrupt data?)",
      context.key,
    )
  n = len(chunk)
  aligned = stacked.ctypes.data % host_memory.HOST_ALIGNMENT == 0 and stacked.flags.c_contiguous
  if in_place and aligned:
    return stacked.reshape(n, *lay.grid_shape)  # already in grid order
  items = stacked[0].size
  padded = -(-size // host_memory.HOST_ALIGNMENT) * host_memory.HOST_ALIGNMENT // dtype.itemsize
  buffer = host_memory.aligned_empty((n, padded), dtype)
  built = buffer[:, :items].reshape(n, *lay.grid_shape)
  np.copyto(built, lay.to_grid(stacked), casting="no")
  return built
