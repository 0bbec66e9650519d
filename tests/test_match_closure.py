"""Closure inside an aligned block (``match/closure.py``): the last leaves of a layer take the
last tensors they fit, and only where every perfect pairing of the block agrees; never after a
hint, never where the block does not correspond, never between two leaves alike."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from abstract import sds as _sds

import paramreg_jax as prj
from paramreg_jax import MemorySource
from paramreg_jax._src.match import closure
from paramreg_jax._src.match.candidates import Candidate


def _opt_like(layers=2):
  """OPT's block: the MLP's ``fc1``/``fc2`` at the layer's level, its norm named
  ``final_layer_norm``; every tensor a distinct value."""
  ck, rng = {}, np.random.default_rng(0)
  for i in range(layers):
    for name, shape in (
      ("self_attn_layer_norm.weight", (4,)),
      ("self_attn_layer_norm.bias", (4,)),
      ("final_layer_norm.weight", (4,)),
      ("final_layer_norm.bias", (4,)),
      ("fc1.weight", (8, 4)),
      ("fc1.bias", (8,)),
      ("fc2.weight", (4, 8)),
      ("fc2.bias", (4,)),
    ):
      ck[f"model.decoder.layers.{i}.{name}"] = rng.standard_normal(shape).astype(np.float32)
  return ck


def _auto_named_block():
  """The same block as ``@nn.compact`` names it."""
  return {
    "LayerNorm_0": {"scale": _sds(4), "bias": _sds(4)},
    "LayerNorm_1": {"scale": _sds(4), "bias": _sds(4)},
    "mlp": {
      "Dense_0": {"kernel": _sds(4, 8), "bias": _sds(8)},
      "Dense_1": {"kernel": _sds(8, 4), "bias": _sds(4)},
    },
  }


_CONFIG = {"model_type": "opt"}  # OPT's linear weights are [out, in]


def test_the_last_leaves_of_a_layer_take_the_last_tensors_they_fit():
  ck = _opt_like()
  target = {f"layers_{i}": _auto_named_block() for i in range(2)}
  m = prj.match(target, MemorySource(ck), config=_CONFIG)
  why = {t: reason for t, _, reason in m.rows()}
  assert "closure: the last tensor of layer (1,) that fits it" in why["layers_1/mlp/Dense_0/kernel"]
  got = prj.restore(target, MemorySource(ck), recipes=m)
  for i in range(2):
    mlp, at = got[f"layers_{i}"]["mlp"], f"model.decoder.layers.{i}."
    np.testing.assert_array_equal(mlp["Dense_0"]["kernel"], ck[at + "fc1.weight"].T)
    np.testing.assert_array_equal(mlp["Dense_1"]["kernel"], ck[at + "fc2.weight"].T)
    np.testing.assert_array_equal(mlp["Dense_1"]["bias"], ck[at + "fc2.bias"])
    norm = got[f"layers_{i}"]["LayerNorm_1"]
    np.testing.assert_array_equal(norm["bias"], ck[at + "final_layer_norm.bias"])


def test_a_pick_two_leaves_claim_is_settled_by_stronger_evidence():
  """``mlp/Dense_1/bias`` takes ``final_layer_norm.bias`` by name while the norm's scale (in
  order) says its bias is that one: the contested pick is reopened, the module settles the
  norm and closure the MLP's bias (both were refused as claimed twice)."""
  ck = _opt_like(1)
  target = {"layers_0": _auto_named_block()}
  rows = {t: r for t, r, _ in prj.match(target, MemorySource(ck), config=_CONFIG).rows()}
  assert rows["layers_0/mlp/Dense_1/bias"] == "source('model.decoder.layers.0.fc2.bias')"
  assert rows["layers_0/LayerNorm_1/bias"] == (
    "source('model.decoder.layers.0.final_layer_norm.bias')"
  )


