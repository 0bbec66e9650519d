"""``SafetensorsSource``: a ``.safetensors`` file, a directory, or a sharded index.

The header of every file is parsed and validated when the source is built, with the rules of
the ``safetensors`` package: no truncation, a header inside the file, known dtypes, sizes that
match the shapes, no duplicate names, and data offsets that tile the data section exactly (no
overlap, no gap, nothing after the last tensor). A malformed checkpoint fails before any payload
byte is read.

Payload reads are positional reads (``os.preadv``) straight into 64-byte aligned buffers, which
``jax.device_put`` adopts without a copy. Nothing is memory-mapped: a file that shrinks while it
is read gives a short read, reported as an error naming the tensor, never a ``SIGBUS``. A region
read touches only the rows that hold it, in bounded chunks. At a URL the same reads are range
requests (:mod:`.stores`).
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import threading
from typing import Any

import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.sources import checkpoint_source as source_lib
from paramreg_jax._src.sources import host_memory
from paramreg_jax._src.sources import selection as sel_lib
from paramreg_jax._src.sources.safetensors_format import INDEX_NAME
from paramreg_jax._src.sources.safetensors_format import SafetensorsFile
from paramreg_jax._src.sources.storage import hub
from paramreg_jax._src.sources.storage import remote
from paramreg_jax._src.sources.storage import stores


class SafetensorsSource(source_lib.BoxSource):
  """A safetensors checkpoint: one file, a directory of files, or a sharded index.

  Args:
    path: a ``.safetensors`` file; a directory (its ``model.safetensors.index.json`` if present,
      else every ``*.safetensors`` in it); or the index file itself. Or a URL of any of them
      (``https://``, ``gs://``, ``s3://``, ``hf://``: ``pip install 'paramreg-jax[remote]'``;
      a folder URL means its index, else its ``model.safetensors``): headers and every read are
      range requests, only the rows a shard needs, in flight together.
    storage_options: for a URL, options of its fsspec filesystem (``{"headers": {...}}`` for
      HTTP, credentials for a bucket).
    retries: for a URL, how often a transient failure (a dropped connection, a timeout, HTTP
      5xx or 429) is retried, with exponential backoff.
    timeout: for a URL, seconds to connect and between received bytes.
    min_throughput: for a URL, bytes per second a request must average: each request's
      deadline is ``timeout`` plus its bytes at this rate (default 1 MiB/s), so a server that
      trickles fails in seconds, not hours.

  A remote object is pinned when it is opened: its size and validator (ETag, else
  Last-Modified) are checked on every response (and sent as ``If-Match``), and a ``206`` must
  name exactly the bytes asked for; an object replaced meanwhile is an error, never a wrong
  value. The index and ``config.json`` are capped at 64 MiB while they stream.

  Raises:
    MalformedSafetensorsError: a truncated file, a header past the end, bad offsets, an
      unknown dtype (checked for every file up front, before any payload read).
    MalformedIndexError / UnsafeShardPathError / MissingShardError /
    ContradictoryIndexMappingError: problems with a sharded index.
    SourceIOError: a URL that cannot be read: a server that ignores ``Range`` (refused before
      it sends the object), 403, timeouts after the retries, an object that changed; the URL
      is named.
    StoreError: a bad argument (an unknown protocol, ``retries`` < 0, a non-positive
      ``timeout``, ``storage_options`` that are not a dict).

  Examples:
    >>> import numpy as np, tempfile, os
    >>> from safetensors.numpy import save_file
    >>> from paramreg_jax import SafetensorsSource
    >>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
    >>> save_file({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, path)
    >>> src = SafetensorsSource(path)
    >>> src.metadata("w"), src.lease("w").read((slice(1, 2),)).tolist()
    (TensorMetadata(shape=(2, 3), dtype=dtype('float32'), nbytes=24), [[3.0, 4.0, 5.0]])
    >>> src.config is None  # no config.json beside the file
    True
  """

  def __init__(
    self,
    path: str | os.PathLike[str],
    *,
    storage_options: dict[str, Any] | None = None,
    retries: int = 3,
    timeout: float = 30.0,
    min_throughput: float = remote.MIN_THROUGHPUT,
  ):
    super().__init__()
    self._where: dict[str, SafetensorsFile] = {}
    self.commit: str | None = None  # an hf:// source's commit, pinned when it was opened
    if stores.is_url(path):
      self.path: Any = str(path)
      remote.check_remote_args(self.path, storage_options, retries, timeout, min_throughput)
      self._open_remote(str(path), storage_options, retries, timeout, min_throughput)
    else:
      self.path = pathlib.Path(path)
      self._open_local()
    self._keys = tuple(sorted(self._where))

  def _open_local(self) -> None:
    if self.path.is_dir():
      self._folder: Any = stores.LocalFolder(self.path)
      if (self.path / INDEX_NAME).exists():
        self._load_index(self._folder, INDEX_NAME)
        return
      files = sorted(self.path.glob("*.safetensors"))
      if not files:
        raise errors.MissingShardError(f"{self.path}: no *.safetensors files and no {INDEX_NAME}")
      for f in files:
        self._add(SafetensorsFile(stores.LocalFile(f)))
      return
    self._folder = stores.LocalFolder(self.path.parent)
    if self.path.name.endswith(".json"):
      self._load_index(self._folder, self.path.name)
    elif self.path.exists():
      self._add(SafetensorsFile(stores.LocalFile(self.path)))
    else:
      raise errors.MissingShardError(
        f"{self.path}: no such file or directory{hub.suggest_for_missing(self.path)}"
      )

  def _open_remote(
    self, url: str, options: Any, retries: int, timeout: float, min_throughput: float
  ) -> None:
    """A file URL, an index URL, or a folder URL (its index, else its ``model.safetensors``);
    an ``hf://`` URL is first pinned to the commit its revision points to."""
    immutable = url.split("://", 1)[0].lower() == "hf"
    if immutable:
      url, options, self.commit = hub.pin(url, options, timeout, retries)
    if url.endswith(".safetensors") or url.endswith(".json"):
      root, name = url.rsplit("/", 1)
    else:
      root, name = url.rstrip("/"), ""
    self._folder = remote.RemoteFolder(
      root,
      options=options,
      retries=retries,
      timeout=timeout,
      min_throughput=min_throughput,
      immutable=immutable,
    )
    if not name:
      name = INDEX_NAME if self._folder.exists(INDEX_NAME) else "model.safetensors"
    if name.endswith(".json"):
      self._load_index(self._folder, name)
    else:
      self._add(SafetensorsFile(self._folder.open(name)))

  @functools.cached_property
  def config(self) -> dict[str, Any] | None:
    """The ``config.json`` beside the weights (a Hugging Face model's description: model type,
    head counts, tied embeddings), parsed; None if there is none. ``match`` reads it.

    Raises:
      MalformedConfigError: the file exists but is not a JSON object.
    """
    where = self._folder.describe("config.json")
    if not self._folder.exists("config.json"):
      return None
    try:
      data = json.loads(self._folder.read_text("config.json"))
    except errors.SourceIOError:
      raise  # the document could not be read (a status, the cap): not a malformed one
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
      raise errors.MalformedConfigError(f"{where}: cannot parse the model config: {e}") from None
    if not isinstance(data, dict):
      raise errors.MalformedConfigError(
        f"{where}: the model config is a JSON {type(data).__name__}, not an object"
      )
    return data

  def has_companion(self, name: str) -> bool:
    """Whether ``name`` (a tokenizer or generation-config file) is beside the weights."""
    return self._folder.exists(name)

  def companion(self, name: str) -> bytes:
    """The bytes of a companion file beside the weights (``export`` copies them as they are).

    Raises:
      SourceIOError: it cannot be read.
    """
    try:
      return self._folder.read_bytes(name)
    except OSError as e:
      raise errors.SourceIOError(f"{self._folder.describe(name)}: cannot read it: {e}") from e

  def _add(self, f: SafetensorsFile, allowed: set[str] | None = None) -> None:
    for key in f.entries:
      if allowed is not None and key not in allowed:
        continue
      if key in self._where:
        raise errors.ContradictoryIndexMappingError(
          f"tensor {key!r} is stored in both {self._where[key].path.name} and {f.path.name}; "
          "a checkpoint must hold each tensor once"
        )
      self._where[key] = f

  def _load_index(self, folder: Any, index_name: str) -> None:
    index = folder.describe(index_name)
    try:
      data = json.loads(folder.read_text(index_name))
    except errors.SourceIOError:
      raise  # the document could not be read (a status, the cap): not a malformed one
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
      raise errors.MalformedIndexError(f"{index}: cannot parse the index: {e}") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(
      isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
      raise errors.MalformedIndexError(
        f"{index}: expected {{'weight_map': {{tensor: shard file}}}}, nothing was read"
      )
    shards: dict[str, set[str]] = {}
    for key, name in weight_map.items():
      if "\x00" in name or len(name) > 1024 or not name.strip():
        raise errors.MalformedIndexError(
          f"{index}: tensor {key!r} points to {name[:60]!r}{'...' if len(name) > 60 else ''} "
          f"({len(name)} characters), which is not a usable file name; nothing was read"
        )
      if folder.escapes(name):
        raise errors.UnsafeShardPathError(
          f"{index}: tensor {key!r} points to {name!r}, outside {folder.root}; shard paths must "
          "be relative names inside the checkpoint directory. Nothing was read"
        )
      shards.setdefault(name, set()).add(key)
    missing = sorted(n for n in shards if not folder.exists(n))
    if missing:
      raise errors.MissingShardError(f"{index}: shard file(s) missing: {', '.join(missing)}")
    for name in sorted(shards):
      f = SafetensorsFile(folder.open(name))
      absent = sorted(shards[name] - set(f.entries))
      if absent:
        raise errors.ContradictoryIndexMappingError(
          f"{index}: maps {', '.join(absent[:5])} to {name}, which does not hold them"
        )
      self._add(f, shards[name])

  def keys(self) -> tuple[str, ...]:
    return self._keys

  def metadata(self, key: str) -> source_lib.TensorMetadata:
    f = self._where.get(key)
    if f is None:
      raise self.unknown_key(key)
    return f.entries[key][0]

  def _read(self, key: str, region: sel_lib.Region) -> np.ndarray:
    return self._where[key].read(key, region)

  @property
  def remote(self) -> bool:  # type: ignore[override]
    """Whether the checkpoint is read from a URL."""
    return isinstance(self._folder, remote.RemoteFolder)

  def read_stacked(self, keys: Any, out: np.ndarray | None = None) -> np.ndarray:
    """The whole tensors ``keys`` stacked along a new first axis: each run of them that the file
    stores back to back, in the order asked, is one physical read (see
    :meth:`CheckpointSource.read_stacked`).

    Examples:
      >>> import numpy as np, tempfile, os
      >>> from safetensors.numpy import save_file
      >>> from paramreg_jax import SafetensorsSource
      >>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
      >>> save_file({f"e{i}": np.full(2, i, np.float32) for i in range(4)}, path)
      >>> src = SafetensorsSource(path)
      >>> src.read_stacked(["e0", "e1", "e2", "e3"]).tolist(), src.stats.reads
      ([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0], [3.0, 3.0]], 1)
    """
    keys = list(keys)
    shape, dtype = self.stacked_layout(keys)
    out = host_memory.stacked_buffer(out, len(keys), shape, dtype)
    size = source_lib.nbytes_of(shape, dtype)
    if size == 0:
      return out
    where = [self._where[key] for key in keys]
    offsets = [f.entries[key][1] for f, key in zip(where, keys)]
    i = 0
    while i < len(keys):
      j = i + 1
      while j < len(keys) and where[j] is where[i] and offsets[j] == offsets[i] + (j - i) * size:
        j += 1
      try:
        self._pread(where[i], out[i:j], offsets[i], keys[i])
      except errors.SourceIOError:
        if j == i + 1:
          raise
        for k in range(i, j):  # again tensor by tensor: the error names the one that fails
          self._pread(where[k], out[k : k + 1], offsets[k], keys[k])
      self.count_run(size * (j - i))
      i = j
    return out

  def _pread(self, f: SafetensorsFile, out: np.ndarray, offset: int, key: str) -> None:
    """One positional read into ``out`` (whole tensors from ``key`` on); a failure names
    ``key``."""
    with self.reading(key, sel_lib.full_region(out.shape[1:])):
      f.store.pread_into(out, offset, repr(key))

  def start_reads(self, requests: Any) -> Any:
    """Local files read when finished (positional reads are synchronous); at a URL every read
    of the window is in flight at once (the window's budget bounds them)."""
    if not isinstance(self._folder, remote.RemoteFolder):
      return super().start_reads(requests)
    pool = self._pool()
    futures = [pool.submit(self.read_region, key, region) for key, region in requests]

    def cancel() -> None:  # a failed unit reads nothing more (those in flight finish)
      for f in futures:
        f.cancel()

    def finish() -> list[np.ndarray]:
      try:
        return [f.result() for f in futures]
      except BaseException:
        cancel()
        raise

    finish.cancel = cancel  # type: ignore[attr-defined]
    return finish

  def _pool(self) -> Any:
    if getattr(self, "_executor", None) is None:
      from concurrent.futures import ThreadPoolExecutor

      self._executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="paramreg-http")
    return self._executor

  def close(self) -> None:
    """Closes the files (they stay open from validation to the last read, so that a file
    replaced at the same path cannot change what was validated). Also on garbage collection.

    Examples:
      >>> import numpy as np, tempfile, os
      >>> from safetensors.numpy import save_file
      >>> from paramreg_jax import SafetensorsSource
      >>> path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
      >>> save_file({"w": np.ones(2, np.float32)}, path)
      >>> with SafetensorsSource(path) as src:
      ...   src.lease("w").read().tolist()
      [1.0, 1.0]
    """
    for f in {id(f): f for f in self._where.values()}.values():
      f.close()
    executor = self.__dict__.pop("_executor", None)
    if executor is not None:  # the threads that read a URL's ranges: queued reads are
      # dropped and those in flight waited for (not from one of those threads: a deadlock)
      own = threading.current_thread().name.startswith("paramreg-http")
      executor.shutdown(wait=not own, cancel_futures=True)

  def storage_box(self, key: str, box: sel_lib.Region) -> sel_lib.Region:
    """``box`` widened to whole rows (leading-axis slices): a tensor is row-major in its file,
    so a column block costs the rows it crosses, and they serve every column block at once."""
    return source_lib.whole_rows(box, self.metadata(key).shape)

  def shard_of(self, key: str) -> Any:
    """The file that holds ``key``."""
    if key not in self._where:
      raise self.unknown_key(key)
    return self._where[key].path

  def __repr__(self) -> str:
    return f"SafetensorsSource({str(self.path)!r})"
