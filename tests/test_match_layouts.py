"""Layouts JAX code in the wild keeps its parameters in, beyond flax's own: torch-style
``[out, in]`` ``weight`` leaves (equinox), and layers stacked on axis 1 with experts in front
(MaxText's ``param_scan_axis``). The whole suite runs through both as ``hf.STYLES``
(``equinox``, ``maxtext``); these pin what decides each, and that an unknown is a question.
"""

from __future__ import annotations

import pathlib
import re
import types

import jax
import numpy as np
import pytest
from abstract import sds as _sds
from safetensors.numpy import load_file

import paramreg_jax as prj
from paramreg_jax import MemorySource
from paramreg_jax._src.match import layouts
from paramreg_jax._src.match import stacks
from paramreg_jax._src.match.evidence import Checkpoint
from paramreg_jax._src.match.vocabulary import concepts

rng = np.random.default_rng(0)
HF = pathlib.Path(__file__).parent / "data" / "hf"


def _rand(*shape):
  return rng.standard_normal(shape).astype(np.float32)


def _rows(m):
  return {t: r for t, r, _ in m.rows()}


# --- orientation: a kernel is [in, out]; any other leaf is what its shapes say ----------------


def test_torch_style_weights_beside_kernels_each_oriented_by_their_own_evidence():
  """The config says the checkpoint is ``[out, in]``: a ``kernel`` is its transpose; a
  ``weight`` whose shape equals the stored one is not (it was refused as "no single
  orientation" when both were one vote)."""
  ck = {
    "model.layers.0.mlp.up_proj.weight": _rand(8, 4),
    "model.layers.0.mlp.down_proj.weight": _rand(4, 8),
    "model.layers.0.self_attn.q_proj.weight": _rand(4, 4),
  }
  target = {
    "layers_0": {
      "mlp": {"up": {"kernel": _sds(4, 8)}, "down": {"weight": _sds(4, 8)}},
      "attn": {"q": {"weight": _sds(4, 4)}},  # square: oriented by the other weight's shape
    }
  }
  m = prj.match(target, MemorySource(ck), config={"model_type": "llama"})
  got = prj.restore(target, MemorySource(ck), recipes=m)["layers_0"]
  np.testing.assert_array_equal(
    got["mlp"]["up"]["kernel"], ck["model.layers.0.mlp.up_proj.weight"].T
  )
  np.testing.assert_array_equal(
    got["mlp"]["down"]["weight"], ck["model.layers.0.mlp.down_proj.weight"]
  )
  np.testing.assert_array_equal(
    got["attn"]["q"]["weight"], ck["model.layers.0.self_attn.q_proj.weight"]
  )


def test_a_square_weight_nothing_orients_is_asked_never_guessed():
  ck = {"model.layers.0.self_attn.q_proj.weight": _rand(4, 4)}
  target = {"layers_0": {"attn": {"q": {"weight": _sds(4, 4)}}}}
  with pytest.raises(prj.MatchError, match=r"layers_0/attn/q/weight \(4, 4\)") as info:
    prj.match(target, MemorySource(ck), config={"model_type": "llama"})
  (problem,) = info.value.problems
  hints = [c.hint for c in problem.choices["layers_0/attn/q/weight"]]
  assert len(hints) == 2 and any("transpose" in str(h) for h in hints), hints


def test_fused_parts_take_the_targets_orientation():
  """GPT-2's ``c_attn`` is ``[in, 3 out]``: a torch-style ``[out, in]`` q/k/v takes its third
  transposed, a flax kernel as stored. Splitting as if every target were ``[in, out]`` gave
  the square attention's parts untransposed (forward off by 0.017, no error)."""
  qkv = _rand(4, 12)
  ck = {"h.0.attn.c_attn.weight": qkv, "h.0.mlp.c_fc.weight": _rand(4, 16)}
  for leaf, up, want in (("weight", (16, 4), qkv[:, 4:8].T), ("kernel", (4, 16), qkv[:, 4:8])):
    target = {
      "h_0": {"attn": {n: {leaf: _sds(4, 4)} for n in "qkv"}, "mlp": {"up": {leaf: _sds(*up)}}}
    }
    m = prj.match(target, MemorySource(ck), config={"model_type": "gpt2"})
    got = prj.restore(target, MemorySource(ck), recipes=m)
    np.testing.assert_array_equal(got["h_0"]["attn"]["k"][leaf], want, err_msg=leaf)


def test_fused_parts_of_unknown_orientation_are_refused():
  """No config and no other weight: a square ``[out, in]`` or ``[in, out]`` part tiles the
  fused tensor either way, so nothing is split."""
  ck = {"h.0.attn.c_attn.weight": _rand(4, 12)}
  target = {"h_0": {"attn": {n: {"weight": _sds(4, 4)} for n in "qkv"}}}
  with pytest.raises(prj.MatchError, match=r"whether the parts are \[in, out\] or \[out, in\]"):
    prj.match(target, MemorySource(ck))


def test_a_square_weight_is_read_both_ways_or_not_at_all():
  """A square ``[n, n]`` linear weight may be ``[out, in]`` or ``[in, out]``: every way it
  becomes a leaf of any shape has its other orientation beside it, so only evidence can
  choose (a reading with no mirror is taken whenever nothing orients the checkpoint: a
  guess). Every 2- and 3-axis leaf of as many values, for five sizes; and every 3-axis
  tensor merged into a square leaf (its input axis is its author's choice)."""
  turned = {"t", "t+heads", "heads+t"}  # the readings that transpose it (layouts.oriented)
  sizes = range(1, 17)
  for n in (4, 6, 8, 12, 16):
    shapes = [(a, b, c) for a in sizes for b in sizes for c in sizes if a * b * c == n * n]
    for shape in [(n, n), *shapes]:
      hows = {how for how, _ in layouts.readings((n, n), shape, True)}
      assert not hows or (hows & turned and hows - turned), (n, shape, hows)
    for stored in shapes:  # and a tensor of three axes merged into it (an einsum's)
      hows = {how for how, _ in layouts.readings(stored, (n, n), False)}
      assert hows in (set(), {"heads", "heads-t"}), (stored, n, hows)


def _moe(e, d, i):
  """transformers 5's fused experts (``[E, 2I, D]``, ``[gate | up]``; ``down`` ``[E, D, I]``)
  and a flax target of ``[E, in, out]`` kernels."""
  x = "model.layers.0.mlp.experts."
  ck = {x + "gate_up_proj": _rand(e, 2 * i, d), x + "down_proj": _rand(e, d, i)}
  experts = {n: {"kernel": _sds(e, d, i)} for n in ("gate_proj", "up_proj")}
  target = {"layers_0": {"mlp": {"experts": {**experts, "down_proj": {"kernel": _sds(e, i, d)}}}}}
  gu = ck[x + "gate_up_proj"]
  want = {
    "layers_0/mlp/experts/gate_proj/kernel": gu[:, :i].transpose(0, 2, 1),
    "layers_0/mlp/experts/up_proj/kernel": gu[:, i:].transpose(0, 2, 1),
    "layers_0/mlp/experts/down_proj/kernel": ck[x + "down_proj"].transpose(0, 2, 1),
  }
  return ck, target, want


