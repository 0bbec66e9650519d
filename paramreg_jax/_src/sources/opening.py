"""Opening a checkpoint by what it is: the one place a path or URL becomes a source.

A ``.gguf`` file is a :class:`GGUFSource`; a ``.safetensors`` file, a sharded index
(``*.index.json``) or a directory holding either is a :class:`SafetensorsSource` (local,
``http(s)://``, ``hf://``, ``s3://``, ``gs://``); an orbax item directory or
``CheckpointManager`` root (local, ``gs://``, ``s3://``) is an :class:`OrbaxSource`. Anything
else is refused with what was found there.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import Any

from paramreg_jax._src import errors
from paramreg_jax._src.sources.storage import hub
from paramreg_jax._src.sources.storage import remote
from paramreg_jax._src.sources.storage import stores

_OPENS = (
  "a .safetensors file, a sharded *.index.json or a directory of either; a .gguf file; or an "
  "orbax checkpoint (an item directory with _METADATA, or a CheckpointManager root of "
  "numbered steps)"
)


def open_source(
  where: str | os.PathLike[str],
  *,
  step: int | None = None,
  item: str | None = None,
  options: Mapping[str, Any] | None = None,
) -> Any:
  """The source for ``where``, by what it is: a ``.gguf`` file is a :class:`GGUFSource`; a
  ``.safetensors`` file, a sharded ``*.index.json`` or a folder of either a
  :class:`SafetensorsSource`; an orbax item directory or ``CheckpointManager`` root an
  :class:`OrbaxSource`.

  Args:
    where: a local path or a URL (``http(s)://``, ``hf://``, ``s3://``, ``gs://``).
    step, item: an orbax ``CheckpointManager``'s step (default: the latest committed) and item.
    options: keyword arguments for the source's constructor (``storage_options``,
      ``retries``, ``timeout`` for a remote safetensors checkpoint).

  Returns:
    The opened source (close it, or use it as a context manager, when done).

  Raises:
    StoreError: nothing there is a checkpoint this opens (names what was found), or ``step``/
      ``item`` were given for a checkpoint that has none.
    MissingShardError: no such file or directory.

  Examples:
    >>> import numpy as np, tempfile, pathlib
    >>> from safetensors.numpy import save_file
    >>> from paramreg_jax import open_source
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> save_file({"w": np.ones(2, np.float32)}, str(folder / "model.safetensors"))
    >>> type(open_source(folder)).__name__
    'SafetensorsSource'
  """
  from paramreg_jax._src.sources.gguf import GGUFSource
  from paramreg_jax._src.sources.orbax import OrbaxSource
  from paramreg_jax._src.sources.safetensors import SafetensorsSource

  options = dict(options or {})
  text = os.fspath(where) if isinstance(where, os.PathLike) else where
  if not isinstance(text, str):
    raise TypeError(f"where must be a path or a URL, got {type(where).__name__}")
  if stores.is_url(text):
    if text.endswith(".gguf"):
      raise errors.StoreError(
        f"{text}: GGUFSource reads a local file; download it first (hf download, curl) and pass "
        "its path"
      )
    scheme = text.split("://", 1)[0]
    if scheme in ("gs", "s3") and not text.endswith((".safetensors", ".json")):
      folder = remote.RemoteFolder(
        text, options=options.get("storage_options"), retries=3, timeout=30.0
      )
      if not folder.exists("model.safetensors.index.json") and not folder.exists(
        "model.safetensors"
      ):
        _no_options("an orbax checkpoint", options)
        return OrbaxSource(text, step=step, item=item)
    _no_step(text, "a safetensors checkpoint", step, item)
    return SafetensorsSource(text, **options)
  path = pathlib.Path(text)
  if not path.exists():
    hub_id = hub.suggest_for_missing(text, "prj.open_source")  # prj.load's too
    raise errors.MissingShardError(f"{text}: no such file or directory{hub_id}")
  kind = _local_kind(path)
  if kind == "orbax":
    _no_options("an orbax checkpoint", options)
    return OrbaxSource(path, step=step, item=item)
  _no_step(text, "a GGUF file" if kind == "gguf" else "a safetensors checkpoint", step, item)
  if kind == "gguf":
    _no_options("a GGUF file", options)
    return GGUFSource(path)
  if kind == "safetensors":
    return SafetensorsSource(path, **options)
  raise errors.StoreError(f"{text}: {kind}; load and open_source open {_OPENS}")


def _local_kind(path: pathlib.Path) -> str:
  """``"safetensors"``, ``"gguf"``, ``"orbax"``, or what was found instead."""
  if path.is_file():
    if path.suffix == ".safetensors" or path.name.endswith(".index.json"):
      return "safetensors"
    if path.suffix == ".gguf":
      return "gguf"
    return f"a file that is none of these (suffix {path.suffix or 'none'!r})"
  names = sorted(p.name for p in path.iterdir())
  if any(n.endswith(".safetensors") or n.endswith(".safetensors.index.json") for n in names):
    return "safetensors"
  ggufs = [n for n in names if n.endswith(".gguf")]
  if ggufs:
    return f"a directory with GGUF files ({', '.join(ggufs[:3])}): pass the one to load"
  orbax = {"_METADATA", "_CHECKPOINT_METADATA", "manifest.ocdbt"}
  if orbax & set(names) or any(n.isdigit() and (path / n).is_dir() for n in names):
    return "orbax"
  shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
  return f"a directory holding {shown or 'nothing'}"


def _no_step(where: str, what: str, step: int | None, item: str | None) -> None:
  given = [f"{n}={v!r}" for n, v in (("step", step), ("item", item)) if v is not None]
  if given:
    raise errors.StoreError(
      f"{' and '.join(given)} select a step/item of an orbax CheckpointManager, but {where} is "
      f"{what}; drop them"
    )


def _no_options(what: str, options: Mapping[str, Any]) -> None:
  if options:
    raise errors.StoreError(
      f"source options {sorted(options)} are for a safetensors checkpoint, but this is {what}; "
      "drop them"
    )
