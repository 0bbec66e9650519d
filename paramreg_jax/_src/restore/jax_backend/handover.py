"""Built shards handed to their devices, window by window, and assembled into weights."""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

from paramreg_jax._src.restore.contract import Materialization
from paramreg_jax._src.restore.contract import MaterializationContext
from paramreg_jax._src.restore.jax_backend import reads as reads_lib
from paramreg_jax._src.restore.jax_backend import transfer


def grid_of(task: reads_lib.Task) -> transfer.DeviceSplit | None:
  """The layout of a weight built whole, when its shards form a grid of more than one block
  (it is then built in grid order), else None."""
  if task.whole is None:
    return None
  lay = transfer.layout(task.whole, task.program.shape)
  return lay if lay.grid is not None and math.prod(lay.grid) > 1 else None


class Puts:
  """Hands built shards to their devices, window by window, and assembles each weight.

  A weight whose shards are all built in one window becomes its global array in one batched
  transfer (:func:`transfer.assembler`). The shards of a weight spread over several windows
  are put on their devices as each window finishes (so no window's host buffers outlive it)
  and assembled at the end.
  """

  def __init__(self, contexts: list[MaterializationContext], tasks: list[reads_lib.Task]):
    self.contexts = contexts
    self.remaining = [0] * len(contexts)
    for task in tasks:
      self.remaining[task.weight] += 1
    self.arrays: list[jax.Array | None] = [None] * len(contexts)
    self.parts: dict[int, list[jax.Array]] = {}

  def hand_over(
    self, window: reads_lib.Window, builds: list[Any], transferring: list[jax.Array]
  ) -> list[jax.Array]:
    """Puts a built window on its devices once the previous window's transfers finished, so
    at most one window of host buffers waits on transfers; returns this window's arrays."""
    hosts: dict[int, dict[Any, np.ndarray]] = {}  # weight -> {device: its host buffer}
    for task, build in zip(window.tasks, builds):
      host = build if isinstance(build, np.ndarray) else build.result()
      if task.whole is not None:  # built whole: in grid order when it has a grid of blocks
        grid = grid_of(task)
        lay = grid or transfer.layout(task.whole, task.program.shape)
        buffers = lay.shards(host) if grid is not None else lay.views(host)
        hosts[task.weight] = dict(zip(lay.devices, buffers))
      else:
        hosts.setdefault(task.weight, {}).update(dict.fromkeys(task.devices, host))
      self.remaining[task.weight] -= 1
    jax.block_until_ready(transferring)
    out: list[jax.Array] = []
    spread_hosts: list[np.ndarray] = []
    spread_devices: list[Any] = []
    spread_owners: list[int] = []
    for weight, by_device in hosts.items():
      context = self.contexts[weight]
      if weight in self.parts or self.remaining[weight]:  # spread over windows
        for device, host in by_device.items():
          spread_hosts.append(host)
          spread_devices.append(device)
          spread_owners.append(weight)
        continue
      lay = transfer.layout(context.sharding, context.shape)
      make = transfer.assembler(context.shape, context.dtype, context.sharding)
      array = make(lay.devices, [by_device[d] for d in lay.devices])
      self.arrays[weight] = array
      out.append(array)
    if spread_hosts:
      put = jax.device_put(spread_hosts, spread_devices)
      for weight, array in zip(spread_owners, put):
        self.parts.setdefault(weight, []).append(array)
      out.extend(put)
    return out

  def weights(self) -> list[Materialization]:
    """Every weight's global array."""
    out = []
    for weight, context in enumerate(self.contexts):
      array = self.arrays[weight]
      if array is None:
        array = jax.make_array_from_single_device_arrays(
          tuple(context.shape), context.sharding, self.parts.pop(weight, [])
        )
      out.append(Materialization(context.key, array))
    return out
