"""The general path: every weight compiled into shard programs, its blocks read in windows.

A window is a set of merged blocks that fits a third of the budget. One reader thread reads
ahead (at most ``budget.DEPTH`` windows alive: being read, read, being built); a thread pool
builds each window's shards (a strided copy each, into 64-byte aligned buffers); a shard that
is exactly one aligned read is handed over as read. Each window is handed to the devices
(:mod:`paramreg_jax._src.restore.jax_backend.handover`) once the previous one's transfers finished.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.recipes import compiler
from paramreg_jax._src.recipes import inference
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.restore.contract import Materialization
from paramreg_jax._src.restore.contract import MaterializationContext
from paramreg_jax._src.restore.jax_backend import budget as budget_lib
from paramreg_jax._src.restore.jax_backend import handover
from paramreg_jax._src.restore.jax_backend import reads as reads_lib
from paramreg_jax._src.sources import checkpoint_source as source_lib
from paramreg_jax._src.sources import host_memory
from paramreg_jax._src.sources import selection as sel_lib


def materialize(
  source: source_lib.CheckpointSource,
  requests: Sequence[tuple[ops.Recipe, MaterializationContext]],
  budget: int,
  threads: int,
  whole_bytes: int,
) -> list[Materialization]:
  """Builds ``requests`` (``threads`` build threads; see ``JaxBackend(whole_bytes=...)``)."""
  if not requests:
    return []
  tasks = [
    task for i, request in enumerate(requests) for task in _tasks(i, request, source, whole_bytes)
  ]
  run = _Run(source, requests, tasks, budget)
  source.prepare(sorted({read.key for task in tasks for read in task.program.reads}))
  pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="paramreg")
  try:
    run.all(pool)
  except BaseException as e:
    run.reader.shutdown(wait=False, cancel_futures=True)
    pool.shutdown(wait=False, cancel_futures=True)
    run.cancel_reads()
    if isinstance(e, KeyboardInterrupt) and run.window is not None:
      # Ctrl-C while this window was read or built
      errors.note_interrupted(e, run.keys[run.window.tasks[0].weight])
    raise
  run.reader.shutdown(wait=True)
  pool.shutdown(wait=True)
  return run.puts.weights()


class _Run:
  """One pass over the windows: read ahead by one thread, built by a pool, handed over."""

  def __init__(
    self,
    source: source_lib.CheckpointSource,
    requests: Any,
    tasks: list[reads_lib.Task],
    budget: int,
  ):
    self.source = source
    self.windows = reads_lib.plan_windows(tasks, source, max(1, budget // budget_lib.DEPTH))
    self.keys = [context.key for _, context in requests]
    self.on_bytes = requests[0][1].on_bytes
    self.puts = handover.Puts([context for _, context in requests], tasks)
    # One reader thread: source blocks are then all allocated in one malloc arena, which
    # reuses what earlier windows freed. Readers per window kept up to twice the budget
    # resident in their threads' arenas (measured), for no speed gain.
    self.reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="paramreg-read")
    self.reading: collections.deque[Any] = collections.deque()
    self.submitted = self.released = 0
    self.window = self.windows[0] if self.windows else None
    self.started: list[Any] = []  # the source's handles of the reads it started

  def read_ahead(self) -> None:
    """Keeps the reader busy, with at most ``DEPTH`` windows alive."""
    while self.submitted < len(self.windows) and self.submitted - self.released < budget_lib.DEPTH:
      started, finish = _start_read(
        self.source, self.windows[self.submitted], self.keys, self.on_bytes
      )
      self.started.append(started)
      self.reading.append(self.reader.submit(finish))
      self.submitted += 1

  def cancel_reads(self) -> None:
    """A failed unit reads nothing more: the reads a source started ahead (at a URL, in
    flight at once) are cancelled, where the source can (``finish.cancel()``)."""
    for finish in self.started:
      cancel = getattr(finish, "cancel", None)
      if cancel is not None:
        cancel()

  def all(self, pool: concurrent.futures.ThreadPoolExecutor) -> None:
    self.read_ahead()
    built: tuple[reads_lib.Window, list[Any]] | None = None
    transferring: list[jax.Array] = []
    for window in self.windows:
      self.window = window
      blocks = self.reading.popleft().result()
      builds: list[Any] = []
      for task in window.tasks:
        handed = _handed(task, window, blocks)
        builds.append(
          pool.submit(_build, task, window, blocks, self.keys) if handed is None else handed
        )
      del blocks  # held by the builds until they finish
      if built is not None:
        transferring = self.puts.hand_over(*built, transferring)
        self.released += 1
        self.read_ahead()
      built = (window, builds)
    if built is not None:
      self.puts.hand_over(*built, transferring)


def _tasks(
  index: int,
  request: tuple[ops.Recipe, MaterializationContext],
  source: source_lib.CheckpointSource,
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


def _culprit(window: reads_lib.Window, keys: list[str], source_key: str | None) -> str:
  """The target key of the first task in ``window`` that reads ``source_key``."""
  for task in window.tasks:
    if any(read.key == source_key for read in task.program.reads):
      return keys[task.weight]
  return keys[window.tasks[0].weight]


def _start_read(
  source: source_lib.CheckpointSource,
  window: reads_lib.Window,
  keys: list[str],
  on_bytes: Callable[[int], None] | None,
) -> tuple[Any, Callable[[], dict[tuple[str, sel_lib.Region], np.ndarray]]]:
  """Issues the reads of every block of ``window`` (orbax starts decoding now): the source's
  handle of them, and a function that waits for them (in the reader thread)."""
  requests = window.requests()
  finish = _named(lambda: source.start_reads(requests), window, keys)
  return finish, functools.partial(_read, finish, source, window, keys, on_bytes, requests)


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
  source: source_lib.CheckpointSource,
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
  if task.program.handoff is None or (
    task.whole is not None and handover.grid_of(task) is not None
  ):
    return None
  value = window.view(blocks, task.program.handoff)
  program = task.program
  if (
    value.ctypes.data % host_memory.HOST_ALIGNMENT == 0
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
    lay = handover.grid_of(task)
    if lay is not None:  # a weight built whole, in grid order: each shard one block
      out = host_memory.aligned_empty(lay.grid_shape, program.dtype)
      np.copyto(out, lay.to_grid(value), casting="no")
      return out
    out = host_memory.aligned_empty(program.shape, program.dtype)
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
