"""Keyed optax: the drop-in gaps found by running plain optax and ``keyed`` side by side, and
surgery reports that say what happened to each parameter's state."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import paramreg_jax as prj

PARAMS = {"w": jnp.arange(6.0).reshape(2, 3) / 7, "b": jnp.array([0.5, -0.25])}


def grads_at(i):
  return jax.tree.map(lambda p: jnp.cos(p * (i + 1)), PARAMS)


def run(tx, steps=4, *, jit, extra=None):
  state, params, trace = tx.init(PARAMS), PARAMS, []
  update = jax.jit(tx.update) if jit else tx.update
  for i in range(steps):
    updates, state = update(grads_at(i), state, params, **(extra or {}))
    params = optax.apply_updates(params, updates)
    trace.append(params)
  return trace, state


def monitored():
  return optax.chain(
    optax.sgd(0.1, momentum=0.9),
    optax.monitor(
      {
        "norm": optax.tree.norm,
        "ema": optax.measure_with_ema(lambda u: optax.tree.norm(u) > 0.5, decay=0.9),
      }
    ),
    optax.clip_by_global_norm(0.5),
  )


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize(
  "make",
  [monitored, lambda: optax.MultiSteps(optax.adam(0.1), every_k_schedule=2)],
  ids=["monitor", "MultiSteps"],
)
def test_monitor_and_multisteps_run_exactly_as_plain_optax(make, jit):
  plain, plain_state = run(make(), jit=jit)
  wrapped, keyed_state = run(prj.keyed(make()), jit=jit)
  chex.assert_trees_all_equal(plain, wrapped)
  chex.assert_trees_all_equal(plain_state, keyed_state)


def test_a_state_the_optimizer_never_builds_is_still_refused_with_monitor():
  tx = prj.keyed(monitored())
  _, state = run(tx, steps=2, jit=False)
  with pytest.raises(prj.StateMismatchError, match="n:b"):
    tx.update(grads_at(0), state, {"w": PARAMS["w"]})


def test_anything_that_is_not_a_transformation_is_refused():
  with pytest.raises(TypeError, match=r"keyed takes an optax transformation .* got int"):
    prj.keyed(3)


# --- reconcile by position -------------------------------------------------------------------


def test_by_position_a_module_renamed_in_place_keeps_its_moments():
  tx = prj.keyed(optax.adam(1e-2), by="position")
  old_params = {"a": jnp.ones(2), "b": jnp.ones(3)}
  state = tx.init(old_params)
  _, state = tx.update(jax.tree.map(jnp.cos, old_params), state, old_params)
  renamed = {"a": jnp.ones(2), "c": jnp.ones(3)}  # b renamed c, same place in the order
  new, report = prj.reconcile(tx, state, renamed)
  assert report.kept == ("p:0", "p:1") and not report.added and not report.dropped
  chex.assert_trees_all_equal(new[0].mu["c"], state[0].mu["b"])
  _, grown = prj.reconcile(tx, state, {**renamed, "d": jnp.ones(1)})
  assert grown.added == ("p:2",) and grown.kept == ("p:0", "p:1") and not grown.shifted
  _, report = prj.reconcile(prj.keyed(optax.adam(1e-2)), state, renamed)
  assert report.added == ("n:c",) and report.dropped == ("n:b",)
  with pytest.raises(prj.StateMismatchError, match=r"p:1: state 0/mu was built for \(3,\)"):
    tx.update(renamed, state, {"a": jnp.ones(2), "c": jnp.ones(4)})


# --- the report tells the truth when the optimizer changes -------------------------------------


def trained(tx, params=PARAMS, steps=2):
  state = tx.init(params)
  for i in range(steps):
    _, state = tx.update(jax.tree.map(lambda p, i=i: jnp.cos(p * (i + 1)), params), state, params)
  return state


def test_adam_to_sgd_momentum_reinitialises_and_says_the_optimizer_changed():
  state = trained(prj.keyed(optax.adam(1e-2)))
  new, report = prj.reconcile(prj.keyed(optax.sgd(1e-2, momentum=0.9)), state, PARAMS)
  assert report.reinitialized == ("n:b", "n:w") and not report.added and not report.kept
  assert "0/mu, 0/nu, 0/count are not kept: the optimizer changed (it now keeps 0/trace)" in (
    report.optimizer_changed
  )
  assert "optimizer:" in str(report) and report.changed
  chex.assert_trees_all_equal(new, optax.sgd(1e-2, momentum=0.9).init(PARAMS))
  with pytest.raises(prj.ReconcileError, match=r"the optimizer changed .*on_unexpected='error'"):
    prj.reconcile(optax.sgd(1e-2, momentum=0.9), state, PARAMS, on_unexpected="error")


def test_adam_to_stateless_sgd_drops_every_parameters_state():
  state = trained(prj.keyed(optax.adam(1e-2)))
  _, report = prj.reconcile(optax.sgd(1e-2), state, PARAMS)
  assert report.dropped == ("n:b", "n:w") and not report.added
  assert "the optimizer changed (it now keeps no state)" in report.optimizer_changed
  with pytest.raises(prj.ReconcileError, match="on_unexpected='error'"):
    prj.reconcile(optax.sgd(1e-2), state, PARAMS, on_unexpected="error")


def test_the_same_optimizer_reports_no_change_even_when_it_fills_state_late():
  tx = prj.keyed(monitored())
  _, state = run(tx, steps=2, jit=False)
  _, report = prj.reconcile(tx, state, PARAMS)
  assert not report.optimizer_changed and report.kept == ("n:b", "n:w")


# --- renames ---------------------------------------------------------------------------------


def layers(n, width=3):
  return {"layers": [{"kernel": jnp.full((width, width), float(i))} for i in range(n)]}


def test_deleting_a_middle_layer_with_the_natural_shift_rename():
  tx = prj.keyed(optax.adam(1e-2))
  old = layers(4)
  state = trained(tx, old)
  shift = {"n:layers/2/kernel": "n:layers/1/kernel", "n:layers/3/kernel": "n:layers/2/kernel"}
  new, report = prj.reconcile(tx, state, layers(3), rename=shift)
  assert report.dropped == ("n:layers/1/kernel",)  # the deleted layer's own state
  assert report.kept == ("n:layers/0/kernel", "n:layers/1/kernel", "n:layers/2/kernel")
  assert not report.shifted  # the rename said where each layer went
  chex.assert_trees_all_equal(new[0].mu["layers"][1], state[0].mu["layers"][2])
  chex.assert_trees_all_equal(new[0].mu["layers"][2], state[0].mu["layers"][3])


def test_a_rename_of_a_key_that_has_no_state_is_an_error_with_did_you_mean():
  tx = prj.keyed(optax.adam(1e-2))
  state = trained(tx, layers(2))
  with pytest.raises(
    prj.ReconcileError,
    match=re.escape("n:layer/1/kernel; did you mean 'n:layers/1/kernel'"),
  ):
    prj.reconcile(tx, state, layers(2), rename={"n:layer/1/kernel": "n:layers/0/kernel"})


def test_inserting_a_layer_without_a_rename_is_flagged_in_the_report():
  tx = prj.keyed(optax.adam(1e-2))
  state = trained(tx, layers(3))
  _, report = prj.reconcile(tx, state, layers(4))
  assert report.shifted == (("layers/", 3, 4),)
  assert "layers/ went from 3 to 4 entries and state stays with its index" in " ".join(
    str(report).split()
  )
  assert "pass rename={old key: new key}" in " ".join(str(report).split())


# --- live NNX states ---------------------------------------------------------------------------


def test_state_keys_and_param_state_read_a_live_nnx_optimizer():
  model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, prj.keyed(optax.adam(1e-3)), wrt=nnx.Param)
  params = nnx.state(model, nnx.Param)
  live = nnx.state(optimizer)
  assert prj.state_keys(live, params) == {"n:bias", "n:kernel"}
  assert prj.state_keys(optimizer.opt_state, params) == {"n:bias", "n:kernel"}
  got = prj.param_state(live, params, "n:kernel")
  assert sorted(got) == ["0/mu", "0/nu"] and np.shape(got["0/mu"]) == (2, 3)


# --- added parameters and Adam's shared step count -----------------------------------------------


def aged(tx, steps):
  """A state after one real update, every step count then set to ``steps`` (a long run)."""
  params = {"w": jnp.ones(3)}
  _, state = tx.update({"w": jnp.full(3, 0.5)}, tx.init(params), params)
  return jax.tree.map(lambda x: jnp.full_like(x, steps) if x.dtype == jnp.int32 else x, state)


def test_an_added_parameter_steps_like_a_fresh_adam_with_debias_added():
  lr, params = 0.01, {"w": jnp.ones(3), "new": jnp.ones(3)}
  grads = {"w": jnp.full(3, 0.5), "new": jnp.full(3, 0.5)}
  plain = prj.keyed(optax.adam(lr))
  state, _ = prj.reconcile(plain, aged(plain, 10_000), params)
  updates, _ = plain.update(grads, state, params)
  assert float(updates["new"][0]) == pytest.approx(-lr * 0.1 / np.sqrt(1e-3), rel=1e-3)  # 3.2x
  fixed = prj.keyed(optax.chain(optax.adam(lr), prj.debias_added()))
  state, report = prj.reconcile(fixed, aged(fixed, 10_000), params)
  assert report.added == ("n:new",) and report.kept == ("n:w",)
  fixed_updates, _ = fixed.update(grads, state, params)
  assert float(fixed_updates["new"][0]) == pytest.approx(-lr, rel=1e-4)  # a fresh Adam's step
  assert np.array_equal(fixed_updates["w"], updates["w"])  # old parameters: bit-identical


@pytest.mark.parametrize("jit", [False, True])
def test_debias_added_changes_nothing_without_surgery(jit):
  plain, _ = run(optax.adam(0.05), steps=5, jit=jit)
  debiased, _ = run(prj.keyed(optax.chain(optax.adam(0.05), prj.debias_added())), steps=5, jit=jit)
  chex.assert_trees_all_equal(plain, debiased)


@pytest.mark.parametrize("b1, b2", [(-0.1, 0.999), (0.9, 1.0), ("0.9", 0.999), (True, 0.999)])
def test_debias_added_refuses_a_decay_outside_0_1(b1, b2):
  bad = "b1" if (b1, b2)[0] != 0.9 else "b2"
  with pytest.raises(ValueError, match=rf"debias_added\({bad}=\.\.\.\) must be Adam's {bad}"):
    prj.debias_added(b1, b2)
