"""The checkpoint-source contract: the base class a source of your own derives from (it
implements ``keys``, ``metadata`` and ``read``; docs: "Read a checkpoint format of your own"),
and what sources hand out.

The sources themselves (``MemorySource``, ``OrbaxSource``, ``SafetensorsSource``) and the
selections (``Full``, ``Range``, ``Indices``) are at the top level (``prj.SafetensorsSource``);
their errors are in :mod:`paramreg_jax.errors`.

Examples:
  >>> import numpy as np
  >>> import paramreg_jax as prj
  >>> from paramreg_jax.sources import CheckpointSource, TensorMetadata
  >>> src = prj.MemorySource({"w": np.zeros((2, 3), np.float32)})
  >>> isinstance(src, CheckpointSource), src.metadata("w") == TensorMetadata((2, 3), np.float32)
  (True, True)
"""

from paramreg_jax._src import surface as _surface
from paramreg_jax._src.sources.checkpoint_source import CheckpointLease
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource
from paramreg_jax._src.sources.checkpoint_source import SourceStats
from paramreg_jax._src.sources.checkpoint_source import TensorMetadata

__all__ = (
  "CheckpointLease",
  "CheckpointSource",
  "SourceStats",
  "TensorMetadata",
)

# a name exported elsewhere: an AttributeError that says where
__getattr__ = _surface.elsewhere("paramreg_jax.sources")