def _restored(target, src, m):
  got = prj.restore(target, src, recipes=m)
  return {
    prj.path_to_name(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(got)[0]
  }


@pytest.mark.parametrize("config", [None, {"model_type": "mixtral"}])
def test_the_fused_experts_parts_orient_a_square_down(config):
  """The axis a fused ``gate_up``'s parts tile is its out axis: where it is the only one,
  the parts say how the expert tensors are laid out, and a square ``down`` (hidden = expert
  width) is oriented by them, not asked."""
  ck, target, want = _moe(4, 6, 6)
  src = MemorySource(ck)
  got = _restored(target, src, prj.match(target, src, config=config))
  for name, value in want.items():
    np.testing.assert_array_equal(got[name], value, err_msg=name)


def _gpt_oss(e, d, i):
  """GPT-OSS's experts: ``[E, D, 2I]``, gate and up alternating; ``down`` ``[E, I, D]``."""
  x = "model.layers.0.mlp.experts."
  ck = {x + "gate_up_proj": _rand(e, d, 2 * i), x + "down_proj": _rand(e, i, d)}
  experts = {n: {"kernel": _sds(e, d, i)} for n in ("gate_proj", "up_proj")}
  target = {"layers_0": {"mlp": {"experts": {**experts, "down_proj": {"kernel": _sds(e, i, d)}}}}}
  gu = ck[x + "gate_up_proj"]
  want = {
    "layers_0/mlp/experts/gate_proj/kernel": gu[..., ::2],
    "layers_0/mlp/experts/up_proj/kernel": gu[..., 1::2],
    "layers_0/mlp/experts/down_proj/kernel": ck[x + "down_proj"],
  }
  return ck, target, want


@pytest.mark.parametrize(
  ("make", "config"), [(lambda: _moe(8, 8, 4), None), (lambda: _gpt_oss(4, 6, 2), "gpt_oss")]
)
def test_a_fused_experts_tensor_is_never_split_along_its_experts(make, config):
  """As many experts as ``2I``: the experts axis tiles the parts' widths too, and was the one
  taken (GPT-OSS's ``[4, 6, 4]``: gate and up cut across the experts, reshaped, no error;
  transformers 5's ``[8, 8, 8]``: every line offered a wrong split). Only the last two axes
  are a fused tensor's out axis; where both tile, the bare tensors decided orient it."""
  ck, target, want = make()
  src = MemorySource(ck)
  m = prj.match(target, src, config=config and {"model_type": config})
  got = _restored(target, src, m)
  for name, value in want.items():
    np.testing.assert_array_equal(got[name], value, err_msg=name)


# --- where the layers are: axis 0, or axis 1 with experts first --------------------------------


def _layers(n, *names, shape):
  return {f"model.layers.{i}.{name}": _rand(*shape) for i in range(n) for name in names}


def test_layers_on_axis_1_are_read_from_the_leaves_that_can_only_be_that():
  ck = _layers(3, "mlp.up_proj.weight", shape=(8, 4)) | _layers(
    3, "input_layernorm.weight", shape=(4,)
  )
  target = {
    "layers": {"mlp": {"up": {"kernel": _sds(4, 3, 8)}}, "attn_norm": {"scale": _sds(4, 3)}}
  }
  m = prj.match(target, MemorySource(ck))
  assert "stacked 3 layers on axis 1" in str(m)
  got = prj.restore(target, MemorySource(ck), recipes=m)["layers"]
  for i in range(3):
    np.testing.assert_array_equal(
      got["mlp"]["up"]["kernel"][:, i], ck[f"model.layers.{i}.mlp.up_proj.weight"].T
    )
    np.testing.assert_array_equal(
      got["attn_norm"]["scale"][:, i], ck[f"model.layers.{i}.input_layernorm.weight"]
    )


def test_experts_in_front_of_the_layers():
  ck = {
    f"model.layers.{i}.block_sparse_moe.experts.{e}.w1.weight": _rand(8, 4)
    for i in range(2)
    for e in range(3)
  }
  target = {"layers": {"moe": {"experts": {"gate": {"kernel": _sds(3, 2, 4, 8)}}}}}
  got = prj.restore(target, MemorySource(ck), recipes=prj.match(target, MemorySource(ck)))
  kernel = got["layers"]["moe"]["experts"]["gate"]["kernel"]
  np.testing.assert_array_equal(
    kernel[2, 1], ck["model.layers.1.block_sparse_moe.experts.2.w1.weight"].T
  )


def test_a_stack_whose_sizes_allow_both_axes_is_a_question():
  """Two layers of ``[2, 8]`` norms (per kv head): ``[2, 2, 8]`` is layers-first or
  layers-second, and no other leaf says which: both are offered, none is picked."""
  ck = _layers(2, "self_attn.k_norm.weight", shape=(2, 8))
  target = {"layers": {"attn": {"k_norm": {"scale": _sds(2, 2, 8)}}}}
  with pytest.raises(prj.MatchError) as info:
    prj.match(target, MemorySource(ck))
  (problem,) = info.value.problems
  codes = [c.code for c in problem.choices["layers/attn/k_norm/scale"]]
  assert any("axis=0" in c for c in codes) and any("axis=1" in c for c in codes), codes
  # one leaf that can only be layers-first settles it for the whole target
  ck |= _layers(2, "input_layernorm.weight", shape=(8,))
  target["layers"]["attn_norm"] = {"scale": _sds(2, 8)}
  got = prj.restore(target, MemorySource(ck), recipes=prj.match(target, MemorySource(ck)))
  np.testing.assert_array_equal(
    got["layers"]["attn"]["k_norm"]["scale"][1], ck["model.layers.1.self_attn.k_norm.weight"]
  )


# --- MaxText's and t5x's words ----------------------------------------------------------------


@pytest.mark.parametrize(
  "target, key",
  [
    ("decoder/layers_0/mlp/wi_0/kernel", "model.layers.0.mlp.gate_proj.weight"),
    ("decoder/layers_0/mlp/wi_1/kernel", "model.layers.0.mlp.up_proj.weight"),
    ("decoder/layers_0/mlp/wo/kernel", "model.layers.0.mlp.down_proj.weight"),
    ("decoder/layers_0/MoeBlock_0/gate/kernel", "model.layers.0.block_sparse_moe.gate.weight"),
    ("token_embedder/embedding", "model.embed_tokens.weight"),
    ("decoder/decoder_norm/scale", "model.norm.weight"),
    ("decoder/logits_dense/kernel", "lm_head.weight"),
  ],
)
def test_maxtext_names_fold_to_the_checkpoints_concepts(target, key):
  roles = {"gate", "up", "down", "o", "router", "embed", "final", "norm", "head", "experts"}
  assert concepts(target).tokens & roles == concepts(key).tokens & roles, target


def _stack_case(leaves, layers=3):
  keys = [f"model.layers.{i}.mlp.up_proj.weight" for i in range(layers)]
  ck = Checkpoint({k: concepts(k) for k in keys}, {k: (8, 4) for k in keys})
  slots = [types.SimpleNamespace(name=n, shape=s) for n, s in leaves.items()]
  return stacks.stacks(slots, ck)


def test_a_subtree_whose_leaves_all_lead_with_the_layer_count_is_a_stack():
  got = _stack_case(
    {"dec/mlp/up/kernel": (3, 4, 8), "dec/mlp/up/bias": (3, 8), "embed/embedding": (9, 4)}
  )
  assert got == {"dec"}  # the largest such subtree, not dec/mlp or dec/mlp/up


@pytest.mark.parametrize(
  "leaves",
  [
    {"dec/mlp/up/kernel": (3, 4, 8), "dec/mlp/up/bias": (8,)},  # one leaf leads otherwise
    {"dec/up/kernel": (3, 4, 8)},  # a single leaf says nothing
    {"layers/up/kernel": (3, 4, 8), "layers/up/bias": (3, 8)},  # named so: nothing to add
    {"dec/up/kernel": (5, 4, 8), "dec/up/bias": (5, 8)},  # 5 is no layer count here
  ],
)
def test_no_stack_without_the_evidence(leaves):
  assert _stack_case(leaves) == frozenset()


def test_a_one_layer_checkpoint_has_no_stacks():
  assert _stack_case({"dec/up/kernel": (1, 4, 8), "dec/up/bias": (1, 8)}, layers=1) == frozenset()


def test_heads_split_and_permuted_without_a_config_read_the_leafs_own_axes():
  """Gemma's einsum weights (``q_einsum`` ``[heads, hidden, head_dim]``, ``attn_vec_einsum``
  ``[heads, head_dim, hidden]``) over ``q_proj``/``k_proj``/``o_proj`` with no config: the
  MLP's kernel says the checkpoint is ``[out, in]``; each leaf's two axes beside the width,
  in its order, are its heads and head size (as a reshape to ``[hidden, heads, head_dim]``
  reads them)."""
  rng = np.random.default_rng(0)
  h, kv, d, width = 4, 2, 8, 32
  at = "model.layers.0."
  ck = {
    at + "self_attn.q_proj.weight": rng.standard_normal((h * d, width)).astype(np.float32),
    at + "self_attn.k_proj.weight": rng.standard_normal((kv * d, width)).astype(np.float32),
    at + "self_attn.o_proj.weight": rng.standard_normal((width, h * d)).astype(np.float32),
    at + "mlp.up_proj.weight": rng.standard_normal((48, width)).astype(np.float32),
  }
  attn = {"q_einsum": (h, width, d), "k_einsum": (kv, width, d), "attn_vec_einsum": (h, d, width)}
  target = {"layer_0": {"attn": {n: {"w": _sds(*s)} for n, s in attn.items()}}}
  target["layer_0"]["mlp"] = {"up_proj": {"kernel": _sds(width, 48)}}
  got = prj.restore(target, MemorySource(ck), recipes=prj.match(target, MemorySource(ck)))
  a = got["layer_0"]["attn"]
  q = ck[at + "self_attn.q_proj.weight"].reshape(h, d, width).transpose(0, 2, 1)
  k = ck[at + "self_attn.k_proj.weight"].reshape(kv, d, width).transpose(0, 2, 1)
  np.testing.assert_array_equal(a["q_einsum"]["w"], q)
  np.testing.assert_array_equal(a["k_einsum"]["w"], k)
  np.testing.assert_array_equal(
    a["attn_vec_einsum"]["w"], ck[at + "self_attn.o_proj.weight"].T.reshape(h, d, width)
  )


# --- stacks that hold the checkpoint's layers between them -------------------------------------


def _mixed(moe, n, axis, stacks=("dense_layers", "moe_layers"), first=1):
  """A checkpoint of ``n`` layers, those in ``moe`` a mixture of 3 experts with a router, the
  rest a dense MLP; and the tree a model that stacks its dense and its MoE layers apart keeps
  (layers on ``axis``: 1 as MaxText, 0 as ``nnx.scan``), built from it by hand."""
  ck = {}
  for i in range(n):
    p = f"model.layers.{i}."
    ck[p + "self_attn.q_proj.weight"] = _rand(16, 8)
    ck[p + "input_layernorm.weight"] = _rand(8)
    if i in moe:
      ck[p + "mlp.gate.weight"] = _rand(3, 8)
      for e in range(3):
        ck[p + f"mlp.experts.{e}.gate_proj.weight"] = _rand(6, 8)
        ck[p + f"mlp.experts.{e}.down_proj.weight"] = _rand(8, 6)
    else:
      ck[p + "mlp.gate_proj.weight"] = _rand(12, 8)
      ck[p + "mlp.down_proj.weight"] = _rand(8, 12)

  def stack(layers, name, experts=False):
    if experts:  # [E, L, ...] (MaxText) or [L, E, ...]
      per = [
        np.stack([ck[f"model.layers.{i}.mlp.experts.{e}.{name}"].T for e in range(3)])
        for i in layers
      ]
      return np.stack(per, axis=1 if axis == 1 else 0)
    per = [ck[f"model.layers.{i}.{name}"] for i in layers]
    per = [w.T if w.ndim == 2 else w for w in per]
    return np.stack(per, axis=axis)

  def common(layers):
    return {
      "attn": {"q": {"kernel": stack(layers, "self_attn.q_proj.weight")}},
      "pre_norm": {"scale": stack(layers, "input_layernorm.weight")},
    }

  def dense_mlp(layers):
    return {
      "wi_0": {"kernel": stack(layers, "mlp.gate_proj.weight")},
      "wo": {"kernel": stack(layers, "mlp.down_proj.weight")},
    }

  dense = [i for i in range(n) if i not in moe]
  if not moe:  # one kind of layer, the ``first`` in one stack, the rest in the other
    return ck, {
      stacks[0]: {**common(dense[:first]), "mlp": dense_mlp(dense[:first])},
      stacks[1]: {**common(dense[first:]), "mlp": dense_mlp(dense[first:])},
    }
  expect = {
    stacks[0]: {**common(dense), "mlp": dense_mlp(dense)},
    stacks[1]: {
      **common(moe),
      "moe": {
        "gate": {"kernel": stack(moe, "mlp.gate.weight")},
        "wi_0": stack(moe, "gate_proj.weight", experts=True),
        "wo": stack(moe, "down_proj.weight", experts=True),
      },
    },
  }
  return ck, expect


def _target(expect):
  return jax.tree.map(lambda x: _sds(x.shape), expect)


def _assert_restores(expect, ck, m):
  got = prj.restore(_target(expect), MemorySource(ck), recipes=m)
  for (path, want), leaf in zip(
    jax.tree_util.tree_flatten_with_path(expect)[0], jax.tree.leaves(got), strict=True
  ):
    np.testing.assert_array_equal(np.asarray(leaf), want, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize(
  "moe, n",
  [
    ((1, 2), 3),  # DeepSeek: the first layer dense (sizes alone say which stack is which)
    ((1, 3), 4),  # Llama 4: every other layer MoE (two stacks of 2: the tensors say it)
    ((0, 1, 3), 5),  # no pattern at all
  ],
)
def test_stacks_that_split_the_layers_each_take_their_own(moe, n, axis):
  ck, expect = _mixed(moe, n, axis)
  m = prj.match(_target(expect), MemorySource(ck))
  _assert_restores(expect, ck, m)


def test_a_single_layer_tensor_is_stacked_in_its_one_layer_stack():
  """DeepSeek's one dense layer: its ``mlp.gate_proj`` is in layer 0 only, and the stack of
  one layer is that layer's stack (not a reshape of a tensor outside the layers, which reads
  the same values and made it a question between the two)."""
  ck, expect = _mixed((1, 2), 3, 1)
  m = prj.match(_target(expect), MemorySource(ck))
  why = {t: reason for t, _, reason in m.rows()}
  assert why["dense_layers/mlp/wi_0/kernel"].endswith("stacked 1 layers on axis 1"), why


def test_layers_alike_in_every_stack_are_asked_and_a_share_hint_settles_them():
  """Four layers alike, in a stack of one and a stack of three: nothing says which layer is
  where, so the refusal names the stacks and a hint to paste; the hint gives each its own."""
  ck, expect = _mixed((), 4, 0, stacks=("early_layers", "late_layers"))
  with pytest.raises(prj.MatchError) as info:
    prj.match(_target(expect), MemorySource(ck))
  msg = str(info.value)
  assert (
    "the target's stacks 'early_layers' (1), 'late_layers' (3) hold the checkpoint's 4 layers between them, "
    "and no grouping of its layers by their tensors fits the stacks' sizes: pass which layers "
    "each holds, e.g. hints={'early_layers': range(0, 1), 'late_layers': range(1, 4)} if they hold them in "
    "that order"
  ) in msg, msg
  hints = {"early_layers": range(0, 1), "late_layers": range(1, 4)}
  _assert_restores(expect, ck, prj.match(_target(expect), MemorySource(ck), hints=hints))
  # one stack's share says the other's: the rest
  _assert_restores(
    expect, ck, prj.match(_target(expect), MemorySource(ck), hints={"early_layers": [0]})
  )


def test_stacks_that_fit_either_way_are_asked_with_each_way_as_hints():
  """Two stacks of two alike layers, the last two with a tensor neither stack has: both ways
  find every leaf its tensors, so both are offered as hints to paste, and neither is picked
  (with the right one, what is left is the tensor the target does not have)."""
  ck, expect = _mixed((), 4, 0, stacks=("a_layers", "b_layers"), first=2)
  ck |= {f"model.layers.{i}.mlp.extra.weight": _rand(8) for i in (2, 3)}
  with pytest.raises(prj.MatchError) as info:
    prj.match(_target(expect), MemorySource(ck))
  assert info.value.problems == (
    "the target's stacks 'a_layers' (2), 'b_layers' (2) hold the checkpoint's 4 layers between "
    "them, and nothing says which layers each holds: pass one of "
    "hints={'a_layers': range(0, 2), 'b_layers': range(2, 4)} or "
    "hints={'a_layers': range(2, 4), 'b_layers': range(0, 2)}",
  )
  hints = {"a_layers": range(0, 2), "b_layers": range(2, 4)}
  with pytest.raises(prj.MatchError, match="layer tensors the target does not use") as info:
    prj.match(_target(expect), MemorySource(ck), hints=hints)
  assert "mlp.extra" in str(info.value)
  _assert_restores(expect, ck, info.value.partial)


@pytest.mark.parametrize(
  "hints, problem",
  [
    (
      {"dense_layer": range(0, 1)},
      "hint for 'dense_layer': range(0, 1) gives a stack of layers its checkpoint layers, but "
      "'dense_layer' is not one of the target's stacks (they are: 'dense_layers', "
      "'moe_layers'); did you mean 'dense_layers'?",
    ),
    (
      {"moe_layers": range(1, 2)},
      "hint for 'moe_layers': the stack holds 2 layers, the hint gives 1 (range(1, 2))",
    ),
    (
      {"moe_layers": (1, 1)},
      "hint for 'moe_layers': (1, 1) is not 2 distinct layers of the checkpoint's 3 (0..2)",
    ),
    (
      {"moe_layers": [2, 3]},
      "hint for 'moe_layers': [2, 3] is not 2 distinct layers of the checkpoint's 3 (0..2)",
    ),
    (
      {"dense_layers": [1], "moe_layers": [1, 2]},
      "hints for 'dense_layers' and 'moe_layers' both take checkpoint layer 1",
    ),
  ],
)
def test_a_share_hint_that_does_not_fit_is_refused_by_name(hints, problem):
  ck, expect = _mixed((1, 2), 3, 1)
  with pytest.raises(prj.MatchError) as info:
    prj.match(_target(expect), MemorySource(ck), hints=hints)
  assert info.value.problems == (problem,)


def test_a_share_hint_is_the_users_word_over_the_evidence():
  """The layers' kinds say dense is layer 0; a hint that says otherwise is followed, and its
  stack then finds no tensors of its own: refused, never restored from the wrong layers."""
  ck, expect = _mixed((1, 2), 3, 1)
  with pytest.raises(prj.MatchError, match="dense_layers/mlp/wi_0/kernel"):
    prj.match(_target(expect), MemorySource(ck), hints={"dense_layers": [2]})


def _grouped(axis, kinds=("sliding_attention", "full_attention")):
  """Four layers, every other one sliding (``layer_types``), and a target whose every
  stacked layer holds a local and a global one (``*_local``, ``*_global``), by hand."""
  ck = {}
  for i in range(4):
    p = f"model.layers.{i}."
    ck[p + "self_attn.q_proj.weight"] = _rand(16, 8)
    ck[p + "mlp.gate_proj.weight"] = _rand(12, 8)
    ck[p + "mlp.down_proj.weight"] = _rand(8, 12)
    ck[p + "input_layernorm.weight"] = _rand(8)
  config = {"model_type": "gemma2", "layer_types": [kinds[i % 2] for i in range(4)]}

  def group(first):
    def stack(name):
      per = [ck[f"model.layers.{i}.{name}"] for i in (first, first + 2)]
      return np.stack([w.T if w.ndim == 2 else w for w in per], axis=axis)

    return {
      "attn": {"q": {"kernel": stack("self_attn.q_proj.weight")}},
      "mlp": {
        "wi_0": {"kernel": stack("mlp.gate_proj.weight")},
        "wo": {"kernel": stack("mlp.down_proj.weight")},
      },
      "norm": {"scale": stack("input_layernorm.weight")},
    }

  local, global_ = group(0), group(1)
  layers = {f"{k}_local": v for k, v in local.items()} | {
    f"{k}_global": v for k, v in global_.items()
  }
  return ck, config, {"layers": layers}


@pytest.mark.parametrize("axis", [0, 1])
def test_groups_in_a_stacked_layer_take_the_layers_of_their_kind(axis):
  """MaxText's Gemma 2: the config's ``layer_types`` says which layers are sliding (local)
  and which full (global); each group takes every other layer, by its word."""
  ck, config, expect = _grouped(axis)
  m = prj.match(_target(expect), MemorySource(ck), config=config)
  _assert_restores(expect, ck, m)


def test_groups_whose_words_say_nothing_of_the_layer_types_are_asked():
  """Groups named ``_a``/``_b``: both ways find every tensor, nothing says which: asked."""
  ck, config, expect = _grouped(0)
  expect = {
    "layers": {
      k.replace("_local", "_a").replace("_global", "_b"): v for k, v in expect["layers"].items()
    }
  }
  with pytest.raises(prj.MatchError) as info:
    prj.match(_target(expect), MemorySource(ck), config=config)
  (problem,) = info.value.problems
  assert "hints={'layers/*_a': range(0, 3, 2), 'layers/*_b': range(1, 4, 2)}" in problem, problem
  hints = {"layers/*_a": range(0, 4, 2), "layers/*_b": range(1, 4, 2)}
  m = prj.match(_target(expect), MemorySource(ck), config=config, hints=hints)
  _assert_restores(expect, ck, m)


@pytest.mark.parametrize(
  "children",
  [
    ["attn_local", "attn_global", "mlp_local"],  # mlp_global missing: not the same names
    ["attn_local", "attn_global", "mlp_local", "mlp_global", "norm"],  # one in no group
    ["attn_local", "attn_global"],  # one name only: a word, not a group
    ["layers_0", "layers_1", "mlp_0", "mlp_1"],  # numbers are places, not groups
  ],
)
def test_no_groups_without_every_module_named_alike_but_for_a_word(children):
  assert stacks.groups({f"layers/{c}/w": "layers" for c in children}) == {}


@pytest.mark.parametrize(
  "kinds", [("sliding_attention", "full_attention"), ("full_attention", "sliding_attention")]
)
def test_groups_in_numbered_layers_take_the_layers_of_their_kind(kinds):
  """The same unscanned: ``layers_{j}`` holds the ``j``-th sliding layer as ``*_local`` and
  the ``j``-th full one as ``*_global``, whichever comes first in ``layer_types``."""
  ck, config, _ = _grouped(0, kinds)
  local = [i for i in range(4) if config["layer_types"][i] == "sliding_attention"]
  full = [i for i in range(4) if config["layer_types"][i] == "full_attention"]

  def layer(i, word):
    p = f"model.layers.{i}."
    return {
      f"attn_{word}": {"q": {"kernel": ck[p + "self_attn.q_proj.weight"].T}},
      f"mlp_{word}": {
        "wi_0": {"kernel": ck[p + "mlp.gate_proj.weight"].T},
        "wo": {"kernel": ck[p + "mlp.down_proj.weight"].T},
      },
      f"norm_{word}": {"scale": ck[p + "input_layernorm.weight"]},
    }

  expect = {f"layers_{j}": layer(local[j], "local") | layer(full[j], "global") for j in (0, 1)}
  m = prj.match(_target(expect), MemorySource(ck), config=config)
  _assert_restores(expect, ck, m)


def _pattern_target(n, p, axis):
  """``n`` alike layers, and the tree MaxText's Gemma 3 keeps them in: blocks of ``p``
  layers scanned (``layers/layers_{r}``: place ``r`` of every block, layer ``p*j + r``) and
  the layers after the last whole block unscanned (``layers_remainder/layers_{r}``)."""
  ck = {}
  for i in range(n):
    p_ = f"model.layers.{i}."
    ck[p_ + "self_attn.q_proj.weight"] = _rand(16, 8)
    ck[p_ + "mlp.down_proj.weight"] = _rand(8, 12)
    ck[p_ + "input_layernorm.weight"] = _rand(8)

  def layer(layers):
    def leaf(name):
      per = [ck[f"model.layers.{i}.{name}"] for i in layers]
      per = [w.T if w.ndim == 2 else w for w in per]
      return np.stack(per, axis=axis)

    return {
      "self_attention": {"query": {"kernel": leaf("self_attn.q_proj.weight")}},
      "mlp": {"wo": {"kernel": leaf("mlp.down_proj.weight")}},
      "pre_self_attention_norm": {"scale": leaf("input_layernorm.weight")},
    }

  blocks = n // p
  decoder = {}
  if blocks:  # none: everything in the remainder (MaxText's scan_length 0)
    decoder["layers"] = {f"layers_{r}": layer([p * j + r for j in range(blocks)]) for r in range(p)}
  if n % p:
    rest = range(p * blocks, n)
    unscanned = {f"layers_{r}": layer_at(ck, i) for r, i in enumerate(rest)}
    decoder["layers_remainder"] = unscanned
  return ck, {"decoder": decoder}


def layer_at(ck, i):
  p = f"model.layers.{i}."
  return {
    "self_attention": {"query": {"kernel": ck[p + "self_attn.q_proj.weight"].T}},
    "mlp": {"wo": {"kernel": ck[p + "mlp.down_proj.weight"].T}},
    "pre_self_attention_norm": {"scale": ck[p + "input_layernorm.weight"]},
  }


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("n, p", [(6, 2), (7, 2), (8, 3), (3, 6)])
def test_a_stacked_pattern_takes_every_pth_layer_and_its_remainder_the_last(n, p, axis):
  ck, expect = _pattern_target(n, p, axis)
  m = prj.match(_target(expect), MemorySource(ck))
  _assert_restores(expect, ck, m)


def test_closure_in_a_pattern_and_its_remainder_reads_their_own_layers():
  """A norm no name says (``blob``) is the last tensor left in its layer: for place ``r``,
  layers ``r, r+2, r+4``; for the remainder's ``layers_0``, layer 6 (not 0)."""
  ck, expect = _pattern_target(7, 2, 1)
  for group in ("layers", "layers_remainder"):
    for layer in expect["decoder"][group].values():
      layer["blob"] = layer.pop("pre_self_attention_norm")
  m = prj.match(_target(expect), MemorySource(ck))
  _assert_restores(expect, ck, m)


def test_a_stacks_own_words_do_not_color_its_leaves():
  """``moe_layers/out`` is the attention's output (``o_proj``) as ``dense_layers/out`` is:
  read with the stack's word, ``out`` after ``moe`` folds to an MLP's down projection, and
  the shared expert's ``down_proj`` of its shape would be taken for it."""
  ck = {}
  for i in range(3):
    p = f"model.layers.{i}."
    ck[p + "self_attn.o_proj.weight"] = _rand(8, 8)
    if i == 0:
      ck[p + "mlp.down_proj.weight"] = _rand(8, 16)
    else:
      ck[p + "mlp.shared_experts.down_proj.weight"] = _rand(8, 8)

  def stack(name, layers):
    return np.stack([ck[f"model.layers.{i}.{name}"].T for i in layers], axis=1)

  expect = {
    "dense_layers": {
      "out": {"kernel": stack("self_attn.o_proj.weight", [0])},
      "mlp": {"wo": {"kernel": stack("mlp.down_proj.weight", [0])}},
    },
    "moe_layers": {
      "out": {"kernel": stack("self_attn.o_proj.weight", [1, 2])},
      "shared_experts": {"wo": {"kernel": stack("mlp.shared_experts.down_proj.weight", [1, 2])}},
    },
  }
  _assert_restores(expect, ck, prj.match(_target(expect), MemorySource(ck)))


def test_a_square_shared_expert_is_a_linear_weight_not_an_embedding():
  """``shared`` is T5's and BART's embedding only as the module itself (``shared.weight``):
  a shared expert's square ``down_proj`` was read as a table, kept as stored where the
  other linear weights are transposed, and restored without an error."""
  ck = {}
  for i in range(2):
    p = f"model.layers.{i}."
    ck[p + "self_attn.o_proj.weight"] = _rand(8, 8)
    ck[p + "mlp.up_proj.weight"] = _rand(16, 8)
    ck[p + "mlp.shared_experts.down_proj.weight"] = _rand(8, 8)

  def stack(name):
    return np.stack([ck[f"model.layers.{i}.{name}"].T for i in (0, 1)])

  expect = {
    "layers": {
      "out": {"kernel": stack("self_attn.o_proj.weight")},
      "mlp": {"wi": {"kernel": stack("mlp.up_proj.weight")}},
      "shared_experts": {"wo": {"kernel": stack("mlp.shared_experts.down_proj.weight")}},
    }
  }
  _assert_restores(expect, ck, prj.match(_target(expect), MemorySource(ck)))
  assert concepts("shared.weight").tokens == concepts("embed_tokens.weight").tokens
  # no embedding's word either (a table's own module is asked too, but its words stay apart)
  assert "embed" not in concepts("model.layers.0.mlp.shared_experts.down_proj.weight").tokens


def test_the_table_says_which_layers_each_stack_holds():
  ck, expect = _mixed((1, 2), 3, 1)
  m = prj.match(_target(expect), MemorySource(ck))
  assert m.stacks == (("dense_layers", "0"), ("moe_layers", "1..2"))
  assert "  stacks (the checkpoint layers each holds): dense_layers = 0; moe_layers = 1..2" in str(
    m
  )
  assert "Stacks (the checkpoint layers each holds): dense_layers = 0;" in m._repr_html_()
  ck, expect = _pattern_target(13, 2, 0)
  stacks = dict(prj.match(_target(expect), MemorySource(ck)).stacks)
  assert stacks == {
    "decoder/layers/layers_0": "0, 2, ..., 10",
    "decoder/layers/layers_1": "1, 3, ..., 11",
  }


def test_a_name_hint_on_a_remainder_leaf_reads_the_layer_it_holds():
  """``layers_remainder/layers_0`` holds layer 6 (after 3 blocks of 2): a hint naming layer
  6's tensor is that leaf's, read at layer 6 (it was looked for at layer 0, and refused)."""
  ck, expect = _pattern_target(7, 2, 1)
  hints = {"decoder/layers_remainder/layers_0/mlp/wo/kernel": "model.layers.6.mlp.down_proj.weight"}
  _assert_restores(expect, ck, prj.match(_target(expect), MemorySource(ck), hints=hints))


# --- a stage's blocks stacked: ``stages/1/blocks/fc1/kernel [blocks, in, out]`` ---------------


def _staged(depths, widths=(4, 6, 8), scale="gamma"):
  """A ConvNeXt-like checkpoint (``encoder.stages.{s}.layers.{b}.*``; a stage's width its
  own) and the target that scans each stage's blocks (the stages a list)."""
  ck, expect = {}, {"stages": []}
  parts = {
    "norm.weight": 1,
    "norm.bias": 1,
    "fc1.weight": (4, 1),
    "fc1.bias": 4,
    "fc2.weight": (1, 4),
    "fc2.bias": 1,
    "layer_scale": 1,
  }
  for s, (d, w) in enumerate(zip(depths, widths)):
    stage = {}
    if s:
      ck[f"encoder.stages.{s}.downsample.weight"] = _rand(w, widths[s - 1])
      stage["proj"] = {"kernel": ck[f"encoder.stages.{s}.downsample.weight"].T}
    blocks = []
    for b in range(d):
      q = f"encoder.stages.{s}.layers.{b}."
      for part, k in parts.items():
        ck[q + part] = _rand(*(np.atleast_1d(k) * w))
      blocks.append(
        {
          "norm": {"scale": ck[q + "norm.weight"], "bias": ck[q + "norm.bias"]},
          "fc1": {"kernel": ck[q + "fc1.weight"].T, "bias": ck[q + "fc1.bias"]},
          "fc2": {"kernel": ck[q + "fc2.weight"].T, "bias": ck[q + "fc2.bias"]},
          scale: ck[q + "layer_scale"],
        }
      )
    stage["blocks"] = jax.tree.map(lambda *xs: np.stack(xs), *blocks)
    expect["stages"].append(stage)
  return ck, expect


@pytest.mark.parametrize("depths", [(2, 2, 2), (1, 3, 2), (3, 1, 2)])
def test_a_stages_stacked_blocks_are_that_stages_blocks(depths):
  """Each stage's stack takes its own stage's blocks, as many as it holds (stages of
  different depths; one of a single block)."""
  ck, expect = _staged(depths)
  m = prj.match(_target(expect), MemorySource(ck))
  _assert_restores(expect, ck, m)
  assert set(re.findall(r"stages\.(\d)", _rows(m)["stages/1/blocks/fc1/kernel"])) == {"1"}


def test_closure_in_a_stages_stacked_blocks_reads_that_stage():
  """``blob`` (no name says it) is the stack left once every other leaf of the stage's stacked
  blocks took its own: reported as closure over that stage's blocks; in a stage of one block,
  over that block."""
  ck, expect = _staged((1, 3, 2), scale="blob")
  m = prj.match(_target(expect), MemorySource(ck))
  _assert_restores(expect, ck, m)
  reasons = {t: why for t, _, why in m.rows()}
  assert "closure: the last stack of layers (1, 0)..(1, 2)" in reasons["stages/1/blocks/blob"]
  assert "closure: the last tensor of layer (0, 0)" in reasons["stages/0/blocks/blob"]


def test_no_closure_in_a_stage_after_a_hint():
  """A hint in a stage's stacked blocks is the user's word, not evidence about the rest: with
  one in every stage, every ``blob`` is asked (with one in some, the others' closure is the
  choice in every stage, as for any layer)."""
  ck, expect = _staged((1, 3, 2), scale="blob")
  hints = {
    f"stages/{s}/blocks/norm/scale": f"encoder.stages.{s}.layers.{{i}}.norm.weight"
    for s in range(3)
  }
  with pytest.raises(prj.MatchError) as e:
    prj.match(_target(expect), MemorySource(ck), hints=hints)
  assert sorted(t for p in e.value.problems for t in p.targets) == [
    f"stages/{s}/blocks/blob" for s in range(3)
  ]
  del hints["stages/1/blocks/norm/scale"]
  m = prj.match(_target(expect), MemorySource(ck), hints=hints)
  _assert_restores(expect, ck, m)
  assert "as in stages/1/blocks/blob" in {t: w for t, _, w in m.rows()}["stages/0/blocks/blob"]


def test_a_stages_stacked_blocks_asked_are_answered_by_uncommenting_lines():
  """Two norms no name tells apart (``a``, ``c``) in every stage's stacked blocks: asked, the
  true stack among each question's lines, and uncommenting those lines restores every value."""
  ck, expect = _staged((2, 3, 2))
  for s, stage in enumerate(expect["stages"]):
    blocks = stage["blocks"]
    blocks["a"] = blocks.pop("norm")
    depth, width = blocks["a"]["scale"].shape
    for part in ("weight", "bias"):
      for b in range(depth):
        ck[f"encoder.stages.{s}.layers.{b}.norm2.{part}"] = _rand(width)
    blocks["c"] = {
      name: np.stack([ck[f"encoder.stages.{s}.layers.{b}.norm2.{part}"] for b in range(depth)])
      for name, part in (("scale", "weight"), ("bias", "bias"))
    }
  with pytest.raises(prj.MatchError) as e:
    prj.match(_target(expect), MemorySource(ck))
  true = {"a": "norm.", "c": "norm2.", "gamma": "layer_scale"}
  hints = {}
  for line in str(e.value).splitlines():
    if (found := re.match(r'\s*# "(stages/\d/blocks/(\w+)\S*)": "(.*)",$', line)) is not None:
      leaf, module, key = found.groups()
      if key.partition("{i}.")[2].startswith(true[module]):
        hints[leaf] = key
  assert len(hints) == 15  # a, c (scale, bias) and gamma in each of 3 stages
  _assert_restores(expect, ck, prj.match(_target(expect), MemorySource(ck), hints=hints))


# --- a list of lists: ``blocks.{stage}.{block}`` ------------------------------------------------


def _list_of_lists(depths=(2, 3), widths=(4, 6)):
  """timm's EfficientNet layout (``blocks.{stage}.{block}.conv_pw.weight``: a list of stages,
  each a list of blocks) and a target that keeps the two numbers but names its own modules."""
  ck, expect = {}, {"blocks": []}
  for s, (d, w) in enumerate(zip(depths, widths)):
    stage = []
    for b in range(d):
      q = f"blocks.{s}.{b}."
      ck[q + "conv_pw.weight"] = _rand(2 * w, w)
      ck[q + "bn1.weight"] = _rand(2 * w)
      ck[q + "bn1.bias"] = _rand(2 * w)
      ck[q + "layer_scale"] = _rand(2 * w)
      stage.append(
        {
          "pointwise": {"kernel": ck[q + "conv_pw.weight"].T},
          "norm": {"scale": ck[q + "bn1.weight"], "bias": ck[q + "bn1.bias"]},
          "blob": ck[q + "layer_scale"],
        }
      )
    expect["blocks"].append(stage)
  return ck, expect


def test_a_list_of_lists_numbers_its_blocks_within_each_stage():
  """``blocks.0.1`` is stage 0's block 1 (its items alike), read as the layer ``(0, 1)`` on
  both sides, so each block's tensors are that block's. Read as layer ``(0,)``, a stage's
  blocks are one layer of many alike tensors, and every leaf is asked."""
  ck, expect = _list_of_lists()
  m = prj.match(_target(expect), MemorySource(ck))
  _assert_restores(expect, ck, m)


def test_a_sequential_in_a_layer_is_not_a_list_of_lists():
  """``layers.0.0`` a conv and ``layers.0.1`` a norm: the items differ, so the second number
  is a module's place, and the layer stays ``(0,)``."""
  from paramreg_jax._src.match import numbering

  names = ["layers.0.0.weight", "layers.0.1.weight", "layers.0.1.bias", "layers.1.0.weight"]
  assert numbering.lists_of_lists(names) == {}
  alike = [f"blocks.{s}.{b}.conv.weight" for s in (0, 1) for b in (0, 1)]
  assert numbering.lists_of_lists(alike)["blocks.1.0.conv.weight"] == (1, 0)


# --- a conv kernel orients the square linear weights beside it (axes._conv_votes) -------------


def _conv_and_square(stored_as):
  """A checkpoint whose only non-square weight is a conv, and a flax target: its attention's
  square ``query``/``key`` kernels are oriented by the conv alone."""
  r = np.random.default_rng(3)
  conv = r.standard_normal((8, 4, 3, 3)).astype(np.float32)  # [out, in, h, w]
  q, k = (r.standard_normal((8, 8)).astype(np.float32) for _ in range(2))  # [out, in]
  if stored_as == "torch":
    tensors = {"conv.weight": conv, "attn.query.weight": q, "attn.key.weight": k}
  else:  # a JAX checkpoint: [h, w, in, out] and [in, out]
    tensors = {
      "conv.kernel": conv.transpose(2, 3, 1, 0),
      "attn.query.kernel": q.T,
      "attn.key.kernel": k.T,
    }
  expect = {
    "conv": {"kernel": conv.transpose(2, 3, 1, 0)},
    "attn": {"query": {"kernel": q.T}, "key": {"kernel": k.T}},
  }
  return prj.MemorySource(tensors), expect


@pytest.mark.parametrize("stored_as", ["torch", "jax"])
def test_a_conv_orients_the_square_weights_nothing_else_orients(stored_as):
  src, expect = _conv_and_square(stored_as)
  target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), expect)
  got = prj.restore(target, src, recipes=prj.match(target, src))
  for (path, want), leaf in zip(
    jax.tree_util.tree_flatten_with_path(expect)[0], jax.tree.leaves(got)
  ):
    np.testing.assert_array_equal(np.asarray(leaf), want, err_msg=jax.tree_util.keystr(path))


