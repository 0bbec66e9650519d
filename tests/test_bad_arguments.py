"""Bad arguments get a TypeError or a library error saying what was expected, never an
AttributeError or an unpacking error from deep inside."""

import re

import jax.numpy as jnp
import numpy as np
import pytest

import paramreg_jax as prj
from paramreg_jax import MemorySource
from paramreg_jax import recipes as R
from paramreg_jax.sources import CheckpointSource
from paramreg_jax.sources import TensorMetadata

SRC = MemorySource({"w": np.ones(3, np.float32)})
TARGET = {"w": jnp.zeros(3)}


class NoMetadata(CheckpointSource):
  """A source of one's own whose metadata returns None."""

  def keys(self):
    return ("w",)

  def metadata(self, key):
    return None

  def read(self, key, index):
    raise AssertionError("never read: the metadata is refused first")


class DuckTyped:
  """keys and metadata, but not derived from CheckpointSource."""

  def keys(self):
    return ("w",)

  def metadata(self, key):
    return TensorMetadata((3,), np.float32)


def test_bind_with_a_value_that_is_not_an_array():
  with pytest.raises(
    prj.BindError, match=re.escape("n:w: a str ('x'), the target expects a jax.Array")
  ):
    prj.bind(TARGET, {"n:w": "x"})


def test_recipes_and_aliases_of_the_wrong_types():
  with pytest.raises(
    prj.errors.RecipeError, match=r"recipe target names must be non-empty strings .* got 5"
  ):
    prj.restore(TARGET, SRC, recipes={5: R.source("w")})
  with pytest.raises(TypeError, match=r"recipes must be a mapping .* got str 'w'"):
    prj.restore(TARGET, SRC, recipes="w")
  with pytest.raises(
    prj.errors.RecipeError,
    match=r"aliases map a parameter name to its owner's name \(strings\), got 1: 2",
  ):
    prj.restore(TARGET, SRC, aliases={1: 2})
  with pytest.raises(prj.errors.RecipeError, match="aliases must be a mapping"):
    prj.plan_restore(TARGET, SRC, aliases=["w"])


@pytest.mark.parametrize("call", [prj.plan_restore, prj.restore, prj.match])
def test_a_duck_typed_source_whose_metadata_returns_none(call):
  with pytest.raises(
    TypeError,
    match=re.escape(
      "NoMetadata.metadata('w') returned NoneType None; a checkpoint source's metadata(key) must return a TensorMetadata"
    ),
  ):
    call(TARGET, NoMetadata())


@pytest.mark.parametrize("call", [prj.plan_restore, prj.restore, prj.match])
def test_a_source_that_does_not_derive_from_checkpoint_source_is_told_how(call):
  with pytest.raises(
    TypeError,
    match=re.escape("got DuckTyped <test_bad_arguments.DuckTyped object at 0x"),
  ) as info:
    call(TARGET, DuckTyped())
  assert str(info.value).endswith(
    "; make DuckTyped derive from paramreg_jax.sources.CheckpointSource (it implements "
    "keys(), metadata(key) and read(key, index); the rest has defaults)"
  )


def test_a_source_missing_read_cannot_be_made():
  class NoRead(CheckpointSource):
    def keys(self):
      return ("w",)

    def metadata(self, key):
      return TensorMetadata((3,), np.float32)

  with pytest.raises(TypeError, match="abstract class NoRead with abstract method read"):
    NoRead()


def test_linen_variables_instead_of_params_get_one_note_with_the_prefix():
  ck = {f"layer_{i}/dense/kernel": np.ones((2, 2), np.float32) for i in range(30)}
  variables = {
    "params": {f"layer_{i}": {"dense": {"kernel": jnp.zeros((2, 2))}} for i in range(30)}
  }
  with pytest.raises(prj.RestorePlanError) as info:
    prj.plan_restore(variables, MemorySource(ck))
  first = info.value.problems[0]
  assert first.startswith(
    "30 parameter name(s) differ from the checkpoint's keys by the prefix 'params/'"
  )
  assert "pass the subtree under 'params' as the target" in first and len(first) < 400
  assert (
    "(the checkpoint has 'layer_0/dense/kernel': see the prefix note)" in info.value.problems[1]
  )
  prj.plan_restore(variables["params"], MemorySource(ck))  # the fix it names works


def test_a_rename_typo_points_to_the_argument_that_exists():
  with pytest.raises(prj.RestorePlanError) as info:
    prj.plan_restore(TARGET, SRC, rename={"v": "w"})
  text = str(info.value)
  assert (
    "recipes.rename(rules, require_all=False)" in text and "pass require_all=False)" not in text
  )
