"""Export from many processes (``jax.distributed``): each writes the tensors it owns.

Every process runs the same plan in the same order:

1. **own**: each checkpoint tensor gets an owner, the process with the fewest bytes so far
   (deterministic: every process computes the same table);
2. **lay out**: process 0 stages the directory and creates every file at its final size with
   its header; the others learn the staged directory's name from it (a broadcast);
3. **write**: tensor by tensor, a piece that its owner does not hold in its own shards (read
   from the sharding, so every process decides alike) is gathered with
   ``process_allgather``, a collective every process joins; only the owner writes, with
   ``pwrite`` at the tensor's offset. In flight: one piece at a time;
4. **commit**: every process reports success (a collective, so a failure anywhere stops all
   of them with an error instead of a hang); process 0 writes the index, the config and the
   companion files and publishes the directory; a barrier, then every process returns.

The files equal a single-host export of the same parameters byte for byte. Whatever fails
(a process's own error, or a collective broken off because another process died), process 0
removes what it staged and every live process raises an ``ExportError``: the destination is
left as it was and nothing else.
"""

from __future__ import annotations

import pathlib
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from paramreg_jax._src import errors
from paramreg_jax._src.export import invert as inv
from paramreg_jax._src.export import writer
from paramreg_jax._src.export.plan import ExportPlan
from paramreg_jax._src.export.plan import TensorPlan
from paramreg_jax._src.export.staging import Staging
from paramreg_jax._src.export.tensors import Fetch
from paramreg_jax._src.export.tensors import fetch_region as _fetch
from paramreg_jax._src.export.tensors import index_box
from paramreg_jax._src.export.tensors import overlap
from paramreg_jax._src.export.tensors import write_tensor
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource

_NAME_BYTES = 4096


def owners(tensors: tuple[TensorPlan, ...], processes: int) -> list[int]:
  """The writing process of each tensor: the least loaded so far (ties: the lowest index)."""
  load = [0] * processes
  out = []
  for t in tensors:
    who = min(range(processes), key=lambda p: (load[p], p))
    load[who] += t.nbytes
    out.append(who)
  return out


def export_all(
  final: pathlib.Path,
  exported: ExportPlan,
  leaves: dict[str, Any],
  src: CheckpointSource,
  *,
  overwrite: bool,
  max_shard_bytes: int,
  block: int,
  extras: Any,
) -> ExportPlan:
  """Runs the four phases above; ``extras(staging)`` writes the config and companion files."""
  me, count = jax.process_index(), jax.process_count()
  staging, staged = None, None
  if me == 0:
    try:
      staging = Staging(final, overwrite=overwrite)
    except errors.ExportError as e:
      staged = e
  try:
    _run(final, exported, leaves, src, staging, staged, max_shard_bytes, block, extras, me)
  except BaseException as e:
    if staging is not None:
      staging.abort()  # nothing staged is left, whatever failed, wherever
    if isinstance(e, errors.ParamRegError) or not isinstance(e, Exception):
      raise
    raise errors.ExportError(
      f"{final}: the export failed on process {me} of {count} ({type(e).__name__}: "
      f"{str(e).strip()[:300]}); a collective with the other processes broke off (did one of "
      "them die?); nothing of this export was kept"
      + (", the old copy is untouched" if final.exists() else ""),
      str(final),
    ) from e
  try:
    multihost_utils.sync_global_devices("paramreg_jax export committed")
  except Exception as e:
    raise errors.ExportError(
      f"{final}: process 0 published the export, but process {me} lost the others before "
      f"they all confirmed it ({type(e).__name__}); check {final}",
      str(final),
    ) from e
  return exported


def _run(
  final: pathlib.Path,
  exported: ExportPlan,
  leaves: dict[str, Any],
  src: CheckpointSource,
  staging: Staging | None,
  staged: errors.ExportError | None,
  max_shard_bytes: int,
  block: int,
  extras: Any,
  me: int,
) -> None:
  """The phases after staging; any exception (a peer's death breaks a collective) is left to
  the caller, which removes what was staged."""
  count = jax.process_count()
  dir_ = _shared_dir(staging)  # a collective: every process learns whether process 0 staged
  if dir_ is None:
    raise staged or errors.ExportError(f"{final}: process 0 could not stage the export")
  entries = writer.entries(exported.tensors)
  shards = writer.layout(entries, max_shard_bytes)
  files, failure = _lay_out(dir_, entries, shards, me)
  failure = _write_owned(dir_, exported, files, leaves, src, block, me, count, failure)
  failures = _vote(failure)
  if failures:
    raise errors.ExportError(
      f"{final}: export failed on {len(failures)} process(es): {'; '.join(failures)}; "
      "nothing was written"
    )
  if staging is not None:
    writer.write_index(staging.dir, entries, shards)
    extras(staging)
    staging.commit()


