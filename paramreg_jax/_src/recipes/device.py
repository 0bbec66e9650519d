"""Recipes as JAX functions: read on the source layout, transform on device.

A transposing (or reshaping) recipe evaluated per target shard would read strided columns of the
stored tensor. Instead, each source tensor is materialized sharded along its *leading* axis
(contiguous row blocks, each process reading only its devices' rows), and the recipe runs as a
jitted JAX function whose ``out_shardings`` is the target's; XLA moves the data between devices.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from paramreg_jax._src import devices as devices_lib
from paramreg_jax._src import selection as sel_lib
from paramreg_jax._src.recipes import ops


def wants_device_transform(recipe: ops.Recipe) -> bool:
  """Whether per-shard pushdown would read strided or redundant bytes (transpose, reshape, view)."""
  stack = [recipe]
  while stack:
    node = stack.pop()
    if isinstance(node, (ops.Transpose, ops.Reshape, ops.View)):
      return True
    stack.extend(node.children())
  return False


def leaves(recipe: ops.Recipe) -> tuple[ops.Source, ...]:
  """The distinct ``Source`` nodes of ``recipe`` in first-visit order."""
  out: list[ops.Source] = []
  stack = [recipe]
  while stack:
    node = stack.pop()
    if isinstance(node, ops.Source) and node not in out:
      out.append(node)
    stack.extend(reversed(node.children()))
  return tuple(out)


def _select(x: jax.Array, selection: sel_lib.Selection) -> jax.Array:
  if isinstance(selection, sel_lib.Full):
    return x
  if isinstance(selection, sel_lib.Range):
    return jax.lax.slice_in_dim(x, selection.start, selection.stop, axis=selection.axis)
  return jnp.take(x, np.asarray(selection.indices), axis=selection.axis)


def to_jax(recipe: ops.Recipe, inputs: dict[ops.Source, jax.Array]) -> jax.Array:
  """Evaluates ``recipe`` with ``jnp`` on already-materialized source leaves."""
  if isinstance(recipe, ops.Source):
    return inputs[recipe]
  args = [to_jax(c, inputs) for c in recipe.children()]
  if isinstance(recipe, ops.Select):
    return _select(args[0], recipe.selection)
  if isinstance(recipe, ops.Concatenate):
    return jnp.concatenate(args, axis=recipe.axis)
  if isinstance(recipe, ops.Stack):
    return jnp.stack(args, axis=recipe.axis)
  if isinstance(recipe, ops.Reshape):
    return jnp.reshape(args[0], recipe.shape)
  if isinstance(recipe, ops.Transpose):
    return jnp.transpose(args[0], recipe.axes)
  if isinstance(recipe, ops.Cast):
    return args[0].astype(recipe.dtype)
  if isinstance(recipe, ops.View):
    x = args[0]
    out_item, in_item = recipe.dtype.itemsize, x.dtype.itemsize
    flat = x.reshape(-1)
    if out_item == in_item:
      y = jax.lax.bitcast_convert_type(flat, recipe.dtype)
    elif out_item < in_item:
      y = jax.lax.bitcast_convert_type(flat, recipe.dtype).reshape(-1)
    else:
      y = jax.lax.bitcast_convert_type(flat.reshape(-1, out_item // in_item), recipe.dtype)
    return y.reshape(recipe.shape)
  if isinstance(recipe, ops.NegLog):
    return jnp.log(-args[0])
  if isinstance(recipe, ops.SubtractOne):
    return args[0] - jnp.asarray(1, args[0].dtype)
  raise TypeError(f"unknown recipe node {recipe!r}")


def auto(sharding: jax.sharding.Sharding) -> jax.sharding.Sharding:
  """The same placement on a mesh whose axes are ``Auto`` (explicit-mode meshes reject many
  reshapes/gathers without per-op output shardings; placement is all that matters here)."""
  if not isinstance(sharding, jax.sharding.NamedSharding):
    return sharding
  mesh = sharding.mesh
  auto_types = (jax.sharding.AxisType.Auto,) * len(mesh.axis_names)
  if tuple(getattr(mesh, "axis_types", auto_types)) == auto_types:
    return sharding
  plain = jax.sharding.Mesh(mesh.devices, mesh.axis_names, axis_types=auto_types)
  return jax.sharding.NamedSharding(plain, sharding.spec)


def row_sharding(target: jax.sharding.Sharding, shape: tuple[int, ...]) -> jax.sharding.Sharding:
  """A sharding of ``shape`` along its leading axis over ``target``'s mesh (contiguous reads).

  Uses the largest set of mesh axes whose size divides the leading dimension; falls back to
  the target's device set replicated (still read once per process) when nothing divides.
  """
  if not isinstance(target, jax.sharding.NamedSharding) or not shape:
    if isinstance(target, jax.sharding.NamedSharding):
      return jax.sharding.NamedSharding(target.mesh, jax.sharding.PartitionSpec())
    return target if not shape else jax.sharding.SingleDeviceSharding(next(iter(target.device_set)))
  mesh = auto(target).mesh  # type: ignore[attr-defined]
  names = list(mesh.axis_names)
  sizes = dict(zip(names, mesh.devices.shape))
  chosen: list[str] = []
  for name in sorted(names, key=lambda n: -sizes[n]):
    if shape[0] % (math.prod(sizes[c] for c in chosen) * sizes[name]) == 0:
      chosen.append(name)
  chosen = [n for n in names if n in chosen]  # mesh order
  spec = jax.sharding.PartitionSpec(
    tuple(chosen) if len(chosen) > 1 else (chosen[0] if chosen else None)
  )
  return jax.sharding.NamedSharding(mesh, spec)


def _anonymous(recipe: ops.Recipe, names: dict[ops.Source, ops.Source]) -> ops.Recipe:
  """``recipe`` with its source keys replaced by positional placeholders (same structure ->
  same compiled function, whatever the checkpoint keys)."""
  if isinstance(recipe, ops.Source):
    return names[recipe]
  fields = {}
  for f in dataclasses.fields(recipe):  # type: ignore[arg-type]
    value = getattr(recipe, f.name)
    if isinstance(value, ops.Recipe):
      value = _anonymous(value, names)
    elif isinstance(value, tuple) and value and isinstance(value[0], ops.Recipe):
      value = tuple(_anonymous(v, names) for v in value)
    fields[f.name] = value
  return type(recipe)(**fields)


def compiled(recipe: ops.Recipe, sources: tuple[ops.Source, ...], out_sharding: Any) -> Any:
  """A jitted function from the source leaves to the recipe's value.

  Cached per recipe *structure*: 64 layers' ``transpose(source(k), (1, 0))`` share one.
  """
  names = {s: ops.Source(f"${i}", s.selection) for i, s in enumerate(sources)}
  return _compiled(_anonymous(recipe, names), tuple(names[s] for s in sources), out_sharding)


@functools.lru_cache(maxsize=256)
def _compiled(recipe: ops.Recipe, sources: tuple[ops.Source, ...], out_sharding: Any) -> Any:
  def fn(*arrays: jax.Array) -> jax.Array:
    return to_jax(recipe, dict(zip(sources, arrays)))

  jitted = jax.jit(fn, out_shardings=auto(out_sharding))
  if auto(out_sharding) is out_sharding:
    return jitted
  return lambda *arrays: jax.device_put(devices_lib.settle(jitted(*arrays)), out_sharding)