def test_a_conv_does_not_outvote_the_linear_weights_shapes():
  """GPT-2's ``Conv1D`` keeps its linear weights ``[in, out]``: a non-square one says so, and a
  conv beside it (stored ``[out, in, h, w]``) is not heard."""
  r = np.random.default_rng(4)
  conv = r.standard_normal((8, 4, 3, 3)).astype(np.float32)
  up, q = (
    r.standard_normal((8, 16)).astype(np.float32),
    r.standard_normal((8, 8)).astype(np.float32),
  )
  src = prj.MemorySource({"conv.weight": conv, "mlp.c_fc.weight": up, "attn.q.weight": q})
  expect = {
    "conv": {"kernel": conv.transpose(2, 3, 1, 0)},
    "mlp": {"c_fc": {"kernel": up}},
    "attn": {"q": {"kernel": q}},
  }
  target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), expect)
  got = prj.restore(target, src, recipes=prj.match(target, src))
  np.testing.assert_array_equal(np.asarray(got["attn"]["q"]["kernel"]), q)


def test_a_1x1_conv_is_the_conv_layout_not_a_reshape():
  """``[o, i, 1, 1] -> [1, 1, i, o]`` with ``o == i`` is also a plain reshape of the same
  size, which would read the kernel transposed."""
  w = np.arange(64, dtype=np.float32).reshape(8, 8, 1, 1)
  src = prj.MemorySource(
    {"quant_conv.weight": w, "conv_in.weight": np.ones((8, 3, 3, 3), np.float32)}
  )
  target = {
    "quant_conv": {"kernel": jax.ShapeDtypeStruct((1, 1, 8, 8), np.float32)},
    "conv_in": {"kernel": jax.ShapeDtypeStruct((3, 3, 3, 8), np.float32)},
  }
  got = prj.restore(target, src, recipes=prj.match(target, src))
  np.testing.assert_array_equal(np.asarray(got["quant_conv"]["kernel"]), w.transpose(2, 3, 1, 0))