def test_after_a_hint_closure_takes_only_what_the_hint_could_not_have_displaced():
  """A hint is the user's word about its leaf, not evidence about the rest: in its block,
  closure pairs only tensors of a kind and size no hinted tensor has (the MLP's weights
  beside a hinted norm scale), so the hint the refusal asks for is the last word needed; a
  wrong hint never makes the other norm's scale a pick by elimination."""
  ck = _opt_like(1)
  target = {"layers_0": _auto_named_block()}
  at = "model.decoder.layers.0."
  hints = {"layers_0/LayerNorm_1/scale": at + "final_layer_norm.weight"}
  m = prj.match(target, MemorySource(ck), config=_CONFIG, hints=hints)
  why = {t: reason for t, _, reason in m.rows()}
  assert "closure" in why["layers_0/mlp/Dense_0/kernel"]
  got = prj.restore(target, MemorySource(ck), recipes=m)["layers_0"]
  np.testing.assert_array_equal(got["LayerNorm_0"]["scale"], ck[at + "self_attn_layer_norm.weight"])
  np.testing.assert_array_equal(got["mlp"]["Dense_0"]["kernel"], ck[at + "fc1.weight"].T)
  wrong = {"layers_0/LayerNorm_1/scale": at + "self_attn_layer_norm.weight"}
  with pytest.raises(prj.MatchError) as e:
    prj.match(target, MemorySource(ck), config=_CONFIG, hints=wrong)
  assert ("layers_0/LayerNorm_0/scale",) in [p.targets for p in e.value.problems]


def test_a_leaf_the_checkpoint_lacks_stops_closure_in_its_block():
  """An extra leaf of the MLP's width with an extra tensor that is no MLP weight: as many
  leaves as tensors, but no perfect pairing (the norm's extra gain fits nothing left)."""
  ck = _opt_like(1)
  ck["model.decoder.layers.0.attn_gain"] = np.ones((3,), np.float32)
  target = {"layers_0": _auto_named_block()}
  target["layers_0"]["mlp"]["Dense_2"] = {"kernel": _sds(8, 4)}
  with pytest.raises(prj.MatchError) as e:
    prj.match(target, MemorySource(ck), config=_CONFIG)
  assert "closure" not in str(e.value.hints_code)
  assert "mlp/Dense_0/kernel" in str(e.value)


def test_more_leaves_than_tensors_left_decides_nothing():
  ck = _opt_like(1)
  target = {"layers_0": _auto_named_block()}
  target["layers_0"]["mlp"]["Dense_2"] = {"bias": _sds(4)}  # no tensor left for it
  with pytest.raises(prj.MatchError) as e:
    prj.match(target, MemorySource(ck), config=_CONFIG)
  assert "layers_0/mlp/Dense_0/kernel" in str(e.value)


def _stacked(tree, layers=2):
  """The block as ``nn.scan``/``nnx.vmap`` keeps it: every leaf with the layers first."""
  return jax.tree.map(lambda x: _sds(layers, *x.shape), tree)


def test_a_stacked_block_closes_as_its_layers_do():
  """An ``nn.scan`` over the auto-named block: each leaf holds every layer's tensor. The
  norms are decided in order; the MLP's leaves left take the stacks left (a stack: the
  tensors named alike in every layer)."""
  ck = _opt_like()
  target = {"ScanBlock_0": _stacked(_auto_named_block())}
  m = prj.match(target, MemorySource(ck), config=_CONFIG)
  why = {t: reason for t, _, reason in m.rows()}
  assert "closure: the last stack of layers 0..1" in why["ScanBlock_0/mlp/Dense_0/kernel"]
  got = prj.restore(target, MemorySource(ck), recipes=m)["ScanBlock_0"]
  for i in range(2):
    at = f"model.decoder.layers.{i}."
    np.testing.assert_array_equal(got["mlp"]["Dense_0"]["kernel"][i], ck[at + "fc1.weight"].T)
    np.testing.assert_array_equal(got["mlp"]["Dense_1"]["kernel"][i], ck[at + "fc2.weight"].T)
    np.testing.assert_array_equal(got["mlp"]["Dense_1"]["bias"][i], ck[at + "fc2.bias"])
    np.testing.assert_array_equal(got["LayerNorm_1"]["bias"][i], ck[at + "final_layer_norm.bias"])


def test_a_stack_whose_layers_differ_or_a_hint_stops_closure():
  ck = _opt_like()
  ck["model.decoder.layers.1.fc3.bias"] = np.ones((4,), np.float32)  # only layer 1 has it
  target = {"ScanBlock_0": _stacked(_auto_named_block())}
  with pytest.raises(prj.MatchError) as e:
    prj.match(target, MemorySource(ck), config=_CONFIG)
  assert "closure" not in e.value.hints_code
  ck = _opt_like()
  hints = {"ScanBlock_0/LayerNorm_1/scale": "final_layer_norm.weight"}
  with pytest.raises(prj.MatchError) as e:
    prj.match(target, MemorySource(ck), config=_CONFIG, hints=hints)
  assert "ScanBlock_0/mlp/Dense_0/kernel" in str(e.value)
  assert "closure" not in e.value.hints_code


