"""``ParameterBackend`` (the seed's trait as a Protocol) and ``JaxBackend``.

``JaxBackend`` builds each weight directly as a sharded ``jax.Array``: for every distinct region
that this process's devices hold (``sharding.addressable_devices_indices_map``), it reads exactly
that region from the source (or evaluates the recipe on it), puts it on the devices that hold it,
and assembles the global array with ``jax.make_array_from_single_device_arrays``. A replicated
region is read once. Under ``jax.distributed`` each process only ever sees its own devices, so it
only reads its own bytes. Host memory is bounded: before a region is read, older transfers are
awaited until the in-flight bytes fit the budget.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable
from typing import Any
from typing import Protocol
from typing import runtime_checkable

import jax
import numpy as np

from paramreg_jax._src import devices as devices_lib
from paramreg_jax._src import errors
from paramreg_jax._src import selection as sel_lib
from paramreg_jax._src import source as source_lib
from paramreg_jax._src import target as target_lib
from paramreg_jax._src.recipes import device as device_lib
from paramreg_jax._src.recipes import evaluate as evaluate_lib
from paramreg_jax._src.recipes import ops


@dataclasses.dataclass
class MaterializationContext:
  """Where one weight goes and the shared host-memory budget of the unit being built.

  Attributes:
    key: the target key (for messages).
    shape, dtype, sharding: what the weight must be.
    max_inflight_bytes: host bytes that may wait for device transfers at once.
    on_bytes: called with the byte count of every region read (progress bars).
  """

  key: str
  shape: tuple[int, ...]
  dtype: np.dtype
  sharding: jax.sharding.Sharding
  max_inflight_bytes: int = 1 << 30
  on_bytes: Callable[[int], None] | None = None
  source_key: str | None = None
  _pending: collections.deque[tuple[int, list[jax.Array]]] = dataclasses.field(
    default_factory=collections.deque
  )
  _inflight: list[int] = dataclasses.field(default_factory=lambda: [0])

  def for_slot(
    self, key: str, shape: tuple[int, ...], dtype: Any, sharding: Any
  ) -> MaterializationContext:
    """A context for another weight sharing this one's budget and progress."""
    return dataclasses.replace(
      self, key=key, shape=tuple(shape), dtype=np.dtype(dtype), sharding=sharding
    )

  def reserve(self, nbytes: int) -> None:
    """Waits for the oldest transfers until ``nbytes`` more fit in the budget."""
    while self._pending and self._inflight[0] + nbytes > self.max_inflight_bytes:
      done, arrays = self._pending.popleft()
      jax.block_until_ready(arrays)
      self._inflight[0] -= done
    self._inflight[0] += nbytes

  def track(self, nbytes: int, arrays: list[jax.Array]) -> None:
    self._pending.append((nbytes, arrays))
    if self.on_bytes is not None:
      self.on_bytes(nbytes)

  def drain(self) -> None:
    while self._pending:
      done, arrays = self._pending.popleft()
      jax.block_until_ready(arrays)
      self._inflight[0] -= done


def _read_lease(lease: Any, region: sel_lib.Region) -> np.ndarray:
  return lease.read(sel_lib.region_slices(region))


