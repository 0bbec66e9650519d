"""The registry's storage (columns) and what one slot knows: its shape, element count, dtype,
and how two accounts of them merge or conflict."""

from __future__ import annotations

import math
from typing import Any
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from paramreg_jax._src import errors


class Slot(NamedTuple):
  """One slot, as seen by queries and error messages."""

  key: str
  name: str | None
  shape: tuple[int, ...] | None
  numel: int | None
  dtype: Any


class Columns(NamedTuple):
  """The registry's storage: one tuple per field, ``ParamId(i)`` indexes position ``i``.

  ``numels[i]`` is only meaningful while ``shapes[i]`` is unknown (a slot restored from an
  element count); otherwise the element count is the product of the shape.
  """

  keys: tuple[str, ...]
  names: tuple[str | None, ...]
  shapes: tuple[tuple[int, ...] | None, ...]
  numels: tuple[int | None, ...]
  dtypes: tuple[Any, ...]


EMPTY = Columns((), (), (), (), ())


def fmt_spec(shape: tuple[int, ...] | None, numel: int | None, dtype: Any) -> str:
  if shape is not None:
    text = str(tuple(shape))
  elif numel is not None:
    text = f"{numel} elements"
  else:
    text = "unknown shape"
  return text if dtype is None else f"{text} {np.dtype(dtype).name}"


def leaf_spec(leaf: Any, *, where: str = "leaf") -> tuple[tuple[int, ...], np.dtype]:
  """``(shape, dtype)`` of an array-like leaf (array, ``ShapeDtypeStruct``, Python scalar)."""
  shape = getattr(leaf, "shape", None)
  dtype = getattr(leaf, "dtype", None)
  if shape is not None and dtype is not None:
    try:
      return tuple(shape), np.dtype(dtype)
    except TypeError:  # extended dtypes (PRNG keys) are not numpy dtypes
      return tuple(shape), dtype
  if isinstance(leaf, (bool, int, float, complex, np.generic)):
    return (), np.dtype(jnp.result_type(leaf))
  raise TypeError(
    f"{where}: a parameter leaf must have .shape and .dtype (an array or a "
    f"jax.ShapeDtypeStruct), got {type(leaf).__name__}; remove it from the tree or make it "
    "an array"
  )


def merge(slot: Slot, shape: Any, numel: Any, dtype: Any, *, restoring: bool) -> Slot:
  """Fills in what ``slot`` does not know; raises when known facts disagree."""
  bad = (
    (shape is not None and slot.shape is not None and shape != slot.shape)
    or (numel is not None and slot.numel is not None and numel != slot.numel)
    or (dtype is not None and slot.dtype is not None and dtype != slot.dtype)
  )
  if bad:
    recorded = fmt_spec(slot.shape, slot.numel, slot.dtype)
    offered = fmt_spec(shape, numel, dtype)
    if slot.name is None and not restoring:
      raise errors.OrderingContractError(
        f"{slot.key}: positional slot {slot.key[2:]} records {recorded}, but the leaf at "
        f"flatten position {slot.key[2:]} is {offered}. Positional identity is the flatten "
        "order: the resuming run must present the same leaves in the same order as the run "
        "that wrote the checkpoint (ordering contract); register by='name' to make resume "
        "order-independent"
      )
    raise errors.ShapeMismatchError(
      f"{slot.key}: the slot records {recorded}, but {offered} was offered; the parameter "
      "changed shape or dtype. Re-initialise its state (reconcile(..., "
      "on_shape_mismatch='init')) or fix the model"
    )
  new_shape = slot.shape if slot.shape is not None else shape
  new_numel = slot.numel if slot.numel is not None else numel
  new_dtype = slot.dtype if slot.dtype is not None else dtype
  if (new_shape, new_numel, new_dtype) == (slot.shape, slot.numel, slot.dtype):
    return slot
  return slot._replace(shape=new_shape, numel=new_numel, dtype=new_dtype)


def parse_size(size: Any, key: str) -> tuple[tuple[int, ...] | None, int | None, Any]:
  """``(shape, numel, dtype)`` from ``None``, an int, a shape tuple or a shaped object."""
  if size is None:
    return None, None, None
  if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
    if size < 0:
      raise errors.MalformedKeyError(f"{key}: element count must be >= 0, got {size}")
    return None, (None if size == 0 else int(size)), None  # an element count of 0 means unknown
  if isinstance(size, (tuple, list)) and all(isinstance(d, (int, np.integer)) for d in size):
    shape = tuple(int(d) for d in size)
    return shape, math.prod(shape), None
  if hasattr(size, "shape"):
    shape = tuple(size.shape)
    dtype = getattr(size, "dtype", None)
    return shape, math.prod(shape), None if dtype is None else np.dtype(dtype)
  raise TypeError(
    f"{key}: expected None, an element count, a shape tuple or an array-like, got "
    f"{type(size).__name__}"
  )