def _shared_dir(staging: Staging | None) -> pathlib.Path | None:
  """The staged directory, as process 0 created it, on every process (None: it could not)."""
  raw = np.zeros(_NAME_BYTES, np.uint8)
  if staging is not None:
    name = str(staging.dir).encode()
    if len(name) > _NAME_BYTES:
      raise errors.ExportError(f"{staging.dir}: the path is longer than {_NAME_BYTES} bytes")
    raw[: len(name)] = np.frombuffer(name, np.uint8)
  raw = np.asarray(multihost_utils.broadcast_one_to_all(raw))
  return pathlib.Path(bytes(raw[raw != 0]).decode()) if raw.any() else None


def _lay_out(
  dir_: pathlib.Path, tensors: list[Any], shards: list[tuple[str, list[int]]], me: int
) -> tuple[dict[str, tuple[str, int]], str | None]:
  """``{tensor key: (file, absolute offset)}`` and this process's failure; process 0 creates
  the files at full size (every process joins the barrier after it, failed or not)."""
  where, failure = {}, None
  for name, positions in shards:
    head, offsets = writer.header([tensors[i] for i in positions], {"format": "pt"})
    size = len(head) + sum(tensors[i][3] for i in positions)
    if me == 0 and failure is None:
      try:
        with open(dir_ / name, "wb") as f:
          f.write(head)
          f.truncate(size)
      except OSError as e:
        failure = f"{dir_ / name}: {e}"
    for i, offset in zip(positions, offsets):
      where[tensors[i][0]] = (name, len(head) + offset)
  multihost_utils.sync_global_devices("paramreg_jax export files created")
  return where, failure


def _write_owned(
  dir_: pathlib.Path,
  exported: ExportPlan,
  files: dict[str, tuple[str, int]],
  leaves: dict[str, Any],
  src: CheckpointSource,
  block: int,
  me: int,
  count: int,
  failure: str | None,
) -> str | None:
  """Every tensor in order: its pieces gathered where the owner lacks them (all processes),
  written by its owner. Returns this process's failure, if any (the collectives still run)."""
  handles: dict[str, Any] = {}
  try:
    for t, owner in zip(exported.tensors, owners(exported.tensors, count)):
      fetch = _Gathered(leaves, owner, me, block)
      for p in t.pieces:  # every process: the same collectives in the same order
        lead, _ = inv.leading_region(p.placement.ops, tuple(leaves[p.param].shape))
        try:
          fetch.prepare(p.param, lead)
        except Exception as e:  # a local failure; the others' collectives still match
          failure = failure or f"{t.key}: {type(e).__name__}: {e}"
      if owner != me or failure is not None:
        continue
      try:
        name, start = files[t.key]
        if name not in handles:
          handles[name] = open(dir_ / name, "r+b")
        write_tensor(handles[name].fileno(), start, t, fetch, src, block)
      except Exception as e:
        failure = f"{t.key}: {type(e).__name__}: {e}"
  finally:
    for f in handles.values():
      f.close()
  return failure