@pytest.mark.parametrize("rank", [3, 4])
def test_a_1x1_conv_is_a_linear_weight_oriented_by_the_leafs_own_word(rank):
  """A pointwise conv ``[o, i, 1]`` (a Conformer's ``pointwise_conv1``) kept as a linear layer:
  a flax ``kernel`` is ``[i, o]``, a torch-style ``weight`` ``[o, i]``; square, both shapes
  fit, and only the word says which (a reshape as stored read the kernel transposed)."""
  r = np.random.default_rng(7)
  w = r.standard_normal((8, 8) + (1,) * (rank - 2)).astype(np.float32)
  up = r.standard_normal((16, 8) + (1,) * (rank - 2)).astype(np.float32)
  src = prj.MemorySource({"conv.pointwise_conv2.weight": w, "conv.pointwise_conv1.weight": up})
  for leaf, want, want_up in (
    ("kernel", w.reshape(8, 8).T, up.reshape(16, 8).T),
    ("weight", w.reshape(8, 8), up.reshape(16, 8)),
  ):
    target = {
      "conv": {
        "pointwise_conv2": {leaf: jax.ShapeDtypeStruct((8, 8), np.float32)},
        "pointwise_conv1": {leaf: jax.ShapeDtypeStruct(want_up.shape, np.float32)},
      }
    }
    got = prj.restore(target, src, recipes=prj.match(target, src))
    np.testing.assert_array_equal(np.asarray(got["conv"]["pointwise_conv2"][leaf]), want)
    np.testing.assert_array_equal(np.asarray(got["conv"]["pointwise_conv1"][leaf]), want_up)


