"""Messages that name the mistake and a fix that works when pasted."""

import ast
import re

import jax
import numpy as np
import pytest

import paramreg_jax as prj


def test_a_swapped_rename_is_named_and_the_pasted_fix_restores():
  src = prj.MemorySource({"enc.w": np.ones((2, 2), np.float32), "enc.b": np.zeros(2, np.float32)})
  target = {
    "encoder": {
      "kernel": jax.ShapeDtypeStruct((2, 2), np.float32),
      "bias": jax.ShapeDtypeStruct((2,), np.float32),
    }
  }
  with pytest.raises(prj.RestorePlanError) as e:
    prj.plan_restore(target, src, rename={"encoder/kernel": "enc.w", "encoder/bias": "enc.b"})
  first = e.value.problems[0]
  assert "swapped?" in first and "2 entries run the other way" in first
  fix = ast.literal_eval(re.search(r"Pass rename=(\{.*\})$", first).group(1))
  out = prj.restore(target, src, rename=fix)
  np.testing.assert_array_equal(np.asarray(out["encoder"]["kernel"]), np.ones((2, 2)))


def test_a_rename_in_the_right_direction_is_not_called_swapped():
  src = prj.MemorySource({"enc.w": np.ones((2, 2), np.float32)})
  target = {"encoder": {"kernel": jax.ShapeDtypeStruct((2, 2), np.float32)}}
  with pytest.raises(prj.RestorePlanError) as e:  # a typo, not a swap
    prj.plan_restore(target, src, rename={"enc.w": "encoder/kernl"})
  assert not any("swapped" in p for p in e.value.problems)


def test_a_wrong_fused_part_name_is_a_library_error_with_did_you_mean():
  split = prj.recipes.fused_split("qkv", 0, {"q": 4, "k": 2, "v": 2})
  with pytest.raises(prj.errors.UnknownPartError, match=r"no part 'Q'.*did you mean 'q'\?"):
    split["Q"]
  with pytest.raises(KeyError):  # still a KeyError, as a mapping's missing key is
    split["x"]


def test_a_recipe_for_a_misspelt_target_says_did_you_mean():
  src = prj.MemorySource({"w": np.ones((2, 2), np.float32)})
  target = {"dense": {"kernel": jax.ShapeDtypeStruct((2, 2), np.float32)}}
  with pytest.raises(prj.RestorePlanError, match=r"n:dense/kernl: .*did you mean 'dense/kernel'"):
    prj.plan_restore(target, src, recipes={"dense/kernl": prj.recipes.source("w")})


def test_reconcile_after_inserting_a_layer_suggests_the_rename_that_keeps_the_moments():
  import jax.numpy as jnp
  import optax

  params = {
    "layers": [{"kernel": jnp.ones((16, 16))}, {"kernel": jnp.arange(512.0).reshape(16, 32)}]
  }
  tx = prj.keyed(optax.adam(1e-2))
  state = tx.init(params)
  _, state = tx.update(jax.tree.map(jnp.sin, params), state, params)
  saved_mu = np.asarray(state[0].mu["layers"][1]["kernel"]).copy()
  new = {
    "layers": [
      {"kernel": jnp.ones((16, 16))},
      {"kernel": jnp.ones((16, 24))},  # inserted
      {"kernel": jnp.arange(512.0).reshape(16, 32)},
    ]
  }
  with pytest.raises(prj.ReconcileError) as e:
    prj.reconcile(tx, state, new)
  text = str(e.value)
  assert text.index("rename=") < text.index("on_shape_mismatch='overlap'")  # rename first
  fix = ast.literal_eval(re.search(r"rename=(\{[^}]*\})", text).group(1))
  assert fix == {"n:layers/1/kernel": "n:layers/2/kernel"}
  fixed, report = prj.reconcile(tx, state, new, rename=fix)
  np.testing.assert_array_equal(np.asarray(fixed[0].mu["layers"][2]["kernel"]), saved_mu)
  assert not np.asarray(fixed[0].mu["layers"][1]["kernel"]).any()  # the new layer starts fresh
  assert "n:layers/1/kernel" in str(report)


def test_problems_alike_but_for_their_names_are_one_bullet():
  """A bfloat16 model restored without a cast: one bullet says the fix, the others are named
  after it; the unused keys likewise. ``.problems`` keeps every one."""
  ck = {f"l{i}/w": np.ones((4, 4), np.float32) for i in range(6)}
  ck |= {f"extra{i}": np.ones(3, np.float32) for i in range(12)}
  target = {f"l{i}": {"w": jax.ShapeDtypeStruct((4, 4), jax.numpy.bfloat16)} for i in range(6)}
  with pytest.raises(prj.RestorePlanError) as e:
    prj.restore(target, prj.MemorySource(ck))
  assert len(e.value.problems) == 18
  assert str(e.value).splitlines()[1:] == [
    "  - n:l0/w: checkpoint 'l0/w' has dtype float32, target expects bfloat16; pass "
    "dtype_policy='cast' or add a cast recipe",
    "    (and 5 more alike: n:l1/w, n:l2/w, n:l3/w, n:l4/w, n:l5/w)",
    "  - checkpoint key 'extra0' is not used by any parameter; rename it, exclude it, or map it "
    "with a recipe",
    "    (and 11 more alike: 'extra1', 'extra10', 'extra11', 'extra2', 'extra3', 'extra4', "
    "'extra5', 'extra6', ...)",
  ]


def test_two_problems_alike_stay_two_bullets():
  ck = {f"l{i}/w": np.ones((4, 4), np.float32) for i in range(2)}
  target = {f"l{i}": {"w": jax.ShapeDtypeStruct((4, 4), jax.numpy.bfloat16)} for i in range(2)}
  with pytest.raises(prj.RestorePlanError) as e:
    prj.restore(target, prj.MemorySource(ck))
  assert "alike" not in str(e.value) and str(e.value).count("\n  - ") == 2
