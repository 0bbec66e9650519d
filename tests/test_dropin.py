"""keyed() is a drop-in: the loops users write with plain optax work unchanged, bit for bit.

Each test runs the same loop with ``tx`` and with ``keyed(tx)`` and compares the results
exactly; identity (keys, the update-time check, reconcile) must still work in each loop.
"""

import pathlib
import re

import chex
import equinox as eqx
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from flax.training import train_state
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import paramreg_jax as prj

# flax 0.12.7 added nnx.as_pure (nnx.pure before it); both are supported (docs/versions.md)
as_pure = getattr(nnx, "as_pure", None) or nnx.pure

DATA = pathlib.Path(__file__).parent / "data"


def both(make):
  """The plain transformation and its keyed twin."""
  return make(), prj.keyed(make())


# --- flax NNX ----------------------------------------------------------------------------------


class MLP(nnx.Module):
  def __init__(self, widths, *, rngs):
    self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(widths[:-1], widths[1:])])

  def __call__(self, x):
    for layer in self.layers[:-1]:
      x = jax.nn.relu(layer(x))
    return self.layers[-1](x)


X = jnp.linspace(-1.0, 1.0, 32).reshape(8, 4)
Y = jnp.sin(X.sum(1, keepdims=True))


def nnx_loss(model):
  return jnp.mean((model(X) - Y) ** 2)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "nnx.jit"])
def test_nnx_optimizer(jit):
  results = []
  for tx in both(lambda: optax.adamw(1e-2)):
    model = MLP((4, 8, 1), rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

    def step(model, optimizer):
      optimizer.update(model, nnx.grad(nnx_loss)(model))

    step = nnx.jit(step) if jit else step
    for _ in range(4):
      step(model, optimizer)
    results.append((nnx.state(model, nnx.Param), nnx.state(optimizer)))
  chex.assert_trees_all_equal(results[0], results[1])


def trained_and_saved(path, steps=3):
  """A small model trained with a keyed NNX optimizer whose state orbax saved at ``path``."""
  model = MLP((4, 8, 1), rngs=nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, prj.keyed(optax.adam(1e-2)), wrt=nnx.Param)
  for _ in range(steps):
    optimizer.update(model, nnx.grad(nnx_loss)(model))
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(path, nnx.state(optimizer))
  ckpt.wait_until_finished()
  return model, optimizer, ckpt


def test_nnx_optimizer_state_round_trips_through_orbax(tmp_path):
  model, optimizer, ckpt = trained_and_saved(tmp_path / "opt")
  abstract = nnx.state(
    nnx.eval_shape(lambda: nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param))
  )
  restored = ckpt.restore(tmp_path / "opt", abstract)
  chex.assert_trees_all_equal(as_pure(restored), as_pure(nnx.state(optimizer)))


def test_nnx_model_surgery_then_the_one_liner(tmp_path):
  old, old_opt, ckpt = trained_and_saved(tmp_path / "opt")
  restored = ckpt.restore(tmp_path / "opt")  # no target: the old model is gone
  assert set(restored["opt_state"]["0"]["mu"]["layers"]["0"]["kernel"]) == {"value"}

  new = MLP((4, 8, 8, 1), rngs=nnx.Rngs(1))  # a layer inserted before the output layer
  state = nnx.state(new, nnx.Param)
  state["layers"][0] = nnx.state(old, nnx.Param)["layers"][0]
  nnx.update(new, state)
  optimizer = nnx.Optimizer(new, prj.keyed(optax.adam(1e-2)), wrt=nnx.Param)
  report = prj.reconcile_optimizer(
    optimizer,
    new,
    restored,
    rename={"n:layers/1/kernel": "n:layers/2/kernel", "n:layers/1/bias": "n:layers/2/bias"},
  )
  assert report.kept == (
    "n:layers/0/bias",
    "n:layers/0/kernel",
    "n:layers/2/bias",
    "n:layers/2/kernel",
  )
  assert report.added == ("n:layers/1/bias", "n:layers/1/kernel")
  mu_old = as_pure(nnx.state(old_opt))["opt_state"][0].mu
  mu_new = as_pure(nnx.state(optimizer))["opt_state"][0].mu
  chex.assert_trees_all_equal(mu_new["layers"][2], mu_old["layers"][1])
  chex.assert_trees_all_equal(mu_new["layers"][1]["kernel"], jnp.zeros((8, 8)))
  assert int(optimizer.step.get_value()) == 3
  optimizer.update(new, nnx.grad(nnx_loss)(new))  # training goes on


