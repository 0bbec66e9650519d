"""mask_by_pattern / label_by_pattern: glob rules over canonical names."""

import re

import jax.numpy as jnp
import optax
import pytest

import paramreg_jax as prj
from paramreg_jax._src.patterns import glob_to_regex

PARAMS = {
  "encoder": {
    "layer_0": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)},
    "norm": {"scale": jnp.ones(2)},
  },
  "head": {"kernel": jnp.ones((2, 1)), "bias": jnp.ones(1)},
}


@pytest.mark.parametrize(
  "pattern, name, hit",
  [
    ("*/bias", "head/bias", True),
    ("*/bias", "encoder/layer_0/bias", False),
    ("**/bias", "encoder/layer_0/bias", True),
    ("**/bias", "bias", True),
    ("encoder/**", "encoder/norm/scale", True),
    ("encoder/**", "encoder", True),
    ("encoder/**", "encoderx/a", False),
    ("layer_?/*", "layer_0/kernel", True),
    ("layer_[!0]/*", "layer_0/kernel", False),
    ("a.b", "aXb", False),
  ],
)
def test_glob(pattern, name, hit):
  assert bool(glob_to_regex(pattern).fullmatch(name)) is hit


def test_mask_for_weight_decay():
  mask = prj.mask_by_pattern(PARAMS, ["**/kernel"])
  assert mask == {
    "encoder": {"layer_0": {"bias": False, "kernel": True}, "norm": {"scale": False}},
    "head": {"bias": False, "kernel": True},
  }
  tx = optax.adamw(1e-3, mask=mask)
  tx.update(PARAMS, tx.init(PARAMS), PARAMS)


def test_unused_pattern_is_an_error():
  with pytest.raises(
    prj.errors.PatternError,
    match=re.escape(
      "1 pattern(s) match no parameter (a typo? parameter names look like 'encoder/layer_0/bias'):\n  - '**/kernal'"
    ),
  ):
    prj.mask_by_pattern(PARAMS, ["**/kernel", "**/kernal"])
  assert (
    prj.mask_by_pattern(PARAMS, ["**/kernal"], require_all_used=False)["head"]["kernel"] is False
  )


def test_labels_first_match_wins():
  labels = prj.label_by_pattern(
    PARAMS, [("encoder/norm/*", "norm"), ("encoder/**", "frozen"), ("**", "train")]
  )
  assert labels["encoder"]["norm"]["scale"] == "norm"
  assert labels["encoder"]["layer_0"]["kernel"] == "frozen"
  assert labels["head"]["bias"] == "train"


def test_unmatched_parameter_and_unused_rule_are_reported_together():
  with pytest.raises(prj.errors.PatternError) as info:
    prj.label_by_pattern(PARAMS, {"encoder/**": "a", "decoder/**": "b"})
  msg = str(info.value)
  assert msg.startswith("3 problem(s) labelling parameters by pattern:")
  assert "n:head/bias: no rule matches (add a rule, e.g. '**' last)" in msg
  assert "rule 'decoder/**': matches no parameter" in msg


def test_mask_rules_mapping():
  mask = prj.mask_by_pattern(PARAMS, {"**/bias": False, "**": True})
  assert mask["head"]["bias"] is False and mask["head"]["kernel"] is True
  with pytest.raises(prj.errors.PatternError, match="must be a bool"):
    prj.mask_by_pattern(PARAMS, {"**": "yes"})


@pytest.mark.parametrize("bad", ["", "[abc"])
def test_bad_patterns(bad):
  with pytest.raises(prj.errors.PatternError):
    prj.mask_by_pattern(PARAMS, [bad])


def test_patterns_must_be_a_list():
  with pytest.raises(prj.errors.PatternError, match="not the string"):
    prj.mask_by_pattern(PARAMS, "**/kernel")
