"""reconcile(): model surgery keeps surviving state bit-exact and reports every key."""

import functools
import json
import re
import subprocess
import sys
import textwrap

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import paramreg_jax as prj


class Net(nnx.Module):
  def __init__(self, widths, *, head="head", rngs):
    self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(widths[:-1], widths[1:])])
    setattr(self, head, nnx.Linear(widths[-1], 2, rngs=rngs))
    self._head = head

  def __call__(self, x):
    for layer in self.layers:
      x = jax.nn.relu(layer(x))
    return getattr(self, self._head)(x)


def params_of(widths, head="head", seed=0):
  return nnx.state(Net(widths, head=head, rngs=nnx.Rngs(seed)), nnx.Param)


def trained_state(tx, params, steps=3):
  state = tx.init(params)
  for i in range(steps):
    grads = jax.tree.map(lambda p: jnp.cos(p + i), params)
    _, state = tx.update(grads, state, params)
  return state


def slot_values(state, slot="mu"):
  """{key: leaf} of an adam moment (it has the parameters' structure: keys are its paths)."""
  flat = jax.tree_util.tree_flatten_with_path(getattr(state[0], slot))[0]
  return {"n:" + prj.path_to_name(p): x for p, x in flat}


TX = prj.keyed(optax.adam(1e-2))


def assert_kept_bit_exact(old, new, keys):
  for slot in ("mu", "nu"):
    o, n = slot_values(old, slot), slot_values(new, slot)
    for k in keys:
      chex.assert_trees_all_equal(o[k], n[k])


def test_nothing_changed_keeps_everything_and_allocates_nothing(monkeypatch):
  params = params_of((4, 8))
  state = trained_state(TX, params)
  calls = []
  real = optax.adam(1e-2)
  concrete = lambda p: not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(p))  # noqa: E731
  counting = optax.GradientTransformation(
    lambda p: (calls.append(concrete(p)), real.init(p))[1], real.update
  )
  new, report = prj.reconcile(prj.keyed(counting), state, params)
  assert not report.changed and len(report.kept) == 4
  chex.assert_trees_all_equal(new, state)
  assert calls == [False]  # init only ran abstractly (jax.eval_shape): no state allocated


def test_add_a_layer():
  old_params, new_params = params_of((4, 8)), params_of((4, 8, 8))
  state = trained_state(TX, old_params)
  new, report = prj.reconcile(TX, state, new_params)
  assert report.added == ("n:layers/1/bias", "n:layers/1/kernel")
  assert report.kept == ("n:head/bias", "n:head/kernel", "n:layers/0/bias", "n:layers/0/kernel")
  assert report.dropped == report.reinitialized == ()
  assert_kept_bit_exact(state, new, report.kept)
  chex.assert_trees_all_equal(slot_values(new)["n:layers/1/kernel"], jnp.zeros((8, 8)))
  assert new[0].count == state[0].count
  TX.update(jax.tree.map(jnp.ones_like, new_params), new, new_params)  # usable


def test_remove_a_layer():
  state = trained_state(TX, params_of((4, 8, 8)))
  new, report = prj.reconcile(TX, state, params_of((4, 8)))
  assert report.dropped == ("n:layers/1/bias", "n:layers/1/kernel") and report.added == ()
  assert_kept_bit_exact(state, new, report.kept)
  with pytest.raises(
    prj.ReconcileError,
    match=re.escape(
      "2 state key(s) have no parameter (on_unexpected='error'): n:layers/1/bias, n:layers/1/kernel"
    ),
  ):
    prj.reconcile(TX, state, params_of((4, 8)), on_unexpected="error")


def test_rename_a_module():
  state = trained_state(TX, params_of((4, 8)))
  new_params = params_of((4, 8), head="readout")
  _, report = prj.reconcile(TX, state, new_params)
  assert report.added == ("n:readout/bias", "n:readout/kernel")
  assert report.dropped == ("n:head/bias", "n:head/kernel")
  # with a rename the moments follow their weights
  new, report = prj.reconcile(
    TX, state, new_params, rename=lambda k: k.replace("n:head/", "n:readout/")
  )
  assert report.added == report.dropped == ()
  assert report.renamed == (
    ("n:head/bias", "n:readout/bias"),
    ("n:head/kernel", "n:readout/kernel"),
  )
  for slot in ("mu", "nu"):
    chex.assert_trees_all_equal(
      slot_values(new, slot)["n:readout/kernel"], slot_values(state, slot)["n:head/kernel"]
    )


