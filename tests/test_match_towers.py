"""Towers (``match/towers.py``): a dual-tower model whose stacks have the same shapes layer for
layer maps each target tower onto the checkpoint tower its anchors point to, checked by value:
each tower's forward pass against the output PyTorch produced for that model."""

from __future__ import annotations

import hf_models as hf
import numpy as np
import pytest
from safetensors.numpy import load_file

import paramreg_jax as prj
from paramreg_jax import MemorySource
from paramreg_jax._src.match import towers
from paramreg_jax._src.match.candidates import Candidate
from paramreg_jax._src.match.evidence import Checkpoint
from paramreg_jax._src.match.vocabulary import concepts

# BERT and ViT: hidden 32, MLP 64, 4 heads, 2 layers: every per-layer tensor alike in shape
_MODELS = {"txt": ("bert", "text_model."), "img": ("vit", "vision_model.")}


def _dual(style_name, names=None, outer=""):
  """The two suite models in one checkpoint under CLIP's tower prefixes (no config.json), and
  a target holding each as a tower (``names``: the target's tower names)."""
  names = names or {t: t for t in _MODELS}
  style = hf.STYLES[style_name]
  ck, target, cases = {}, {}, {}
  for tower, (model, prefix) in _MODELS.items():
    arch, sizes, _, ref = hf.case(model)
    shapes = hf.canonical_shapes(arch, sizes)
    target[names[tower]] = hf.target(style, shapes, arch, sizes)
    cases[tower] = (arch, sizes, ref, shapes)
    for k, v in load_file(str(hf.DATA / model / "model.safetensors")).items():
      ck[outer + prefix + k] = v
  return style, ck, target, cases


