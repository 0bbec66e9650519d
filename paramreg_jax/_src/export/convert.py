"""``convert``: pay a foreign checkpoint's transposes and splits once.

A team that restores the same Hugging Face checkpoint every day runs the recipes (or ``match``)
once, through the usual budgeted restore, and saves the result as an orbax checkpoint in the
target's own names, layout and sharding; later starts are a plain orbax restore with no
recipes. The way back, orbax -> Hugging Face layout, is :func:`~paramreg_jax.export`.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import Any

from paramreg_jax._src import api_types
from paramreg_jax._src import errors
from paramreg_jax._src.export.staging import Staging
from paramreg_jax._src.export.staging import check_destination
from paramreg_jax._src.export.staging import published
from paramreg_jax._src.restore import bind as bind_lib
from paramreg_jax._src.restore import materialize as materialize_lib
from paramreg_jax._src.restore import planning
from paramreg_jax._src.restore import restore_plan as plan_lib
from paramreg_jax._src.sources import checkpoint_source as source_lib


def convert(
  source: source_lib.CheckpointSource,
  path: str | os.PathLike[str],
  target: api_types.PyTree,
  *,
  recipes: api_types.Recipes | None = None,
  hints: api_types.Hints | None = None,
  rename: api_types.RenameRules | None = None,
  aliases: Mapping[str, str] | None = None,
  exclude: api_types.Exclude | None = None,
  dtype_policy: api_types.DtypePolicy = "exact",
  max_inflight_bytes: int | None = None,
  overwrite: bool = False,
  progress: bool = False,
) -> plan_lib.RestorePlan:
  """Restores ``target`` from ``source`` once and saves it as an orbax checkpoint at ``path``.

  The checkpoint holds the target's own names, shapes, dtypes and shardings, so later starts
  need no recipes: ``ocp.StandardCheckpointer().restore(path, abstract_target)`` (or
  ``prj.restore(target, prj.OrbaxSource(path))``) gives the same arrays as the recipe restore.

  Args:
    source: the foreign checkpoint (``SafetensorsSource``, ...).
    path: the orbax checkpoint directory to write (orbax writes it atomically).
    target: the abstract target (shapes, dtypes, shardings), as for
      :func:`~paramreg_jax.restore`.
    recipes: the mapping; ``None`` (with no ``rename``) asks :func:`~paramreg_jax.match`,
      with ``hints``.
    hints: for ``match``, when ``recipes`` is ``None``.
    rename, aliases, exclude, dtype_policy: as for :func:`~paramreg_jax.plan_restore`.
    max_inflight_bytes, progress: as for :func:`~paramreg_jax.materialize`.
    overwrite: replace an existing checkpoint at ``path``: the new one is written beside it
      and swapped in only when complete, so a failure leaves the old one as it was.

  Returns:
    The :class:`~paramreg_jax.RestorePlan` that was used (pass it to :func:`~paramreg_jax.export`
    to go back).

  Raises:
    MatchError, RestorePlanError: the mapping is incomplete (nothing was read or written).
    ExportError: ``path`` exists and ``overwrite`` is not set, or cannot be written (under a
      file, read-only), ``hints`` given with ``recipes``, or saving failed (nothing new is
      left, an old checkpoint is untouched).

  Examples:
    >>> import jax, numpy as np, tempfile
    >>> import orbax.checkpoint as ocp
    >>> import paramreg_jax as prj
    >>> src = prj.MemorySource({"fc.weight": np.arange(6, dtype=np.float32).reshape(3, 2)})
    >>> target = {"fc": {"kernel": jax.ShapeDtypeStruct((2, 3), np.float32)}}
    >>> path = tempfile.mkdtemp() + "/converted"
    >>> _ = prj.convert(src, path, target)   # match finds the transpose, once
    >>> restored = ocp.StandardCheckpointer().restore(path, target)   # later: no recipes
    >>> np.asarray(restored["fc"]["kernel"]).tolist()
    [[0.0, 2.0, 4.0], [1.0, 3.0, 5.0]]
  """
  final = pathlib.Path(os.fspath(path)).absolute()
  check_destination(final, overwrite)
  if recipes is None and rename is None:
    from paramreg_jax._src.match import match

    recipes = match(target, source, hints=hints)
  elif hints is not None:
    raise errors.ExportError(
      "convert: hints are for match (recipes=None); with recipes or rename, drop hints or "
      "put what they say into the recipes"
    )
  plan = planning.plan_restore(
    target,
    source,
    recipes=recipes,
    aliases=aliases,
    rename=rename,
    exclude=exclude,
    dtype_policy=dtype_policy,
  )
  unit = materialize_lib.materialize(plan, max_inflight_bytes=max_inflight_bytes, progress=progress)
  params = bind_lib.bind(target, unit, exclude=exclude)
  del unit
  _save(final, params, overwrite)
  return plan


def _save(final: pathlib.Path, params: Any, overwrite: bool) -> None:
  """Saves beside ``final`` and swaps it in when complete: a failure (a full disk, a size
  limit, a kill) leaves an old checkpoint at ``final`` as it was."""
  import orbax.checkpoint as ocp  # lazily: orbax is heavy and does work at import

  staged = Staging(final, overwrite=overwrite, create=False)
  with published(staged, "convert (saving the checkpoint)"), ocp.StandardCheckpointer() as ckpt:
    ckpt.save(staged.dir, params)
    ckpt.wait_until_finished()