def test_reorder_a_list_of_layers():
  state = trained_state(TX, params_of((4, 4, 4)))
  swap = {
    "n:layers/0/kernel": "n:layers/1/kernel",
    "n:layers/1/kernel": "n:layers/0/kernel",
    "n:layers/0/bias": "n:layers/1/bias",
    "n:layers/1/bias": "n:layers/0/bias",
  }
  new, report = prj.reconcile(TX, state, params_of((4, 4, 4)), rename=swap)
  assert len(report.renamed) == 4 and not report.added and not report.dropped
  chex.assert_trees_all_equal(
    slot_values(new)["n:layers/0/kernel"], slot_values(state)["n:layers/1/kernel"]
  )
  with pytest.raises(prj.ReconcileError, match="rename maps several old keys to n:layers/1/kernel"):
    prj.reconcile(
      TX,
      state,
      params_of((4, 4, 4)),
      rename={"n:layers/0/kernel": "n:layers/1/kernel", "n:head/kernel": "n:layers/1/kernel"},
    )


def test_freeze_a_subtree():
  params = params_of((4, 8))

  def tx_for(frozen):
    rules = {"layers/**": "frozen" if frozen else "train", "**": "train"}
    return prj.keyed(
      optax.partition(
        {"train": optax.adam(1e-2), "frozen": optax.set_to_zero()},
        prj.label_by_pattern(params, rules, require_all_used=False),
      )
    )

  state = trained_state(tx_for(False), params)
  new, report = prj.reconcile(tx_for(True), state, params)
  assert report.dropped == ("n:layers/0/bias", "n:layers/0/kernel")
  assert report.kept == ("n:head/bias", "n:head/kernel")
  assert prj.state_keys(new, params) == {"n:head/bias", "n:head/kernel"}


def test_change_a_width_is_never_silent():
  state = trained_state(TX, params_of((4, 8)))
  with pytest.raises(prj.ReconcileError) as info:
    prj.reconcile(TX, state, params_of((4, 16)))
  msg = str(info.value)
  assert msg.startswith(
    "cannot reconcile the optimizer state with the new parameters; nothing was changed:"
  )
  assert (
    "3 parameter(s) changed shape or dtype; pass on_shape_mismatch='overlap' to keep the state "
    "of the rows and columns both shapes have (a grown vocabulary or MLP), prj.layer_map([...]) "
    "for deeper or shallower stacked layers, 'init' to re-initialise their state, or fix the "
    "model:"
  ) in msg
  assert (
    "n:layers/0/kernel: state 0/mu has (4, 8) float32, the new parameters need (4, 16) float32"
    in msg
  )
  assert (
    "n:head/kernel: state 0/nu has (8, 2) float32, the new parameters need (16, 2) float32" in msg
  )
  new, report = prj.reconcile(TX, state, params_of((4, 16)), on_shape_mismatch="init")
  assert report.reinitialized == ("n:head/kernel", "n:layers/0/bias", "n:layers/0/kernel")
  assert report.kept == ("n:head/bias",)
  chex.assert_trees_all_equal(slot_values(new)["n:layers/0/kernel"], jnp.zeros((4, 16)))


def test_on_missing_error():
  state = trained_state(TX, params_of((4, 8)))
  with pytest.raises(
    prj.ReconcileError,
    match=re.escape(
      "2 new parameter(s) have no state (on_missing='error'): n:layers/1/bias, n:layers/1/kernel"
    ),
  ):
    prj.reconcile(TX, state, params_of((4, 8, 8)), on_missing="error")


def test_a_clip_added_keeps_the_state_and_strict_mode_refuses_it():
  state = trained_state(TX, params_of((4, 8)))
  other = prj.keyed(optax.chain(optax.clip(1.0), optax.adam(1e-2)))
  _, report = prj.reconcile(other, state, params_of((4, 8)))
  assert len(report.kept) == 4 and "under a new wrapping" in report.optimizer_changed
  with pytest.raises(prj.ReconcileError, match=r"under a new wrapping.*on_unexpected='error'"):
    prj.reconcile(other, state, params_of((4, 8)), on_unexpected="error")


def test_plain_optax_works_and_options_are_checked():
  params = params_of((4, 8))
  plain = optax.adam(1e-2)
  state = trained_state(plain, params)
  again, report = prj.reconcile(plain, state, params)  # plain optax: keys from paths too
  chex.assert_trees_all_equal(again, state)
  assert not report.changed and len(report.kept) == 4
  with pytest.raises(TypeError, match=re.escape("reconcile takes an optax transformation")):
    prj.reconcile(lambda p: p, TX.init(params), params)
  with pytest.raises(ValueError, match="on_missing must be one of"):
    prj.reconcile(TX, TX.init(params), params, on_missing="drop")


