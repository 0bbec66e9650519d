"""``ParamId``: the dense, stable index of a registry slot (interned)."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True, order=True, slots=True)
class ParamId:
  """The dense, stable index of one registry slot.

  Frozen, hashable and ordered by ``index``; the registry hands them out (:func:`assign_ids`).

  Attributes:
    index: the slot's position in the registry (``0``, ``1``, ... in registration order).

  Examples:
    >>> from paramreg_jax import ParamId
    >>> ParamId(3).index, ParamId(1) < ParamId(2)
    (3, True)
  """

  index: int

  def __repr__(self) -> str:
    return f"ParamId({self.index})"


_PARAM_IDS: list[ParamId] = []


def param_ids(indices: Any) -> list[ParamId]:
  """Interned ``ParamId`` objects for ``indices`` (ids are immutable, so they are shared)."""
  top = max(indices, default=-1)
  if top >= len(_PARAM_IDS):
    _PARAM_IDS.extend(ParamId(i) for i in range(len(_PARAM_IDS), top + 1))
  get = _PARAM_IDS.__getitem__
  return list(map(get, indices))
