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
import optax
import orbax.checkpoint as ocp
from flax import nnx

from paramreg_jax._src import errors
from paramreg_jax._src import keyed as keyed_lib
from paramreg_jax._src import reconcile as reconcile_lib
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


def train(model: MLP, tx: Any, state: Any, steps: int) -> tuple[Any, float]:
  """A few jitted SGD steps on a fixed regression batch; returns the new state and the loss."""
  graphdef, params = nnx.split(model, nnx.Param)[:2]
  x = jnp.linspace(-1.0, 1.0, 32 * 4).reshape(32, 4)
  y = jnp.stack([jnp.sin(x.sum(1)), jnp.cos(x.sum(1))], axis=1)

  @jax.jit
  def step(params, state):
    def loss_fn(p):
      out = nnx.merge(graphdef, p, nnx.state(model, nnx.Not(nnx.Param)))(x)
      return jnp.mean((out - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  loss = jnp.inf
  for _ in range(steps):
    params, state, loss = step(params, state)
  nnx.update(model, params)
  return state, float(loss)


def chapter_keyed(workdir: str) -> None:
  say(
    "3. Optimizer state keyed by parameter, surviving model surgery",
    """
    keyed(tx) wraps any optax transformation; its moments are stored by canonical key
    and its updates are bit-identical to tx's.
    """,
  )
  tx = keyed_lib.keyed(optax.adamw(3e-2))
  model = MLP((4, 16, 2), rngs=nnx.Rngs(0))
  state = tx.init(nnx.state(model, nnx.Param))
  state, loss = train(model, tx, state, 60)
  print(f"   trained 60 steps, loss {loss:.4f}; adam moments for: {sorted(state[0].mu)[:2]} ...")
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(f"{workdir}/opt", state)
  ckpt.wait_until_finished()
  print(f"   saved the optimizer state with orbax to {workdir}/opt")

  say(
    "4. Model surgery: insert a hidden layer, then resume",
    "The checkpoint is restored without a target (the old model is gone) and reconciled by key.",
  )
  bigger = MLP((4, 16, 16, 2), rngs=nnx.Rngs(1))
  # Keep the trained first layer; the old output layer (layers/1) becomes layers/2.
  old = nnx.state(model, nnx.Param)
  new = nnx.state(bigger, nnx.Param)
  new["layers"][0] = old["layers"][0]
  new["layers"][2] = old["layers"][1]
  nnx.update(bigger, new)
  raw = ckpt.restore(f"{workdir}/opt")
  rename = {f"n:layers/1/{leaf}": f"n:layers/2/{leaf}" for leaf in ("kernel", "bias")}
  try:
    reconcile_lib.reconcile(tx, raw, new)
  except errors.ReconcileError as e:
    first = str(e).splitlines()
    print("   without a rename, the moved layer's moments do not fit its new slot:")
    print("\n".join("     " + line for line in first[:4]))
  state, report = reconcile_lib.reconcile(tx, raw, new, rename=rename)
  print("   with rename={'n:layers/1/*': 'n:layers/2/*'}:")
  print(textwrap.indent(str(report), "   "))
  state, loss = train(bigger, tx, state, 40)
  print(f"   resumed: 40 more steps on the bigger model, loss {loss:.4f}")


def run(*, workdir: str | None = None) -> None:
  """Runs every chapter of the demo and prints what happens."""
  with tempfile.TemporaryDirectory() as tmp:
    workdir = workdir or tmp
    say(
      "paramreg_jax demo",
      f"jax {jax.__version__} on {jax.device_count()} {jax.devices()[0].platform} devices",
    )
    model = MLP((4, 16, 2), rngs=nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    chapter_registry(params)
    chapter_keyed(workdir)
    say("done")