def test_report_renders():
  report = prj.SurgeryReport(kept=("n:a",), added=("n:b",), dropped=("n:c",), reinitialized=())
  assert str(report).splitlines() == [
    "SurgeryReport: 1 kept, 1 added, 1 dropped, 0 re-initialised",
    "  kept:          n:a",
    "  added:         n:b",
    "  dropped:       n:c",
  ]
  html = report._repr_html_()
  assert "<table" in html and "n:b" in html
  with pytest.raises(AttributeError):
    report.kept = ()  # frozen


# --- property: random surgery on random nested trees ---------------------------------------

_shape = st.sampled_from([(), (2,), (3,), (2, 3)])


@st.composite
def surgery_case(draw):
  names = draw(
    st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f"]), min_size=1, max_size=5, unique=True)
  )
  groups = {n: draw(st.sampled_from(["g", "h"])) for n in names}
  old = {n: draw(_shape) for n in names}
  new = dict(old)
  renames = {}
  for op in draw(st.lists(st.sampled_from(["add", "remove", "rename", "resize"]), max_size=4)):
    if op == "add":
      name = draw(st.sampled_from(["u", "v", "w", "x"]))
      if name not in new and name not in renames.values():
        new[name] = draw(_shape)
        groups[name] = draw(st.sampled_from(["g", "h"]))
    elif op == "remove" and len(new) > 1:
      del new[draw(st.sampled_from(sorted(new)))]
    elif op == "rename" and new:
      src = draw(st.sampled_from(sorted(new)))
      dst = src.upper()
      if src in old and dst not in new and src not in renames:
        new[dst] = new.pop(src)
        groups[dst] = groups[src]
        renames[src] = dst
    elif op == "resize" and new:
      name = draw(st.sampled_from(sorted(new)))
      new[name] = (4,) if new[name] != (4,) else (5,)
  return old, new, groups, renames


def build(spec, groups, offset=0.0):
  tree = {}
  for i, (name, shape) in enumerate(sorted(spec.items())):
    tree.setdefault(groups[name], {})[name] = jnp.full(shape, i + offset, jnp.float32)
  return tree


@settings(max_examples=40, deadline=None)
@given(surgery_case())
def test_random_surgery_keeps_invariants(case):
  old_spec, new_spec, groups, renames = case
  old_params, new_params = build(old_spec, groups), build(new_spec, groups, 100.0)
  tx = prj.keyed(optax.adam(1e-2))
  state = trained_state(tx, old_params, steps=2)
  key = lambda n: f"n:{groups[n]}/{n}"  # noqa: E731
  rename = {key(s): key(d) for s, d in renames.items()}
  old_keys = {rename.get(key(n), key(n)): n for n in old_spec}
  new_keys = {key(n): n for n in new_spec}
  resized = sorted(
    k for k in set(old_keys) & set(new_keys) if old_spec[old_keys[k]] != new_spec[new_keys[k]]
  )
  if resized:
    with pytest.raises(prj.ReconcileError) as info:
      prj.reconcile(tx, state, new_params, rename=rename)
    for k in resized:
      assert f"{k}: state" in str(info.value)
    new, report = prj.reconcile(tx, state, new_params, rename=rename, on_shape_mismatch="init")
  else:
    new, report = prj.reconcile(tx, state, new_params, rename=rename)
  assert report.added == tuple(sorted(set(new_keys) - set(old_keys)))
  assert report.dropped == tuple(sorted(set(old_keys) - set(new_keys)))
  assert report.reinitialized == tuple(resized)
  assert report.kept == tuple(sorted(set(old_keys) & set(new_keys) - set(resized)))
  inverse = {v: k for k, v in rename.items()}
  for slot in ("mu", "nu"):
    for k in report.kept:
      chex.assert_trees_all_equal(
        slot_values(new, slot)[k], slot_values(state, slot)[inverse.get(k, k)]
      )
  assert prj.state_keys(new, new_params) == set(new_keys)
  tx.update(jax.tree.map(jnp.ones_like, new_params), new, new_params)


# --- resume equivalence across processes ----------------------------------------------------

