"""``ParameterBackend`` (the seed's trait as a Protocol) and ``JaxBackend``.

``JaxBackend`` builds each weight directly as a sharded ``jax.Array``, in one pass over the data
flow ``source -> plan -> materialize -> bind``:

1. every distinct box this process's devices hold (``sharding.addressable_devices_indices_map``)
   is compiled with the weight's recipe into reads and one function
   (:mod:`paramreg_jax._src.recipes.compiler`);
2. the reads are widened to storage granules and merged into blocks, packed into windows that
   fit the host-memory budget (:mod:`paramreg_jax._src.restore.reads`): a chunk is read once per
   process, whatever number of shards need it;
3. while the next windows are read, the current window's shards are built by a thread pool (a
   strided copy each, into 64-byte aligned buffers); a shard that is exactly one read is handed
   over as read;
4. each weight whose shards are all in one window becomes its global array in one batched
   transfer (:mod:`paramreg_jax._src.restore.transfer`; on CPU the devices adopt the aligned buffers:
   no copy); the shards of a weight spread over windows go to their devices window by window
   and are assembled at the end.

Small stored tensors restored as they are (no recipe, whole, up to ``whole_bytes``, a sharding
that tiles them as a grid) take a direct path instead: grouped by shape, dtype and sharding,
read stacked (``source.read_stacked``: adjacent tensors of a safetensors file are one read),
copied into grid order by one vectorized copy per chunk (each device's shard one contiguous
block), and assembled by one transfer each. Planning, windows and programs per tensor are
skipped: for 10,000 [64, 64] tensors over 8 devices that is most of the time.

Under ``jax.distributed`` each process only ever sees its own devices, so it only reads its own
bytes. No XLA program runs: no compile, no collective, and no device holds more than its shard.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import math
import os
from collections.abc import Callable
from typing import Any
from typing import Protocol
from typing import runtime_checkable

import jax
import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.recipes import compiler
from paramreg_jax._src.recipes import inference
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.restore import reads as reads_lib
from paramreg_jax._src.restore import target as target_lib
from paramreg_jax._src.restore import transfer
from paramreg_jax._src.sources import base as source_lib
from paramreg_jax._src.sources import selection as sel_lib

_MIB = 1 << 20
# Windows alive at once: being read, read and waiting, being built. Each gets 1/_DEPTH of the
# budget; the reader never waits for the builders and vice versa.
_DEPTH = 3


def default_max_inflight_bytes() -> int:
  """The default host budget: 1/64 of the memory available now, between 4 and 16 MiB.

  Throughput does not need more: three windows of about 5 MiB (being read, read, being
  built) already keep the disk and the build threads busy; restoring 268 MB took 0.22-0.26 s with a
  16 MiB budget and 0.28-0.31 s with 128 MiB (docs/benchmarks.md). A larger budget only
  raises the peak. A single shard whose blocks are larger is still read whole.

  Examples:
    >>> from paramreg_jax._src.restore.backend import default_max_inflight_bytes
    >>> 4 << 20 <= default_max_inflight_bytes() <= 16 << 20
    True
  """
  available = None
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          available = int(line.split()[1]) * 1024
          break
  except OSError:
    pass
  if available is None:
    try:
      available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
      available = 1 << 31
  return int(min(16 * _MIB, max(4 * _MIB, available // 64)))


@dataclasses.dataclass
class MaterializationContext:
  """Where one weight goes, and the host-memory budget of the unit it belongs to.

  Attributes:
    key: the target key (for messages).
    shape, dtype, sharding: what the weight must be.
    max_inflight_bytes: source bytes the host may hold at once besides the restored arrays
      (three windows of a third of it: being read, read, being built); ``None`` for
      :func:`default_max_inflight_bytes`.
    on_bytes: called with the byte count of every block read (progress bars).
  """

  key: str
  shape: tuple[int, ...]
  dtype: np.dtype
  sharding: jax.sharding.Sharding
  max_inflight_bytes: int | None = None
  on_bytes: Callable[[int], None] | None = None

  def for_slot(
    self, key: str, shape: tuple[int, ...], dtype: Any, sharding: Any
  ) -> MaterializationContext:
    """A context for another weight sharing this one's budget and progress."""
    return MaterializationContext(
      key, tuple(shape), np.dtype(dtype), sharding, self.max_inflight_bytes, self.on_bytes
    )