def test_reconcile_understands_a_restored_nnx_optimizer_state(tmp_path):
  model, optimizer, ckpt = trained_and_saved(tmp_path / "opt", steps=1)
  tx = optimizer.tx
  raw = ckpt.restore(tmp_path / "opt")  # {'opt_state': {'0': {'mu': {...{'value': x}}}}, ...}
  params = as_pure(nnx.state(model, nnx.Param))
  state, report = prj.reconcile(tx, raw, params)
  assert not report.changed and len(report.kept) == 4
  assert jax.tree.structure(state) == jax.tree.structure(tx.init(params))  # optax's own form
  live = as_pure(nnx.state(optimizer))["opt_state"]  # (NNX keeps tuples as int-keyed States)
  chex.assert_trees_all_equal(jax.tree.leaves(state), jax.tree.leaves(live))


# --- sharding metadata ---------------------------------------------------------------------------


class Dense(nn.Module):
  @nn.compact
  def __call__(self, x):
    kernel = self.param(
      "kernel", nn.with_partitioning(nn.initializers.lecun_normal(), (None, "model")), (4, 8)
    )
    return x @ kernel


def test_linen_partitioning_metadata_reaches_the_moments(devices):
  boxed = jax.eval_shape(lambda: Dense().init(jax.random.key(0), X))["params"]
  plain, keyed_tx = both(lambda: optax.adam(1e-2))
  specs = [nn.get_partition_spec(jax.eval_shape(t.init, boxed)) for t in (plain, keyed_tx)]
  assert specs[0] == specs[1]
  assert specs[1][0].mu["kernel"] == P(None, "model")


def test_nnx_sharding_metadata_reaches_the_moments(devices):
  mesh = jax.sharding.Mesh(np.array(devices).reshape(4, 2), ("data", "model"))
  with jax.set_mesh(mesh):
    model = nnx.Linear(
      4,
      8,
      kernel_init=nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, "model")),
      rngs=nnx.Rngs(0),
    )
    optimizer = nnx.Optimizer(model, prj.keyed(optax.adam(1e-2)), wrt=nnx.Param)
    spec = nnx.get_partition_spec(nnx.state(optimizer))
  assert spec["opt_state"][0].mu["kernel"].get_value() == P(None, "model")


def test_map_params_derives_state_shardings_for_jit_init(devices):
  mesh = jax.sharding.Mesh(np.array(devices), ("x",))
  params = {"w": jnp.ones((8, 16)), "b": jnp.ones(16)}
  replicated = NamedSharding(mesh, P())
  for tx in both(lambda: optax.adam(1e-2)):
    shardings = optax.tree.map_params(  # optax's documented recipe for state shardings
      tx,
      lambda p: NamedSharding(mesh, P(None, "x")) if p.ndim == 2 else replicated,
      jax.eval_shape(tx.init, params),
      transform_non_params=lambda _: replicated,
    )
    state = jax.jit(tx.init, out_shardings=shardings)(params)
    assert state[0].mu["w"].sharding.spec == P(None, "x")
    assert state[0].count.sharding.spec == P()


# --- linen TrainState ----------------------------------------------------------------------------


def test_linen_train_state_jit_orbax_and_serialization(tmp_path):
  params = Dense().init(jax.random.key(0), X)["params"]
  params = nn.meta.unbox(params)
  states = []
  for tx in both(lambda: optax.sgd(1e-2, momentum=0.9)):
    ts = train_state.TrainState.create(apply_fn=Dense().apply, params=params, tx=tx)

    @jax.jit
    def step(ts):
      grads = jax.grad(lambda p: jnp.mean(ts.apply_fn({"params": p}, X) ** 2))(ts.params)
      return ts.apply_gradients(grads=grads)

    for _ in range(3):
      ts = step(ts)
    states.append(ts)
  chex.assert_trees_all_equal(states[0].params, states[1].params)
  chex.assert_trees_all_equal(states[0].opt_state, states[1].opt_state)
  keyed_ts = states[1]
  data = flax.serialization.to_bytes(keyed_ts)
  back = flax.serialization.from_bytes(keyed_ts.replace(step=0), data)
  chex.assert_trees_all_equal(back.opt_state, keyed_ts.opt_state)
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(tmp_path / "ts", keyed_ts)
  ckpt.wait_until_finished()
  restored = ckpt.restore(tmp_path / "ts", jax.eval_shape(lambda: keyed_ts))
  chex.assert_trees_all_equal(restored.opt_state, keyed_ts.opt_state)


# --- equinox ---------------------------------------------------------------------------------------


