"""ParamRegistry: ported seed tests plus the JAX-native contract."""

import pickle
import re
from typing import NamedTuple

import chex
import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import paramreg_jax as prj
from paramreg_jax import ParamId
from paramreg_jax import ParamRegistry


def tensor(n):
  return jnp.zeros((n,), jnp.float32)


# --- ported seed tests (param_id.rs mod tests) -------------------------------------------


def test_same_tensor_resolves_to_one_id():
  reg, a = ParamRegistry().id_for_named("w", tensor(4))
  reg, b = reg.id_for_named("w", tensor(4))
  assert a == b and len(reg) == 1


def test_distinct_tensors_get_distinct_ids():
  reg, ids = prj.assign_ids(ParamRegistry(), {"a": tensor(4), "b": tensor(8)})
  assert ids["a"] != ids["b"] and len(reg) == 2


def test_updating_a_tree_keeps_every_id():
  # JAX analogue of "mutating in place" and "rebind after reallocation": a new array at the
  # same path keeps its id.
  params = {"w": tensor(4), "layers": [tensor(2), tensor(3)]}
  reg, ids = prj.assign_ids(ParamRegistry(), params)
  new_params = jax.tree.map(lambda x: x + 1.0, params)
  reg2, ids2 = prj.assign_ids(reg, new_params)
  assert ids2 == ids and reg2 == reg and len(reg2) == 3


def test_named_ids_are_address_independent():
  reg, a = ParamRegistry().id_for_named("w", tensor(4))
  reg, b = reg.id_for_named("w", jnp.ones(4))
  assert a == b and reg.key(a) == "n:w"


def test_keys_are_stable_and_prefixed():
  reg, pid = ParamRegistry().id_for_position(0, tensor(4))
  assert reg.key(pid) == "p:0"
  reg, nid = ParamRegistry().id_for_named("bias", tensor(4))
  assert reg.key(nid) == "n:bias"


def test_restored_positional_slots_are_claimed_in_order():
  reg = ParamRegistry.from_keys({"p:0": 4, "p:1": 8})
  reg, ids = prj.assign_ids(reg, [tensor(4), tensor(8)], by="position")
  assert [reg.key(i) for i in ids] == ["p:0", "p:1"] and len(reg) == 2


def test_restored_named_slots_match_by_name_in_any_order():
  reg = ParamRegistry.from_keys({"n:a": 4, "n:b": 8})
  reg, b = reg.id_for_named("b", tensor(8))
  reg, a = reg.id_for_named("a", tensor(4))
  assert (reg.key(a), reg.key(b)) == ("n:a", "n:b") and len(reg) == 2


def test_order_mismatch_on_resume_is_an_error_not_silent_reset():
  reg = ParamRegistry.from_keys({"p:0": 4})
  with pytest.raises(
    prj.errors.OrderingContractError,
    match=re.escape(
      "p:0: positional slot 0 records 4 elements, but the leaf at flatten position 0 is "
      "(9,) float32. Positional identity is the flatten order"
    ),
  ):
    reg.id_for_position(0, tensor(9))
  # the mismatch is also caught for shapes with the same element count
  reg = ParamRegistry.from_keys({"p:0": (2, 3)})
  with pytest.raises(prj.errors.OrderingContractError, match=re.escape("records (2, 3)")):
    reg.id_for_position(0, jnp.zeros((3, 2)))


def test_anonymous_path_refuses_to_hijack_a_named_slot():
  reg = ParamRegistry.from_keys({"n:w": 4})
  with pytest.raises(
    prj.errors.NamedSlotHijackError,
    match=re.escape(
      "p:0: slot 0 was registered under the name 'w' (n:w); the positional path never claims a named slot"
    ),
  ):
    reg.id_for_position(0, tensor(4))


def test_restore_rejects_unprefixed_keys():
  with pytest.raises(prj.errors.UnknownKeyPrefixError, match="0x7f9c2a001234"):
    ParamRegistry().restore_key("0x7f9c2a001234", 4)


def test_clear_resets_everything():
  reg, _ = prj.assign_ids(ParamRegistry(), {"a": tensor(1), "b": tensor(2)})
  reg = reg.clear()
  assert reg.is_empty() and len(reg) == 0 and reg.keys() == ()
  reg, pid = reg.id_for_position(0, tensor(3))
  assert reg.key(pid) == "p:0"