@pytest.mark.parametrize("linears", [("linear_1", "linear_2"), ("0", "2")])
def test_a_square_linear_inside_an_embedder_is_oriented_like_any_linear(linears):
  """``time_embedder/linear_2`` (diffusers) and ``time_embedder/2`` (LDM's ``time_embed``
  sequential) are linear layers of the time embedding, not lookup tables: a square kernel
  is transposed like the rest (read as a table, it loaded as stored, a wrong weight with no
  error)."""
  r = np.random.default_rng(6)
  w1 = r.standard_normal((16, 8)).astype(np.float32)  # [out, in]: says the checkpoint's layout
  w2 = r.standard_normal((16, 16)).astype(np.float32)
  table = r.standard_normal((10, 16)).astype(np.float32)
  first, second = linears
  src = prj.MemorySource(
    {
      f"emb.time_embedder.{first}.weight": w1,
      f"emb.time_embedder.{second}.weight": w2,
      "emb.embed_tokens.weight": table,
    }
  )
  target = {
    "emb": {
      "time_embedder": {n: {"kernel": _sds(w.T.shape)} for n, w in ((first, w1), (second, w2))},
      "embed_tokens": {"embedding": _sds(table.shape)},
    }
  }
  got = prj.restore(target, src, recipes=prj.match(target, src))
  np.testing.assert_array_equal(np.asarray(got["emb"]["time_embedder"][second]["kernel"]), w2.T)
  np.testing.assert_array_equal(np.asarray(got["emb"]["embed_tokens"]["embedding"]), table)