RESUME_SCRIPT = textwrap.dedent(
  """
  import sys, json
  import jax, jax.numpy as jnp, numpy as np, optax
  import orbax.checkpoint as ocp
  import paramreg_jax as prj
  path, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
  tx = prj.keyed(optax.adamw(1e-2))
  ckpt = ocp.StandardCheckpointer()
  params = ckpt.restore(path + "/params")
  raw_state = ckpt.restore(path + "/opt")
  state, report = prj.reconcile(tx, raw_state, params)
  assert not report.changed, str(report)
  step = jax.jit(lambda p, s, g: (lambda u, s: (optax.apply_updates(p, u), s))(*tx.update(g, s, p)))
  for i in range(steps):
    grads = jax.tree.map(lambda p: jnp.sin(p * 3.0), params)
    params, state = step(params, state, grads)
  np.savez(out, **{k: np.asarray(v) for k, v in zip(json.loads(sys.argv[4]), jax.tree.leaves(params))})
  """
)


def test_resume_in_a_new_process_is_bit_exact(tmp_path):
  params = {
    "dense": {"kernel": jnp.linspace(-1, 1, 12).reshape(3, 4), "bias": jnp.zeros(4)},
    "out": jnp.ones(4),
  }
  tx = prj.keyed(optax.adamw(1e-2))
  step = jax.jit(lambda p, s, g: (lambda u, s: (optax.apply_updates(p, u), s))(*tx.update(g, s, p)))
  state = tx.init(params)
  p = params
  for _ in range(3):
    p, state = step(p, state, jax.tree.map(lambda x: jnp.sin(x * 3.0), p))
  ckpt = ocp.StandardCheckpointer()
  ckpt.save(tmp_path / "ck" / "params", p)
  ckpt.save(tmp_path / "ck" / "opt", state)
  ckpt.wait_until_finished()
  for _ in range(4):
    p, state = step(p, state, jax.tree.map(lambda x: jnp.sin(x * 3.0), p))
  names = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(p)[0]]
  script = tmp_path / "resume.py"
  script.write_text(RESUME_SCRIPT)
  subprocess.run(
    [
      sys.executable,
      str(script),
      str(tmp_path / "ck"),
      str(tmp_path / "out.npz"),
      "4",
      json.dumps(names),
    ],
    check=True,
    timeout=300,
  )
  resumed = np.load(tmp_path / "out.npz")
  for name, leaf in zip(names, jax.tree.leaves(p)):
    np.testing.assert_array_equal(resumed[name], np.asarray(leaf), err_msg=name)


def test_kept_state_follows_its_parameter_to_a_new_mesh():
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  devices = np.array(jax.devices())
  old_mesh = jax.sharding.Mesh(devices.reshape(8), ("x",))
  new_mesh = jax.sharding.Mesh(devices.reshape(4, 2), ("data", "model"))
  old = {
    "k": jax.device_put(jnp.arange(128.0).reshape(16, 8), NamedSharding(old_mesh, P(None, "x")))
  }
  new = {"k": jax.device_put(old["k"], NamedSharding(new_mesh, P(None, "model")))}
  state = trained_state(TX, old)
  moved, report = prj.reconcile(TX, state, new)
  assert report.kept == ("n:k",)
  for slot in ("mu", "nu"):
    assert slot_values(moved, slot)["n:k"].sharding == new["k"].sharding
    chex.assert_trees_all_equal(slot_values(moved, slot)["n:k"], slot_values(state, slot)["n:k"])


def test_a_changed_learning_rate_follows_the_code_and_is_reported():
  """``inject_hyperparams(adam)(learning_rate=1e-2)`` in the old run, ``1e-4`` in the code now:
  the state used to keep 0.01 silently (updates 100x larger than the code says)."""
  params = {"w": jnp.arange(4.0)}
  grads = {"w": jnp.ones(4)}
  old_tx = prj.keyed(optax.inject_hyperparams(optax.adam)(learning_rate=1e-2))
  old = old_tx.init(params)
  _, old = old_tx.update(grads, old, params)  # moments and count to keep
  before = jax.tree.map(np.asarray, old)
  new_tx = prj.keyed(optax.inject_hyperparams(optax.adam)(learning_rate=1e-4))
  state, report = prj.reconcile(new_tx, old, params)
  assert float(state.hyperparams["learning_rate"]) == pytest.approx(1e-4)
  np.testing.assert_array_equal(state.inner_state[0].mu["w"], before.inner_state[0].mu["w"])
  assert report.hyperparams == (("hyperparams/learning_rate", "0.01", "0.0001", "code"),)
  said = " ".join(str(report).split())  # the note wraps at 88 columns
  assert "hyperparams/learning_rate: 0.01 (state) -> 0.0001 (code); now the code's" in said
  assert report.changed
  # the next update is the one the code asks for: the kept moments at the new rate
  want = optax.inject_hyperparams(optax.adam)(learning_rate=1e-4).init(params)
  want = want._replace(
    inner_state=jax.tree.map(jnp.asarray, before.inner_state), count=before.count
  )
  np.testing.assert_array_equal(
    new_tx.update(grads, state, params)[0]["w"],
    optax.inject_hyperparams(optax.adam)(learning_rate=1e-4).update(grads, want, params)[0]["w"],
  )
  kept, report = prj.reconcile(new_tx, old, params, hyperparams="state")
  assert float(kept.hyperparams["learning_rate"]) == pytest.approx(1e-2)
  assert "now the state's, kept (hyperparams='state')" in " ".join(str(report).split())
  _, report = prj.reconcile(old_tx, old, params)  # nothing changed: nothing reported
  assert report.hyperparams == () and not report.changed
  with pytest.raises(ValueError, match=r"hyperparams must be one of \('code', 'state'\)"):
    prj.reconcile(new_tx, old, params, hyperparams="new")


