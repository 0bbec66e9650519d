"""``MemorySource``: a checkpoint held in memory (tests, in-memory conversion)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from paramreg_jax._src.sources import checkpoint_source as source_lib
from paramreg_jax._src.sources import host_memory
from paramreg_jax._src.sources import selection as sel_lib


class MemorySource(source_lib.BoxSource):
  """A source over a mapping ``name -> array`` (numpy, jax or anything ``np.asarray`` takes).

  Args:
    tensors: ``{name: array}``.
    config: the model's description (a parsed ``config.json``) for :func:`match`, if any.

  Examples:
    >>> import numpy as np
    >>> from paramreg_jax import MemorySource
    >>> src = MemorySource({"b": np.zeros(2), "a": np.ones((2, 2), np.float32)})
    >>> src.keys(), src.metadata("a")
    (('a', 'b'), TensorMetadata(shape=(2, 2), dtype=dtype('float32'), nbytes=16))
  """

  def __init__(self, tensors: Mapping[str, Any], *, config: Mapping[str, Any] | None = None):
    super().__init__()
    if not isinstance(tensors, Mapping):
      raise TypeError(f"MemorySource takes a mapping name -> array, got {type(tensors).__name__}")
    if config is not None and not isinstance(config, Mapping):
      raise TypeError(f"MemorySource config must be a mapping, got {type(config).__name__}")
    self._config = dict(config) if config is not None else None
    self._arrays: dict[str, np.ndarray] = {}
    for k, v in tensors.items():
      if not isinstance(k, str) or not k:
        raise TypeError(f"MemorySource keys must be non-empty strings, got {k!r}")
      self._arrays[k] = np.asarray(v)
    self._keys = tuple(sorted(self._arrays))

  @property
  def config(self) -> dict[str, Any] | None:
    """The ``config`` given (a parsed ``config.json``), or None."""
    return self._config

  def keys(self) -> tuple[str, ...]:
    return self._keys

  def metadata(self, key: str) -> source_lib.TensorMetadata:
    arr = self._arrays.get(key)
    if arr is None:
      raise self.unknown_key(key)
    return source_lib.TensorMetadata(arr.shape, arr.dtype)

  def _read(self, key: str, region: sel_lib.Region) -> np.ndarray:
    arr = self._arrays[key]
    return host_memory.read_into_aligned(arr[sel_lib.region_slices(region)], arr.dtype)

  def __repr__(self) -> str:
    return f"MemorySource({len(self._keys)} tensors)"