# --- heads: a split the config contradicts is a model built otherwise ------------------------


def _llama_split(heads, kv_heads):
  """The tiny Llama (4 heads of 8, 2 kv heads) with q, k, v, o kept ``[hidden, heads,
  head_dim]`` (o ``[heads, head_dim, hidden]``), split into ``heads`` and ``kv_heads``."""
  c = load_file(str(HF / "llama" / "model.safetensors"))
  t = {
    "embed": {"embedding": c["model.embed_tokens.weight"]},
    "norm": {"scale": c["model.norm.weight"]},
  }
  t["lm_head"] = {"kernel": c["lm_head.weight"].T}
  for i in range(2):
    q = f"model.layers.{i}."
    w = {r: c[q + f"self_attn.{r}_proj.weight"] for r in "qkvo"}
    t[f"layers_{i}"] = {
      "attn_norm": {"scale": c[q + "input_layernorm.weight"]},
      "mlp_norm": {"scale": c[q + "post_attention_layernorm.weight"]},
      "attn": {
        "q": {"kernel": w["q"].T.reshape(32, heads, -1)},
        "k": {"kernel": w["k"].T.reshape(32, kv_heads, -1)},
        "v": {"kernel": w["v"].T.reshape(32, kv_heads, -1)},
        "o": {"kernel": w["o"].T.reshape(heads, -1, 32)},
      },
      "mlp": {r: {"kernel": c[q + f"mlp.{r}_proj.weight"].T} for r in ("gate", "up", "down")},
    }
  return t