def test_reconcile_of_an_unchanged_state_traces_no_optimizer_update():
  """Learning the state's later forms (what ``optax.monitor`` fills in at the first update)
  traces updates: ~15x ``tx.init`` at 2,000 leaves. With nothing changed it is not needed."""
  calls = []
  inner = optax.adamw(1e-3)

  def update(grads, state, params=None):
    calls.append(1)
    return inner.update(grads, state, params)

  tx = prj.keyed(optax.GradientTransformation(inner.init, update))
  params = {f"l{i}": jnp.ones(3) for i in range(20)}
  state = tx.init(params)
  _, report = prj.reconcile(tx, state, params)
  assert calls == [] and not report.changed
  monitored = prj.keyed(optax.chain(optax.adam(1e-3), optax.monitor({"norm": optax.tree.norm})))
  filled = monitored.update(jax.tree.map(jnp.ones_like, params), monitored.init(params), params)[1]
  _, report = prj.reconcile(monitored, filled, params)  # a later form: traced, then matched
  assert not report.changed


def test_moving_to_a_mesh_on_more_devices_brings_counts_and_hyperparams_along(devices):
  """Moments follow the new parameters' shardings; counts, hyperparameters and MultiSteps
  counters (replicated on the old 4 devices, as an orbax restore leaves them) used to stay
  there, and the jitted step failed with "Received incompatible devices"."""
  from jax.sharding import Mesh
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  four, eight = Mesh(np.array(devices[:4]), ("x",)), Mesh(np.array(devices), ("x",))
  tx = prj.keyed(
    optax.MultiSteps(optax.inject_hyperparams(optax.adam)(learning_rate=0.1), every_k_schedule=2)
  )
  old_params = {"w": jax.device_put(jnp.arange(32.0).reshape(8, 4), NamedSharding(four, P("x")))}
  old = jax.tree.map(
    lambda x: jax.device_put(x, NamedSharding(four, P())) if x.ndim == 0 else x,
    jax.jit(tx.init)(old_params),
  )
  before = jax.tree.map(np.asarray, old)
  params = {"w": jax.device_put(np.asarray(old_params["w"]), NamedSharding(eight, P("x")))}
  state, report = prj.reconcile(tx, old, params)
  assert not report.changed
  for leaf in jax.tree.leaves(state):
    assert leaf.sharding.device_set == set(devices)
  jax.tree.map(np.testing.assert_array_equal, state, before)  # bit for bit

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def step(p, s):
    u, s = tx.update(jax.tree.map(jnp.ones_like, p), s, p)
    return optax.apply_updates(p, u), s

  new_params, _ = step(params, state)
  assert new_params["w"].sharding.is_equivalent_to(NamedSharding(eight, P("x")), 2)


def test_a_grown_vocabulary_keeps_the_old_rows_moments_and_the_new_rows_are_fresh():
  tx = prj.keyed(optax.adam(1e-3))
  old_params = {"embed": jnp.arange(12.0).reshape(4, 3), "w": jnp.ones(2)}
  old = tx.update(jax.tree.map(jnp.ones_like, old_params), tx.init(old_params), old_params)[1]
  before = jax.tree.map(np.asarray, old)
  grown = {"embed": jnp.ones((6, 3)), "w": jnp.ones(2)}  # two new tokens
  with pytest.raises(prj.ReconcileError, match="on_shape_mismatch='overlap' to keep the state"):
    prj.reconcile(tx, old, grown)
  state, report = prj.reconcile(tx, old, grown, on_shape_mismatch="overlap")
  fresh = tx.init(grown)
  mu = np.asarray(state[0].mu["embed"])
  np.testing.assert_array_equal(mu[:4], before[0].mu["embed"])  # the old rows, bit for bit
  np.testing.assert_array_equal(mu[4:], np.asarray(fresh[0].mu["embed"])[4:])  # as tx.init
  np.testing.assert_array_equal(state[0].nu["w"], before[0].nu["w"])
  assert report.resized == (("n:embed", "(4, 3) -> (6, 3): kept [0:4, 0:3], fresh elsewhere"),)
  assert report.kept == ("n:w",) and report.reinitialized == ()
  assert "resized:" in str(report) and report.changed
  shrunk, report = prj.reconcile(
    tx, old, {"embed": jnp.ones((2, 3)), "w": jnp.ones(2)}, on_shape_mismatch="overlap"
  )
  np.testing.assert_array_equal(shrunk[0].mu["embed"], before[0].mu["embed"][:2])