# --- seed behaviours beyond the named tests ------------------------------------------------


def test_empty_registry_queries():
  reg = ParamRegistry()
  assert len(reg) == 0 and reg.is_empty() and reg.keys() == ()
  for q in (reg.key, reg.name, reg.numel, reg.shape, reg.dtype):
    assert q(ParamId(0)) is None


def test_queries_on_named_positional_and_placeholder_slots():
  reg, pid = ParamRegistry().restore_key("p:2", 8)
  assert reg.keys() == ("p:0", "p:1", "p:2") and len(reg) == 3
  assert reg.numel(ParamId(0)) is None and reg.name(ParamId(0)) is None
  assert reg.numel(pid) == 8 and reg.shape(pid) is None
  reg, nid = reg.id_for_named("w", jnp.zeros((2, 3), jnp.bfloat16))
  assert nid == ParamId(3) and reg.name(nid) == "w" and reg.numel(nid) == 6
  assert reg.shape(nid) == (2, 3) and reg.dtype(nid) == jnp.bfloat16
  assert reg.key(ParamId(99)) is None and reg.id_for_key("n:w") == nid


def test_restore_order_does_not_matter_for_indexed_keys():
  a = ParamRegistry.from_keys(["p:1", "p:0"])
  b = ParamRegistry.from_keys(["p:0", "p:1"])
  assert a.keys() == b.keys() == ("p:0", "p:1")


def test_restore_named_twice_adds_no_slot_and_fills_unknown_size():
  reg, a = ParamRegistry().restore_key("n:w")
  reg, b = reg.restore_key("n:w", 4)
  assert a == b and len(reg) == 1 and reg.numel(a) == 4


def test_restore_p_index_of_named_slot_is_refused():
  reg = ParamRegistry.from_keys(["n:w"])
  with pytest.raises(prj.errors.NamedSlotHijackError):
    reg.restore_key("p:0")


@pytest.mark.parametrize("key", ["p:", "p:x", "p:007", "p:-1", "p:100000000"])
def test_restore_rejects_malformed_indices(key):
  with pytest.raises(prj.errors.MalformedKeyError):
    ParamRegistry().restore_key(key)


def test_unknown_size_accepts_any_leaf():
  reg = ParamRegistry.from_keys(["p:0", "n:w"])
  reg, _ = reg.id_for_position(0, jnp.zeros((5, 5)))
  reg, wid = reg.id_for_named("w", jnp.zeros(7))
  assert reg.shape(ParamId(0)) == (5, 5) and reg.numel(wid) == 7


def test_named_size_mismatch_is_an_error_stronger_than_the_seed():
  reg, _ = ParamRegistry().id_for_named("w", tensor(4))
  with pytest.raises(
    prj.errors.ShapeMismatchError,
    match=re.escape("n:w: the slot records (4,) float32, but (5,) float32 was offered"),
  ):
    reg.id_for_named("w", tensor(5))
  with pytest.raises(prj.errors.ShapeMismatchError, match="bfloat16"):
    reg.id_for_named("w", jnp.zeros(4, jnp.bfloat16))


def test_named_path_validates_names():
  with pytest.raises(prj.errors.MalformedKeyError):
    ParamRegistry().id_for_named("", tensor(1))


def test_registration_is_pure():
  reg = ParamRegistry()
  reg2, _ = reg.id_for_named("w", tensor(4))
  assert reg.is_empty() and len(reg2) == 1
  with pytest.raises(prj.errors.ShapeMismatchError):
    prj.assign_ids(reg2, {"w": tensor(5), "v": tensor(1)})
  assert reg2.keys() == ("n:w",)


def test_leaf_without_shape_is_a_clear_type_error():
  with pytest.raises(
    TypeError, match=re.escape("n:a: a parameter leaf must have .shape and .dtype")
  ):
    prj.assign_ids(ParamRegistry(), {"a": "not an array"})


# --- whole-tree assignment ----------------------------------------------------------------


def test_assign_same_tree_twice_does_not_grow():
  tree = {"a": tensor(1), "b": [tensor(2), tensor(3)]}
  reg, ids = prj.assign_ids(ParamRegistry(), tree)
  reg2, ids2 = prj.assign_ids(reg, tree)
  assert len(reg2) == 3 and ids2 == ids and reg2 is reg


