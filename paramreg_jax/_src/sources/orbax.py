"""``OrbaxSource``: an orbax checkpoint read region by region through tensorstore.

Keys are the canonical names of the saved tree's paths (``params/dense/kernel``). Metadata
comes from orbax's metadata API (no payload read). Reads open the array's tensorstore (the
same spec orbax uses) and read only the requested box; ``stats.bytes_read`` counts the bytes
of the storage chunks that box touches, which is what the disk actually serves.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import threading
from typing import Any

import jax
import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.registry import assign as registry_lib
from paramreg_jax._src.registry import keys as keys_lib
from paramreg_jax._src.sources import checkpoint_source as source_lib
from paramreg_jax._src.sources import host_memory
from paramreg_jax._src.sources import orbax_remote
from paramreg_jax._src.sources import selection as sel_lib
from paramreg_jax._src.sources import ts_specs
from paramreg_jax._src.sources.storage import stores

_METADATA_FILE = "_METADATA"
# (tree path, orbax array name, shape, dtype, storage chunk shape)
_Leaf = tuple[tuple[Any, ...], str, tuple[int, ...], np.dtype, "tuple[int, ...] | None"]


def _is_item_dir(path: pathlib.Path) -> bool:
  return (path / _METADATA_FILE).exists() or (path / "manifest.ocdbt").exists()


def _committed(path: pathlib.Path) -> bool:
  """Orbax's own rule: a finished rename locally, a ``commit_success.txt`` on GCS."""
  from orbax.checkpoint import path as ocp_path

  return bool(ocp_path.step.is_path_finalized(path)) and not ocp_path.step.is_path_temporary(path)


def _refuse_uncommitted(path: pathlib.Path, what: str) -> None:
  raise errors.StoreError(
    f"{path}: {what} is not committed (a save that did not finish, or is still running, leaves "
    "it); orbax does not restore it and neither do we. Nothing was read: wait for the save to "
    "finish, or restore an earlier committed step"
  )


def _as_path(path: Any) -> Any:
  """A local path, or for ``gs://``/``s3://`` orbax's own path type (etils ``epath``: the
  listing and ``_METADATA`` go through gcsfs/s3fs, the arrays through tensorstore)."""
  if not stores.is_url(path):
    return pathlib.Path(path)
  scheme = str(path).split("://", 1)[0]
  if scheme not in ("gs", "s3"):
    raise errors.StoreError(
      f"{path}: orbax checkpoints are read from local paths, gs:// or s3:// ({scheme}:// has no "
      "directory listing); for safetensors at a URL use SafetensorsSource"
    )
  from etils import epath

  return epath.Path(str(path))


