"""The main job: ``python -m paramreg_jax demo``.

A narrated walk through what the library does, on a small flax NNX model and 8 virtual CPU
devices, in well under a minute. Each capability adds a chapter.
"""

from __future__ import annotations

import tempfile
import textwrap
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from paramreg_jax._src import errors
from paramreg_jax._src import registry


def say(title: str, body: str = "") -> None:
  print(f"\n== {title}")
  if body:
    print(textwrap.indent(textwrap.dedent(body).strip(), "   "))


class MLP(nnx.Module):
  """A tiny model whose layer list we will edit (model surgery)."""

  def __init__(self, widths: tuple[int, ...], *, rngs: nnx.Rngs):
    self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(widths[:-1], widths[1:])])

  def __call__(self, x: jax.Array) -> jax.Array:
    for i, layer in enumerate(self.layers):
      x = layer(x)
      if i < len(self.layers) - 1:
        x = jax.nn.relu(x)
    return x


def chapter_registry(params: Any) -> registry.ParamRegistry:
  say(
    "1. Every parameter gets a canonical key from its tree path",
    "assign_keys() walks the parameter pytree and names each leaf by its path.",
  )
  reg, keys = registry.assign_keys(registry.ParamRegistry(), params)
  for key, leaf in zip(jax.tree.leaves(keys), jax.tree.leaves(params)):
    print(f"   {key:<24} {leaf.shape!s:<10} {leaf.dtype}")
  updated = jax.tree.map(lambda x: x * 0.5, params)
  reg2, _ = registry.assign_keys(reg, updated)
  print(f"   after an update step the registry is unchanged: {reg2 == reg}")

  say(
    "2. Positional identity is checked, never silently reset",
    "Restoring positional keys p:0.. and presenting leaves in another order is an error:",
  )
  saved = {
    k: reg.shape(registry.ParamId(i))
    for i, k in enumerate(
      registry.assign_keys(registry.ParamRegistry(), params, by="position")[0].keys()
    )
  }
  restored = registry.ParamRegistry.from_keys(saved)
  leaves = jax.tree.leaves(params)
  try:
    registry.assign_ids(restored, list(reversed(leaves)), by="position")
  except errors.OrderingContractError as e:
    print(
      textwrap.fill(
        f"OrderingContractError: {e}", 96, initial_indent="   ", subsequent_indent="     "
      )
    )
  return reg


def run(*, workdir: str | None = None) -> None:
  """Runs every chapter of the demo and prints what happens."""
  with tempfile.TemporaryDirectory() as tmp:
    del workdir, tmp  # checkpoints arrive with the checkpoint chapters
    say(
      "paramreg_jax demo",
      f"jax {jax.__version__} on {jax.device_count()} {jax.devices()[0].platform} devices",
    )
    model = MLP((4, 16, 2), rngs=nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    chapter_registry(params)
    x = jnp.ones((2, 4))
    print(f"\n   model output shape: {model(x).shape}")
    say("done")