def _forward_matches(style, cases, tower, restored):
  arch, sizes, ref, shapes = cases[tower]
  weights = hf.to_canonical(style, shapes, arch, sizes, restored)
  got = np.asarray(hf.forward(arch, sizes, weights, ref["input_ids"]))
  np.testing.assert_allclose(got, ref["output"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("style_name", ["flax", "haiku", "equinox", "nnx"])
def test_each_tower_comes_from_the_checkpoint_tower_its_anchors_say(style_name):
  """The patch embedding (only a vision tower has one) and the token embedding anchor the
  towers; inside them, every layer's names fit both towers equally."""
  style, ck, target, cases = _dual(style_name)
  m = prj.match(target, MemorySource(ck))
  restored = prj.restore(target, MemorySource(ck), recipes=m)
  for tower in _MODELS:
    _forward_matches(style, cases, tower, restored[tower])
  assert "towers (aligned by their anchors): img = vision_model, txt = text_model" in str(m)
  assert m.towers == (("img", "vision_model"), ("txt", "text_model"))


def test_towers_under_a_wrapper_and_a_model_prefix():
  names = {"txt": "text_encoder", "img": "image_encoder"}
  style, ck, target, cases = _dual("flax", names, outer="clip.")
  target = {"params": target}
  m = prj.match(target, MemorySource(ck))
  restored = prj.restore(target, MemorySource(ck), recipes=m)["params"]
  for tower, name in names.items():
    _forward_matches(style, cases, tower, restored[name])


@pytest.mark.parametrize("names", [("Encoder_0", "Encoder_1"), ("m13", "m0")])
def test_towers_whose_names_hold_numbers_are_towers(names):
  """Two towers of one flax class (``Encoder_0``, ``Encoder_1``) or named by opaque tokens:
  a number in a tower's name does not make it a layer (``layers_0``, ``block1`` are)."""
  style, ck, target, cases = _dual("flax", dict(zip(_MODELS, names)))
  m = prj.match(target, MemorySource(ck))
  restored = prj.restore(target, MemorySource(ck), recipes=m)
  for tower, name in zip(_MODELS, names):
    _forward_matches(style, cases, tower, restored[name])
  assert m.towers == tuple(sorted(zip(names[::-1], ("vision_model", "text_model"))))


def test_without_anchors_the_towers_are_asked_with_both_on_the_lines():
  """Only the layers: nothing outside them says which tower is which."""
  _, ck, target, _ = _dual("flax")
  target = {
    t: {k: v for k, v in tree.items() if k.startswith("layers_")} for t, tree in target.items()
  }
  ck = {k: v for k, v in ck.items() if ".layer." in k}
  with pytest.raises(prj.MatchError) as e:
    prj.match(target, MemorySource(ck))
  code = e.value.hints_code
  assert "text_model.encoder" in code and "vision_model.encoder" in code


def _ck(keys):
  return Checkpoint({k: concepts(k) for k in keys}, {k: (4,) for k in keys})


def _pick(key):
  return Candidate(1.0, (key,), "name", lambda: None)


_NAMES = ["a/layers_0/x/scale", "b/layers_0/x/scale", "a/embed/embedding", "b/patch/kernel"]
_KEYS = ["t.layers.0.x.weight", "v.layers.0.x.weight", "t.embed.weight", "v.patch.weight"]


def test_anchors_align_towers_one_to_one():
  picked = {"a/embed/embedding": _pick("t.embed.weight"), "b/patch/kernel": _pick("v.patch.weight")}
  assert towers.align(_NAMES, picked, _ck(_KEYS)) == {"a": "t", "b": "v"}


def test_anchors_that_disagree_align_nothing():
  picked = {
    "a/embed/embedding": _pick("t.embed.weight"),
    "a/layers_0/x/scale": _pick("v.layers.0.x.weight"),
    "b/patch/kernel": _pick("v.patch.weight"),
  }
  assert towers.align(_NAMES, picked, _ck(_KEYS)) == {"b": "v"}


def test_two_target_towers_anchored_to_one_checkpoint_tower_align_neither():
  picked = {"a/embed/embedding": _pick("v.patch.weight"), "b/patch/kernel": _pick("v.patch.weight")}
  assert towers.align(_NAMES, picked, _ck(_KEYS)) == {}


def test_a_tower_sees_its_own_tensors_and_those_outside_every_tower():
  """A shared embedding (T5's ``shared.weight``) may serve any tower; a leaf's name is read
  with its checkpoint tower's words for its own tower's."""
  ck = _ck([*_KEYS, "shared.weight"])
  ck.towers = {"a": "t", "b": "v"}
  got = towers.views(_NAMES, ck)
  view, out, in_ = got["a/embed/embedding"]
  assert sorted(view.concepts) == ["shared.weight", "t.embed.weight", "t.layers.0.x.weight"]
  # its words, not a kind (a bias read with them stays a bias), nor a stack's "layers"
  assert (out, in_) == (concepts("a").tokens - {"w"}, concepts("t").tokens - {"w"})
  ck.towers = {"layers": "t"}  # a stack named as layers stays a stack read with "t"'s words
  (_, out, _), *_ = towers.views(["layers/x/scale", "b/layers_0/x/scale"], ck).values()
  assert "layers" not in out
  assert sorted(got["b/patch/kernel"][0].concepts) == [
    "shared.weight",
    "v.layers.0.x.weight",
    "v.patch.weight",
  ]


def test_the_modules_of_one_layer_are_no_towers():
  """Every name inside ``layers_0`` (a one-layer model): its attention and MLP each hold the
  layer's number, but they are modules of one layer, not towers."""
  names = ["layers_0/attn/x/scale", "layers_0/mlp/x/scale", "layers_0/Dense_0/kernel"]
  keys = ["h.0.attn.x.weight", "h.0.mlp.x.weight", "h.0.fc1.weight"]
  picked = {"layers_0/attn/x/scale": _pick(keys[0]), "layers_0/mlp/x/scale": _pick(keys[1])}
  assert towers.align(names, picked, _ck(keys)) == {}


def test_a_stack_of_one_tower_has_no_towers():
  names = ["layers_0/x/scale", "layers_1/x/scale", "embed/embedding"]
  keys = ["model.layers.0.x.weight", "model.layers.1.x.weight", "model.embed.weight"]
  picked = {"embed/embedding": _pick("model.embed.weight")}
  assert towers.align(names, picked, _ck(keys)) == {}
