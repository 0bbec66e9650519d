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

from paramreg_jax._src import api_types
from paramreg_jax._src import errors
from paramreg_jax._src import plan as plan_lib
from paramreg_jax._src import restore as restore_lib
from paramreg_jax._src import source as source_lib


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
    overwrite: replace an existing checkpoint at ``path``.

  Returns:
    The :class:`~paramreg_jax.RestorePlan` that was used (pass it to :func:`~paramreg_jax.export`
    to go back).

  Raises:
    MatchError, RestorePlanError: the mapping is incomplete (nothing was read or written).
    ExportError: ``path`` exists and ``overwrite`` is not set.

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
  if final.exists() and not overwrite:
    raise errors.ExportError(
      f"{final} already exists (overwrite=True, or --overwrite on the command line, replaces it)",
      str(final),
    )
  if recipes is None and rename is None:
    from paramreg_jax._src.match import match

    recipes = match(target, source, hints=hints)
  elif hints is not None:
    raise ValueError("convert: hints are for match; with recipes or rename, drop hints")
  plan = plan_lib.plan_restore(
    target,
    source,
    recipes=recipes,
    aliases=aliases,
    rename=rename,
    exclude=exclude,
    dtype_policy=dtype_policy,
  )
  unit = restore_lib.materialize(plan, max_inflight_bytes=max_inflight_bytes, progress=progress)
  params = restore_lib.bind(target, unit, exclude=exclude)
  del unit
  import orbax.checkpoint as ocp  # lazily: orbax is heavy and does work at import

  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(final, params, force=overwrite)
    checkpointer.wait_until_finished()
  return plan
