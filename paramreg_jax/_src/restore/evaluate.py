"""``recipes.evaluate``: a recipe's value (or a region of it) on the host, as a restore reads it."""

from __future__ import annotations

from typing import Any

import numpy as np

from paramreg_jax._src.recipes import ops
from paramreg_jax._src.restore.jax_backend import backend as backend_lib
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource


def evaluate(recipe: ops.Recipe, src: CheckpointSource, index: Any = None) -> np.ndarray:
  """The value of ``recipe`` (or just the region ``index`` of it) as a numpy array.

  The same compiled program and block reads a restore runs for one shard, on the host (the
  default backend's ``evaluate``).

  Args:
    recipe: a recipe.
    src: a checkpoint source.
    index: ``None`` for the whole output, or a tuple of slices into the output shape.

  Returns:
    ``evaluate(recipe, src)[index]``, computed reading only what that region needs.

  Raises:
    RecipeError: the recipe does not fit the source's metadata (the subclass names the node,
      as :func:`~paramreg_jax.recipes.infer` raises it).
    InvalidRegionError: ``index`` is not a tuple of slices with steps of 1 inside the output.
    SourceIOError: the source could not read a block (the message names the file and tensor).

  Examples:
    >>> import numpy as np
    >>> from paramreg_jax import recipes
    >>> from paramreg_jax import MemorySource
    >>> src = MemorySource({"left": np.ones((2, 3), np.float32), "right": np.zeros((2, 3), np.float32)})
    >>> r = recipes.concatenate([recipes.source("left"), recipes.source("right")], axis=0)
    >>> recipes.evaluate(r, src, (slice(1, 3),)).tolist(), src.stats.bytes_read
    ([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], 24)
  """
  return backend_lib.default().evaluate(recipe, src, index)
