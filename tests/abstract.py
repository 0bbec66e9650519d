"""The tests' abstract parameters: ``sds(2, 3)`` or ``sds((2, 3))`` is a float32
``jax.ShapeDtypeStruct`` (``dtype=`` and ``sharding=`` otherwise)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def sds(*shape: Any, dtype: Any = np.float32, sharding: Any = None) -> jax.ShapeDtypeStruct:
  if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
    shape = tuple(shape[0])
  return jax.ShapeDtypeStruct(tuple(int(d) for d in shape), dtype, sharding=sharding)