class _Gathered(Fetch):
  """Regions of the parameters for one tensor's owner: from its own shards where they cover
  the region, else gathered from every process in blocks (``process_allgather`` puts a copy of
  what it gathers on every local device: here one copy per process, a block is the budget over
  the copies in flight)."""

  def __init__(self, leaves: dict[str, Any], owner: int, me: int, budget: int):
    super().__init__(leaves)
    self.owner, self.me = owner, me
    self.block = max(1, budget // (jax.process_count() + 2))
    self.got: dict[tuple[str, str], np.ndarray] = {}

  def prepare(self, param: str, index: tuple[Any, ...]) -> None:
    leaf = self.leaves[param]
    if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable:
      return  # every process has all of it
    if _held_by(leaf, index, self.owner):
      return
    value = _gather(leaf, index, self.block, keep=self.me == self.owner)
    if value is not None:
      self.got[(param, repr(index))] = value

  def __call__(self, param: str, index: tuple[Any, ...]) -> np.ndarray:
    found = self.got.pop((param, repr(index)), None)
    return found if found is not None else super().__call__(param, index)


def _gather(leaf: jax.Array, index: tuple[Any, ...], block: int, keep: bool) -> Any:
  """``leaf[index]`` assembled on the owner (``keep``), in blocks of at most ``block`` bytes
  along the region's first axis of more than one element: each process contributes what its
  own shards hold of a block, the others' parts arrive through one exchange per block."""
  box = index_box(index, tuple(leaf.shape))
  sizes = [hi - lo for lo, hi in box]
  out = np.empty(sizes, leaf.dtype) if keep else None
  axis = next((a for a, n in enumerate(sizes) if n > 1), 0)
  row_bytes = int(np.prod(sizes[axis + 1 :], dtype=np.int64)) * leaf.dtype.itemsize
  step = max(1, block // max(row_bytes, 1))
  held = _holdings(leaf)
  for a in range(box[axis][0], box[axis][1], step):
    part = list(box)
    part[axis] = (a, min(a + step, box[axis][1]))
    mine = _fetch(leaf, tuple(slice(lo, hi) for lo, hi in part))  # this process's shards
    every = _exchange(mine)  # [processes, *block]
    if out is not None:
      for process, regions in held.items():
        for region in regions:  # what this process's devices hold of the block
          found = overlap(box, part, region)
          if found is not None:
            out[found[1]] = every[process][found[0]]
    del mine, every
  if out is None:
    return None
  return out.reshape([n for n, i in zip(sizes, index) if not isinstance(i, int)])


def _holdings(leaf: jax.Array) -> dict[int, list[list[tuple[int, int]]]]:
  """``{process: [region of each of its devices]}`` of a sharded array."""
  out: dict[int, list[list[tuple[int, int]]]] = {}
  mapping: Any = leaf.sharding.devices_indices_map(tuple(leaf.shape))
  for device, where in mapping.items():
    region = index_box(where, tuple(leaf.shape))
    out.setdefault(device.process_index, []).append(region)
  return out


def _exchange(mine: np.ndarray) -> np.ndarray:
  """Every process's ``mine`` (same shape), stacked: one device per process, so the gathered
  block lands once on each host (``process_allgather`` would copy it to every local device)."""
  devices = [jax.local_devices(process_index=p)[0] for p in range(jax.process_count())]
  mesh = jax.sharding.Mesh(np.array(devices), ("p",))
  spread = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("p"))
  local = jax.device_put(mine[None], devices[jax.process_index()])
  stacked = jax.make_array_from_single_device_arrays((len(devices), *mine.shape), spread, [local])
  everywhere = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return np.asarray(_identity(stacked, everywhere).addressable_data(0))


def _identity(x: jax.Array, sharding: Any) -> jax.Array:
  return jax.jit(lambda y: y, out_shardings=sharding)(x)


def _held_by(leaf: jax.Array, index: tuple[Any, ...], process: int) -> bool:
  """Whether one device of ``process`` holds the whole region ``index`` of ``leaf``."""
  box = index_box(index, tuple(leaf.shape))
  mapping: Any = leaf.sharding.devices_indices_map(tuple(leaf.shape))
  for device, where in mapping.items():
    if device.process_index != process:
      continue
    have = index_box(where, tuple(leaf.shape))
    if all(h[0] <= b[0] and b[1] <= h[1] for h, b in zip(have, box)):
      return True
  return False


def _vote(failure: str | None) -> list[str]:
  """Every process's failure (a collective: each process learns all of them)."""
  raw = np.zeros(1024, np.uint8)
  if failure:
    text = failure.encode()[:1023]
    raw[: len(text)] = np.frombuffer(text, np.uint8)
  every = np.asarray(multihost_utils.process_allgather(raw)).reshape(-1, 1024)
  return [
    f"process {i}: {bytes(row[row != 0]).decode(errors='replace')}"
    for i, row in enumerate(every)
    if row.any()
  ]