@dataclasses.dataclass(frozen=True)
class Materialization:
  """A weight whose device transfers may still be in flight (finish it to wait).

  ``adopted`` marks a weight whose every shard is a host buffer a CPU device adopted as it
  was (no transfer to wait for).
  """

  key: str
  weight: jax.Array
  adopted: bool = False


@runtime_checkable
class ParameterBackend(Protocol):
  """Materializes checkpoint data into native weights and binds them to parameter slots.

  The seed's contract: ``preflight_recipe`` reads only metadata; ``validate_bind`` checks
  shape, dtype and placement without publishing; ``bind`` cannot fail after a successful
  ``validate_bind`` on the same arguments, so a whole unit is validated before anything is
  published.

  Examples:
    >>> from paramreg_jax import JaxBackend, ParameterBackend
    >>> isinstance(JaxBackend(), ParameterBackend)
    True
  """

  def preflight_recipe(self, recipe: Any, source: Any) -> None: ...

  def materialize(self, lease: Any, context: Any) -> Any: ...

  def materialize_recipe(self, recipe: Any, source: Any, context: Any) -> Any: ...

  def materialized_weight(self, materialization: Any) -> Any: ...

  def finish_materialization(self, materialization: Any) -> Any: ...

  def share_materialized_weight(self, weight: Any) -> Any: ...

  def validate_bind(self, parameter: Any, weight: Any) -> None: ...

  def bind(self, parameter: Any, weight: Any) -> Any: ...


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
    >>> from paramreg_jax import JaxBackend
    >>> from paramreg_jax._src.restore.backend import MaterializationContext
    >>> from paramreg_jax.sources import MemorySource
    >>> src = MemorySource({"w": np.arange(8, dtype=np.float32)})
    >>> slot = jax.ShapeDtypeStruct((8,), np.float32, sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    >>> ctx = MaterializationContext("n:w", slot.shape, slot.dtype, slot.sharding)
    >>> backend = JaxBackend()
    >>> weight = backend.finish_materialization(backend.materialize(src.lease("w"), ctx))
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

  def preflight_recipe(self, recipe: ops.Recipe, source: Any) -> None:
    """Metadata-only: the recipe infers, and JAX can hold its dtype as it is."""
    meta = inference.infer(recipe, source)
    canonical = jax.dtypes.canonicalize_dtype(meta.dtype)
    if canonical != meta.dtype:
      raise errors.UnsupportedDtypeError(
        f"{recipe}: produces {meta.dtype.name}, which JAX stores as {np.dtype(canonical).name} "
        "unless jax_enable_x64 is set; cast it explicitly or enable x64"
      )

  def materialize(self, lease: Any, context: MaterializationContext) -> Materialization:
    """Builds the weight from one lease (each block of it read once)."""
    recipe = ops.Source(lease.key, lease.selection)
    return self.materialize_all(lease.source, [(recipe, context)])[0]

  def materialize_recipe(
    self, recipe: ops.Recipe, source: Any, context: MaterializationContext
  ) -> Materialization:
    """Builds the weight from ``recipe`` (see :meth:`materialize_all`)."""
    return self.materialize_all(source, [(recipe, context)])[0]

  def materialize_all(
    self, source: Any, requests: list[tuple[ops.Recipe, MaterializationContext]]
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
      rest = [r for r, e in zip(requests, empty) if e is None]
      others = iter(self.materialize_all(source, rest))
      return [e if e is not None else next(others) for e in empty]
    first = requests[0][1]
    budget = first.max_inflight_bytes or default_max_inflight_bytes()
    layouts = _direct_layouts(requests, source, self.whole_bytes)
    direct = [i for i, lay in enumerate(layouts) if lay is not None]
    if not direct:
      return self._materialize_windows(source, requests, budget)
    out: list[Materialization | None] = [None] * len(requests)
    for i, m in _materialize_direct(source, requests, direct, layouts, budget):
      out[i] = m
    general = [i for i, lay in enumerate(layouts) if lay is None]
    built = self._materialize_windows(source, [requests[i] for i in general], budget)
    for i, m in zip(general, built):
      out[i] = m
    return out  # type: ignore[return-value]

  def _materialize_windows(
    self,
    source: Any,
    requests: list[tuple[ops.Recipe, MaterializationContext]],
    budget: int,
  ) -> list[Materialization]:
    """The general path: every weight compiled into shard programs, read in windows."""
    if not requests:
      return []
    first = requests[0][1]
    tasks = [
      task
      for i, request in enumerate(requests)
      for task in _tasks(i, request, source, self.whole_bytes)
    ]
    windows = reads_lib.windows(tasks, source, max(1, budget // _DEPTH))
    keys = [context.key for _, context in requests]
    puts = _Puts([context for _, context in requests], tasks)
    if hasattr(source, "prepare"):
      source.prepare(sorted({read.key for task in tasks for read in task.program.reads}))
    pool = concurrent.futures.ThreadPoolExecutor(self.threads, thread_name_prefix="paramreg")
    # One reader thread: source blocks are then all allocated in one malloc arena, which
    # reuses what earlier windows freed. Readers per window kept up to twice the budget
    # resident in their threads' arenas (measured), for no speed gain.
    reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="paramreg-read")
    reading: collections.deque[Any] = collections.deque()
    submitted = released = 0

    def read_ahead() -> None:  # keep the reader busy, with at most _DEPTH windows alive
      nonlocal submitted
      while submitted < len(windows) and submitted - released < _DEPTH:
        finish = _start_read(source, windows[submitted], keys, first.on_bytes)
        reading.append(reader.submit(finish))
        submitted += 1

    window = windows[0] if windows else None
    try:
      read_ahead()
      built: tuple[reads_lib.Window, list[Any]] | None = None
      transferring: list[jax.Array] = []
      for window in windows:
        blocks = reading.popleft().result()
        builds: list[Any] = []
        for task in window.tasks:
          handed = _handed(task, window, blocks)
          builds.append(
            pool.submit(_build, task, window, blocks, keys) if handed is None else handed
          )
        del blocks  # held by the builds until they finish
        if built is not None:
          transferring = puts.hand_over(*built, transferring)
          released += 1
          read_ahead()
        built = (window, builds)
      if built is not None:
        puts.hand_over(*built, transferring)
    except BaseException as e:
      reader.shutdown(wait=False, cancel_futures=True)
      pool.shutdown(wait=False, cancel_futures=True)
      if isinstance(e, KeyboardInterrupt) and window is not None:
        # Ctrl-C while this window was read or built
        errors.note_interrupted(e, keys[window.tasks[0].weight])
      raise
    reader.shutdown(wait=True)
    pool.shutdown(wait=True)
    return puts.weights()

  def materialized_weight(self, materialization: Materialization) -> jax.Array:
    return materialization.weight

  def finish_materialization(self, materialization: Materialization) -> jax.Array:
    """Waits for exactly this weight's transfers."""
    if materialization.adopted:
      return materialization.weight
    return jax.block_until_ready(materialization.weight)

  def finish_all(self, materializations: list[Materialization]) -> list[jax.Array]:
    """Waits for every weight's transfers (one call for a whole unit)."""
    jax.block_until_ready([m.weight for m in materializations if not m.adopted])
    return [m.weight for m in materializations]

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
  source: Any, recipe: ops.Recipe, context: MaterializationContext
) -> Materialization | None:
  """A plain checkpoint tensor with a zero-size axis, as the empty array it is (no read), or
  None for anything else (a recipe that produces zero bytes stays an error, at plan time)."""
  shape = tuple(context.shape)
  if not (isinstance(recipe, ops.Source) and 0 in shape and source_lib.has_key(source, recipe.key)):
    return None
  meta = source.metadata(recipe.key)
  if not isinstance(recipe.selection, sel_lib.Full) or (meta.shape, meta.dtype) != (
    shape,
    np.dtype(context.dtype),
  ):
    return None  # the general path reports the mismatch
  return Materialization(context.key, jax.device_put(np.zeros(shape, meta.dtype), context.sharding))


def _direct_layouts(
  requests: list[tuple[ops.Recipe, MaterializationContext]], source: Any, whole_bytes: int
) -> list[transfer.Layout | None]:
  """For each request, the layout of a small stored tensor restored as it is, when it can take
  the direct path (read stacked with its neighbours, built in grid order, one transfer), else
  None (the general path: recipes, selections, large tensors, shardings without a grid)."""
  if not whole_bytes or not hasattr(source, "read_stacked"):
    return [None] * len(requests)
  seen: dict[tuple[Any, ...], transfer.Layout | None] = {}  # per (sharding, shape)
  out: list[transfer.Layout | None] = []
  for recipe, context in requests:
    lay = None
    if (
      type(recipe) is ops.Source
      and type(recipe.selection) is sel_lib.Full
      and source_lib.has_key(source, recipe.key)
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


def _materialize_direct(
  source: Any,
  requests: list[tuple[ops.Recipe, MaterializationContext]],
  direct: list[int],
  layouts: list[transfer.Layout | None],
  budget: int,
) -> list[tuple[int, Materialization]]:
  """Small stored tensors restored as they are, by chunks of one shape, dtype and sharding.

  A chunk is one ``source.read_stacked`` (adjacent tensors: one physical read) and one
  vectorized copy into grid order; then each weight is assembled by one batched transfer.
  A local source is read in this thread, a chunk at most half the budget (the scratch it is
  read into, and the chunk built from it): reading and copying a chunk takes about 1 ms, and a
  reader thread would wait for the GIL while this one assembles (measured: 0.1-0.45 s of such
  waits for 10,000 tensors). A remote source (``source.remote``) is read ahead by a thread,
  three chunks of a quarter of the budget each.
  """
  groups: dict[tuple[Any, ...], list[int]] = {}
  for i in direct:
    context = requests[i][1]
    groups.setdefault((context.shape, np.dtype(context.dtype), context.sharding), []).append(i)
  remote = bool(getattr(source, "remote", False))
  # alive at once: the chunk being read (scratch) and the one built from it (host memory until
  # its transfers finish, off CPU), or, read ahead, _DEPTH built chunks and one being read
  limit = max(1, budget // (_DEPTH + 1 if remote else 2))
  chunks: list[list[int]] = []
  for members in groups.values():
    size = source.metadata(requests[members[0]][0].key).nbytes  # type: ignore[attr-defined]
    per = max(1, limit // size)
    chunks.extend(members[k : k + per] for k in range(0, len(members), per))
  if hasattr(source, "prepare"):
    source.prepare(sorted({requests[i][0].key for i in direct}))  # type: ignore[attr-defined]
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
        while submitted < len(chunks) and len(reading) < _DEPTH:
          # chunks read ahead each have their own scratch
          reading.append(reader.submit(read, chunks[submitted], _Scratch()))
          submitted += 1
        built = reading.popleft().result()
      else:
        built = read(chunk, scratch)
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
      transferring = []
      for g, i in enumerate(chunk):
        array = make(devices, lay.shards(built[g]))
        transferring.append(array)
        out.append((i, Materialization(requests[i][1].key, array, adopted)))
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


class _Scratch:
  """A reusable aligned buffer for stacked reads (chunks read one after another share one)."""

  def __init__(self) -> None:
    self.raw = np.empty(0, np.uint8)

  def get(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    n = source_lib.nbytes_of(shape, dtype)
    if self.raw.size < n:
      self.raw = source_lib.aligned_empty((n,), np.uint8)
    return self.raw[:n].view(dtype).reshape(shape)


def _read_chunk(
  source: Any,
  requests: list[tuple[ops.Recipe, MaterializationContext]],
  chunk: list[int],
  lay: transfer.Layout,
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
  in_place = math.prod(lay.grid) == 1 and size % source_lib.HOST_ALIGNMENT == 0  # type: ignore[arg-type]
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
  aligned = stacked.ctypes.data % source_lib.HOST_ALIGNMENT == 0 and stacked.flags.c_contiguous
  if in_place and aligned:
    return stacked.reshape(n, *lay.grid_shape)  # already in grid order
  items = stacked[0].size
  padded = -(-size // source_lib.HOST_ALIGNMENT) * source_lib.HOST_ALIGNMENT // dtype.itemsize
  buffer = source_lib.aligned_empty((n, padded), dtype)
  built = buffer[:, :items].reshape(n, *lay.grid_shape)
  np.copyto(built, lay.to_grid(stacked), casting="no")
  return built


def _tasks(
  index: int,
  request: tuple[ops.Recipe, MaterializationContext],
  source: Any,
  whole_bytes: int,
) -> list[Any]:
  """One compiled task per distinct box of the weight that this process's devices hold."""
  recipe, context = request
  shape, dtype = tuple(context.shape), np.dtype(context.dtype)
  try:
    metas: inference.Metas = {}
    inference.infer(recipe, source, memo=metas)
  except errors.ParamRegError as e:
    raise errors.MaterializationError(f"{context.key}: {e}", context.key) from e
  meta = metas[id(recipe)]
  if meta.shape != shape or meta.dtype != dtype:
    raise errors.MaterializationError(
      f"{context.key}: {recipe} produces {meta.shape} {meta.dtype.name}, the slot needs "
      f"{shape} {dtype.name}",
      context.key,
    )
  sharding = context.sharding
  if (
    len(sharding.device_set) > 1 and sharding.is_fully_addressable and meta.nbytes <= whole_bytes
  ):  # one host build and one device_put beat a Python-level call per shard
    full = sel_lib.full_region(shape)
    return [reads_lib.Task(index, [], compiler.compile_shard(recipe, metas, full), sharding)]
  by_region: dict[sel_lib.Region, list[Any]] = {}
  for device, index_ in sharding.addressable_devices_indices_map(shape).items():
    region = sel_lib.normalize_index(index_, shape, where=context.key)
    by_region.setdefault(region, []).append(device)
  tasks = [
    reads_lib.Task(index, by_region[r], compiler.compile_shard(recipe, metas, r))
    for r in sorted(by_region)
  ]
  # shards that need the same storage blocks next to each other: a window boundary then never
  # separates them, so a block is not read twice under a small budget
  return sorted(
    tasks,
    key=lambda t: [(r.key, source.storage_box(r.key, r.box)) for r in t.program.reads],
  )


def _grid_of(task: reads_lib.Task) -> transfer.Layout | None:
  """The layout of a weight built whole, when its shards form a grid of more than one block
  (it is then built in grid order), else None."""
  if task.whole is None:
    return None
  lay = transfer.layout(task.whole, task.program.shape)
  return lay if lay.grid is not None and math.prod(lay.grid) > 1 else None


class _Puts:
  """Hands built shards to their devices, window by window, and assembles each weight.

  A weight whose shards are all built in one window becomes its global array in one batched
  transfer (:func:`transfer.assembler`). The shards of a weight spread over several windows
  are put on their devices as each window finishes (so no window's host buffers outlive it)
  and assembled at the end.
  """

  def __init__(self, contexts: list[MaterializationContext], tasks: list[reads_lib.Task]):
    self.contexts = contexts
    self.remaining = [0] * len(contexts)
    for task in tasks:
      self.remaining[task.weight] += 1
    self.arrays: list[jax.Array | None] = [None] * len(contexts)
    self.parts: dict[int, list[jax.Array]] = {}

  def hand_over(
    self, window: reads_lib.Window, builds: list[Any], transferring: list[jax.Array]
  ) -> list[jax.Array]:
    """Puts a built window on its devices once the previous window's transfers finished, so
    at most one window of host buffers waits on transfers; returns this window's arrays."""
    hosts: dict[int, dict[Any, np.ndarray]] = {}  # weight -> {device: its host buffer}
    for task, build in zip(window.tasks, builds):
      host = build if isinstance(build, np.ndarray) else build.result()
      if task.whole is not None:  # built whole: in grid order when it has a grid of blocks
        grid = _grid_of(task)
        lay = grid or transfer.layout(task.whole, task.program.shape)
        buffers = lay.shards(host) if grid is not None else lay.views(host)
        hosts[task.weight] = dict(zip(lay.devices, buffers))
      else:
        hosts.setdefault(task.weight, {}).update(dict.fromkeys(task.devices, host))
      self.remaining[task.weight] -= 1
    jax.block_until_ready(transferring)
    out: list[jax.Array] = []
    spread_hosts: list[np.ndarray] = []
    spread_devices: list[Any] = []
    spread_owners: list[int] = []
    for weight, by_device in hosts.items():
      context = self.contexts[weight]
      if weight in self.parts or self.remaining[weight]:  # spread over windows
        for device, host in by_device.items():
          spread_hosts.append(host)
          spread_devices.append(device)
          spread_owners.append(weight)
        continue
      lay = transfer.layout(context.sharding, context.shape)
      make = transfer.assembler(context.shape, context.dtype, context.sharding)
      array = make(lay.devices, [by_device[d] for d in lay.devices])
      self.arrays[weight] = array
      out.append(array)
    if spread_hosts:
      put = jax.device_put(spread_hosts, spread_devices)
      for weight, array in zip(spread_owners, put):
        self.parts.setdefault(weight, []).append(array)
      out.extend(put)
    return out

  def weights(self) -> list[Materialization]:
    """Every weight's global array."""
    out = []
    for weight, context in enumerate(self.contexts):
      array = self.arrays[weight]
      if array is None:
        array = jax.make_array_from_single_device_arrays(
          tuple(context.shape), context.sharding, self.parts.pop(weight, [])
        )
      out.append(Materialization(context.key, array))
    return out


def _culprit(window: reads_lib.Window, keys: list[str], source_key: str | None) -> str:
  """The target key of the first task in ``window`` that reads ``source_key``."""
  for task in window.tasks:
    if any(read.key == source_key for read in task.program.reads):
      return keys[task.weight]
  return keys[window.tasks[0].weight]


def _start_read(
  source: Any, window: reads_lib.Window, keys: list[str], on_bytes: Callable[[int], None] | None
) -> Callable[[], dict[tuple[str, sel_lib.Region], np.ndarray]]:
  """Issues the reads of every block of ``window`` (orbax starts decoding now); the returned
  function waits for them (in the reader thread)."""
  requests = window.requests()
  if hasattr(source, "start_reads"):
    finish = _named(lambda: source.start_reads(requests), window, keys)
  else:  # any CheckpointSource: read_many when finished
    finish = functools.partial(source.read_many, requests)
  return functools.partial(_read, finish, source, window, keys, on_bytes, requests)


def _named(call: Callable[[], Any], window: reads_lib.Window, keys: list[str]) -> Any:
  """``call()``, with a source error turned into a ``MaterializationError`` naming the weight
  whose read failed (and an interrupt noted with it)."""
  try:
    return call()
  except errors.SourceIOError as e:
    culprit = _culprit(window, keys, e.key)
    raise errors.MaterializationError(f"{culprit}: {e}", culprit) from e
  except KeyboardInterrupt as e:
    errors.note_interrupted(e, _culprit(window, keys, getattr(e, "paramreg_source_key", None)))
    raise


def _read(
  finish: Callable[[], list[np.ndarray]],
  source: Any,
  window: reads_lib.Window,
  keys: list[str],
  on_bytes: Callable[[int], None] | None,
  requests: list[tuple[str, sel_lib.Region]],
) -> dict[tuple[str, sel_lib.Region], np.ndarray]:
  """Every block of ``window``, checked, by ``(key, box)``."""
  values = _named(finish, window, keys)
  out = {}
  for (key, box), value in zip(requests, values):
    want, dtype = sel_lib.region_shape(box), np.dtype(source.metadata(key).dtype)
    if value.shape != want or value.dtype != dtype:
      culprit = _culprit(window, keys, key)
      raise errors.MaterializationError(
        f"{culprit}: {key!r} region {sel_lib.region_slices(box)} came back as {value.shape} "
        f"{value.dtype}, expected {want} {dtype.name} (corrupt data?)",
        culprit,
      )
    out[key, box] = value
  if on_bytes is not None:
    on_bytes(sum(v.nbytes for v in values))
  return out


def _handed(
  task: reads_lib.Task,
  window: reads_lib.Window,
  blocks: dict[tuple[str, sel_lib.Region], np.ndarray],
) -> np.ndarray | None:
  """The block itself when it is exactly the shard, aligned for a zero-copy hand-over (no
  thread needed: most shards of a direct restore), else None."""
  if task.program.handoff is None or (task.whole is not None and _grid_of(task) is not None):
    return None
  value = window.view(blocks, task.program.handoff)
  program = task.program
  if (
    value.ctypes.data % source_lib.HOST_ALIGNMENT == 0
    and value.flags.c_contiguous
    and value.shape == program.shape
    and value.dtype == program.dtype
  ):
    return value
  return None


def _build(
  task: reads_lib.Task,
  window: reads_lib.Window,
  blocks: dict[tuple[str, sel_lib.Region], np.ndarray],
  keys: list[str],
) -> np.ndarray:
  """The host buffer of one shard: one copy of the program's value (or of an unaligned
  hand-off) into a new aligned buffer. Runs in the thread pool."""
  program = task.program

  def fetch(read: compiler.Read) -> np.ndarray:
    return window.view(blocks, read)

  try:
    value = fetch(program.handoff) if program.handoff is not None else program.run(fetch)
    if value.shape != program.shape or value.dtype != program.dtype:
      raise errors.MaterializationError(
        f"{keys[task.weight]}: region {sel_lib.region_slices(program.region)} came out as "
        f"{value.shape} {value.dtype}, expected {program.shape} {program.dtype.name}",
        keys[task.weight],
      )
    lay = _grid_of(task)
    if lay is not None:  # a weight built whole, in grid order: each shard one block
      out = source_lib.aligned_empty(lay.grid_shape, program.dtype)
      np.copyto(out, lay.to_grid(value), casting="no")
      return out
    out = source_lib.aligned_empty(program.shape, program.dtype)
    np.copyto(out, value, casting="no")
    return out
  except errors.ParamRegError:
    raise
  except Exception as e:  # numpy errors while transforming: name the weight
    raise errors.MaterializationError(
      f"{keys[task.weight]}: building region {sel_lib.region_slices(program.region)} failed: "
      f"{type(e).__name__}: {e}",
      keys[task.weight],
    ) from e


def evaluate(recipe: ops.Recipe, src: Any, index: Any = None) -> np.ndarray:
  """The value of ``recipe`` (or just the region ``index`` of it) as a numpy array.

  The same compiled program and block reads a restore runs for one shard, on the host.

  Args:
    recipe: a recipe.
    src: a checkpoint source.
    index: ``None`` for the whole output, or a tuple of slices into the output shape.

  Returns:
    ``evaluate(recipe, src)[index]``, computed reading only what that region needs.

  Examples:
    >>> import numpy as np
    >>> from paramreg_jax import recipes
    >>> from paramreg_jax.sources import MemorySource
    >>> src = MemorySource({"left": np.ones((2, 3), np.float32), "right": np.zeros((2, 3), np.float32)})
    >>> r = recipes.concatenate([recipes.source("left"), recipes.source("right")], axis=0)
    >>> recipes.evaluate(r, src, (slice(1, 3),)).tolist(), src.stats.bytes_read
    ([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], 24)
  """
  metas: inference.Metas = {}
  inference.infer(recipe, src, memo=metas)
  region = sel_lib.normalize_index(index, metas[id(recipe)].shape, where=str(recipe))
  program = compiler.compile_shard(recipe, metas, region)
  (window,) = reads_lib.windows([reads_lib.Task(0, [], program)], src, 1 << 62)
  requests = window.requests()
  blocks = dict(zip(requests, src.read_many(requests)))
  return np.ascontiguousarray(program.run(lambda read: window.view(blocks, read)))