def test_equinox_filtered_params_with_none_leaves():
  model = eqx.nn.MLP(4, 1, 8, 2, key=jax.random.key(0))
  params = eqx.filter(model, eqx.is_inexact_array)
  assert None in jax.tree.leaves(params, is_leaf=lambda x: x is None)
  results = []
  for tx in both(lambda: optax.adam(1e-2)):
    m, state = model, tx.init(params)

    @eqx.filter_jit
    def step(m, state):
      grads = eqx.filter_grad(lambda m: jnp.mean((jax.vmap(m)(X) - Y) ** 2))(m)
      updates, state = tx.update(grads, state, eqx.filter(m, eqx.is_inexact_array))
      return eqx.apply_updates(m, updates), state

    for _ in range(3):
      m, state = step(m, state)
    results.append((eqx.filter(m, eqx.is_inexact_array), state))
  chex.assert_trees_all_equal(results[0], results[1])
  assert "n:layers/0/weight" in prj.state_keys(results[1][1], params)


# --- prefix masks and labels ------------------------------------------------------------------------


PARAMS = {"enc": {"w": jnp.ones((3, 4)), "b": jnp.zeros(4)}, "head": {"w": jnp.ones((4, 2))}}


def test_prefix_masks_and_labels_are_keyed():
  masked = prj.keyed(optax.masked(optax.adam(1e-2), {"enc": True, "head": False}))
  state = masked.init(PARAMS)
  assert prj.state_keys(state, PARAMS) == {"n:enc/w", "n:enc/b"}
  grown = dict(PARAMS, enc={"w": jnp.ones((5, 4)), "b": jnp.zeros(4)})
  with pytest.raises(
    prj.StateMismatchError, match=re.escape("n:enc/w: state inner_state/0/mu was built")
  ):
    masked.update(grown, state, grown)
  renamed = {"encoder": PARAMS["enc"], "head": PARAMS["head"]}
  new = prj.keyed(optax.masked(optax.adam(1e-2), {"encoder": True, "head": False}))
  again, report = prj.reconcile(
    new, state, renamed, rename={"n:enc/w": "n:encoder/w", "n:enc/b": "n:encoder/b"}
  )
  assert report.kept == ("n:encoder/b", "n:encoder/w") and not report.added
  chex.assert_trees_all_equal(again.inner_state[0].mu["encoder"], state.inner_state[0].mu["enc"])

  labels = {"enc": "train", "head": "frozen"}
  tx = optax.partition({"train": optax.adam(1e-2), "frozen": optax.set_to_zero()}, labels)
  plain_state, keyed_state = (t.init(PARAMS) for t in (tx, prj.keyed(tx)))
  chex.assert_trees_all_equal(plain_state, keyed_state)
  assert prj.state_keys(keyed_state, PARAMS) == {"n:enc/w", "n:enc/b"}


def test_a_dict_leaf_named_value_keeps_its_name():
  params = {
    "attn": {"query": jnp.ones(2), "key": jnp.ones(2), "value": jnp.ones(2)},
    "out": jnp.ones(2),
  }
  labels = prj.label_by_pattern(params, {"attn/*": "frozen", "**": "train"})
  assert labels == {"attn": {"query": "frozen", "key": "frozen", "value": "frozen"}, "out": "train"}
  tx = prj.keyed(
    optax.partition({"train": optax.adam(1e-2), "frozen": optax.set_to_zero()}, labels)
  )
  state = tx.init(params)
  updates, _ = tx.update(jax.tree.map(jnp.ones_like, params), state, params)
  assert float(jnp.abs(updates["attn"]["value"]).sum()) == 0.0  # frozen stays frozen
  assert prj.state_keys(state, params) == {"n:out"}


# --- transformations of the step --------------------------------------------------------------------


def test_shard_map_updates_on_local_shards(devices):
  mesh = jax.sharding.Mesh(np.array(devices), ("x",))
  params = {"w": jnp.arange(64.0).reshape(8, 8)}
  results = []
  for tx in both(lambda: optax.adam(1e-2)):
    state = tx.init(params)
    state_spec = jax.tree.map(lambda x: P("x") if x.ndim else P(), state)

    @jax.jit
    @jax.shard_map(mesh=mesh, in_specs=(P("x"), state_spec, P("x")), out_specs=(P("x"), state_spec))
    def step(grads, state, params):  # every device updates its own rows
      return tx.update(grads, state, params)

    updates, state = step(jax.tree.map(jnp.cos, params), state, params)
    results.append((updates, state))
  chex.assert_trees_all_equal(results[0], results[1])


def test_vmapped_ensembles():
  members = {"w": jnp.stack([jnp.full((3,), float(i)) for i in range(4)])}
  results = []
  for tx in both(lambda: optax.adam(1e-2)):
    state = jax.vmap(tx.init)(members)
    updates, state = jax.vmap(tx.update)(jax.tree.map(jnp.sin, members), state, members)
    results.append((updates, state))
  chex.assert_trees_all_equal(results[0], results[1])