def _cand(key, reason="name"):
  return Candidate(0.3, (key,), reason, lambda: None)


def test_forced_pairs_only_where_every_perfect_pairing_agrees():
  edges = {
    "a": {"x": [_cand("x")]},
    "b": {"x": [_cand("x")], "y": [_cand("y")], "z": [_cand("z")]},
    "c": {"y": [_cand("y")], "z": [_cand("z")]},
    "d": {"y": [_cand("y")], "z": [_cand("z")]},
  }
  assert closure._forced(edges) == {}  # b, c, d want y, z: no perfect pairing (x is a's)
  edges["d"]["w"] = [_cand("w")]
  edges["c"]["w"] = [_cand("w")]
  # a <- x forced; b then takes y or z, c and d the rest: only a is decided
  forced = closure._forced(edges)
  assert {n: c.keys for n, c in forced.items()} == {"a": ("x",)}


def test_a_forced_pair_of_two_layouts_is_left_open():
  edges = {
    "a": {"x": [_cand("x", "same"), _cand("x", "t")]},
    "b": {"x": [_cand("x")], "y": [_cand("y")]},
  }
  forced = closure._forced(edges)
  assert {n: c.keys for n, c in forced.items()} == {"b": ("y",)}  # a is x, but which way?


def test_two_leaves_alike_stay_asked_with_both_tensors_on_their_lines():
  """Both norms renamed to opaque tokens: nothing but the name told them apart, and closure
  does not either."""
  ck = _opt_like(1)
  block = _auto_named_block()
  target = {"layers_0": {"p": block["LayerNorm_0"], "q": block["LayerNorm_1"], "mlp": block["mlp"]}}
  with pytest.raises(prj.MatchError) as e:
    prj.match(target, MemorySource(ck), config=_CONFIG)
  code = e.value.hints_code
  for key in ("self_attn_layer_norm.weight", "final_layer_norm.weight"):
    assert f'"layers_0/p/scale": "model.decoder.layers.0.{key}"' in code


def test_a_tensor_left_over_in_the_block_decides_nothing():
  """An adapter the target does not have, of the MLP's output weight's shape: more tensors
  left than leaves, so a tensor one leaf fits is not forced to be that leaf's."""
  ck = _opt_like(1)
  ck["model.decoder.layers.0.adapter.weight"] = np.ones((4, 8), np.float32)
  target = {"layers_0": _auto_named_block()}
  with pytest.raises(prj.MatchError) as e:
    prj.match(target, MemorySource(ck), config=_CONFIG)
  asked = {t for p in e.value.problems for t in p.targets}
  assert {"layers_0/mlp/Dense_0/kernel", "layers_0/mlp/Dense_1/kernel"} <= asked
  assert "closure" not in str(e.value) + e.value.hints_code


def _stem_like():
  """A ConvNeXt-style stem outside the layers: a patch conv and a norm, stored under one
  module (``embeddings``) beside a final norm of the same width."""
  rng = np.random.default_rng(1)
  shapes = {
    "embeddings.patch_embeddings.weight": (8, 3, 4, 4),
    "embeddings.patch_embeddings.bias": (8,),
    "embeddings.layernorm.weight": (8,),
    "embeddings.layernorm.bias": (8,),
    "layernorm.weight": (8,),
    "layernorm.bias": (8,),
  }
  return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def _stem_target():
  return {
    "stem": [{"kernel": _sds(4, 4, 3, 8), "bias": _sds(8)}, {"scale": _sds(8), "bias": _sds(8)}],
    "final_norm": {"scale": _sds(8), "bias": _sds(8)},
  }


def test_a_module_outside_the_layers_closes_on_the_checkpoint_module_it_aligns_with():
  """``stem/0`` is the patch conv (its shape is the only one of its kind), so ``stem`` is
  ``embeddings``: the norm left in it takes the norm left there, not the final norm."""
  ck = _stem_like()
  target = _stem_target()
  m = prj.match(target, MemorySource(ck))
  why = {t: reason for t, _, reason in m.rows()}
  assert "closure: the last tensor of embeddings that fits it" in why["stem/1/scale"]
  got = prj.restore(target, MemorySource(ck), recipes=m)
  np.testing.assert_array_equal(got["stem"][1]["scale"], ck["embeddings.layernorm.weight"])
  np.testing.assert_array_equal(got["stem"][1]["bias"], ck["embeddings.layernorm.bias"])
  np.testing.assert_array_equal(got["stem"][0]["bias"], ck["embeddings.patch_embeddings.bias"])
  np.testing.assert_array_equal(got["final_norm"]["scale"], ck["layernorm.weight"])


