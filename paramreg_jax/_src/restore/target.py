"""Restore targets: the parameter slots of a pytree, abstract or concrete, with shardings.

A target is any pytree whose array-like leaves (``jax.Array``, ``jax.ShapeDtypeStruct``, numpy
arrays) are parameter slots; other leaves (static values, callables) are left alone. A flax NNX
module stands for ``nnx.state(module, nnx.Param)``.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import jax
import numpy as np

from paramreg_jax._src.registry import assign as registry_lib
from paramreg_jax._src.registry import keys as keys_lib


@dataclasses.dataclass(frozen=True)
class TargetSlot:
  """One parameter slot of a target: where it is and what it must receive."""

  key: str
  name: str
  position: int
  shape: tuple[int, ...]
  dtype: np.dtype
  sharding: jax.sharding.Sharding


def default_sharding() -> jax.sharding.Sharding:
  return jax.sharding.SingleDeviceSharding(jax.devices()[0])


def is_slot(leaf: Any) -> bool:
  return hasattr(leaf, "shape") and hasattr(leaf, "dtype") and not isinstance(leaf, (str, bytes))


def as_state(target: Any) -> Any:
  """An NNX module's ``Param`` state; anything else unchanged."""
  nnx = sys.modules.get("flax.nnx")  # not imported -> the target cannot be an NNX module
  if nnx is not None and isinstance(target, nnx.Module):
    return nnx.state(target, nnx.Param)
  return target


def transposed_convs(target: Any) -> dict[str, bool]:
  """``{kernel name: transpose_kernel}`` of every ``nnx.ConvTranspose`` in an NNX module
  target (its flag says how it applies its kernel; a parameter tree does not hold it), else
  ``{}``."""
  nnx = sys.modules.get("flax.nnx")
  if nnx is None or not isinstance(target, nnx.Module):
    return {}
  out = {}
  for path, node in nnx.iter_graph(target):
    if isinstance(node, nnx.ConvTranspose):
      keys = [
        jax.tree_util.SequenceKey(p) if isinstance(p, int) else jax.tree_util.DictKey(p)
        for p in (*path, "kernel")
      ]
      out[keys_lib.path_to_name(keys)] = bool(node.transpose_kernel)
  return out


def slots(target: Any) -> tuple[list[Any], Any, list[TargetSlot]]:
  """``(leaves, treedef, slots)`` of a target; every name collision is raised at once."""
  flat, treedef = jax.tree_util.tree_flatten_with_path(as_state(target))
  leaves = [leaf for _, leaf in flat]
  found: list[TargetSlot] = []
  names: list[str] = []
  paths = []
  at = [i for i, (_, leaf) in enumerate(flat) if is_slot(leaf)]
  for i, name in zip(at, keys_lib.paths_to_names([flat[i][0] for i in at])):
    path, leaf = flat[i]
    names.append(name)
    paths.append(path)
    sharding = getattr(leaf, "sharding", None)
    if not isinstance(sharding, jax.sharding.Sharding):
      sharding = default_sharding()
    found.append(
      TargetSlot(
        keys_lib.NAMED_KEY_PREFIX + name, name, i, tuple(leaf.shape), np.dtype(leaf.dtype), sharding
      )
    )
  if len(set(names)) != len(names):
    registry_lib.raise_collisions(tuple(names), paths)
  return leaves, treedef, found


def describe_sharding(sharding: Any) -> str:
  spec = getattr(sharding, "spec", None)
  mesh = getattr(sharding, "mesh", None)
  if spec is not None and mesh is not None:
    axes = dict(zip(mesh.axis_names, mesh.devices.shape))
    return f"{spec} on mesh {axes}"
  if isinstance(sharding, jax.sharding.SingleDeviceSharding):
    return f"single device {next(iter(sharding.device_set))}"
  return type(sharding).__name__
