"""The main job: ``python -m paramreg_jax demo``.

A narrated walk through the library on a small flax NNX model and 8 virtual CPU devices, in well
under a minute: canonical keys, a keyed optimizer, an orbax ``CheckpointManager`` save, model
surgery (a layer added, a module renamed), a restore into a different sharded mesh through
rename rules, the optimizer state reconciled by key, and training resumed.
"""

from __future__ import annotations

import tempfile
import textwrap
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from paramreg_jax._src import devices as devices_lib
from paramreg_jax._src import errors
from paramreg_jax._src.optim import keyed as keyed_lib
from paramreg_jax._src.optim import reconcile as reconcile_lib
from paramreg_jax._src.optim import state_access
from paramreg_jax._src.registry import assign
from paramreg_jax._src.registry.ids import ParamId
from paramreg_jax._src.registry.registry import ParamRegistry
from paramreg_jax._src.restore import bind as bind_lib
from paramreg_jax._src.restore import materialize as materialize_lib
from paramreg_jax._src.restore.planning import plan_restore
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource
from paramreg_jax._src.sources.orbax import OrbaxSource


def say(title: str, body: str = "") -> None:
  print(f"\n== {title}")
  if body:
    print(textwrap.indent(textwrap.dedent(body).strip(), "   "))


def indent(text: str) -> str:
  return textwrap.indent(text, "   ")


class Net(nnx.Module):
  """encoder -> hidden layers -> head; v2 adds a hidden layer and renames the head."""

  def __init__(self, hidden: int = 1, head: str = "head", *, rngs: nnx.Rngs):
    self.encoder = nnx.Linear(4, 16, rngs=rngs)
    self.hidden = nnx.List([nnx.Linear(16, 16, rngs=rngs) for _ in range(hidden)])
    setattr(self, head, nnx.Linear(16, 2, rngs=rngs))
    self.head_name = head

  def __call__(self, x: jax.Array) -> jax.Array:
    x = jax.nn.relu(self.encoder(x))
    for layer in self.hidden:
      x = x + 0.5 * jax.nn.relu(layer(x))
    return getattr(self, self.head_name)(x)


X = jnp.linspace(-1.0, 1.0, 64 * 4).reshape(64, 4)
Y = jnp.stack([jnp.sin(3 * X.sum(1)), jnp.cos(2 * X.sum(1))], axis=1)


def train(graphdef: Any, params: Any, tx: Any, state: Any, steps: int) -> tuple[Any, Any, float]:
  @jax.jit
  def step(params: Any, state: Any) -> tuple[Any, Any, jax.Array]:
    loss, grads = jax.value_and_grad(lambda p: jnp.mean((nnx.merge(graphdef, p)(X) - Y) ** 2))(
      params
    )
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  loss = jnp.inf
  for _ in range(steps):
    # settle: one sharded step in flight at a time (XLA:CPU can deadlock otherwise; see the
    # docs/howto/cpu_devices.md). On accelerators it is a no-op.
    params, state, loss = devices_lib.settle(step(params, state))
  return params, state, float(loss)


def shard(params: Any, mesh: jax.sharding.Mesh, axis: str) -> Any:
  """Kernels split along their output axis over ``axis`` where it divides; the rest replicated."""

  def place(x: Any) -> Any:
    spec = P(None, axis) if x.ndim == 2 and x.shape[1] % mesh.shape[axis] == 0 else P()
    return NamedSharding(mesh, spec)

  return jax.tree.map(place, params)


def chapter_keys(params: Any) -> None:
  say("1. Every parameter gets a canonical key from its tree path")
  reg, keys = assign.assign_keys(ParamRegistry(), params)
  for key, leaf in zip(jax.tree.leaves(keys), jax.tree.leaves(params)):
    print(f"   {key:<24} {leaf.shape!s:<10} {leaf.dtype}")
  reg2, _ = assign.assign_keys(reg, jax.tree.map(lambda x: x * 0.5, params))
  print(f"   after an update the registry is unchanged (same ids): {reg2 == reg}")

  say(
    "2. Positional identity is checked, never silently reset",
    "A tree without stable names is keyed by flatten position instead (by='position'):",
  )
  positional, _ = assign.assign_keys(ParamRegistry(), params, by="position")
  saved = {k: positional.shape(ParamId(i)) for i, k in enumerate(positional.keys())}
  print("   " + ", ".join(f"{k} {shape}" for k, shape in list(saved.items())[:3]) + ", ...")
  print(
    "   A resumed run that presents the same leaves in another order is refused before any id\n"
    "   is assigned (the error below is the point: positional keys never silently re-pair):"
  )
  try:
    assign.assign_ids(
      ParamRegistry.from_keys(saved),
      list(reversed(jax.tree.leaves(params))),
      by="position",
    )
  except errors.OrderingContractError as e:
    print(
      textwrap.fill(
        f"OrderingContractError: {e}", 96, initial_indent="   ", subsequent_indent="     "
      )
    )