def test_depth_changes_keep_the_layers_a_user_maps():
  tx = prj.keyed(optax.adam(1e-3))
  old_params = {"layers": jnp.ones((3, 2))}
  old = tx.init(old_params)
  mu = jnp.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
  old = (old[0]._replace(mu={"layers": mu}), old[1])
  deeper = {"layers": jnp.ones((5, 2))}
  state, report = prj.reconcile(
    tx, old, deeper, on_shape_mismatch=prj.layer_map([0, 1, 1, 2, None])
  )
  got = np.asarray(state[0].mu["layers"])[:, 0].tolist()
  assert got == [1.0, 2.0, 2.0, 3.0, 0.0]  # duplicated layer 1, a fresh layer at the end
  assert report.resized == (("n:layers", "(3, 2) -> (5, 2): by the on_shape_mismatch callable"),)
  with pytest.raises(prj.ReconcileError, match=r"n:layers: layer_map takes old layers \[7\]"):
    prj.reconcile(tx, old, deeper, on_shape_mismatch=prj.layer_map([0, 1, 7, 2, None]))
  with pytest.raises(
    prj.ReconcileError, match=r"gave a \(2,\) float32 leaf, the new state needs \(5, 2\)"
  ):
    prj.reconcile(tx, old, deeper, on_shape_mismatch=lambda key, o, f: jnp.ones(2))


# --- the same Adam under a new wrapping keeps its moments and count ------------------------------


def adam_state_after_steps(tx, params, steps=2):
  state = tx.init(params)
  for i in range(steps):
    state = tx.update(
      jax.tree.map(lambda p, i=i: jnp.ones_like(p) * (i + 1), params), state, params
    )[1]
  return state


def moments(state):
  """The Adam moments and count of a state, wherever the wrapping put them."""
  found = {}

  def visit(node):
    if isinstance(node, optax.ScaleByAdamState):
      found["count"], found["mu"], found["nu"] = node.count, node.mu, node.nu
    return node

  jax.tree.map(visit, state, is_leaf=lambda n: isinstance(n, optax.ScaleByAdamState))
  return jax.tree.map(np.asarray, found)


WRAPPINGS = {
  "clip added": (
    lambda: optax.adam(1e-2),
    lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2)),
  ),
  "clip removed": (
    lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2)),
    lambda: optax.adam(1e-2),
  ),
  "MultiSteps added": (
    lambda: optax.adam(1e-2),
    lambda: optax.MultiSteps(optax.adam(1e-2), every_k_schedule=2),
  ),
  "MultiSteps removed": (
    lambda: optax.MultiSteps(optax.adam(1e-2), every_k_schedule=2),
    lambda: optax.adam(1e-2),
  ),
}


@pytest.mark.parametrize("change", sorted(WRAPPINGS))
def test_the_same_adam_under_a_new_wrapping_keeps_its_moments_and_count(change):
  before_tx, after_tx = WRAPPINGS[change]
  params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
  old = adam_state_after_steps(prj.keyed(before_tx()), params)
  kept = moments(old)
  state, report = prj.reconcile(prj.keyed(after_tx()), old, params)
  jax.tree.map(np.testing.assert_array_equal, moments(state), kept)  # bit for bit
  assert report.kept == ("n:b", "n:w") and not report.added and not report.dropped
  assert (
    "the same transformations under a new wrapping, kept by what they are"
    in report.optimizer_changed
  )
  fresh = after_tx().init(params)
  if change == "MultiSteps added":  # its own counters and accumulators: as tx.init gives them
    assert int(state.mini_step) == 0 and int(state.gradient_step) == 0
    np.testing.assert_array_equal(state.acc_grads["w"], fresh.acc_grads["w"])
    assert "new state, as tx.init gives it: acc_grads, gradient_step, mini_step" in (
      report.optimizer_changed
    )
  with pytest.raises(prj.ReconcileError, match="on_unexpected='error'"):
    prj.reconcile(prj.keyed(after_tx()), old, params, on_unexpected="error")