def resolve_checkpoint_dir(
  path: pathlib.Path, *, step: int | str | None, item: str | None
) -> pathlib.Path:
  """The item directory of a StandardCheckpointer / PyTreeCheckpointer / CheckpointManager path.

  Only committed checkpoints are resolved (orbax's rules); the result is absolute.
  """
  from orbax.checkpoint import path as ocp_path

  if stores.is_url(str(path)):
    orbax_remote.check_listing(path)
  else:
    path = path.absolute()  # epath's absolute() would prefix a URL with the working directory
  if not path.is_dir():
    raise errors.StoreError(f"{path}: no such orbax checkpoint directory")
  if isinstance(step, str) and step.strip().isdigit():
    step = int(step)  # "2" from a config file or a command line
  if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
    raise TypeError(f"step must be a non-negative int (a CheckpointManager step), got {step!r}")
  for candidate in (path, path.parent):  # an uncommitted save, or an item inside one
    if ocp_path.step.TMP_DIR_SUFFIX in candidate.name:
      _refuse_uncommitted(path, repr(candidate.name))
  if _is_item_dir(path) and step is None and item is None:
    return path
  digits = {int(p.name): p for p in path.iterdir() if p.is_dir() and p.name.isdigit()}
  steps = sorted(s for s, p in digits.items() if _committed(p))
  uncommitted = sorted(
    [p.name for s, p in digits.items() if s not in steps]
    + [p.name for p in path.iterdir() if p.is_dir() and ocp_path.step.TMP_DIR_SUFFIX in p.name]
  )
  if steps:  # a CheckpointManager root
    chosen = steps[-1] if step is None else step
    if chosen not in steps:
      if chosen in digits or any(n.startswith(f"{chosen}.") for n in uncommitted):
        _refuse_uncommitted(path, f"step {chosen}")
      raise errors.StoreError(f"{path}: no step {chosen}; committed steps: {steps}")
    path = path / str(chosen)
  elif uncommitted:
    _refuse_uncommitted(path, f"every step here ({', '.join(uncommitted)})")
  elif step is not None:
    raise errors.StoreError(f"{path}: step={step} given, but this is not a CheckpointManager root")
  if _is_item_dir(path) and item is None:
    return path
  items = sorted(
    p.name
    for p in path.iterdir()
    if p.is_dir() and _is_item_dir(p) and ocp_path.step.TMP_DIR_SUFFIX not in p.name
  )
  if item is not None:
    if item not in items:
      raise errors.StoreError(f"{path}: no item {item!r}; items: {items}")
    return path / item
  if len(items) == 1:
    return path / items[0]
  unfinished = sorted(
    p.name for p in path.iterdir() if p.is_dir() and ocp_path.step.TMP_DIR_SUFFIX in p.name
  )
  if not items and unfinished:
    _refuse_uncommitted(path, f"the item {unfinished[0]!r}")
  raise errors.StoreError(
    f"{path}: holds items {items}; pass item=... to choose one"
    if items
    else f"{path}: not an orbax checkpoint (no {_METADATA_FILE} found)"
  )


def _check_metadata_file(path: pathlib.Path) -> dict[str, Any]:
  """``_METADATA`` must exist and be a JSON object; orbax reads a missing or damaged one as an
  empty tree, which would make a damaged checkpoint look like one with no tensors."""
  meta = path / _METADATA_FILE
  if not meta.is_file():
    raise errors.StoreError(
      f"{path}: no {_METADATA_FILE} file, so the saved tree is unknown (an unfinished save, a "
      "damaged copy, or not an orbax item directory); nothing was read"
    )
  try:
    data = json.loads(meta.read_text())
  except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
    raise errors.StoreError(
      f"{meta}: not valid JSON ({e}); the checkpoint's tree metadata is damaged, nothing was read"
    ) from None
  if not isinstance(data, dict):
    raise errors.StoreError(f"{meta}: expected a JSON object, got {type(data).__name__}")
  return data


def _saved_leaves(data: dict[str, Any]) -> dict[str, str]:
  """``{tree path: value type}`` of the leaves ``_METADATA`` says were saved."""
  tree = data.get("tree_metadata")
  if not isinstance(tree, dict):
    return {}
  out = {}
  for path, entry in tree.items():
    value = entry.get("value_metadata") if isinstance(entry, dict) else None
    if isinstance(value, dict) and not value.get("skip_deserialize"):
      out[path] = str(value.get("value_type"))
  return out


def _damaged(path: pathlib.Path, expected: int, found: int) -> errors.StoreError:
  """The error for array metadata orbax could not read although ``_METADATA`` lists arrays."""
  ocdbt = [p for p in path.glob("ocdbt.process_*") if p.is_dir()]
  if ocdbt and not (path / "manifest.ocdbt").exists():
    what = "its manifest.ocdbt is missing"
  elif ocdbt or (path / "manifest.ocdbt").exists():
    what = "its OCDBT manifest or data files (manifest.ocdbt, d/, ocdbt.process_*/) are damaged"
  else:
    what = "its array metadata files (.zarray / zarr.json) are damaged or missing"
  return errors.StoreError(
    f"{path}: _METADATA lists {expected} saved arrays, but orbax can read the metadata of "
    f"{found}: {what}. The checkpoint is damaged; nothing was read (restore an earlier step, "
    "or a copy)"
  )