def run(*, workdir: str | None = None) -> None:
  """Runs every chapter of the demo and prints what happens."""
  with tempfile.TemporaryDirectory() as tmp:
    workdir = workdir or tmp
    devices = np.array(jax.devices())
    say(
      "paramreg_jax demo", f"jax {jax.__version__} on {len(devices)} {devices[0].platform} devices"
    )
    v1 = Net(hidden=1, head="head", rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(v1, nnx.Param)
    chapter_keys(params)
    params, tx, manager = chapter_train(graphdef, params, devices, workdir)
    plan, src, shardings, mesh42, graphdef2 = chapter_surgery(devices, workdir)
    new_params = chapter_bind(plan, src, params, shardings, mesh42)
    chapter_resume(manager, tx, new_params, graphdef2)
    say("done", "Everything above is in the docs (docs/) and the notebooks.")


def chapter_train(graphdef: Any, params: Any, devices: np.ndarray, workdir: str) -> tuple:
  """3: a keyed optimizer trains on 8 devices; params and its state are saved with orbax."""
  import orbax.checkpoint as ocp

  say(
    "3. Train with a keyed optimizer, save params + optimizer state with orbax",
    "keyed(adamw): optax's own state and updates, bit for bit; parameter keys come from paths.",
  )
  mesh8 = jax.sharding.Mesh(devices.reshape(8), ("x",))
  params = jax.device_put(params, shard(params, mesh8, "x"))
  tx = keyed_lib.keyed(optax.adamw(2e-2))
  params, state, loss = train(graphdef, params, tx, tx.init(params), 80)
  print(f"   80 steps on mesh {dict(mesh8.shape)}, loss {loss:.4f}")
  held = sorted(state_access.state_keys(state, params))
  print(f"   adam moments held for: {', '.join(held[:3])}, ... ({len(held)} keys, from paths)")
  manager = ocp.CheckpointManager(f"{workdir}/ckpts", item_names=("params", "opt"))
  manager.save(
    80,
    args=ocp.args.Composite(params=ocp.args.StandardSave(params), opt=ocp.args.StandardSave(state)),
  )
  manager.wait_until_finished()
  print(f"   CheckpointManager step 80 -> {workdir}/ckpts (items: params, opt)")
  return params, tx, manager


def chapter_surgery(devices: np.ndarray, workdir: str) -> tuple:
  """4: a changed model, described abstractly on a new mesh, planned from the checkpoint."""
  say(
    "4. Model surgery: add a hidden layer, rename 'head' to 'readout'",
    "The new model is only described abstractly (nnx.eval_shape), on a (4, 2) mesh.",
  )
  mesh42 = jax.sharding.Mesh(devices.reshape(4, 2), ("data", "model"))
  v2_abstract = nnx.eval_shape(lambda: Net(hidden=2, head="readout", rngs=nnx.Rngs(1)))
  graphdef2, abstract = nnx.split(v2_abstract, nnx.Param)
  shardings = shard(abstract, mesh42, "model")
  target = jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings
  )
  src = OrbaxSource(f"{workdir}/ckpts", item="params")
  try:
    plan_restore(target, src)
  except errors.RestorePlanError as e:
    print("   a naive restore is refused before reading anything:")
    for p in e.problems:
      print(f"     - {p}")
  rename = [(r"head/(.*)", r"readout/\1"), (r"(.*)", r"\1")]
  plan = plan_restore(target, src, rename=rename, exclude=["hidden/1/**"])
  print("   with rename rules (head/* -> readout/*) and the new layer excluded:")
  print(indent(str(plan)))
  print(f"   payload bytes read while planning: {src.stats.bytes_read}")
  return plan, src, shardings, mesh42, graphdef2


def chapter_bind(plan: Any, src: CheckpointSource, params: Any, shardings: Any, mesh42: Any) -> Any:
  """5: the plan materialized into the new mesh and bound all or nothing."""
  say("5. Materialize into the new mesh, then bind all or nothing")
  fresh = nnx.state(Net(hidden=2, head="readout", rngs=nnx.Rngs(1)), nnx.Param)
  fresh = jax.device_put(fresh, shardings)  # the new layer keeps this initialisation
  unit = materialize_lib.materialize(plan)
  new_params = bind_lib.bind(fresh, unit, exclude=["hidden/1/**"])
  kernel = new_params["readout"]["kernel"].value
  print(
    f"   {len(unit)} weights built, {src.stats.bytes_read} bytes read; readout/kernel on "
    f"{kernel.sharding.spec} over mesh {dict(mesh42.shape)}"
  )
  same = bool(jnp.all(kernel == params["head"]["kernel"].value))
  print(f"   readout/kernel equals the trained head/kernel: {same}")
  return new_params


def chapter_resume(manager: Any, tx: Any, new_params: Any, graphdef2: Any) -> None:
  """6: the optimizer state restored without a target and reconciled by key."""
  import orbax.checkpoint as ocp

  say("6. Resume the optimizer: restore without a target, reconcile by key")
  raw = manager.restore(80, args=ocp.args.Composite(opt=ocp.args.StandardRestore()))["opt"]
  key_rename = {f"n:head/{n}": f"n:readout/{n}" for n in ("kernel", "bias")}
  state, report = reconcile_lib.reconcile(tx, raw, new_params, rename=key_rename)
  print(indent(str(report)))
  new_params, state, loss = train(graphdef2, new_params, tx, state, 60)
  print(f"   60 more steps on the bigger model, loss {loss:.4f}")
  manager.close()
