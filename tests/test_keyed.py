"""keyed(): bit-identical updates, keyed state layout, jit behaviour, orbax round trips."""

import re

import chex
import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp
import pytest

import paramreg_jax as prj
from paramreg_jax._src.registry import keys as keys_lib


def make_params(seed=0):
  k = jax.random.split(jax.random.key(seed), 4)
  return {
    "enc": {"kernel": jax.random.normal(k[0], (8, 130)), "bias": jnp.zeros(130)},
    "layers": [
      {"w": jax.random.normal(k[1], (130, 4))},
      {"w": jax.random.normal(k[2], (4, 4)), "scale": jnp.ones(())},
    ],
    "head": jax.random.normal(k[3], (4,)),
  }


def grads_for(params, step):
  return jax.tree.map(
    lambda p: jnp.sin(p * (step + 1.0) + 0.5).astype(p.dtype) + 0.1 * (step - 2), params
  )


LR_ONLY = [
  "adabelief",
  "adadelta",
  "adafactor",
  "adagrad",
  "adam",
  "adamax",
  "adamaxw",
  "adamw",
  "adan",
  "amsgrad",
  "fromage",
  "lamb",
  "lars",
  "lion",
  "nadam",
  "nadamw",
  "novograd",
  "optimistic_gradient_descent",
  "radam",
  "rmsprop",
  "rprop",
  "sgd",
  "sm3",
  "yogi",
]


def run(tx, params, steps=5, *, jit):
  update = jax.jit(tx.update) if jit else tx.update
  state = tx.init(params)
  out = []
  for i in range(steps):
    updates, state = update(grads_for(params, i), state, params)
    params = optax.apply_updates(params, updates)
    out.append(updates)
  return params, out, state


def mirrors(state, params):
  """Whether a subtree of ``state`` has exactly the parameters' tree structure."""
  want, found = jax.tree.structure(params), []
  jax.tree.map(
    lambda node: found.append(node),
    state,
    is_leaf=lambda node: jax.tree.structure(node) == want,
  )
  return any(jax.tree.structure(node) == want for node in found)


def test_the_oracle_sees_per_parameter_state():
  params = make_params()
  assert mirrors(optax.adam(1e-2).init(params), params)
  assert not mirrors(optax.sgd(1e-2).init(params), params)


def assert_bit_identical(a, b):
  chex.assert_trees_all_equal(a, b)  # exact equality, not allclose


@pytest.mark.parametrize("name", LR_ONLY)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_every_lr_only_alias_is_bit_identical(name, jit):
  make = getattr(optax, name)
  params = make_params()
  if name == "sm3":  # optax's sm3 cannot handle scalar parameters at all
    del params["layers"][1]["scale"]
  p_plain, u_plain, _ = run(make(1e-2), params, jit=jit)
  p_keyed, u_keyed, state = run(prj.keyed(make(1e-2)), params, jit=jit)
  assert_bit_identical(u_keyed, u_plain)
  assert_bit_identical(p_keyed, p_plain)
  # every per-parameter subtree got keyed; the oracle is optax's own state: it has keys exactly
  # when some subtree of it has the parameters' structure (sgd without momentum has none)
  all_keys = {"n:" + n for n in keys_lib.tree_names(params)}
  plain_state = make(1e-2).init(params)
  expected = all_keys if mirrors(plain_state, params) else frozenset()
  assert prj.state_keys(state, params) == expected
  assert jax.tree.structure(state) == jax.tree.structure(plain_state)  # optax's own structure


def compositions():
  params = make_params()
  labels = prj.label_by_pattern(params, {"enc/**": "slow", "**": "fast"})
  return {
    "chain_clip": optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2)),
    "named_chain": optax.named_chain(("clip", optax.clip(0.5)), ("adam", optax.adam(1e-2))),
    "partition": optax.partition(
      {"slow": optax.sgd(1e-3, momentum=0.9), "fast": optax.adam(1e-2)}, labels
    ),
    "masked": optax.chain(
      optax.masked(
        optax.add_decayed_weights(1e-2), prj.mask_by_pattern(params, ["**/w", "enc/kernel"])
      ),
      optax.adam(1e-2),
    ),
    "multisteps": optax.MultiSteps(optax.adam(1e-2), every_k_schedule=2).gradient_transformation(),
    "inject": optax.inject_hyperparams(optax.adamw)(learning_rate=1e-2, weight_decay=1e-3),
    "ema": optax.chain(optax.adam(1e-2), optax.ema(0.9)),
    "adafactor_factored": optax.adafactor(1e-2, min_dim_size_to_factor=4),
  }