@pytest.mark.parametrize("with_params", [True, False])
def test_dpsgd_with_per_example_gradients(with_params):
  params = {"w": jnp.ones(3)}
  per_example = {"w": jnp.arange(12.0).reshape(4, 3)}
  results = []
  for tx in both(lambda: optax.contrib.dpsgd(1e-2, 1.0, 0.0, seed=0, momentum=0.9)):
    state = tx.init(params)
    updates, state = tx.update(per_example, state, params if with_params else None)
    results.append((updates, state))
  chex.assert_trees_all_equal(results[0], results[1])
  state = results[1][1]  # its PRNG key leaf has an extended dtype
  again, report = prj.reconcile(
    prj.keyed(optax.contrib.dpsgd(1e-2, 1.0, 0.0, seed=0, momentum=0.9)), state, params
  )
  assert report.kept == ("n:w",) and not report.changed
  chex.assert_trees_all_equal(
    jax.random.key_data(again[0].rng_key), jax.random.key_data(state[0].rng_key)
  )


def test_lbfgs_with_value_and_grad_from_state():
  def f(p):
    return jnp.sum((p["x"] - 3.0) ** 2) + jnp.sum(p["y"] ** 2)

  results = []
  for tx in both(optax.lbfgs):
    params = {"x": jnp.zeros(2), "y": jnp.ones(3)}
    state = tx.init(params)
    value_and_grad = optax.value_and_grad_from_state(f)

    @jax.jit
    def step(params, state):
      value, grad = value_and_grad(params, state=state)
      updates, state = tx.update(grad, state, params, value=value, grad=grad, value_fn=f)
      return optax.apply_updates(params, updates), state

    for _ in range(5):
      params, state = step(params, state)
    results.append((params, state))
  chex.assert_trees_all_equal(results[0], results[1])
  assert float(f(results[1][0])) < 1e-6


def test_schedule_free_eval_params():
  params = {"w": jnp.ones(3)}
  evals = []
  for tx in both(lambda: optax.contrib.schedule_free_adamw(1e-2)):
    state = tx.init(params)
    p = params
    for i in range(3):
      updates, state = tx.update(jax.tree.map(lambda x: jnp.sin(x + i), p), state, p)
      p = optax.apply_updates(p, updates)
    evals.append(optax.contrib.schedule_free_eval_params(state, p))
  chex.assert_trees_all_equal(evals[0], evals[1])


def test_extra_arguments_reach_the_wrapped_transformation_as_in_optax():
  params = {"w": jnp.ones(3)}
  plain, keyed_tx = both(lambda: optax.scale(0.5))  # a GradientTransformation without extra args
  for tx in (plain, keyed_tx):
    with pytest.raises(TypeError):
      tx.update(params, tx.init(params), params, value=1.0)
  assert isinstance(prj.keyed(optax.adam(1e-2)), optax.GradientTransformationExtraArgs)
  assert not isinstance(keyed_tx, optax.GradientTransformationExtraArgs)


# --- checkpoints written before keyed states had optax's structure ----------------------------------


def test_a_checkpoint_of_the_old_keyed_state_still_reconciles():
  params = {
    "enc": {"kernel": jnp.arange(12.0).reshape(3, 4) / 10, "bias": jnp.zeros(4)},
    "head": [jnp.ones((4, 2))],
  }
  plain = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))
  expected = plain.init(params)
  for i in range(3):  # the steps the checkpoint in tests/data was written after
    _, expected = plain.update(jax.tree.map(lambda p: jnp.sin(p + i), params), expected, params)
  raw = ocp.StandardCheckpointer().restore((DATA / "legacy_keyed_adam").absolute())
  assert "n:enc/kernel" in raw[1][0]["mu"]  # moments stored by canonical key
  assert prj.state_keys(raw) == {"n:enc/kernel", "n:enc/bias", "n:head/0"}
  state, report = prj.reconcile(prj.keyed(plain), raw, params)
  assert not report.changed
  # the saved moments, bit for bit, each under its own parameter ...
  for key, path in [("n:enc/kernel", ("enc", "kernel")), ("n:enc/bias", ("enc", "bias"))]:
    for moment in ("mu", "nu"):
      saved = raw[1][0][moment][key]
      chex.assert_trees_all_equal(getattr(state[1][0], moment)[path[0]][path[1]], saved)
  # ... and they are the moments of those parameters (recomputed here; another XLA version may
  # round the last bit of sin differently from the one that wrote the checkpoint)
  chex.assert_trees_all_close(state, expected, rtol=1e-6, atol=0)


def test_state_pairs_with_params_in_tree_maps():
  for tx in both(lambda: optax.adam(1e-2)):
    state = tx.init(PARAMS)
    mu = optax.tree.get(state, "mu")
    paired = jax.tree.map(lambda p, m: p.shape == m.shape, PARAMS, mu)
    assert all(jax.tree.leaves(paired))