def test_two_adams_in_one_chain_are_not_matched_by_guess():
  params = {"w": jnp.ones(3)}
  old = adam_state_after_steps(prj.keyed(optax.adam(1e-2)), params)
  two = prj.keyed(optax.chain(optax.adam(1e-2), optax.adam(1e-3)))
  with pytest.raises(prj.ReconcileError, match="missing from the old state"):
    prj.reconcile(two, old, params)


def test_lora_by_multi_transform_labels_keeps_the_count_and_reports_the_frozen_base():
  params = {"dense": {"kernel": jnp.ones((4, 4)), "bias": jnp.zeros(4)}}
  old = adam_state_after_steps(prj.keyed(optax.adam(1e-3)), params)
  lora = {**params, "lora": {"a": jnp.ones((4, 2)), "b": jnp.zeros((2, 4))}}
  labels = {"dense": {"kernel": "frozen", "bias": "frozen"}, "lora": {"a": "train", "b": "train"}}
  tx = prj.keyed(
    optax.multi_transform({"train": optax.adam(1e-3), "frozen": optax.set_to_zero()}, labels)
  )
  state, report = prj.reconcile(tx, old, lora)
  assert report.added == ("n:lora/a", "n:lora/b")
  assert report.dropped == ("n:dense/bias", "n:dense/kernel")  # frozen: no optimizer state now
  assert int(state.inner_states["train"].inner_state[0].count) == int(moments(old)["count"])
  assert "0/count -> inner_states/train/inner_state/0/count" in report.optimizer_changed


def test_a_state_nothing_can_be_matched_to_is_refused_with_the_way_past_it():
  params = {"w": jnp.ones(3)}
  with pytest.raises(prj.ReconcileError) as info:
    prj.reconcile(prj.keyed(optax.adam(1e-2)), {"step": jnp.array(3)}, params)
  text = str(info.value)
  assert "its parts cannot be matched by what they are" in text
  assert "Reconcile with the optimizer that built it" in text and "tx.init(params)" in text
  assert "pass the optax state itself" not in text  # the user did; the old advice misled


# --- issue: keyed surgery on today's JAX, with schedules, and on damaged state ---------------


def _adam_after(params, steps=2):
  tx = prj.keyed(optax.adam(1e-2))
  state = tx.init(params)
  for i in range(steps):
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5 + i), params)
    _, state = tx.update(grads, state, params)
  return tx, state


@pytest.mark.parametrize(
  "damage",
  ["a leaf deleted", "a leaf None", "all of nu gone"],
)
def test_half_a_moment_is_refused_naming_the_parameter_and_what_is_missing(damage):
  params = {"a": jnp.ones(3), "b": jnp.full(2, 2.0)}
  tx, st = _adam_after(params)
  mu, nu = dict(st[0].mu), dict(st[0].nu)
  if damage == "a leaf deleted":
    del mu["b"]
  elif damage == "a leaf None":
    mu["b"] = None
  else:
    nu = {}
  raw = {"0": {"count": st[0].count, "mu": mu, "nu": nu}, "1": {}}
  before = jax.tree.map(np.asarray, raw)
  missing = "0/nu" if damage == "all of nu gone" else "0/mu"
  with pytest.raises(prj.ReconcileError) as info:
    prj.reconcile(tx, raw, params)
  text = str(info.value)
  assert "half a moment is never kept" in text and "on_incomplete='init'" in text
  assert re.search(rf"n:b: has 0/\w+; missing {missing}", text), text
  chex.assert_trees_all_equal(jax.tree.map(np.asarray, raw), before)
  # the way out, pasted: every leaf of the damaged parameters fresh, the others kept bit for bit
  state, report = prj.reconcile(tx, raw, params, on_incomplete="init")
  fresh = tx.init(params)
  damaged = {"a", "b"} if damage == "all of nu gone" else {"b"}
  for k in params:
    for moment in ("mu", "nu"):
      got = getattr(state[0], moment)[k]
      want = getattr(fresh[0] if k in damaged else st[0], moment)[k]
      np.testing.assert_array_equal(got, want, err_msg=f"{k} {moment}")
  assert set(report.reinitialized) == {f"n:{k}" for k in damaged}
  assert set(report.kept) == {f"n:{k}" for k in params} - set(report.reinitialized)