@pytest.mark.parametrize("name", sorted(compositions()))
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_compositions_are_bit_identical(name, jit):
  tx = compositions()[name]
  params = make_params()
  p_plain, u_plain, _ = run(tx, params, jit=jit)
  p_keyed, u_keyed, state = run(prj.keyed(tx), params, jit=jit)
  assert_bit_identical(u_keyed, u_plain)
  assert_bit_identical(p_keyed, p_plain)
  assert prj.state_keys(state, params)  # parameter state was found, by key
  assert jax.tree.structure(state) == jax.tree.structure(tx.init(params))


def test_lookahead_keeps_working_and_is_keyed():
  tx = optax.lookahead(optax.adam(1e-2), sync_period=2, slow_step_size=0.5)
  params = optax.LookaheadParams.init_synced(make_params())
  results = []
  for t in (tx, prj.keyed(tx)):
    p = params
    state = t.init(p)
    for i in range(5):
      updates, state = jax.jit(t.update)(grads_for(p.fast, i), state, p)
      p = optax.apply_updates(p, updates)
    results.append(p)
  assert_bit_identical(results[0], results[1])
  assert "n:enc/kernel" in prj.state_keys(state, params.fast)


def test_state_has_optax_structure_and_is_read_by_key():
  params = make_params()
  state = prj.keyed(optax.adam(1e-2)).init(params)
  assert jax.tree.structure(state) == jax.tree.structure(optax.adam(1e-2).init(params))
  assert prj.state_keys(state, params) == {"n:" + n for n in keys_lib.tree_names(params)}
  assert set(prj.param_state(state, params, "n:layers/1/scale")) == {"0/mu", "0/nu"}
  assert prj.param_state(state, params, "n:layers/1/scale")["0/mu"].shape == ()
  with pytest.raises(KeyError, match=re.escape("did you mean 'n:layers/1/scale'")):
    prj.param_state(state, params, "n:layers/1/scael")


def test_masked_parameters_hold_no_state():
  params = make_params()
  tx = optax.masked(optax.adam(1e-2), prj.mask_by_pattern(params, ["layers/**"]))
  state = prj.keyed(tx).init(params)
  assert prj.state_keys(state, params) == {"n:layers/0/w", "n:layers/1/w", "n:layers/1/scale"}
  assert prj.param_state(state, params, "n:enc/kernel") == {}


def count_traces(tx, params, calls=3):
  traces = []

  @jax.jit
  def step(params, state, grads):
    traces.append(1)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  state = tx.init(params)
  for i in range(calls):
    params, state = step(params, state, grads_for(params, i))
  return len(traces)


def test_keyed_step_retraces_no_more_than_plain():
  params = make_params()
  tx = optax.adamw(1e-2)
  assert count_traces(prj.keyed(tx), params) == count_traces(tx, params) == 1


def test_key_work_happens_once_per_treedef(monkeypatch):
  params = make_params()
  tx = prj.keyed(optax.adam(1e-2))
  state = tx.init(params)
  tx.update(grads_for(params, 0), state, params)
  calls = []
  real = keys_lib.path_to_name
  monkeypatch.setattr(keys_lib, "path_to_name", lambda p: (calls.append(p), real(p))[1])
  for i in range(3):
    _, state = tx.update(grads_for(params, i), state, params)
  assert calls == []


def test_jit_and_eager_keyed_states_agree():
  params = make_params()
  tx = prj.keyed(optax.sgd(1e-2, momentum=0.9))
  _, _, s_eager = run(tx, params, jit=False)
  _, _, s_jit = run(tx, params, jit=True)
  # XLA may fuse multiply-adds under jit, so the last bit can differ from eager execution
  chex.assert_trees_all_close(s_eager, s_jit, rtol=1e-5, atol=1e-6)
  assert jax.tree.structure(s_eager) == jax.tree.structure(s_jit)