class _DropMissingCheckpointMetadata(logging.Filter):
  """Orbax warns that an item directory has no ``_CHECKPOINT_METADATA`` (it lives in the step
  directory of a CheckpointManager); expected here, so not shown to users."""

  def filter(self, record: logging.LogRecord) -> bool:
    return "Metadata file does not exist" not in record.getMessage()


class OrbaxSource(source_lib.BoxSource):
  """An orbax checkpoint directory as a :class:`CheckpointSource`.

  Args:
    path: a ``StandardCheckpointer``/``PyTreeCheckpointer`` directory, a ``CheckpointManager``
      step directory, or a manager root (the latest step is used unless ``step`` is given);
      locally or at a ``gs://`` or ``s3://`` URL. In a bucket, the listing is read through
      gcsfs/s3fs and the arrays through tensorstore, both with the endpoint and credentials
      from the environment (how-to "Restore straight from the Hub or a bucket").
    step: the step of a ``CheckpointManager`` root.
    item: the item name inside a step that holds several (``"params"``, ``"opt"``...).

  Raises:
    StoreError: nothing committed at ``path`` (no checkpoint, an unfinished save, no such step
      or item), a damaged ``_METADATA``, or a bucket that denies the listing.

  Examples:
    >>> import os, tempfile, jax.numpy as jnp, orbax.checkpoint as ocp
    >>> from paramreg_jax import OrbaxSource
    >>> path = os.path.join(tempfile.mkdtemp(), "ckpt")
    >>> ckpt = ocp.StandardCheckpointer()
    >>> ckpt.save(path, {"dense": {"kernel": jnp.arange(6.0).reshape(2, 3)}})
    >>> ckpt.wait_until_finished()
    >>> src = OrbaxSource(path)
    >>> src.keys(), src.lease("dense/kernel").read((slice(1, 2),)).tolist()
    (('dense/kernel',), [[3.0, 4.0, 5.0]])
  """

  def __init__(
    self, path: str | os.PathLike[str], *, step: int | str | None = None, item: str | None = None
  ):
    super().__init__()
    self.path = resolve_checkpoint_dir(_as_path(path), step=step, item=item)
    data = _check_metadata_file(self.path)
    self._use_ocdbt = (self.path / "manifest.ocdbt").exists() or any(
      p.name.startswith("ocdbt.process") for p in self.path.iterdir()
    )
    self._stores: dict[str, Any] = {}
    self._open_lock = threading.Lock()
    self._context: Any = None
    self._base = orbax_remote.kvstore(str(self.path)) if stores.is_url(str(self.path)) else None
    opened: dict[str, Any] = {}
    self._versions = orbax_remote.versions(str(self.path)) if self._base is not None else None
    leaves = self._orbax_leaves(data) if self._base is None else self._bucket_leaves(data, opened)
    # an nnx.State was saved as {'value': x} dicts: name its arrays as the live State's
    paths = [leaf[0] for leaf in leaves]
    names = tuple(keys_lib.paths_to_names(keys_lib.fold_saved_variables(paths)))
    if len(set(names)) != len(names):
      registry_lib.raise_collisions(names, paths)
    self._entries: dict[str, tuple[source_lib.TensorMetadata, str, tuple[int, ...] | None]] = {}
    for name, (_, array, shape, dtype, chunk) in zip(names, leaves):
      self._entries[name] = (source_lib.TensorMetadata(shape, dtype), array, chunk)
      if array in opened:
        self._stores[name] = opened[array]
    self._keys = tuple(sorted(self._entries))

  @property
  def remote(self) -> bool:  # type: ignore[override]
    """Whether the checkpoint is read over a network (``gs://``, ``s3://``); a restore's
    default memory budget is then larger, to keep requests in flight."""
    return self._base is not None

  def confirm_unchanged(self) -> None:
    """A checkpoint in a bucket must hold the objects it held at open: one listing after the
    reads (a generation or ETag never returns to an earlier one, so every read before it saw
    the opened objects)."""
    if self._versions is None:
      return
    moved = orbax_remote.changed(self._versions, orbax_remote.versions(str(self.path)))
    if moved:
      shown = ", ".join(moved[:3]) + (f" and {len(moved) - 3} more" if len(moved) > 3 else "")
      raise errors.SourceIOError(
        f"{self.path}: the checkpoint changed while it was read ({shown} written, replaced "
        "or deleted since it was opened); nothing read from it is used: open it again once "
        "the save is done"
      )

  def _orbax_leaves(self, data: dict[str, Any]) -> list[_Leaf]:
    """The saved arrays, as orbax's metadata API describes them (local and gs:// paths)."""
    import orbax.checkpoint as ocp  # lazily: orbax is heavy and does work at import

    quiet = _DropMissingCheckpointMetadata()
    logging.getLogger("absl").addFilter(quiet)
    try:
      md: Any = ocp.PyTreeCheckpointer().metadata(self.path)
    except Exception as e:  # orbax raises many types for unreadable metadata
      raise errors.StoreError(f"{self.path}: cannot read orbax metadata: {e}") from e
    finally:
      logging.getLogger("absl").removeFilter(quiet)
    md = getattr(md, "item_metadata", md)
    self._use_zarr3 = bool(getattr(md, "use_zarr3", False))
    tree = getattr(md, "tree", md)
    flat, _ = jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=lambda x: hasattr(x, "shape") and hasattr(x, "dtype")
    )
    flat = [(p, x) for p, x in flat if hasattr(x, "shape") and hasattr(x, "dtype")]
    arrays = sum(t in orbax_remote.ARRAY_TYPES for t in _saved_leaves(data).values())
    if arrays and len(flat) < arrays:
      raise _damaged(self.path, arrays, len(flat))
    leaves = []
    for p, leaf in flat:
      chunk = getattr(getattr(leaf, "storage", None), "chunk_shape", None)
      shape, dtype = tuple(leaf.shape), np.dtype(leaf.dtype)
      leaves.append((p, leaf.name, shape, dtype, tuple(chunk) if chunk else None))
    return leaves

  def _bucket_leaves(self, data: dict[str, Any], opened: dict[str, Any]) -> list[_Leaf]:
    """The saved arrays of a checkpoint in a bucket: the tree from ``_METADATA``, each array's
    shape, dtype and chunks from its tensorstore (left open in ``opened`` for the reads)."""
    self._use_zarr3 = bool(data.get("use_zarr3", False))
    saved = orbax_remote.saved_arrays(data)
    specs = {array: self._spec(array) for _, array in saved}
    opened.update(orbax_remote.open_arrays(specs, self._ts_context(), str(self.path)))
    return [(p, array, *orbax_remote.describe(opened[array])) for p, array in saved]

  def _spec(self, array: str) -> dict[str, Any]:
    return ts_specs.read_spec(
      str(self.path), array, self._use_zarr3, self._use_ocdbt, base=self._base
    )

  def _ts_context(self) -> Any:
    if self._context is None:
      self._context = ts_specs.context(self._use_ocdbt)
    return self._context

  def keys(self) -> tuple[str, ...]:
    return self._keys

  def metadata(self, key: str) -> source_lib.TensorMetadata:
    entry = self._entries.get(key)
    if entry is None:
      raise self.unknown_key(key)
    return entry[0]

  def prepare(self, keys: Any) -> None:
    """Opens the tensorstores of ``keys`` concurrently (opening dominates small arrays)."""
    for key in keys:
      self.metadata(key)
    self._open(keys)

  def _open(self, keys: Any) -> dict[str, Any]:
    """The tensorstores of ``keys``; unopened ones are opened concurrently (opening dominates
    the cost of reading many small arrays)."""
    with self._open_lock:
      missing = [k for k in dict.fromkeys(keys) if k not in self._stores]
      if missing:
        import tensorstore as ts

        futures = {
          k: ts.open(
            self._spec(self._entries[k][1]), context=self._ts_context(), open=True, read=True
          )
          for k in missing
        }
        for k, fut in futures.items():
          try:
            self._stores[k] = fut.result()
          except Exception as e:  # tensorstore raises ValueError/RuntimeError variants
            raise errors.SourceIOError(f"{k}: cannot open its array in {self.path}: {e}", k) from e
      return {k: self._stores[k] for k in keys}

  def _read(self, key: str, region: sel_lib.Region) -> np.ndarray:
    return self._read_unaccounted([(key, region)])[0]

  def read_many(self, requests: Any) -> list[np.ndarray]:
    """Issues every tensorstore read before waiting on any (overlapping I/O and decoding)."""
    return self.start_reads(requests)()

  def start_reads(self, requests: Any) -> Any:
    """Issues the reads now (tensorstore decodes in its own threads) and returns the function
    that waits for them: the backend issues the next window before the current one is done,
    so the decoders never run dry at a window's end."""
    requests = list(requests)
    for key, _ in requests:
      self.metadata(key)
    stores = self._open([key for key, _ in requests])
    issued = self._issue(stores, requests)

    def finish() -> list[np.ndarray]:
      out = []
      for (key, region), (value, fut) in zip(requests, issued):
        with self.reading(key, region):  # name the read being waited for
          fut.result()
        self.count_read(key, region)
        out.append(value)
      return out

    return finish

  def _issue(self, stores: dict[str, Any], requests: Any) -> list[tuple[np.ndarray, Any]]:
    """Starts every read straight into a 64-byte aligned buffer (``jax.device_put`` on CPU
    then adopts the buffer instead of copying it); tensorstore decodes them concurrently."""
    import tensorstore as ts

    issued = []
    for key, region in requests:
      out = host_memory.aligned_empty(sel_lib.region_shape(region), self._entries[key][0].dtype)
      fut = ts.array(out).write(stores[key][sel_lib.region_slices(region)])
      issued.append((out, fut))
    return issued

  def _read_unaccounted(self, requests: Any) -> list[np.ndarray]:
    """Reads without counting (``read_region`` counts); used by the single-read path."""
    stores = self._open([key for key, _ in requests])
    issued = self._issue(stores, requests)
    for _, fut in issued:
      fut.result()
    return [value for value, _ in issued]

  def read_failed(
    self, key: str, region: sel_lib.Region, cause: BaseException
  ) -> errors.SourceIOError:
    """The error for a failed read, naming the checkpoint (tensorstore's message may not)."""
    return errors.SourceIOError(
      f"{key}: reading {sel_lib.region_slices(region)} of {self.path} failed: {cause}", key
    )

  def _physical_bytes(self, key: str, region: sel_lib.Region) -> int:
    """The bytes of the whole chunks ``region`` touches: what the storage serves."""
    if any(b <= a for a, b in region):
      return 0
    box = self.storage_box(key, region)
    return source_lib.nbytes_of(sel_lib.region_shape(box), self._entries[key][0].dtype)

  def storage_box(self, key: str, box: sel_lib.Region) -> sel_lib.Region:
    """``box`` widened to whole storage chunks (tensorstore decodes whole chunks anyway)."""
    meta, _, chunk = self._entries[key]
    if not chunk or len(chunk) != len(meta.shape):
      return box
    return tuple(
      ((a // c) * c, min(-(-b // c) * c, dim)) for (a, b), c, dim in zip(box, chunk, meta.shape)
    )

  def chunk_shape(self, key: str) -> tuple[int, ...] | None:
    """The storage chunk shape of ``key`` (the unit of physical reads), if known."""
    self.metadata(key)
    return self._entries[key][2]

  def __repr__(self) -> str:
    return f"OrbaxSource({str(self.path)!r})"