def test_an_overlap_that_keeps_nothing_is_reported_re_initialised():
  tx = prj.keyed(optax.adam(1e-2))
  old = tx.init({"w": jnp.ones(4)})
  old = (old[0]._replace(mu={"w": jnp.full(4, 3.0)}, nu={"w": jnp.full(4, 5.0)}), old[1])
  new = {"w": jnp.ones(4, jnp.bfloat16)}
  state, report = prj.reconcile(tx, old, new, on_shape_mismatch="overlap")
  assert report.resized == () and report.reinitialized == ("n:w",) and report.kept == ()
  assert not np.asarray(state[0].mu["w"]).any() and state[0].mu["w"].dtype == jnp.bfloat16
  grown = {"w": jnp.ones(6)}  # and one that keeps something says exactly what
  state, report = prj.reconcile(tx, old, grown, on_shape_mismatch="overlap")
  assert report.resized == (("n:w", "(4,) -> (6,): kept [0:4], fresh elsewhere"),)
  assert report.reinitialized == ()
  np.testing.assert_array_equal(state[0].mu["w"], [3, 3, 3, 3, 0, 0])


def test_reconcile_and_overlap_work_on_the_default_explicit_axes_mesh():
  mesh = jax.make_mesh((4, 2), ("data", "model"))  # Explicit axes on the newest jax
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data", "model"))
  old = {"e": jax.device_put(jnp.arange(192.0).reshape(24, 8), sharding)}
  new = {"e": jax.device_put(jnp.ones((40, 8)), sharding)}
  tx, st = _adam_after(old)
  state, report = prj.reconcile(tx, st, new, on_shape_mismatch="overlap")
  assert report.resized[0][0] == "n:e" and state[0].mu["e"].sharding == sharding
  np.testing.assert_array_equal(np.asarray(state[0].mu["e"])[:24], np.asarray(st[0].mu["e"]))
  assert not np.asarray(state[0].mu["e"])[24:].any()
  same, report = prj.reconcile(tx, st, old)
  assert report.kept == ("n:e",) and same[0].nu["e"].sharding == sharding
  np.testing.assert_array_equal(same[0].nu["e"], st[0].nu["e"])


def test_a_scheduled_learning_rate_is_code_not_a_change():
  schedule = optax.linear_schedule(1e-2, 0.0, 10)
  tx = prj.keyed(optax.inject_hyperparams(optax.adam)(learning_rate=schedule))
  params = {"a": jnp.ones(3)}
  state = tx.init(params)
  for _ in range(3):
    _, state = tx.update({"a": jnp.ones(3)}, state, params)
  before = jax.tree.map(np.asarray, state)
  new, report = prj.reconcile(tx, state, params)
  assert not report.changed and report.hyperparams == ()
  chex.assert_trees_all_equal(jax.tree.map(np.asarray, new), before)  # a no-op, bit for bit
  fixed = prj.keyed(optax.inject_hyperparams(optax.adam)(learning_rate=1e-4))  # a constant
  _, report = prj.reconcile(fixed, state, params)
  assert report.changed and report.hyperparams[0][0].endswith("learning_rate")


def test_a_momentum_state_into_adam_gets_the_way_out_and_it_works():
  params = {"a": jnp.ones(3)}
  old = prj.keyed(optax.sgd(0.1, momentum=0.9)).init(params)
  tx = prj.keyed(optax.adam(1e-3))
  with pytest.raises(
    prj.ReconcileError, match=r"start this optimizer fresh with tx\.init\(params\)"
  ):
    prj.reconcile(tx, old, params)
  state = tx.init(params)  # the way out, pasted
  chex.assert_trees_all_equal(prj.reconcile(tx, state, params)[0], state)


def test_a_live_flax_train_state_is_accepted_whole():
  from flax import linen
  from flax.training import train_state

  model = linen.Dense(3)
  params = model.init(jax.random.key(0), jnp.ones((1, 2)))["params"]
  tx = prj.keyed(optax.adam(1e-3))
  ts = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)
  ts = ts.apply_gradients(grads=jax.tree.map(jnp.ones_like, params))
  state, report = prj.reconcile(tx, ts, params)
  assert report.kept == ("n:bias", "n:kernel") and not report.changed
  chex.assert_trees_all_equal(state, ts.opt_state)


def test_reconcile_under_jit_is_refused_at_trace_time():
  """Under ``jax.jit`` the moments would keep the old sharding (eagerly: the new one)."""
  tx = prj.keyed(optax.adam(1e-3))
  params = {"a": jnp.ones(3)}
  state = tx.init(params)
  with pytest.raises(prj.ReconcileError, match=r"under a jax transformation .* Call it eagerly"):
    jax.jit(lambda s, p: prj.reconcile(tx, s, p)[0])(state, params)
  assert prj.reconcile(tx, state, params)[1].kept == ("n:a",)
