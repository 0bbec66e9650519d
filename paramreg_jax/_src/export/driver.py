"""``export``: parameters back into the layout of the checkpoint they were restored from.

Data flows one way, as in a restore: **plan** (:func:`plan_export`, metadata only: every recipe
inverted, every tensor's coverage checked, all problems at once) -> **write** (one checkpoint
tensor at a time, each parameter fetched from its shards only for the part a tensor needs,
written in blocks of ``max_inflight_bytes``) -> **commit** (the staged directory renamed into
place). Host memory stays within the largest tensor plus the block budget, except for a tensor
assembled from parts along an inner axis, which is built whole before it is written.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from paramreg_jax._src import api_types
from paramreg_jax._src import errors
from paramreg_jax._src import progress
from paramreg_jax._src.export import writer
from paramreg_jax._src.export.plan import ExportPlan
from paramreg_jax._src.export.plan import companion_names
from paramreg_jax._src.export.plan import plan_export
from paramreg_jax._src.export.staging import Staging
from paramreg_jax._src.export.staging import check_destination
from paramreg_jax._src.export.staging import existing_files
from paramreg_jax._src.export.staging import published
from paramreg_jax._src.export.tensors import Fetch
from paramreg_jax._src.export.tensors import fetch_region
from paramreg_jax._src.export.tensors import same_bits
from paramreg_jax._src.export.tensors import write_tensor
from paramreg_jax._src.restore import planning
from paramreg_jax._src.restore import restore_plan as plan_lib
from paramreg_jax._src.restore import target as target_lib
from paramreg_jax._src.sources import checkpoint_source as source_lib

DEFAULT_MAX_SHARD_BYTES = 5_000_000_000  # transformers' default max_shard_size, "5GB"
_DEFAULT_BLOCK = 16 * 2**20


def export(
  params: api_types.PyTree,
  mapping: plan_lib.RestorePlan | api_types.Recipes | None,
  path: str | os.PathLike[str],
  *,
  source: source_lib.CheckpointSource | None = None,
  rename: api_types.RenameRules | None = None,
  aliases: Mapping[str, str] | None = None,
  exclude: api_types.Exclude | None = None,
  copy_unmapped: bool = True,
  max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
  max_inflight_bytes: int | None = None,
  overwrite: bool = False,
  progress: bool = False,
) -> ExportPlan:
  """Writes ``params`` back in the layout of the checkpoint ``mapping`` reads from.

  The inverse of :func:`~paramreg_jax.restore`: every recipe runs backwards (transposes and
  reshapes undone, stacked layers unstacked, the parts of a fused tensor joined, casts back to
  the stored dtype, a tied weight written once), checkpoint tensors no parameter reads are
  copied from the source, and the result is a directory that transformers, vLLM or a
  ``SafetensorsSource`` loads: ``model.safetensors`` (or size-bounded shards and
  ``model.safetensors.index.json``) with ``__metadata__ = {"format": "pt"}``, the source's
  ``config.json`` when it has one, and its companion files as they are (``generation_config.json``,
  tokenizer and special-token files, chat templates: ``plan.companions``).

  Args:
    params: the parameters (a restored tree of sharded ``jax.Array`` objects, numpy arrays, an
      ``nnx.State`` or ``nnx.Module``, ...), with the names and shapes of the restore target.
    mapping: what the parameters were restored with: the :class:`~paramreg_jax.RestorePlan`,
      or the ``recipes`` (a :class:`~paramreg_jax.Match`, a ``RecipeSet``, a mapping) given
      with the same ``rename``/``aliases``/``exclude`` (``None``: names only).
    path: the directory to create.
    source: the checkpoint the mapping reads (for a ``Match``, its own source by default).
    rename, aliases, exclude: as given to the restore, when ``mapping`` is not a plan.
    copy_unmapped: copy tensors no parameter reads from the source (``False``: leave them out).
    max_shard_bytes: the largest shard file (a larger tensor gets a shard of its own).
    max_inflight_bytes: bytes written per block (default 16 MiB).
    overwrite: replace ``path`` if it exists: the new directory is swapped in in one atomic
      step when it is complete, and everything under the old one is removed (listed in the
      returned plan's ``replaced``). Without it, a directory that exists, or appears while the
      export is written, is never touched.
    progress: show a progress bar.

  Returns:
    The :class:`ExportPlan` that was written.

  Raises:
    ExportPlanError: a recipe cannot be run backwards, or a tensor is covered only in part
      (every problem at once; nothing was written).
    ExportError: a bad argument or destination (a path under a file, a read-only place, a
      size that is not a positive int), parameters that do not fit the plan (deleted arrays,
      tied parameters whose values diverged), two parameters that disagree about one tensor, or
      a failed write; nothing exists under ``path`` and an old directory there is untouched.

  Examples:
    >>> import jax, numpy as np, tempfile
    >>> import paramreg_jax as prj
    >>> from paramreg_jax import recipes as R
    >>> src = prj.MemorySource({"fc.weight": np.arange(6, dtype=np.float32).reshape(3, 2)})
    >>> target = {"fc": {"kernel": jax.ShapeDtypeStruct((2, 3), np.float32)}}
    >>> recipes = {"fc/kernel": R.transpose(R.source("fc.weight"), (1, 0))}
    >>> params = prj.restore(target, src, recipes=recipes)
    >>> out = tempfile.mkdtemp() + "/exported"
    >>> _ = prj.export(jax.tree.map(lambda w: w + 1, params), recipes, out, source=src)
    >>> prj.SafetensorsSource(out).lease("fc.weight").read().tolist()
    [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
  """
  final = pathlib.Path(os.fspath(path))
  block = _check_args(max_shard_bytes, max_inflight_bytes)
  plan = _restore_plan(params, mapping, source, rename, aliases, exclude)
  exported = plan_export(plan, copy_unmapped=copy_unmapped)
  leaves = _check_params(params, plan)
  if jax.process_count() > 1:  # every process writes the tensors it owns
    from paramreg_jax._src.export import multihost

    check_destination(final, overwrite)
    exported = dataclasses.replace(
      exported, companions=companion_names(plan.source), replaced=existing_files(final)
    )
    extras = functools.partial(_write_extras, src=plan.source, companions=exported.companions)
    return multihost.export_all(
      final,
      exported,
      leaves,
      plan.source,
      overwrite=overwrite,
      max_shard_bytes=max_shard_bytes,
      block=block,
      extras=extras,
    )
  staging = Staging(final, overwrite=overwrite)
  exported = dataclasses.replace(
    exported, companions=companion_names(plan.source), replaced=existing_files(final)
  )
  bar = _progress(progress, exported.nbytes)
  try:
    with published(staging, "export"):
      _write_shards(staging, exported, leaves, plan.source, max_shard_bytes, block, bar)
      _write_extras(staging, src=plan.source, companions=exported.companions)
  finally:
    if bar is not None:
      bar.close()
  return exported


def _check_args(max_shard_bytes: Any, max_inflight_bytes: Any) -> int:
  """The block size; a bad size is an ``ExportError`` naming the argument."""
  for name, value in (
    ("max_shard_bytes", max_shard_bytes),
    ("max_inflight_bytes", max_inflight_bytes),
  ):
    if value is None and name == "max_inflight_bytes":
      continue
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise errors.ExportError(
        f"export: {name} must be a positive number of bytes (an int), got {value!r}"
      )
  return _DEFAULT_BLOCK if max_inflight_bytes is None else int(max_inflight_bytes)


def _write_shards(
  staging: Staging,
  exported: ExportPlan,
  leaves: dict[str, Any],
  src: source_lib.CheckpointSource,
  max_shard_bytes: int,
  block: int,
  bar: Any,
) -> None:
  """Every safetensors file (and the index when there are several), one tensor at a time."""
  tensors = writer.entries(exported.tensors)
  shards = writer.layout(tensors, max_shard_bytes)
  for name, positions in shards:
    head, offsets = writer.header([tensors[i] for i in positions], {"format": "pt"})
    with open(staging.path(name), "wb") as f:
      f.write(head)
      for i, offset in zip(positions, offsets):
        t = exported.tensors[i]
        write_tensor(f.fileno(), len(head) + offset, t, Fetch(leaves), src, block)
        if bar is not None:
          bar.update(t.nbytes)
  writer.write_index(staging.dir, tensors, shards)


def _write_extras(
  staging: Staging, *, src: source_lib.CheckpointSource, companions: tuple[str, ...]
) -> None:
  """The source's ``config.json`` and its companion files (tokenizer, generation config)."""
  config = src.config
  if isinstance(config, Mapping):
    text = json.dumps(dict(config), indent=2, sort_keys=True) + "\n"
    staging.path("config.json").write_text(text)
  for name in companions:
    staging.path(name).write_bytes(src.companion(name))


def _restore_plan(
  params: Any,
  mapping: Any,
  source: source_lib.CheckpointSource | None,
  rename: Any,
  aliases: Any,
  exclude: Any,
) -> plan_lib.RestorePlan:
  if isinstance(mapping, plan_lib.RestorePlan):
    given = [
      n
      for n, v in (
        ("source", source),
        ("rename", rename),
        ("aliases", aliases),
        ("exclude", exclude),
      )
      if v is not None
    ]
    if given:
      raise errors.ExportError(
        f"export: a RestorePlan already holds its source and names; drop {', '.join(given)}"
      )
    return mapping
  if source is None:
    source = getattr(mapping, "source", None)  # a Match remembers its checkpoint
  if source is None:
    raise errors.ExportError(
      "export: pass source= (the checkpoint the mapping reads), or the RestorePlan the "
      "parameters were restored with"
    )
  abstract = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if target_lib.is_slot(x) else x,
    target_lib.as_state(params),
  )
  return planning.plan_restore(
    abstract, source, recipes=mapping, rename=rename, aliases=aliases, exclude=exclude
  )


def _check_params(params: Any, plan: plan_lib.RestorePlan) -> dict[str, Any]:
  """``{key: leaf}`` for every planned parameter; all mismatches raised at once."""
  leaves, _, slots = target_lib.slots(params)
  by_key = {s.key: (s, leaves[s.position]) for s in slots}
  problems = []
  out = {}
  for entry in plan.entries:
    if entry.kind == "alias":
      continue
    found = by_key.get(entry.key)
    if found is not None and _deleted(found[1]):
      problems.append(
        f"{entry.key}: its array was deleted (donated to a jitted step?); export the "
        "parameters the step returned"
      )
      continue
    if found is None:
      problems.append(f"{entry.key}: the mapping writes it, but params has no such parameter")
      continue
    slot, leaf = found
    if slot.shape != tuple(entry.shape) or slot.dtype != np.dtype(entry.dtype):
      problems.append(
        f"{entry.key}: params has {slot.shape} {slot.dtype}, the mapping was planned for "
        f"{tuple(entry.shape)} {np.dtype(entry.dtype)}"
      )
      continue
    out[entry.key] = leaf
  problems += _diverged_aliases(plan, by_key, out)
  if problems:
    raise errors.ExportError(
      errors.collected("export these parameters", problems, "nothing was written")
    )
  return out


def _whole(leaf: Any) -> np.ndarray:
  """All of a parameter on this host (gathered from every process when it is spread over
  them: a collective, which every process reaches in the same order)."""
  if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
  return np.asarray(fetch_region(leaf, ()))


def _deleted(leaf: Any) -> bool:
  return isinstance(leaf, jax.Array) and leaf.is_deleted()


def _diverged_aliases(
  plan: plan_lib.RestorePlan, by_key: dict[str, Any], leaves: dict[str, Any]
) -> list[str]:
  """Tied parameters (an alias and its owner) write one tensor: they must still be equal. After
  training they are two leaves to ``jax.grad`` and optax, and may have diverged."""
  problems = []
  for entry in plan.entries:
    found = by_key.get(entry.key)
    if entry.kind != "alias" or found is None or entry.owner not in leaves:
      continue
    alias, owner = found[1], leaves[entry.owner]
    if _deleted(alias):
      continue  # the owner is written; a deleted alias has no value of its own to lose
    a, b = _whole(alias), _whole(owner)
    if a.shape == b.shape and a.dtype == b.dtype and same_bits(a, b).all():
      continue
    gap = (
      float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
      if a.shape == b.shape
      else None
    )
    problems.append(
      f"{entry.key} and {entry.owner} were restored tied (aliases: {entry.key} -> {entry.owner}) "
      f"and are one tensor in the checkpoint, but their values now differ"
      + (f" (max |difference| {gap:.3g})" if gap is not None else "")
      + f"; export would drop {entry.key}'s update. Tie them in the model (one parameter used "
      f"in both places), or export only the one to keep: exclude=[{entry.key.removeprefix('n:')!r}] "
      "writes the owner's value"
    )
  return problems


def _progress(enabled: bool, total: int) -> Any:
  if not enabled:
    return None
  return progress.bar(total=total, unit="B", unit_scale=True, desc="export")