@dataclasses.dataclass(frozen=True)
class Materialization:
  """A weight whose device transfers may still be in flight (finish it to wait)."""

  key: str
  weight: jax.Array


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
  """The JAX implementation: weights are sharded ``jax.Array``s built from region reads.

  A parameter slot is a target leaf (``jax.Array`` or ``jax.ShapeDtypeStruct`` with a
  ``.sharding``). ``bind`` is functional: it returns the value to put in the new tree.

  Examples:
    >>> import jax, numpy as np
    >>> from paramreg_jax import JaxBackend
    >>> from paramreg_jax._src.backend import MaterializationContext
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

  def preflight_recipe(self, recipe: ops.Recipe, source: Any) -> None:
    """Metadata-only: the recipe infers, and JAX can hold its dtype as it is."""
    meta = ops.infer(recipe, source)
    canonical = jax.dtypes.canonicalize_dtype(meta.dtype)
    if canonical != meta.dtype:
      raise errors.UnsupportedDtypeError(
        f"{recipe}: produces {meta.dtype.name}, which JAX stores as {np.dtype(canonical).name} "
        "unless jax_enable_x64 is set; cast it explicitly or enable x64"
      )

  def _build_many(
    self,
    items: list[tuple[MaterializationContext, Callable[[sel_lib.Region], np.ndarray]]],
    read_many: Callable[[list[tuple[int, sel_lib.Region]]], list[np.ndarray]] | None = None,
  ) -> list[Materialization]:
    """Builds several weights, batching their region reads up to the shared budget."""
    tasks: list[tuple[int, sel_lib.Region, list[Any], int]] = []
    for i, (context, _) in enumerate(items):
      shape, dtype = tuple(context.shape), np.dtype(context.dtype)
      by_region: dict[sel_lib.Region, list[Any]] = {}
      for device, index in context.sharding.addressable_devices_indices_map(shape).items():
        region = sel_lib.normalize_index(index, shape, where=context.key)
        by_region.setdefault(region, []).append(device)
      for region in sorted(by_region):
        nbytes = source_lib.nbytes_of(sel_lib.region_shape(region), dtype)
        tasks.append((i, region, by_region[region], nbytes))
    shards: list[list[jax.Array]] = [[] for _ in items]
    batch: list[tuple[int, sel_lib.Region, list[Any], int]] = []
    budget = items[0][0].max_inflight_bytes if items else 0

    def flush() -> None:
      if not batch:
        return
      culprit = items[batch[0][0]][0].key

      def owner_of(source_key: str | None) -> str:  # the target key that read ``source_key``
        hits = (items[i][0].key for i, _, _, _ in batch if items[i][0].source_key == source_key)
        return next(hits, culprit)

      try:
        if read_many is not None:
          values = read_many([(i, r) for i, r, _, _ in batch])
        else:
          values = []
          for i, r, _, _ in batch:
            culprit = items[i][0].key
            values.append(items[i][1](r))
      except errors.SourceIOError as e:
        culprit = owner_of(e.key) if read_many is not None else culprit
        raise errors.MaterializationError(f"{culprit}: {e}", culprit) from e
      except KeyboardInterrupt as e:
        if read_many is not None:
          culprit = owner_of(getattr(e, "paramreg_source_key", None))
        if hasattr(e, "add_note"):
          e.add_note(f"paramreg_jax: interrupted while materializing {culprit}; nothing was kept")
        raise
      hosts, targets, owners = [], [], []
      for (i, region, devices, _), host in zip(batch, values):
        context = items[i][0]
        want, dtype = sel_lib.region_shape(region), np.dtype(context.dtype)
        if host.shape != want or host.dtype != dtype:
          raise errors.MaterializationError(
            f"{context.key}: region {sel_lib.region_slices(region)} came back as {host.shape} "
            f"{host.dtype}, expected {want} {dtype.name} (corrupt data?)",
            context.key,
          )
        for k, d in enumerate(devices):
          hosts.append(host)
          targets.append(d)
          owners.append((i, host.nbytes if k == 0 else 0))  # a replicated region counts once
      put = jax.device_put(hosts, targets)  # one batched transfer call for the whole batch
      for (i, nbytes), array in zip(owners, put):
        shards[i].append(array)
        items[i][0].track(nbytes, [array])
      batch.clear()

    batch_bytes = 0
    for task in tasks:
      if batch and batch_bytes + task[3] > budget:
        flush()
        batch_bytes = 0
      items[task[0]][0].reserve(task[3])
      batch.append(task)
      batch_bytes += task[3]
    flush()
    return [
      Materialization(
        context.key,
        jax.make_array_from_single_device_arrays(tuple(context.shape), context.sharding, shards[i]),
      )
      for i, (context, _) in enumerate(items)
    ]

  def materialize(self, lease: Any, context: MaterializationContext) -> Materialization:
    """Builds the weight from one lease (reading each local region once)."""
    return self.materialize_many([(lease, context)])[0]

  def materialize_many(
    self, requests: list[tuple[Any, MaterializationContext]]
  ) -> list[Materialization]:
    """Several leases at once: their region reads are batched (orbax overlaps them)."""
    items: list[tuple[MaterializationContext, Callable[[sel_lib.Region], np.ndarray]]] = []
    for lease, context in requests:
      context.source_key = lease.key
      items.append((context, functools.partial(_read_lease, lease)))
    sources = {id(lease.source) for lease, _ in requests}
    full = all(isinstance(lease.selection, sel_lib.Full) for lease, _ in requests)
    if len(sources) == 1 and full and requests and hasattr(requests[0][0].source, "read_many"):
      src = requests[0][0].source

      def read_many(reqs: list[tuple[int, sel_lib.Region]]) -> list[np.ndarray]:
        return src.read_many([(requests[i][0].key, r) for i, r in reqs])

      return self._build_many(items, read_many)
    return self._build_many(items)

  def materialize_recipe(
    self, recipe: ops.Recipe, source: Any, context: MaterializationContext
  ) -> Materialization:
    """Builds the weight from ``recipe``.

    Selection pushdown (each local region evaluated on host, reading only what it needs) for
    recipes that select, join, cast or apply unary ops. Recipes that transpose, reshape or view
    would read strided bytes per shard: their sources are read on the source layout (leading-
    axis row blocks over the target's mesh) and transformed on device by a jitted function
    whose output sharding is the target's.
    """
    if not device_lib.wants_device_transform(recipe):
      read = lambda r: evaluate_lib.evaluate(recipe, source, sel_lib.region_slices(r))  # noqa: E731
      return self._build_many([(context, read)])[0]
    leaves = device_lib.leaves(recipe)
    requests = []
    for leaf in leaves:
      lease = source.lease(leaf.key, leaf.selection)
      sharding = device_lib.row_sharding(context.sharding, lease.shape)
      sub = context.for_slot(f"{context.key} <- {leaf}", lease.shape, lease.dtype, sharding)
      requests.append((lease, sub))
    inputs = [m.weight for m in self.materialize_many(requests)]
    # settle: never two of our (possibly collective) device programs in flight on XLA:CPU
    weight = devices_lib.settle(device_lib.compiled(recipe, leaves, context.sharding)(*inputs))
    if weight.dtype != np.dtype(context.dtype) or tuple(weight.shape) != tuple(context.shape):
      raise errors.MaterializationError(
        f"{context.key}: {recipe} produced {weight.shape} {weight.dtype}, expected "
        f"{tuple(context.shape)} {np.dtype(context.dtype).name}",
        context.key,
      )
    return Materialization(context.key, weight)

  def materialized_weight(self, materialization: Materialization) -> jax.Array:
    return materialization.weight

  def finish_materialization(self, materialization: Materialization) -> jax.Array:
    """Waits for exactly this weight's transfers."""
    return jax.block_until_ready(materialization.weight)

  def share_materialized_weight(self, weight: jax.Array) -> jax.Array:
    """The same array: JAX arrays are immutable, so a tied weight is one array at two paths."""
    return weight

  def problems(self, parameter: Any, weight: Any) -> list[str]:
    """Every reason ``weight`` cannot replace ``parameter`` (empty when it can)."""
    out = []
    shape, dtype = tuple(parameter.shape), np.dtype(parameter.dtype)
    if tuple(weight.shape) != shape:
      out.append(f"shape {tuple(weight.shape)}, the target expects {shape}")
    if np.dtype(weight.dtype) != dtype:
      out.append(f"dtype {np.dtype(weight.dtype).name}, the target expects {dtype.name}")
    want = getattr(parameter, "sharding", None)
    if not isinstance(want, jax.sharding.Sharding):
      want = target_lib.default_sharding()
    have = getattr(weight, "sharding", None)
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
