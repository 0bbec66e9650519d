"""``materialize``: every planned weight read and built; nothing kept on a failure.

``materialize`` reads and builds every planned weight through the backend (aliases share their
owner's array) and never touches the target; any failure drops everything built so far.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from typing import Any

import jax

from paramreg_jax._src import errors
from paramreg_jax._src import progress
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.restore import contract
from paramreg_jax._src.restore import restore_plan as plan_lib
from paramreg_jax._src.restore import target as target_lib
from paramreg_jax._src.restore.jax_backend import backend as backend_lib
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource


class MaterializedUnit(Mapping[str, jax.Array]):
  """An immutable mapping ``canonical key -> jax.Array`` ready to bind.

  Returned by :func:`~paramreg_jax.materialize`; :func:`~paramreg_jax.bind` takes it.

  Args:
    weights: ``{canonical key: array}`` (or pairs).

  Examples:
    >>> import jax.numpy as jnp
    >>> from paramreg_jax import MaterializedUnit
    >>> unit = MaterializedUnit({"n:w": jnp.ones(2)})
    >>> list(unit), len(unit)
    (['n:w'], 1)
  """

  def __init__(self, weights: Mapping[str, jax.Array] | Iterable[tuple[str, jax.Array]]):
    items = list(weights.items()) if isinstance(weights, Mapping) else list(weights)
    data: dict[str, jax.Array] = {}
    for key, value in items:
      if key in data:
        raise errors.BindError(
          f"{key}: two weights for one parameter (duplicate binding)", (f"{key}: duplicate",)
        )
      data[key] = value
    self._data = dict(sorted(data.items()))

  def __getitem__(self, key: str) -> jax.Array:
    return self._data[key]

  def __iter__(self) -> Iterator[str]:
    return iter(self._data)

  def __len__(self) -> int:
    return len(self._data)

  def __repr__(self) -> str:
    return f"MaterializedUnit({len(self._data)} weights: {', '.join(list(self._data)[:4])}{', ...' if len(self._data) > 4 else ''})"


@contextlib.contextmanager
def _progress_bar(
  enabled: bool, total: int, count: int, source: CheckpointSource
) -> Iterator[Callable[[int], None] | None]:
  """A bar of the bytes the weights need; for a source at a URL, also the bytes fetched over
  the network (whole rows or chunks around what the shards need, and headers)."""
  if not enabled:
    yield None
    return
  bar = progress.bar(
    total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=f"restoring {count} tensors"
  )
  if not source.remote:
    update: Callable[[int], None] = bar.update
  else:
    start = source.stats.bytes_read

    def update(n: int) -> None:
      fetched = bar.format_sizeof(source.stats.bytes_read - start, "B", 1024)
      bar.set_postfix_str(f"{fetched} over the network", refresh=False)
      bar.update(n)

  try:
    yield update
  finally:
    bar.close()


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
  """Python's cycle collector paused while weights are built: every task, program and array
  the restore allocates would otherwise trigger generation scans of the whole heap (a large
  share of the time of restoring many small tensors). Reference counting still frees everything; the
  collector resumes, as it was, when the restore ends (also on an error)."""
  enabled = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    if enabled:
      gc.enable()


def _recipe_of(entry: plan_lib.PlanEntry) -> ops.Recipe:
  """A plan entry's recipe; a direct entry is ``source(key)``."""
  if entry.kind == "direct" or entry.recipe is None:
    return ops.Source(str(entry.source_key))
  return entry.recipe


