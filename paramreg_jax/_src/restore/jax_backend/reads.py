"""Which bytes to read: the shard programs' boxes become storage-aligned blocks, in windows.

A device's shard needs a few boxes of stored tensors (:mod:`recipes.compiler`). The storage
serves bytes in larger units: an orbax array in chunks, a safetensors tensor in whole rows (its
bytes are row-major in one file). So each box is widened to its storage granule
(``source.storage_box``), and the widened boxes of one tensor that overlap are merged into one
*block*. A chunk several shards need is then read once per process and sliced for each of them
(an unsharded orbax array restored over 8 devices reads its single chunk once, not 8 times; a
column-sharded kernel over row-chunked storage reads each row chunk once).

Blocks are grouped into *windows* of at most ``window_bytes`` (one program alone may exceed it:
its blocks are then a window of their own). The backend keeps three windows alive (being read,
read, being built), each a third of the budget, so host memory holds at most the budget of
source bytes besides the restored arrays themselves.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from paramreg_jax._src.recipes import compiler
from paramreg_jax._src.sources import selection as sel_lib
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource


def intersects(a: sel_lib.Region, b: sel_lib.Region) -> bool:
  return all(lo1 < hi2 and lo2 < hi1 for (lo1, hi1), (lo2, hi2) in zip(a, b))


def contains(outer: sel_lib.Region, inner: sel_lib.Region) -> bool:
  return all(lo1 <= lo2 and hi2 <= hi1 for (lo1, hi1), (lo2, hi2) in zip(outer, inner))


def bounding(a: sel_lib.Region, b: sel_lib.Region) -> sel_lib.Region:
  return tuple((min(lo1, lo2), max(hi1, hi2)) for (lo1, hi1), (lo2, hi2) in zip(a, b))


def box_bytes(box: sel_lib.Region, itemsize: int) -> int:
  return math.prod(b - a for a, b in box) * itemsize


def merge(blocks: list[sel_lib.Region], box: sel_lib.Region) -> list[sel_lib.Region]:
  """``blocks`` (pairwise disjoint) with ``box`` added: every block it overlaps is merged into
  their bounding box, repeatedly, so the result is again pairwise disjoint."""
  if any(contains(b, box) for b in blocks):
    return blocks
  rest = list(blocks)
  while True:
    hit = next((i for i, b in enumerate(rest) if intersects(b, box)), None)
    if hit is None:
      return [*rest, box]
    box = bounding(box, rest.pop(hit))


@dataclasses.dataclass
class Task:
  """One distinct shard of one weight: its program and the devices that hold it.

  ``whole`` is set instead of ``devices`` for a small weight built whole on the host and
  handed to ``jax.device_put(value, whole)`` in one call (jax slices it in C++).
  """

  weight: int
  devices: list[Any]
  program: compiler.ShardProgram
  whole: Any = None

  @property
  def on_host(self) -> bool:
    """Whether the shard's devices are CPU devices that adopt its buffer (host memory: a block
    handed over as the shard *is* restored memory, not extra). A weight built whole is sliced
    by ``jax.device_put``, so its block is transient."""
    return (
      self.whole is None and bool(self.devices) and all(d.platform == "cpu" for d in self.devices)
    )


@dataclasses.dataclass
class Window:
  """Shard tasks whose blocks are read together: ``{key: [block box, ...]}``."""

  tasks: list[Task] = dataclasses.field(default_factory=list)
  blocks: dict[str, list[sel_lib.Region]] = dataclasses.field(default_factory=dict)
  nbytes: int = 0  # what the budget counts: blocks that are not handed over as CPU shards
  handed: set[tuple[str, sel_lib.Region]] = dataclasses.field(default_factory=set)

  def requests(self) -> list[tuple[str, sel_lib.Region]]:
    """The blocks as ``(key, box)`` read requests, in first-use order."""
    return [(key, box) for key, boxes in self.blocks.items() for box in boxes]

  def view(
    self, blocks: dict[tuple[str, sel_lib.Region], np.ndarray], read: compiler.Read
  ) -> np.ndarray:
    """The buffer of ``read``: the block holding it (every read is in exactly one), or a view
    of it."""
    box = next(b for b in self.blocks[read.key] if contains(b, read.box))
    block = blocks[read.key, box]
    if box == read.box:
      return block
    return block[tuple(slice(a - a0, b - a0) for (a, b), (a0, _) in zip(read.box, box))]


def _with(
  window: Window, task: Task, source: CheckpointSource, itemsize: dict[str, int]
) -> tuple[dict[str, list[sel_lib.Region]], int, tuple[str, sel_lib.Region] | None]:
  """What adding ``task`` changes: ``({key: blocks}, counted bytes, handed-over block)``.

  A block that a CPU shard receives as it is read costs nothing beyond the restored arrays,
  so it is not counted (an orbax checkpoint saved with the target's sharding is then read
  with every chunk in flight); on accelerators every block is host memory in transit. Only
  the keys ``task`` touches are recounted, so packing is linear in the number of shards.
  """
  handoff = task.program.handoff
  handed = None
  if handoff is not None and task.on_host:
    block = (handoff.key, handoff.box)
    if source.storage_box(*block) == handoff.box and block not in window.handed:
      handed = block

  def counted(key: str, boxes: list[sel_lib.Region], with_new: bool) -> int:
    return sum(
      box_bytes(b, itemsize[key])
      for b in boxes
      if (key, b) not in window.handed and not (with_new and (key, b) == handed)
    )

  changes: dict[str, list[sel_lib.Region]] = {}
  total = window.nbytes
  touched = [read.key for read in task.program.reads] + ([handed[0]] if handed else [])
  for key in dict.fromkeys(touched):
    before = window.blocks.get(key, [])
    after = before
    for read in task.program.reads:
      if read.key == key:
        after = merge(after, source.storage_box(key, read.box))
    total += counted(key, after, True) - counted(key, before, False)
    if after is not before:
      changes[key] = after
  return changes, total, handed


def plan_windows(
  tasks: Sequence[Task], source: CheckpointSource, window_bytes: int
) -> list[Window]:
  """Packs ``tasks`` in order into windows of at most ``window_bytes`` of blocks.

  Examples:
    >>> import numpy as np
    >>> from paramreg_jax import recipes as R
    >>> from paramreg_jax import MemorySource
    >>> from paramreg_jax._src.restore.jax_backend import reads
    >>> from paramreg_jax._src.recipes import compiler, inference
    >>> src = MemorySource({"w": np.zeros((4, 4), np.float32)})
    >>> r = R.source("w")
    >>> metas = {}
    >>> _ = inference.infer(r, src, memo=metas)
    >>> halves = [((0, 4), (0, 2)), ((0, 4), (2, 4)), ((0, 4), (1, 3))]
    >>> tasks = [reads.Task(0, [], compiler.compile_shard(r, metas, h)) for h in halves]
    >>> [w.blocks for w in reads.plan_windows(tasks, src, 1 << 20)]  # the middle box joins both
    [{'w': [((0, 4), (0, 4))]}]
  """
  itemsize = {}
  out: list[Window] = []
  current = Window()
  for task in tasks:
    for read in task.program.reads:
      if read.key not in itemsize:
        itemsize[read.key] = np.dtype(source.metadata(read.key).dtype).itemsize
    changes, total, handed = _with(current, task, source, itemsize)
    if current.tasks and total > window_bytes and total > current.nbytes:
      out.append(current)
      current = Window()
      changes, total, handed = _with(current, task, source, itemsize)
    current.tasks.append(task)
    current.blocks.update(changes)
    current.nbytes = total
    if handed is not None:
      current.handed.add(handed)
  if current.tasks:
    out.append(current)
  return out