def test_updating_with_the_wrong_params_is_a_clear_error():
  params = make_params()
  tx = prj.keyed(optax.adam(1e-2))
  state = tx.init(params)
  grown = dict(params, extra=jnp.ones(3))
  del grown["head"]
  with pytest.raises(prj.StateMismatchError) as info:
    tx.update(jax.tree.map(jnp.ones_like, grown), state, grown)
  msg = str(info.value)
  assert (
    "1 parameter(s) without state, 1 state key(s) without a parameter, 0 reshaped parameter(s)"
    in msg
  )
  assert "missing state: n:extra" in msg and "unexpected state: n:head" in msg
  assert "paramreg_jax.reconcile(tx, state, params)" in msg
  # a broadcastable width change is not silently accepted (plain optax would broadcast)
  wide = dict(params, head=jnp.ones((1, 4)))
  with pytest.raises(
    prj.StateMismatchError,
    match=re.escape("n:head: state 0/mu was built for (4,), the parameter is (1, 4)"),
  ):
    jax.jit(tx.update)(jax.tree.map(jnp.ones_like, wide), state, wide)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_bare_array_params_work_as_in_optax_docs(jit):
  params = jnp.linspace(-1.0, 1.0, 3)
  p_plain, u_plain, _ = run(optax.adam(1e-2), params, jit=jit)
  p_keyed, u_keyed, state = run(prj.keyed(optax.adam(1e-2)), params, jit=jit)
  assert_bit_identical((p_keyed, u_keyed), (p_plain, u_plain))
  assert prj.state_keys(state, params) == {"p:0"}  # a bare array has no path: its position
  with pytest.raises(prj.StateMismatchError, match=re.escape("p:0: state 0/mu was built for (3,)")):
    prj.keyed(optax.adam(1e-2)).update(jnp.ones(4), state, jnp.ones(4))


def test_by_position():
  params = make_params()
  state = prj.keyed(optax.adam(1e-2), by="position").init(params)
  assert sorted(prj.state_keys(state, params, by="position")) == sorted(f"p:{i}" for i in range(6))


def test_bad_by():
  with pytest.raises(ValueError, match="by must be"):
    prj.keyed(optax.adam(1.0), by="path")


WEIRD = {
  "a/b": jnp.ones(2),
  "c~d:e": {"0": jnp.zeros(3), "ü": jnp.full((1,), 2.0)},
  "x": [jnp.ones((2, 2))],
}


def test_orbax_round_trip_with_target(tmp_path):
  tx = prj.keyed(optax.adam(1e-2))
  state = tx.init(WEIRD)
  _, state = tx.update(jax.tree.map(jnp.ones_like, WEIRD), state, WEIRD)
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(tmp_path / "opt", state)
  ckpt.wait_until_finished()
  restored = ckpt.restore(tmp_path / "opt", jax.eval_shape(tx.init, WEIRD))
  assert_bit_identical(restored, state)
  assert (
    prj.state_keys(restored, WEIRD)
    == prj.state_keys(state, WEIRD)
    == {
      "n:a~1b",
      "n:c~0d:e/0",
      "n:c~0d:e/ü",
      "n:x/0",
    }
  )


def test_orbax_round_trip_without_target_then_reconcile(tmp_path):
  tx = prj.keyed(optax.adam(1e-2))
  state = tx.init(WEIRD)
  _, state = tx.update(jax.tree.map(jnp.ones_like, WEIRD), state, WEIRD)
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(tmp_path / "opt", state)
  ckpt.wait_until_finished()
  raw = ckpt.restore(tmp_path / "opt")  # plain dicts and lists: optax's NamedTuples are gone
  assert prj.state_keys(raw, WEIRD) == prj.state_keys(state, WEIRD)
  with pytest.raises(prj.StateMismatchError, match=re.escape("restored without a target?")):
    tx.update(jax.tree.map(jnp.ones_like, WEIRD), raw, WEIRD)
  again, report = prj.reconcile(tx, raw, WEIRD)
  assert_bit_identical(again, state)
  assert report.kept == tuple(sorted(prj.state_keys(state, WEIRD))) and not report.changed


def test_keyed_state_is_a_well_behaved_pytree():
  import pickle

  params = make_params()
  state = prj.keyed(optax.adam(1e-2)).init(params)
  again = pickle.loads(pickle.dumps(state))
  assert jax.tree.structure(again) == jax.tree.structure(state)
  assert_bit_identical(again, state)
  mapped = jax.tree.map(lambda x: x + 1, state)
  assert jax.tree.structure(mapped) == jax.tree.structure(state)
  leaves, treedef = jax.tree_util.tree_flatten(state)
  assert_bit_identical(jax.tree_util.tree_unflatten(treedef, leaves), state)
