"""Checkpoint sources: metadata-first catalogs that hand out bounded reads (leases)."""

from paramreg_jax._src.errors import ContradictoryIndexMappingError
from paramreg_jax._src.errors import InvalidRegionError
from paramreg_jax._src.errors import MalformedConfigError
from paramreg_jax._src.errors import MalformedIndexError
from paramreg_jax._src.errors import MalformedSafetensorsError
from paramreg_jax._src.errors import MissingShardError
from paramreg_jax._src.errors import SourceIOError
from paramreg_jax._src.errors import StoreError
from paramreg_jax._src.errors import UnknownTensorError
from paramreg_jax._src.errors import UnsafeShardPathError
from paramreg_jax._src.sources.base import CheckpointLease
from paramreg_jax._src.sources.base import CheckpointSource
from paramreg_jax._src.sources.base import SourceStats
from paramreg_jax._src.sources.base import TensorMetadata
from paramreg_jax._src.sources.memory import MemorySource
from paramreg_jax._src.sources.orbax import OrbaxSource
from paramreg_jax._src.sources.safetensors import SafetensorsSource
from paramreg_jax._src.sources.selection import Full
from paramreg_jax._src.sources.selection import Indices
from paramreg_jax._src.sources.selection import Range

__all__ = (
  "CheckpointLease",
  "CheckpointSource",
  "ContradictoryIndexMappingError",
  "Full",
  "Indices",
  "InvalidRegionError",
  "MalformedConfigError",
  "MalformedIndexError",
  "MalformedSafetensorsError",
  "MemorySource",
  "MissingShardError",
  "OrbaxSource",
  "Range",
  "SafetensorsSource",
  "SourceIOError",
  "SourceStats",
  "StoreError",
  "TensorMetadata",
  "UnknownTensorError",
  "UnsafeShardPathError",
)
