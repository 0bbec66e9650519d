"""Key grammar: path_to_name / name_to_path / parse_key."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import paramreg_jax as prj
from paramreg_jax._src.registry import keys as keys_lib

DK = jax.tree_util.DictKey
GA = jax.tree_util.GetAttrKey
SK = jax.tree_util.SequenceKey
FK = jax.tree_util.FlattenedIndexKey


def test_prefixes():
  assert prj.NAMED_KEY_PREFIX == "n:"
  assert prj.INDEXED_KEY_PREFIX == "p:"


@pytest.mark.parametrize(
  "path, name",
  [
    ((DK("a"),), "a"),
    ((GA("a"), DK("b")), "a/b"),
    ((SK(3),), "3"),
    ((DK(3),), "3"),
    ((DK("3"),), "3"),
    ((FK(3),), "3"),
    ((DK("a/b"), DK("c~d")), "a~1b/c~0d"),
    ((DK(""),), "~2"),
    ((DK("x"), DK(""), DK("y")), "x/~2/y"),
    ((DK("layers"), DK(0), DK("kernel"), GA("value")), "layers/0/kernel"),
    ((DK("layers"), DK(0), DK("kernel"), GA("raw_value")), "layers/0/kernel"),
    # a dict key 'value' is a name like any other (orbax's saved-Variable dicts are folded by
    # fold_saved_variables, not by the grammar)
    ((DK("layers"), DK(0), DK("kernel"), DK("value")), "layers/0/kernel/value"),
    ((DK("attn"), DK("value")), "attn/value"),
    ((DK("attn"), DK("raw_value")), "attn/raw_value"),
    ((DK("value"),), "value"),
    ((DK("ü"), DK("n:x")), "ü/n:x"),
  ],
)
def test_path_to_name(path, name):
  assert prj.path_to_name(path) == name


def test_root_leaf_has_no_name():
  with pytest.raises(prj.errors.MalformedKeyError, match=re.escape("use by='position'")):
    prj.path_to_name(())


@pytest.mark.parametrize("bad", ["", "a//b", "/a", "a/", "a~", "a~3b", "~"])
def test_name_to_path_rejects_malformed(bad):
  with pytest.raises(prj.errors.MalformedKeyError):
    prj.name_to_path(bad)


_component = st.one_of(st.text(max_size=8), st.integers(min_value=0, max_value=10**6))


@settings(max_examples=300, deadline=None)
@given(st.lists(_component, min_size=1, max_size=6))
def test_round_trip(components):
  path = tuple(DK(c) for c in components)
  name = prj.path_to_name(path)
  assert prj.name_to_path(name) == tuple(str(c) for c in components)
  assert keys_lib.parse_key("n:" + name).name == name


@settings(max_examples=200, deadline=None)
@given(
  st.lists(
    st.lists(st.text(max_size=4), min_size=1, max_size=4), min_size=2, max_size=6, unique_by=tuple
  )
)
def test_distinct_paths_never_collide(paths):
  names = {prj.path_to_name(tuple(DK(c) for c in p)) for p in paths}
  assert len(names) == len(paths)


def test_tree_names_for_real_trees():
  tree = {"enc": [{"w": jnp.ones(1)}, {"w": jnp.ones(1)}], "b": (jnp.ones(1),)}
  assert keys_lib.tree_names(tree) == ["b/0", "enc/0/w", "enc/1/w"]


@pytest.mark.parametrize(
  "key, message",
  [
    (
      "0x7f9c2a001234",
      "unrecognised parameter key '0x7f9c2a001234': expected 'n:<name>' or 'p:<index>'",
    ),
    ("p:", "malformed parameter key 'p:': '' is not a canonical index"),
    ("p:007", "malformed parameter key 'p:007': '007' is not a canonical index"),
    ("p:-1", "malformed parameter key 'p:-1'"),
    ("p:x", "malformed parameter key 'p:x'"),
    ("p:99999999999", "exceeds the limit"),
    ("n:", "a parameter name must be a non-empty string"),
  ],
)
def test_parse_key_errors_golden(key, message):
  with pytest.raises(prj.errors.MalformedKeyError, match=re.escape(message)):
    keys_lib.parse_key(key)


def test_unknown_prefix_is_its_own_class():
  with pytest.raises(prj.errors.UnknownKeyPrefixError):
    keys_lib.parse_key("m:foo")
  assert issubclass(prj.errors.UnknownKeyPrefixError, prj.ParamRegError)
  assert issubclass(prj.ParamRegError, ValueError)


def test_parse_key_valid():
  assert keys_lib.parse_key("p:0").index == 0
  assert keys_lib.parse_key("p:12").index == 12
  assert keys_lib.parse_key("n:a~1b/c").name == "a~1b/c"
  assert keys_lib.is_canonical_key("n:x") and not keys_lib.is_canonical_key("x")


SHARED = jax.tree_util.GetAttrKey("w")  # a custom node that reuses one key object everywhere


class Shared:
  def __init__(self, w):
    self.w = w


jax.tree_util.register_pytree_with_keys(
  Shared, lambda n: (((SHARED, n.w),), None), lambda _, c: Shared(*c)
)


@settings(max_examples=100, deadline=None)
@given(
  st.recursive(
    st.just(1.0),
    lambda kids: st.one_of(
      st.dictionaries(st.text(alphabet="ab/~v", max_size=3), kids, min_size=1, max_size=3),
      st.lists(kids, min_size=1, max_size=3),
      kids.map(Shared),
    ),
    max_leaves=12,
  )
)
def test_paths_to_names_equals_path_to_name(tree):
  tree = {"root": tree, "value": {"value": 2.0}}
  paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
  assert keys_lib.paths_to_names(paths) == [prj.path_to_name(p) for p in paths]


@settings(max_examples=150, deadline=None)
@given(
  st.recursive(
    st.one_of(
      st.just(1.0),
      st.just(None),
      st.just(True),
      st.just(np.float32(2.0)),
      st.builds(lambda: np.zeros(2)),
      st.builds(lambda: jnp.zeros(1)),
    ),
    lambda kids: st.one_of(
      st.dictionaries(
        st.one_of(st.text(alphabet="ab/~v", max_size=3), st.sampled_from(["value", "raw_value"])),
        kids,
        max_size=3,
      ),
      st.dictionaries(st.integers(0, 20), kids, max_size=3),
      st.lists(kids, max_size=3),
      st.lists(kids, max_size=3).map(tuple),
      kids.map(Shared),
    ),
    max_leaves=14,
  )
)
def test_fast_walk_equals_the_general_path_or_declines(tree):
  tree = {"root": tree}
  leaves = jax.tree_util.tree_leaves(tree)
  fast = keys_lib.fast_tree_names(tree, leaves)
  general = keys_lib.paths_to_names([p for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]])
  assert fast is None or fast == general


# Trees the fast walk is meant to take (dicts with string or int keys, lists, tuples, array and
# scalar leaves), with names that need escaping in most examples: every one must take the fast
# path and give the general path's names.
_ESCAPED = st.text(alphabet="ab/~", min_size=1, max_size=3)
_PLAIN_TREES = st.recursive(
  st.one_of(st.just(1.0), st.builds(lambda: np.zeros(2)), st.builds(lambda: jnp.zeros(1))),
  lambda kids: st.one_of(
    st.dictionaries(_ESCAPED, kids, min_size=1, max_size=3),
    st.dictionaries(st.integers(0, 20), kids, min_size=1, max_size=3),
    st.lists(kids, min_size=1, max_size=3),
    st.lists(kids, min_size=1, max_size=3).map(tuple),
  ),
  max_leaves=14,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(_ESCAPED, _PLAIN_TREES, min_size=1, max_size=3))
def test_the_fast_walk_takes_plain_trees_and_escapes_like_the_general_path(tree):
  leaves = jax.tree_util.tree_leaves(tree)
  fast = keys_lib.fast_tree_names(tree, leaves)
  general = keys_lib.paths_to_names([p for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]])
  assert fast is not None, "the fast walk declined a plain tree"
  assert fast == general


def test_the_fast_walk_is_reached_and_escapes():
  tree = {"a/b": {"c~": [jnp.zeros(1), np.zeros(2)]}, "x": {0: 1.0}}
  names = keys_lib.fast_tree_names(tree, jax.tree_util.tree_leaves(tree))
  assert names == ["a~1b/c~0/0", "a~1b/c~0/1", "x/0"]


def test_the_fast_walk_names_tracers_inside_jit():
  # jax's tracers are jax.Array instances without subclassing it: the walk must still take them
  tree = {"dense": {"kernel": jnp.zeros((2, 2)), "bias": jnp.zeros(2)}, "scale": [jnp.ones(())]}
  seen = []

  def f(t):
    seen.append(keys_lib.fast_tree_names(t, jax.tree_util.tree_leaves(t)))
    return t

  jax.jit(f)(tree)
  assert seen == [["dense/bias", "dense/kernel", "scale/0"]]


def test_value_and_raw_value_dict_keys_are_distinct_names():
  params = {"attn": {"query": 1.0, "key": 2.0, "value": 3.0, "raw_value": 4.0}}
  _, keys = prj.assign_keys(prj.ParamRegistry(), params)
  assert keys["attn"] == {
    "query": "n:attn/query",
    "key": "n:attn/key",
    "value": "n:attn/value",
    "raw_value": "n:attn/raw_value",
  }


def test_saved_variable_levels_fold_only_when_alone():
  saved = {
    "dense": {"kernel": {"value": 1.0}},  # an orbax-saved nnx Variable
    "attn": {"key": 2.0, "value": 3.0},  # a user's dict with a 'value' entry
    "v": {"value": {"value": 4.0}},  # a Variable holding a dict key 'value'
  }
  paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(saved)[0]]
  names = [prj.path_to_name(p) for p in keys_lib.fold_saved_variables(paths)]
  assert names == ["attn/key", "attn/value", "dense/kernel", "v/value"]