def test_none_leaves_and_empty_subtrees_are_not_parameters():
  tree = {"a": None, "b": {}, "c": [], "d": tensor(2)}
  reg, keys = prj.assign_keys(ParamRegistry(), tree)
  assert reg.keys() == ("n:d",)
  assert keys == {"a": None, "b": {}, "c": [], "d": "n:d"}


def test_by_position():
  reg, keys = prj.assign_keys(ParamRegistry(), {"z": tensor(1), "a": tensor(2)}, by="position")
  assert keys == {"a": "p:0", "z": "p:1"} and reg.name(ParamId(0)) is None


def test_by_position_on_a_named_registry_is_refused():
  reg, _ = prj.assign_ids(ParamRegistry(), {"w": tensor(1)})
  with pytest.raises(prj.errors.NamedSlotHijackError):
    prj.assign_ids(reg, [tensor(1)], by="position")


def test_bad_by():
  with pytest.raises(ValueError, match="by must be 'name' or 'position'"):
    prj.assign_ids(ParamRegistry(), {"a": tensor(1)}, by="path")  # type: ignore[arg-type]


class TwoViews:
  """A custom node whose children are reachable both as attribute 'x' and as item 'x'."""

  def __init__(self, a, b):
    self.a, self.b = a, b


jax.tree_util.register_pytree_with_keys(
  TwoViews,
  lambda n: (((jax.tree_util.GetAttrKey("x"), n.a), (jax.tree_util.DictKey("x"), n.b)), None),
  lambda _, c: TwoViews(*c),
)


def test_collisions_are_raised_never_merged():
  tree = {"m": TwoViews(tensor(1), tensor(2)), "k": TwoViews(tensor(1), tensor(2))}
  with pytest.raises(prj.errors.KeyCollisionError) as info:
    prj.assign_ids(ParamRegistry(), tree)
  msg = str(info.value)
  assert "2 canonical name(s) are shared by different leaves" in msg
  assert "n:m/x <- ['m'].x, ['m']['x']" in msg and "n:k/x <- " in msg
  # 'a/b' escapes to a~1b, so it does NOT collide with a/b
  tree = {"a/b": tensor(3), "a": {"b": tensor(4)}}
  reg, _ = prj.assign_ids(ParamRegistry(), tree)
  assert set(reg.keys()) == {"n:a~1b", "n:a/b"}


class Pair(NamedTuple):
  kernel: jax.Array
  bias: jax.Array


def test_names_users_would_write():
  # plain dict / list / tuple / NamedTuple
  _, keys = prj.assign_keys(
    ParamRegistry(), {"enc": [Pair(tensor(2), tensor(1))], "t": (tensor(1),)}
  )
  assert keys == {"enc": [Pair("n:enc/0/kernel", "n:enc/0/bias")], "t": ("n:t/0",)}
  # flax linen
  lin = nn.Dense(3).init(jax.random.key(0), jnp.ones((1, 2)))
  _, keys = prj.assign_keys(ParamRegistry(), lin)
  assert jax.tree.leaves(keys) == ["n:params/bias", "n:params/kernel"]
  # flax NNX State: Variable's .value is not part of the name
  model = nnx.Sequential(nnx.Linear(2, 3, rngs=nnx.Rngs(0)), nnx.Linear(3, 1, rngs=nnx.Rngs(1)))
  state = nnx.state(model, nnx.Param)
  reg, _ = prj.assign_keys(ParamRegistry(), state)
  assert reg.keys() == (
    "n:layers/0/bias",
    "n:layers/0/kernel",
    "n:layers/1/bias",
    "n:layers/1/kernel",
  )
  # equinox
  lin = eqx.nn.Linear(2, 3, key=jax.random.key(0))
  reg, _ = prj.assign_keys(ParamRegistry(), eqx.filter(lin, eqx.is_array))
  assert reg.keys() == ("n:weight", "n:bias")


def test_abstract_trees_get_the_same_keys():
  params = {"w": jnp.zeros((2, 3)), "b": jnp.zeros(3)}
  abstract = jax.eval_shape(lambda: params)
  r1, _ = prj.assign_ids(ParamRegistry(), params)
  r2, _ = prj.assign_ids(ParamRegistry(), abstract)
  assert r1 == r2