def test_outside_the_layers_never_after_a_hint_in_the_module():
  """Hinted leaves are the user's word about them: no anchor for the stem's alignment, and
  closure stays out of the module (a leaf decided by its unique shape would be an anchor)."""
  ck = _stem_like()
  hints = {
    "stem/0/bias": "embeddings.patch_embeddings.bias",
    "stem/0/kernel": "embeddings.patch_embeddings.weight",
  }
  with pytest.raises(prj.MatchError) as e:
    prj.match(_stem_target(), MemorySource(ck), hints=hints)
  assert "stem/1/scale" in str(e.value) and "closure" not in e.value.hints_code


def test_outside_the_layers_two_norms_left_in_the_module_decide_nothing():
  """The stem aligns with ``embeddings``, but two norms of its width are left there: neither
  the alignment nor closure picks one (a mask token left beside one norm would not stop
  them: it is no bias)."""
  ck = _stem_like()
  ck["embeddings.norm2.weight"] = np.ones((8,), np.float32)
  ck["embeddings.norm2.bias"] = np.ones((8,), np.float32)
  with pytest.raises(prj.MatchError) as e:
    prj.match(_stem_target(), MemorySource(ck))
  assert "stem/1/scale" in str(e.value)


def _units():
  """A stem and a head, each a unit of a conv and its norm (``net.conv_1x1.convolution`` and
  ``.normalization``, with running statistics no target below keeps)."""
  rng = np.random.default_rng(0)
  shapes = {
    "net.conv_1x1.convolution.weight": (16, 8, 1, 1),
    **{
      f"net.conv_1x1.normalization.{k}": (16,)
      for k in ("weight", "bias", "running_mean", "running_var")
    },
    "net.first.convolution.weight": (8, 3, 3, 3),
    "net.first.normalization.weight": (8,),
    "net.first.normalization.bias": (8,),
  }
  return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def test_a_norm_in_the_unit_its_conv_came_from_takes_its_best_named_tensor():
  """``top/conv`` came from ``net.conv_1x1.convolution`` by its shape, so ``top`` is the unit
  ``net.conv_1x1``: its norm, named like nothing in the checkpoint, takes the best named of
  the unit's tensors of its shape (``weight`` for ``scale``, not ``running_mean``), where
  closure cannot pair the unit (its statistics are left over: the target keeps none)."""
  ck = _units()

  def unit(c, i, o):
    return {"conv": {"kernel": _sds(c, c, i, o)}, "bn": {"scale": _sds(o), "bias": _sds(o)}}

  target = {"stem": unit(3, 3, 8), "top": unit(1, 8, 16)}
  m = prj.match(target, MemorySource(ck))
  assert {t: why for t, _, why in m.rows()}["top/bn/scale"] == "name, beside top/conv/kernel"
  got = prj.restore(target, MemorySource(ck), recipes=m)
  np.testing.assert_array_equal(got["top"]["bn"]["scale"], ck["net.conv_1x1.normalization.weight"])
  np.testing.assert_array_equal(got["top"]["bn"]["bias"], ck["net.conv_1x1.normalization.bias"])


def test_haiku_module_keys_align_by_their_decided_neighbours_too():
  """The same unit as haiku keeps it (``net/~/top/~/conv`` one escaped key): its ``/~/`` are
  module boundaries like ``/``, so ``top`` is aligned with ``net.conv_1x1`` all the same."""
  ck = _units()
  target = {}
  for unit, (c, i, o) in {"stem": (3, 3, 8), "top": (1, 8, 16)}.items():
    target[f"net/~/{unit}/~/conv"] = {"w": _sds(c, c, i, o)}
    target[f"net/~/{unit}/~/bn"] = {"scale": _sds(o), "offset": _sds(o)}
  m = prj.match(target, MemorySource(ck))
  got = prj.restore(target, MemorySource(ck), recipes=m)
  np.testing.assert_array_equal(
    got["net/~/top/~/bn"]["scale"], ck["net.conv_1x1.normalization.weight"]
  )
  np.testing.assert_array_equal(
    got["net/~/top/~/bn"]["offset"], ck["net.conv_1x1.normalization.bias"]
  )