def _abstract(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def test_heads_split_otherwise_than_the_config_says_is_refused_with_the_counts():
  """A target built with 8 heads of 4 over a checkpoint of 4 heads of 8: every reshape fits
  and every value lands, and the attention computes something else. The config says the
  heads: refused, each projection once for every layer, with the counts to build it with."""
  src = prj.open_source(str(HF / "llama"))
  right = _llama_split(4, 2)
  m = prj.match(_abstract(right), src)
  got = prj.restore(_abstract(right), src, recipes=m)
  np.testing.assert_array_equal(
    np.asarray(got["layers_1"]["attn"]["o"]["kernel"]), right["layers_1"]["attn"]["o"]["kernel"]
  )
  with pytest.raises(prj.MatchError) as e:
    prj.match(_abstract(_llama_split(8, 4)), src)
  assert [p.split(":", 1)[0] for p in e.value.problems] == [
    f"layers_{{i}}/attn/{r}/kernel, in 2 layers (0, 1), each alike" for r in "koqv"
  ]
  assert (
    "layers_{i}/attn/q/kernel, in 2 layers (0, 1), each alike: splits its 32 values per row "
    "into 8 heads of 4; the config says 4 heads of 8 (kv heads 2): the target model's head "
    "count is not the checkpoint's; build it with 4 heads of 8, 2 kv heads (or, if this split "
    "is right, choose its line below)"
  ) in e.value.problems
  assert e.value.partial.proposals  # the rest was matched


def test_t5s_head_width_is_its_d_kv_not_d_model_over_heads():
  """T5's heads are ``d_kv`` wide, whatever ``d_model / num_heads`` is (t5-11b: 128 heads of
  128 over 1024). Read as 16 / 4, no split of the 32 rows was checked: a target of 8 heads
  of 4 restored every value and computed another attention."""
  ck = {f"encoder.block.0.layer.0.SelfAttention.{n}.weight": _rand(32, 16) for n in ("q", "k", "v")}
  ck["encoder.block.0.layer.0.SelfAttention.o.weight"] = _rand(16, 32)
  config = {"model_type": "t5", "num_heads": 4, "d_model": 16, "d_kv": 8}

  def target(h, d):
    attn = {n: {"kernel": _sds(16, h, d)} for n in ("query", "key", "value")}
    return {"encoder": {"layers_0": {"attention": {**attn, "out": {"kernel": _sds(h, d, 16)}}}}}

  m = prj.match(target(4, 8), MemorySource(ck), config=config)
  q = _restored(target(4, 8), MemorySource(ck), m)["encoder/layers_0/attention/query/kernel"]
  np.testing.assert_array_equal(
    q, ck["encoder.block.0.layer.0.SelfAttention.q.weight"].T.reshape(16, 4, 8)
  )
  with pytest.raises(prj.MatchError, match="into 8 heads of 4; the config says 4 heads of 8"):
    prj.match(target(8, 4), MemorySource(ck), config=config)


@pytest.mark.parametrize("decoder_heads", [4, 2])
def test_bart_and_whisper_say_their_heads_per_stack(decoder_heads):
  """BART, Whisper and Marian give ``encoder_attention_heads`` and
  ``decoder_attention_heads``, no ``num_attention_heads``: nothing was checked. Where the
  two agree, that is the count; where they differ, no one count is said (nothing refused)."""
  ck = {f"model.encoder.layers.0.self_attn.{n}_proj.weight": _rand(16, 16) for n in "qkv"}
  config = {
    "model_type": "bart",
    "d_model": 16,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": decoder_heads,
  }
  attn = {n: {"kernel": _sds(16, 8, 2)} for n in ("q", "k", "v")}  # 8 heads of 2
  target = {"encoder": {"layers_0": {"self_attn": attn}}}
  if decoder_heads == 2:
    prj.match(target, MemorySource(ck), config=config)
    return
  with pytest.raises(prj.MatchError, match="into 8 heads of 2; the config says 4 heads of 4"):
    prj.match(target, MemorySource(ck), config=config)


def test_a_heads_split_without_a_config_or_by_a_hint_is_the_users():
  """Without a config nothing says the heads: the split the target keeps is taken. A hint
  naming the tensor is the user's word, as the refusal says."""
  wrong = _llama_split(8, 4)
  m = prj.match(_abstract(wrong), MemorySource(load_file(str(HF / "llama" / "model.safetensors"))))
  assert "layers_0/attn/q/kernel" in {t for t, _, _ in m.rows()}
  hints = {
    f"layers_{{i}}/attn/{r}/kernel": f"model.layers.{{i}}.self_attn.{r}_proj.weight" for r in "qkvo"
  }
  src = prj.open_source(str(HF / "llama"))
  got = prj.restore(_abstract(wrong), src, recipes=prj.match(_abstract(wrong), src, hints=hints))
  np.testing.assert_array_equal(
    np.asarray(got["layers_0"]["attn"]["q"]["kernel"]), wrong["layers_0"]["attn"]["q"]["kernel"]
  )


# --- a tensor of three or more axes merged into one linear leaf ---------------------------------


def _funnel(d, heads, head_dim):
  """Funnel's attention: torch ``[out, in]`` projections and ``r_kernel`` ``[d, heads,
  head_dim]``, an einsum's parameter kept input first (``einsum("nd,dhf->nhf", r,
  r_kernel)``); and a torch-style target whose ``r_proj`` is a linear ``[out, in]`` weight."""
  a = "encoder.layers.0.attention."
  ck = {a + f"{n}_head.weight": _rand(d, d) for n in "qkv"}
  ck[a + "post_proj.weight"] = _rand(d, d)
  ck[a + "r_kernel"] = _rand(d, heads, head_dim)
  attn = {n: {"weight": _sds(d, d)} for n in ("q_head", "k_head", "v_head", "post_proj")}
  attn["r_proj"] = {"weight": _sds(heads * head_dim, d)}
  # a linear weight that is not square: it says the target keeps them [out, in]
  ck["encoder.layers.0.ffn.linear_1.weight"] = _rand(2 * d, d)
  ffn = {"linear_1": {"weight": _sds(2 * d, d)}}
  return ck, {"layers_0": {"attention": attn, "ffn": ffn}}


def _funnel_forward(r_kernel, weight):
  """The projection Funnel computes with ``r_kernel``, and the one the target's ``[out, in]``
  ``weight`` computes, on the same positions."""
  r = np.random.default_rng(1).standard_normal((5, r_kernel.shape[0])).astype(np.float32)
  heads = np.einsum("nd,dhf->nhf", r, r_kernel).reshape(5, -1)
  return heads, r @ np.asarray(weight).T


@pytest.mark.parametrize("config", [None, {"model_type": "funnel"}])
def test_an_einsum_parameter_merged_into_a_square_linear_leaf_is_asked_both_ways(config):
  """Funnel's ``r_kernel`` ``[32, 4, 8]`` merged into a square ``[32, 32]`` linear weight fits
  as stored or transposed, and nothing says which of its axes is the input (torch's linear
  weights are output first; this einsum's parameter is input first): it was merged as
  stored, the transpose of the true weight, with no error. Both readings are offered, the
  true one among them, and nothing else of the layer is held back."""
  ck, target = _funnel(32, 4, 8)
  with pytest.raises(prj.MatchError) as info:
    prj.match(target, MemorySource(ck), config=config)
  (problem,) = info.value.problems
  assert problem.targets == ("layers_0/attention/r_proj/weight",)
  r_kernel = ck["encoder.layers.0.attention.r_kernel"]
  (choices,) = problem.choices.values()
  merged = [
    c.hint
    for c in choices
    if isinstance(c.hint, prj.recipes.Recipe)
    and set(prj.recipes.source_keys(c.hint)) == {"encoder.layers.0.attention.r_kernel"}
  ]
  assert len(merged) == 2
  right = [
    r
    for r in merged
    if np.allclose(
      *_funnel_forward(r_kernel, prj.recipes.evaluate(r, MemorySource(ck))), rtol=1e-4, atol=1e-5
    )
  ]
  assert len(right) == 1
  assert "layers_0/attention/r_proj/weight" not in dict(info.value.partial.items())
  hints = {"layers_0/attention/r_proj/weight": right[0]}
  m = prj.match(target, MemorySource(ck), config=config, hints=hints)
  got = prj.restore(target, MemorySource(ck), recipes=m)["layers_0"]["attention"]
  np.testing.assert_allclose(
    *_funnel_forward(r_kernel, got["r_proj"]["weight"]), rtol=1e-4, atol=1e-5
  )


def test_an_einsum_parameter_merged_into_a_transposed_leaf_of_other_shape_maps():
  """Where the leaf is not square only one reading fits: ``[16, 4, 8]`` into ``[32, 16]``
  is the heads merged, then transposed (there was no such reading: refused)."""
  ck, target = _funnel(16, 4, 8)
  for n in ("q_head", "k_head", "v_head", "post_proj"):
    ck[f"encoder.layers.0.attention.{n}.weight"] = _rand(16, 16)
    target["layers_0"]["attention"][n]["weight"] = _sds(16, 16)
  m = prj.match(target, MemorySource(ck))
  got = prj.restore(target, MemorySource(ck), recipes=m)["layers_0"]["attention"]
  r_kernel = ck["encoder.layers.0.attention.r_kernel"]
  np.testing.assert_allclose(
    *_funnel_forward(r_kernel, got["r_proj"]["weight"]), rtol=1e-4, atol=1e-5
  )


def _patch_conv(d, channels, patch, leaf):
  """A ViT's patch embedding (a torch conv ``[d, C, p, p]``, ``C * p * p == d``) as one linear
  leaf over flattened patches, beside a linear layer whose shape says how the target keeps
  its linear weights (``kernel`` ``[in, out]``, or ``weight`` ``[out, in]``)."""
  ck = {"patch.proj.weight": _rand(d, channels, patch, patch), "head.weight": _rand(8, d)}
  fc = (d, 8) if leaf == "kernel" else (8, d)
  return ck, {"patch": {"proj": {leaf: _sds(d, d)}}, "head": {leaf: _sds(*fc)}}


def test_a_conv_kernel_merged_into_a_square_linear_leaf_is_read_only_as_torch_flattens_it():
  """A conv's ``[out, in, h, w]`` merged into a square leaf: a torch-style ``[out, in]``
  weight over patches flattened as torch does (channels, then rows and columns) is the
  kernel reshaped, and a conv applied to one patch equals it. A ``[in, out]`` kernel of the
  same shape was given the same reshape (the transpose of the true weight, no error); it
  is not the conv's layout in any flattening match can know, so it is not offered."""
  ck, target = _patch_conv(12, 3, 2, "weight")
  m = prj.match(target, MemorySource(ck))
  weight = np.asarray(prj.restore(target, MemorySource(ck), recipes=m)["patch"]["proj"]["weight"])
  patch = np.random.default_rng(2).standard_normal((3, 2, 2)).astype(np.float32)
  conv = np.einsum("ochw,chw->o", ck["patch.proj.weight"], patch)
  np.testing.assert_allclose(weight @ patch.ravel(), conv, rtol=1e-4, atol=1e-5)
  ck, target = _patch_conv(12, 3, 2, "kernel")
  with pytest.raises(prj.MatchError, match="patch/proj/kernel"):
    prj.match(target, MemorySource(ck))
  # a Conv1d [out, in, k] as a kernel [in * k, out] of another shape: the same, refused
  ck = {"conv.weight": _rand(8, 4, 3), "head.weight": _rand(5, 8)}
  target = {"conv": {"kernel": _sds(12, 8)}, "head": {"kernel": _sds(8, 5)}}
  with pytest.raises(prj.MatchError, match="conv/kernel"):
    prj.match(target, MemorySource(ck))


def _dense_general(d, heads, head_dim, ffn):
  """A flax checkpoint whose attention is ``DenseGeneral``: ``query`` ``[d, heads, head_dim]``
  and ``out`` ``[heads, head_dim, d]`` kernels (inputs first, always), beside ``Dense``
  kernels of the MLP."""
  ck = {}
  for i in range(2):
    p = f"params/layers_{i}/"
    for n in ("query", "key", "value"):
      ck[p + f"attn/{n}/kernel"] = _rand(d, heads, head_dim)
    ck[p + "attn/out/kernel"] = _rand(heads, head_dim, d)
    ck[p + "mlp/wi/kernel"] = _rand(d, ffn)
    ck[p + "mlp/wo/kernel"] = _rand(ffn, d)
  return ck


@pytest.mark.parametrize("leaf", ["kernel", "weight"])
def test_dense_general_kernels_merged_into_square_linear_leaves_follow_flax_layout(leaf):
  """flax's ``DenseGeneral`` kernel is ``[*in, *out]`` by definition: merged into a square
  ``Dense`` kernel it is the kernel as stored, into a torch-style ``[out, in]`` weight (the
  MLP's shapes say the target keeps them so) its transpose; attention computed with the
  restored leaves equals the checkpoint's einsums. Before, a ``weight`` was given the kernel
  as stored (its transpose, no error)."""
  d, ffn = 32, 48
  ck = _dense_general(d, 4, 8, ffn)
  fc = {"fc1": (d, ffn), "fc2": (ffn, d)}
  if leaf == "weight":
    fc = {k: s[::-1] for k, s in fc.items()}
  block = {
    "attn": {n: {leaf: _sds(d, d)} for n in ("q", "k", "v", "o")},
    "mlp": {k: {leaf: _sds(*s)} for k, s in fc.items()},
  }
  target = {f"blocks_{i}": block for i in range(2)}
  m = prj.match(target, MemorySource(ck))
  got = prj.restore(target, MemorySource(ck), recipes=m)["blocks_1"]["attn"]
  x = np.random.default_rng(3).standard_normal((5, d)).astype(np.float32)
  heads = np.einsum("nd,dhf->nhf", x, ck["params/layers_1/attn/query/kernel"])
  out = np.einsum("nhf,hfd->nd", heads, ck["params/layers_1/attn/out/kernel"])

  def apply(w, v):
    return v @ (np.asarray(w) if leaf == "kernel" else np.asarray(w).T)

  q = apply(got["q"][leaf], x)
  np.testing.assert_allclose(q, heads.reshape(5, -1), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(apply(got["o"][leaf], q), out, rtol=1e-4, atol=1e-4)


# --- a checkpoint that stacks its layers, into a target that keeps each layer apart -----------


def _scanned(layers, axis, d=32, heads=4, head_dim=8, ffn=48):
  """A flax checkpoint trained scanned, every layer's tensor stacked on ``axis`` (0:
  ``nn.scan``/``nnx.scan``; 1: MaxText's ``param_scan_axis``): ``DenseGeneral`` attention
  kernels ``[d, heads, head_dim]`` and ``[heads, head_dim, d]``, MLP kernels, norm scales;
  and each layer's own arrays, as the truth."""
  per = [
    {
      "query": _rand(d, heads, head_dim),
      "key": _rand(d, heads, head_dim),
      "out": _rand(heads, head_dim, d),
      "wi": _rand(d, ffn),
      "wo": _rand(ffn, d),
      "pre_norm": _rand(d),
    }
    for _ in range(layers)
  ]
  where = {"query": "attn/query", "key": "attn/key", "out": "attn/out", "wi": "mlp/wi"}
  where |= {"wo": "mlp/wo", "pre_norm": "pre_norm"}
  ck = {
    f"params/decoder/layers/{path}/{'scale' if n == 'pre_norm' else 'kernel'}": np.stack(
      [p[n] for p in per], axis=axis if per[0][n].ndim >= axis else 0
    )
    for n, path in where.items()
  }
  return ck, per


def _layers_target(per, merged):
  """A target of ``layers_{i}`` modules: heads split as stored, or merged into ``Dense``
  kernels ``[d, heads * head_dim]`` and ``[heads * head_dim, d]``."""

  out = {}
  for i, p in enumerate(per):
    q, k, o = p["query"], p["key"], p["out"]
    if merged:
      q, k, o = q.reshape(q.shape[0], -1), k.reshape(k.shape[0], -1), o.reshape(-1, o.shape[-1])
    out[f"layers_{i}"] = {
      "attn": {"query": {"kernel": q}, "key": {"kernel": k}, "out": {"kernel": o}},
      "mlp": {"wi": {"kernel": p["wi"]}, "wo": {"kernel": p["wo"]}},
      "pre_norm": {"scale": p["pre_norm"]},
    }
  return out


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("merged", [False, True])
def test_a_scanned_checkpoint_is_unstacked_into_a_targets_layers(axis, merged):
  """Every layer of a target that keeps its layers apart comes from its layer of the stacked
  tensors (selected on the layers' axis, 0 or MaxText's 1), read as one tensor is: heads
  kept split, or merged into a ``Dense`` kernel as flax's ``[*in, *out]`` says (square
  ones too). Before, nothing was read: no tensor has a layer number. Each layer's attention,
  computed with the restored leaves, equals the checkpoint's einsums on that layer."""
  ck, per = _scanned(3, axis)
  expect = _layers_target(per, merged)
  target = jax.tree.map(lambda x: _sds(*x.shape), expect)
  m = prj.match(target, MemorySource(ck))
  got = prj.restore(target, MemorySource(ck), recipes=m)
  for (path, want), leaf in zip(
    jax.tree_util.tree_flatten_with_path(expect)[0], jax.tree.leaves(got)
  ):
    np.testing.assert_array_equal(np.asarray(leaf), want, err_msg=jax.tree_util.keystr(path))
  x = np.random.default_rng(4).standard_normal((5, 32)).astype(np.float32)
  for i, p in enumerate(per):
    attn = got[f"layers_{i}"]["attn"]
    heads = np.einsum("nd,dhf->nhf", x, p["query"])
    q = x @ np.asarray(attn["query"]["kernel"]).reshape(32, -1)
    np.testing.assert_allclose(q, heads.reshape(5, -1), rtol=1e-4, atol=1e-4)
  rows = {t: why for t, _, why in m.rows()}
  assert rows["layers_2/mlp/wi/kernel"].endswith(f"layer 2 of 3 stacked on axis {axis}")


def test_a_scanned_checkpoint_whose_two_axes_could_be_the_layers_is_asked():
  """Where every tensor named for the layers has as many rows as there are layers on both of
  axes 0 and 1 (4 layers of width 4, and no tensor that leads with another size), the
  checkpoint does not say where its layers are: both readings are offered, nothing is
  taken by guess, and ``.partial`` holds only what is true. (With MaxText's ``out``
  ``[heads, L, head_dim, d]`` beside them, the axes disagree and the layers' axis is known.)"""
  ck, per = _scanned(4, 0, d=4, heads=2, head_dim=2, ffn=6)
  ck = {k: v for k, v in ck.items() if not k.endswith(("out/kernel", "wo/kernel"))}
  expect = _layers_target(per, merged=False)
  for layer in expect.values():
    del layer["attn"]["out"], layer["mlp"]["wo"]
  target = jax.tree.map(lambda x: _sds(*x.shape), expect)
  with pytest.raises(prj.MatchError) as info:
    prj.match(target, MemorySource(ck))
  problem = next(p for p in info.value.problems if "layers_0/mlp/wi/kernel" in p.targets)
  (choices,) = (c for k, c in problem.choices.items() if "layers_0/mlp/wi" in k)
  picked = {str(c.hint) for c in choices if "mlp/wi" in str(c.hint)}
  assert any("Range(axis=0" in h for h in picked) and any("Range(axis=1" in h for h in picked)
  partial = dict(info.value.partial.items()) if info.value.partial is not None else {}
  for name, recipe in partial.items():
    want = expect
    for part in name.split("/"):
      want = want[part]
    np.testing.assert_array_equal(np.asarray(prj.recipes.evaluate(recipe, MemorySource(ck))), want)
  # with the tensors that lead with another size, the checkpoint says axis 0
  ck, per = _scanned(4, 0, d=4, heads=2, head_dim=2, ffn=6)
  expect = _layers_target(per, merged=False)
  target = jax.tree.map(lambda x: _sds(*x.shape), expect)
  got = prj.restore(target, MemorySource(ck), recipes=prj.match(target, MemorySource(ck)))
  np.testing.assert_array_equal(got["layers_3"]["mlp"]["wi"]["kernel"], per[3]["wi"])


def test_maxtext_norms_are_read_as_the_attention_and_mlp_norms():
  """MaxText's decoders (Llama, Mistral, DeepSeek) name their two norms
  ``pre_self_attention_layer_norm`` and ``post_self_attention_layer_norm``, the second the
  norm before the MLP (as transformers' ``post_attention_layernorm``): a scanned MaxText
  checkpoint's ``[d, L]`` scales go to each layer's attention and MLP norms, by name (they
  were ambiguous with each other)."""
  layers = "params/decoder/layers/"
  pre, post = _rand(16, 3), _rand(16, 3)
  ck = {
    layers + "pre_self_attention_layer_norm/scale": pre,
    layers + "post_self_attention_layer_norm/scale": post,
    layers + "mlp/wi/kernel": _rand(16, 3, 24),
  }
  block = {"attention_norm": {"scale": _sds(16)}, "ffn_norm": {"scale": _sds(16)}}
  block["feed_forward"] = {"w1": {"kernel": _sds(16, 24)}}
  target = {f"layers_{i}": block for i in range(3)}
  m = prj.match(target, MemorySource(ck))
  got = prj.restore(target, MemorySource(ck), recipes=m)
  for i in range(3):
    np.testing.assert_array_equal(got[f"layers_{i}"]["attention_norm"]["scale"], pre[:, i])
    np.testing.assert_array_equal(got[f"layers_{i}"]["ffn_norm"]["scale"], post[:, i])


@pytest.mark.parametrize("stored, kept", [(1, 0), (0, 1)])
def test_a_scanned_checkpoint_into_a_target_scanned_on_its_other_axis(stored, kept):
  """MaxText keeps its layers on axis 1, ``nn.scan``/``nnx.scan`` on axis 0: a checkpoint of
  one into a target of the other has its layers' axis moved (a transpose; with the heads
  merged, each layer merged and stacked again). Before, nothing fit. The target's other
  leaves say its layers' axis (a norm ``[L, d]`` or ``[d, L]``)."""
  ck, per = _scanned(3, stored)
  q = np.stack([p["query"].reshape(32, -1) for p in per], axis=kept)
  wi = np.stack([p["wi"] for p in per], axis=kept)
  norm = np.stack([p["pre_norm"] for p in per], axis=kept)
  expect = {"layers": {"attn": {"query": {"kernel": q}}, "mlp": {"wi": {"kernel": wi}}}}
  expect["layers"]["pre_norm"] = {"scale": norm}
  for n in ("key", "out"):
    expect["layers"]["attn"][n] = {"kernel": np.stack([p[n] for p in per], axis=kept)}
  for n in ("wo",):
    expect["layers"]["mlp"][n] = {"kernel": np.stack([p[n] for p in per], axis=kept)}
  target = jax.tree.map(lambda x: _sds(*x.shape), expect)
  m = prj.match(target, MemorySource(ck))
  got = prj.restore(target, MemorySource(ck), recipes=m)["layers"]
  np.testing.assert_array_equal(got["attn"]["query"]["kernel"], q)
  np.testing.assert_array_equal(got["mlp"]["wi"]["kernel"], wi)
  np.testing.assert_array_equal(got["pre_norm"]["scale"], norm)
  rows = {t: why for t, _, why in m.rows()}
  assert rows["layers/mlp/wi/kernel"].endswith(f"moved from axis {stored} to {kept}")


def test_a_name_hint_on_a_layer_names_the_scanned_tensor_it_is_a_layer_of():
  """A hint for every layer (``{i}``) naming a scanned checkpoint's tensor gives each layer
  its own slice of it (the tensor has no layer number: it was read whole, and fit no leaf)."""
  ck, per = _scanned(3, 1)
  expect = _layers_target(per, merged=True)
  for layer in expect.values():
    layer["mlp"]["p7"] = layer["mlp"].pop("wi")  # a name nothing ties to wi
  target = jax.tree.map(lambda x: _sds(*x.shape), expect)
  hints = {"layers_{i}/mlp/p7/kernel": "params/decoder/layers/mlp/wi/kernel"}
  m = prj.match(target, MemorySource(ck), hints=hints)
  got = prj.restore(target, MemorySource(ck), recipes=m)
  for i, p in enumerate(per):
    np.testing.assert_array_equal(got[f"layers_{i}"]["mlp"]["p7"]["kernel"], p["wi"])


def test_a_target_of_other_layers_than_a_scanned_checkpoint_is_told_why():
  """A target of 4 layers over a checkpoint that stacks 3: every leaf is refused, and one
  problem, first, says why and the recipe that takes a layer's slice (checked by restoring
  layer 2 of a tensor with it, as pasted)."""
  ck, per = _scanned(3, 1)
  target = jax.tree.map(lambda x: _sds(*x.shape), _layers_target([*per, per[0]], merged=False))
  with pytest.raises(prj.MatchError) as info:
    prj.match(target, MemorySource(ck))
  key = "params/decoder/layers/attn/key/kernel"
  assert info.value.problems[0] == (
    f"the checkpoint stacks its layers (3 on axis 1: {key!r} (32, 3, 4, 8)), the target has 4 "
    "of 'layers_{i}/attn/key/kernel' (24 leaves refused for it): restore into a model of 3 "
    "layers, or give each leaf its layer's slice of its tensor as a recipe hint, as for layer "
    f"i of that one: R.reshape(R.source({key!r}, prj.Range(1, i, i + 1)), (32, 4, 8))"
  )
  recipe = eval(  # the user's paste
    info.value.problems[0].rpartition(": ")[2].replace("i, i + 1", "2, 3"),
    {"R": prj.recipes, "prj": prj},
  )
  np.testing.assert_array_equal(prj.recipes.evaluate(recipe, MemorySource(ck)), per[2]["key"])