# --- value semantics: pytree with no leaves, hashable, jit-static, pickle ----------------------


def test_registry_is_a_leafless_pytree():
  reg, _ = prj.assign_ids(ParamRegistry(), {"a": tensor(1), "b": tensor(2)})
  assert jax.tree.leaves(reg) == []
  mapped = jax.tree.map(lambda x: x + 1, reg)
  assert isinstance(mapped, ParamRegistry) and mapped == reg
  leaves, treedef = jax.tree_util.tree_flatten(reg)
  assert jax.tree_util.tree_unflatten(treedef, leaves) == reg
  chex.assert_trees_all_equal({"reg": reg, "x": tensor(2)}, {"reg": mapped, "x": tensor(2)})


def test_registry_hash_and_equality_are_by_value():
  a, _ = prj.assign_ids(ParamRegistry(), {"a": tensor(1)})
  b, _ = ParamRegistry().id_for_named("a", tensor(1))
  assert a == b and hash(a) == hash(b) and a is not b
  c, _ = ParamRegistry().id_for_named("a", tensor(2))
  assert a != c
  assert len({a, b, c}) == 2


def test_registry_pickles():
  reg, _ = prj.assign_ids(ParamRegistry(), {"a": jnp.zeros((2,), jnp.bfloat16), "b": tensor(3)})
  reg = reg.restore_key("p:3", 5)[0]
  again = pickle.loads(pickle.dumps(reg))
  assert again == reg and again.keys() == reg.keys() and again.dtype(ParamId(0)) == jnp.bfloat16


def test_registry_is_a_static_jit_argument_without_retracing():
  traces = []

  f = jax.jit(lambda x, reg: (traces.append(1), x * len(reg))[1], static_argnums=1)
  reg, _ = prj.assign_ids(ParamRegistry(), {"a": tensor(1), "b": tensor(1)})
  same, _ = prj.assign_ids(ParamRegistry(), {"a": tensor(1), "b": tensor(1)})
  np.testing.assert_array_equal(f(jnp.ones(2), reg), 2 * np.ones(2))
  f(jnp.ones(2), same)
  assert len(traces) == 1
  # and as a pytree argument (no leaves): also fine under jit
  g = jax.jit(lambda x, r: x + len(r))
  assert float(g(1.0, reg)) == 3.0


def test_registry_rides_in_a_pytree_through_jit():
  reg, _ = prj.assign_ids(ParamRegistry(), {"a": tensor(1)})
  out = jax.jit(lambda s: s)({"reg": reg, "count": jnp.zeros(())})
  assert out["reg"] == reg


# --- properties -------------------------------------------------------------------------------

_names = st.text(alphabet="ab/~:0ü", min_size=0, max_size=4)


@st.composite
def trees(draw, depth=0):
  if depth >= 3 or draw(st.booleans()):
    return jnp.zeros((draw(st.integers(0, 3)),))
  kind = draw(st.sampled_from(["dict", "list"]))
  if kind == "dict":
    keys = draw(st.lists(_names, min_size=1, max_size=3, unique=True))
    return {k: draw(trees(depth + 1)) for k in keys}
  return [draw(trees(depth + 1)) for _ in range(draw(st.integers(1, 3)))]


@settings(max_examples=60, deadline=None)
@given(trees())
def test_assignment_properties(tree):
  tree = {"root": tree}
  reg, ids = prj.assign_ids(ParamRegistry(), tree)
  flat = jax.tree.leaves(ids)
  assert len(set(flat)) == len(flat) == len(reg)  # distinct leaves -> distinct ids
  reg2, ids2 = prj.assign_ids(reg, jax.tree.map(lambda x: x + 1, tree))
  assert ids2 == ids and reg2 == reg  # idempotent, value-independent
  # the registry can be rebuilt from its keys and re-claimed by the same tree
  rebuilt = ParamRegistry.from_keys({k: reg.shape(ParamId(i)) for i, k in enumerate(reg.keys())})
  reg3, ids3 = prj.assign_ids(rebuilt, tree)
  assert ids3 == ids and reg3.keys() == reg.keys()
  for k in reg.keys():
    path = prj.name_to_path(k[2:])
    assert path[0] == "root"
