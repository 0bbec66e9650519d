"""``load``: one call from a checkpoint to your model (open by what it is, ``match``,
``restore``), for a user coming from ``from_pretrained``. The lower-level calls stay for
those who need them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from typing import NamedTuple

from paramreg_jax._src import api_types
from paramreg_jax._src import errors
from paramreg_jax._src.match import Match
from paramreg_jax._src.match import match as match_fn
from paramreg_jax._src.restore.pipeline import restore
from paramreg_jax._src.sources import checkpoint_source as source_lib
from paramreg_jax._src.sources.opening import open_source

_OPTIONS = (
  "hints",
  "config",
  "dtype_policy",
  "step",
  "item",
  "source_options",
  "max_inflight_bytes",
  "progress",
  "backend",
)


class Loaded(NamedTuple):
  """What :func:`load` returns: ``params, report = prj.load(...)``.

  Examples:
    >>> import jax, numpy as np, tempfile, pathlib
    >>> import paramreg_jax as prj
    >>> from safetensors.numpy import save_file
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "model.safetensors"
    >>> save_file({"model.norm.weight": np.ones(4, np.float32)}, str(path))
    >>> loaded = prj.load({"final_norm": {"scale": jax.ShapeDtypeStruct((4,), np.float32)}},
    ...                   path, progress=False)
    >>> loaded.report.rows()
    [('final_norm/scale', "source('model.norm.weight')", 'name')]
  """

  params: api_types.PyTree  # the restored tree, of the target's structure
  report: Match  # the mapping used: print it for the table, .to_python() for the code


def load(
  target: api_types.PyTree,
  where: str | os.PathLike[str] | source_lib.CheckpointSource,
  *,
  hints: api_types.Hints | None = None,
  config: Mapping[str, Any] | None = None,
  dtype_policy: api_types.DtypePolicy = "exact",
  step: int | None = None,
  item: str | None = None,
  source_options: Mapping[str, Any] | None = None,
  max_inflight_bytes: int | None = None,
  progress: bool = True,
  backend: Any = None,
  **unexpected: Any,
) -> Loaded:
  """Loads a checkpoint into ``target``: opens ``where`` by what it is, proposes the mapping
  with :func:`match`, restores with a progress bar, all or nothing.

  Args:
    target: your model's abstract tree (``jax.eval_shape``, ``nnx.eval_shape`` + ``nnx.split``
      state, linen params, an ``nnx.Module``, an equinox module), with shardings if you want
      sharded arrays.
    where: a ``.safetensors`` file, a sharded ``*.index.json`` or a directory of either; a
      ``.gguf`` file; an orbax checkpoint or ``CheckpointManager`` root; local or at a URL
      (``http(s)://``, ``hf://org/name``, ``s3://``, ``gs://``); or a source you opened.
    hints, config: as for :func:`match` (what names and shapes cannot settle; the
      ``config.json`` when the source does not carry it).
    dtype_policy: as for :func:`restore`; ``match`` already casts each weight to your target's
      dtype where they differ (a ``cast`` in the report, as ``from_pretrained(torch_dtype=...)``
      converts), so ``"exact"`` is only a check on your own recipes.
    step, item: an orbax ``CheckpointManager``'s step (default the latest) and item.
    source_options: keyword arguments for a safetensors source (``storage_options`` with a
      token or credentials, ``retries``, ``timeout``).
    max_inflight_bytes, progress, backend: as for :func:`restore`.

  Returns:
    ``Loaded(params, report)``: the restored tree (for an ``nnx.Module``, its new ``Param``
    state: ``nnx.update(model, params)``) and the :class:`Match` that mapped it.

  Raises:
    MatchError: the mapping is not certain (unmatched or ambiguous parameters): the refusal
      ends with a ``hints = {...}`` literal to uncomment and pass back as ``hints=``.
    StoreError: nothing at ``where`` is a checkpoint this opens (names what was found).
    RestorePlanError, MaterializationError, BindError: as for :func:`restore`; nothing is
      bound.

  Examples:
    >>> import jax, numpy as np, tempfile, pathlib
    >>> import paramreg_jax as prj
    >>> from safetensors.numpy import save_file
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> up = np.arange(24, dtype=np.float32).reshape(8, 3)  # torch's [out, in]
    >>> save_file({"model.layers.0.mlp.up_proj.weight": up}, str(folder / "model.safetensors"))
    >>> target = {"layers_0": {"mlp": {"up": {"kernel": jax.ShapeDtypeStruct((3, 8), np.float32)}}}}
    >>> params, report = prj.load(target, folder, progress=False)
    >>> bool((params["layers_0"]["mlp"]["up"]["kernel"] == up.T).all())
    True
  """
  errors.refuse_arguments("load", unexpected, _OPTIONS)
  opened = not isinstance(where, source_lib.CheckpointSource)
  if opened:
    source = open_source(where, step=step, item=item, options=source_options)  # type: ignore[arg-type]
  else:
    pairs = (("step", step), ("item", item), ("source_options", source_options))
    given = [n for n, v in pairs if v is not None]
    if given:
      raise TypeError(
        f"load: {', '.join(given)} open a checkpoint at a path; {where!r} is a source already "
        "opened: pass them to its constructor, or pass the path"
      )
    source = where
  try:
    report = match_fn(target, source, hints=hints, config=config)
    params = restore(
      target,
      source,
      recipes=report,
      dtype_policy=dtype_policy,
      max_inflight_bytes=max_inflight_bytes,
      progress=progress,
      backend=backend,
    )
  finally:
    if opened:
      source.close()
  return Loaded(params, report)