def materialize(
  plan: plan_lib.RestorePlan,
  *,
  backend: contract.ParameterBackend | None = None,
  max_inflight_bytes: int | None = None,
  progress: bool = False,
) -> MaterializedUnit:
  """Reads and builds every weight of ``plan`` as sharded ``jax.Array`` objects.

  Args:
    plan: from :func:`plan_restore`.
    backend: a :class:`ParameterBackend` (default :class:`JaxBackend`).
    max_inflight_bytes: source bytes the host may hold at once besides the restored arrays.
      Peak host memory during the call stays within the restored arrays plus
      ``max(max_inflight_bytes, the blocks one shard needs)``. Default
      (``None``): 1/64 of the memory available, between 4 and 16 MiB (64 MiB for a
      source at a URL).
    progress: show a tqdm bar (bytes, rate) that works in notebooks and terminals.

  Returns:
    A :class:`MaterializedUnit` with one array per planned key; an alias holds its owner's
    array (one physical read).

  Raises:
    MaterializationError: a read or build failed; names the key. Nothing built is kept.

  Examples:
    >>> import jax, numpy as np
    >>> from paramreg_jax import materialize, plan_restore
    >>> from paramreg_jax import MemorySource
    >>> src = MemorySource({"w": np.ones((2, 2), np.float32)})
    >>> target = {"w": jax.ShapeDtypeStruct((2, 2), np.float32), "tied": jax.ShapeDtypeStruct((2, 2), np.float32)}
    >>> unit = materialize(plan_restore(target, src, aliases={"tied": "w"}))
    >>> unit["n:tied"] is unit["n:w"], src.stats.reads
    (True, 1)
  """
  if not isinstance(plan, plan_lib.RestorePlan):
    raise TypeError(f"materialize takes a RestorePlan from plan_restore, got {type(plan).__name__}")
  if max_inflight_bytes is not None and (
    not isinstance(max_inflight_bytes, int)
    or isinstance(max_inflight_bytes, bool)
    or max_inflight_bytes <= 0
  ):
    raise ValueError(f"max_inflight_bytes must be a positive int, got {max_inflight_bytes!r}")
  backend = backend_lib.default() if backend is None else backend
  owners = [e for e in plan.entries if e.kind != "alias"]
  weights: dict[str, Any] = {}
  key = owners[0].key if owners else None
  with _progress_bar(progress, plan.nbytes, len(owners), plan.source) as on_bytes, no_cyclic_gc():
    base = contract.MaterializationContext(
      "", (), jax.numpy.float32, target_lib.default_sharding(), max_inflight_bytes, on_bytes
    )
    try:
      requests = [
        (_recipe_of(e), base.for_slot(e.key, e.shape, e.dtype, e.sharding)) for e in owners
      ]
      built = backend.materialize_all(plan.source, requests)
      weights.update(zip((e.key for e in owners), _finish(backend, owners, built)))
      for entry in plan.entries:
        if entry.kind == "alias":
          key = entry.key
          weights[entry.key] = backend.share_materialized_weight(weights[str(entry.owner)])
      _confirm_unchanged(plan.source)
    except (KeyboardInterrupt, Exception) as e:
      weights.clear()
      if isinstance(e, KeyboardInterrupt):
        errors.note_interrupted(e, key)
        raise
      error = _nothing_kept(e, key)
      if error is e:
        raise
      raise error from e
  return MaterializedUnit(weights)


def _finish(
  backend: contract.ParameterBackend,
  owners: list[plan_lib.PlanEntry],
  built: list[contract.Materialization],
) -> list[jax.Array]:
  """One wait for the whole unit; when it fails, a wait per weight names the one that fails."""
  try:
    return backend.finish_all(built)
  except Exception:
    pass
  out = []
  for entry, m in zip(owners, built):
    try:
      out.extend(backend.finish_all([m]))
    except errors.MaterializationError:
      raise
    except Exception as e:
      raise errors.MaterializationError(f"{entry.key}: {type(e).__name__}: {e}", entry.key) from e
  return out


def _confirm_unchanged(source: CheckpointSource) -> None:
  """Every read is done: a source whose storage changed meanwhile fails the whole unit."""
  try:
    source.confirm_unchanged()
  except errors.SourceIOError as e:
    raise errors.MaterializationError(str(e), e.key, nothing_kept=True) from e


def _nothing_kept(e: Exception, key: str | None) -> errors.MaterializationError:
  """The error ``materialize`` raises for ``e``: a ``MaterializationError`` that names the
  weight and says the target is untouched."""
  if isinstance(e, errors.MaterializationError):
    return e if e.nothing_kept else errors.MaterializationError(str(e), e.key, nothing_kept=True)
  what = str(e) if isinstance(e, errors.ParamRegError) else f"{type(e).__name__}: {e}"
  return errors.MaterializationError(f"{key}: {what}", key, nothing_kept=True)
