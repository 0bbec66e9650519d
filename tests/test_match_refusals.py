"""A refusal as a user reads it (``match/refusal.py``): one question per concept, answered by
uncommenting lines of its own ``hints = {...}`` literal, never by typing a name.

The chooser is a simulated user who knows the true mapping (``match`` on the same model with
its own names and config.json) and only uncomments lines; every restore it reaches is checked
by value (the forward pass against PyTorch's output).
"""

from __future__ import annotations

import re
import shutil

import hf_models as hf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import paramreg_jax as prj
from paramreg_jax import MemorySource
from paramreg_jax import SafetensorsSource
from paramreg_jax import recipes as R
from paramreg_jax._src.match.hints import is_layout
from paramreg_jax._src.match.hints import named_keys

CASES = sorted(hf.ARCHS)
_ENTRY = re.compile(r'^  # ("[^"]+"): (.+?),(?:  # (.+))?$')  # a wide entry's reason: under it


def literal_entries(error):
  """``{hints key: [line, ...]}``: the commented choices of a refusal's literal, in order,
  each with its reason after it (where the literal put it under, it is put back)."""
  out: dict[str, list[str]] = {}
  key = None
  for line in error.hints_code.splitlines():
    if m := _ENTRY.match(line):
      key = eval(m.group(1))
      out.setdefault(key, []).append(line)
    elif key and line.startswith(("  #     ^ ", "  #       ")):  # a wide entry's reason
      sep = "  # " if line.startswith("  #     ^ ") else " "
      out[key][-1] += sep + line.lstrip(" #^")
    else:
      key = None
  return out


def uncommented(line):
  """The one entry a line holds, as the user gets it by deleting its ``# ``."""
  scope = {"prj": prj, "R": R}
  exec("hints = {\n" + line.replace("  # ", "  ", 1) + "\n}", scope)
  return scope["hints"]


def expand_template(key, names):
  rx = re.compile(re.escape(key).replace(re.escape("{i}"), r"(\d+)") + "$")
  return [(n, m.group(1) if "{i}" in key else None) for n in names if (m := rx.match(n))]


def _true(line, layer, proposal, keys):
  """Whether a line's hint, read at ``layer`` (as ``match`` reads a ``{i}`` key), is the
  true proposal's: a name that names its tensors, or its very recipe."""
  if layer is not None:
    line = line.replace("{i}", layer)
  value = next(iter(uncommented(line).values()))
  if isinstance(value, str):
    return set(named_keys(value, keys)) == set(proposal.keys)
  return value == proposal.recipe


def _true_layout(line, key, target, src, hints, truth, rename):
  """Whether a layout line (``"model.layers.{i}.attn.qkv": "per_head"``) is the truth: with
  it, every leaf cut from that fused tensor is given the true proposal's recipe."""
  rx = re.compile(re.escape(key).replace(re.escape("{i}"), r"\d+") + r"(\.\w+)?$")
  try:
    got = prj.match(target, src, hints={**hints, **uncommented(line)})
  except prj.MatchError as e:
    got = e.partial
  if got is None:
    return False
  cut = [p for p in got.proposals if any(rx.match(k) for k in p.keys)]
  return bool(cut) and all(p.recipe == truth[rename(p.target)].recipe for p in cut)


def choose(target, src, truth, rename=lambda n: n, rounds=6):
  """Uncomments, per entry of each refusal, the one line the truth says; returns the match,
  the number of choices made and the number of refusals seen."""
  hints: dict = {}
  choices = refusals = 0
  leaves = {prj.path_to_name(p): x for p, x in jax.tree_util.tree_flatten_with_path(target)[0]}
  names = list(leaves)
  keys = list(src.keys())
  for _ in range(rounds):
    try:
      return prj.match(target, src, hints=hints), choices, refusals
    except prj.MatchError as e:
      refusals += 1
      scope: dict = {"prj": prj, "R": R}
      exec(e.hints_code, scope)
      assert scope["hints"] == {}, "the literal pasted unchanged must be hints = {}"
      for line in e.hints_code.splitlines():  # an entry alone may pass 88: it is one line
        m = _ENTRY.match(line)
        assert len(line) <= 88 or (m and not m.group(3)), f"{len(line)} columns: {line}"
      for key, lines in literal_entries(e).items():
        if all(is_layout(next(iter(uncommented(x).values()))) for x in lines):
          right = [x for x in lines if _true_layout(x, key, target, src, hints, truth, rename)]
          assert len(right) == 1, f"{key}: {len(right)} true lines:\n" + "\n".join(lines)
          hints.update(uncommented(right[0]))
          choices += 1
          continue
        members = expand_template(key, names)
        assert members, f"{key!r} fits no target name"
        right = [
          line for line in lines if all(_true(line, i, truth[rename(n)], keys) for n, i in members)
        ]
        assert right, f"{key}: the true tensor is not among its lines:\n" + "\n".join(lines)
        for line in lines:  # and every line is a hint for its leaf (the wrong ones too)
          for n, i in members:
            value = next(iter(uncommented(line.replace("{i}", i or "{i}")).values()))
            if not isinstance(value, str):
              meta = R.infer(value, src)
              assert (meta.shape, meta.dtype) == (leaves[n].shape, leaves[n].dtype), line
        hints.update(uncommented(right[0]))
        choices += 1
  raise AssertionError(f"still refused after {rounds} rounds of choosing")


def _case(name, config, tmp_path, style_name="flax"):
  """A suite architecture's target (flax's, or ``style_name``'s), its source (``config``: with
  config.json beside it) and the truth: ``match``'s proposals for the target with its own
  names and the config."""
  arch, sizes, cfg, ref = hf.case(name)
  style = hf.STYLES[style_name]
  shapes = hf.canonical_shapes(arch, sizes)
  if arch.head and not cfg.get("tie_word_embeddings", True):
    shapes = hf.with_head(shapes, arch, sizes)
  target = hf.target(style, shapes, arch, sizes)
  path = hf.DATA / name / "model.safetensors"
  truth = {p.target: p for p in prj.match(target, SafetensorsSource(path)).proposals}
  if not config:
    shutil.copy(path, tmp_path / "model.safetensors")
    path = tmp_path / "model.safetensors"
  return arch, sizes, ref, style, shapes, target, SafetensorsSource(path), truth


def _renamer(back):
  """A target name back in the suite's own words (``back``: new prefix -> old prefix)."""

  def rename(n):
    for new, old in back.items():
      if n.startswith(new):
        return old + n[len(new) :]
    return n

  return rename


def _restores_as_pytorch(arch, sizes, ref, style, shapes, target, src, truth, back):
  """The chooser's restore, renamed back (``back``: new prefix -> old prefix, or a function),
  gives PyTorch's logits; returns its choices."""
  rename = back if callable(back) else _renamer(back)
  m, choices, _ = choose(target, src, truth, rename)
  flat = jax.tree_util.tree_flatten_with_path(prj.restore(target, src, recipes=m))[0]
  restored: dict = {}
  for path, value in flat:
    node = restored
    *head, last = rename(prj.path_to_name(path)).split("/")
    for part in head:
      node = node.setdefault(part, {})
    node[last] = value
  weights = hf.to_canonical(style, shapes, arch, sizes, restored)
  got = np.asarray(hf.forward(arch, sizes, weights, ref["input_ids"]))
  np.testing.assert_allclose(got, ref["output"], atol=1e-5, rtol=1e-5)
  return choices


@pytest.mark.parametrize("variant", ["no config", "renamed", "renamed, no config"])
@pytest.mark.parametrize("name", CASES)
def test_a_user_who_only_uncomments_lines_restores_every_refusal(name, variant, tmp_path):
  *model, target, src, truth = _case(name, "no config" not in variant, tmp_path)
  back = {}
  if "renamed" in variant:  # every per-layer module an opaque token, the structure kept
    for key in [k for k in target if k.startswith("layers_")]:
      for j, module in enumerate(sorted(target[key])):
        target[key][f"m{j}"] = target[key].pop(module)
        back[f"{key}/m{j}/"] = f"{key}/{module}/"
  choices = _restores_as_pytorch(*model, target, src, truth, back)
  print(name, variant, "choices", choices)


@pytest.mark.parametrize("style", ["equinox", "maxtext"])
@pytest.mark.parametrize("name", CASES)
def test_torch_style_and_axis_1_stacks_without_a_config_ask_with_the_truth(name, style, tmp_path):
  """Without config.json nothing says a fused layout, a tied head, or (for equinox's
  ``[out, in]`` weights) what a square weight is beside the rest: whatever is refused is asked
  with the true tensor among the lines, and the chooser's restore equals PyTorch's forward."""
  *model, target, src, truth = _case(name, False, tmp_path, style)
  choices = _restores_as_pytorch(*model, target, src, truth, {})
  print(name, style, "choices", choices)


def _sds(shape, dtype=np.float32):
  return jax.ShapeDtypeStruct(shape, dtype)


def test_each_problem_is_its_message_and_carries_its_choices():
  src = MemorySource(
    {f"h.{i}.ln_{j}.weight": np.ones(4, np.float32) for i in range(3) for j in (1, 2)}
  )
  target = {
    f"block_{i}": {n: {"scale": _sds((4,))} for n in ("norm_a", "norm_b")} for i in range(3)
  }
  with pytest.raises(prj.MatchError) as info:
    prj.match(target, src)
  e = info.value
  assert len(e.problems) == 2  # one per concept, not one per layer and leaf
  (pre,) = (p for p in e.problems if "block_{i}/norm_a/scale" in p.choices)
  assert isinstance(pre, str)
  assert pre.startswith("block_{i}/norm_a/scale, in 3 layers (0, 1, 2)")
  assert pre.targets == ("block_0/norm_a/scale", "block_1/norm_a/scale", "block_2/norm_a/scale")
  assert [c.hint for c in pre.choices["block_{i}/norm_a/scale"]] == [
    "h.{i}.ln_1.weight",
    "h.{i}.ln_2.weight",
  ]
  scope: dict = {}
  exec(e.hints_code, scope)
  with pytest.raises(prj.MatchError) as again:  # pasted unchanged: nothing new
    prj.match(target, src, hints=scope["hints"])
  assert str(again.value) == str(e)


def test_rivals_for_one_tensor_are_not_one_question_across_their_numbers():
  """``proj_0`` and ``proj_1`` want the same two tensors, whose roles say no order: a
  ``proj_{i}`` hint would give both one tensor, so each is asked on its own."""
  src = MemorySource(
    {
      "attn.a_proj.weight": np.ones((4, 6), np.float32),
      "attn.b_proj.weight": np.ones((4, 6), np.float32),
    }
  )
  target = {"attn": {f"proj_{j}": {"kernel": _sds((6, 4))} for j in (0, 1)}}
  with pytest.raises(prj.MatchError) as info:
    prj.match(target, src)
  assert sorted(info.value.problems[j].targets[0] for j in (0, 1)) == [
    "attn/proj_0/kernel",
    "attn/proj_1/kernel",
  ]
  assert "{i}" not in info.value.hints_code


# --- order as evidence (match/order.py) -----------------------------------------------------------


def _pair(*names, shape=(4, 6)):
  return MemorySource({n: rng.standard_normal(shape).astype(np.float32) for n in names})


rng = np.random.default_rng(0)


def test_numbered_siblings_take_the_roles_in_call_order():
  src = _pair("attn.k_proj.weight", "attn.q_proj.weight", "attn.v_proj.weight")
  target = {"attn": {f"Dense_{j}": {"kernel": _sds((6, 4))} for j in range(3)}}
  m = prj.match(target, src)
  got = {t: r for t, r, _ in m.rows()}
  for j, role in enumerate("qkv"):
    assert got[f"attn/Dense_{j}/kernel"] == f"transpose(source('attn.{role}_proj.weight'), (1, 0))"
  why = dict((t, w) for t, _, w in m.rows())
  assert why["attn/Dense_1/kernel"].endswith("in order: Dense_1 of 3 is the k")
  restored = prj.restore(target, src, recipes=m)
  np.testing.assert_array_equal(
    restored["attn"]["Dense_2"]["kernel"], R.evaluate(R.source("attn.v_proj.weight"), src).T
  )


def test_haiku_numbering_is_an_order_too():
  src = _pair("h.0.ln_1.weight", "h.0.ln_2.weight", shape=(4,))
  for a, b in (("layer_norm", "layer_norm_1"), ("LayerNorm_0", "LayerNorm_1")):
    target = {"h_0": {a: {"scale": _sds((4,))}, b: {"scale": _sds((4,))}}}
    got = {t: r for t, r, _ in prj.match(target, src).rows()}
    assert got[f"h_0/{a}/scale"] == "source('h.0.ln_1.weight')"
    assert got[f"h_0/{b}/scale"] == "source('h.0.ln_2.weight')"


@pytest.mark.parametrize(
  "names, why",
  [
    (("mlp.gate_proj.weight", "mlp.up_proj.weight"), "gate and up: code calls them either way"),
    (("attn.q_proj.weight", "attn.a_proj.weight"), "a role the order does not know"),
  ],
)
def test_order_decides_nothing_it_cannot_know(names, why):
  src = _pair(*names)
  target = {"blk": {f"Dense_{j}": {"kernel": _sds((6, 4))} for j in range(2)}}
  with pytest.raises(prj.MatchError, match=r"blk/Dense_0/kernel"):
    prj.match(target, src)


def test_order_is_not_used_against_a_sibling_decided_out_of_order():
  """``Dense_0`` is the v by its shape: numbers that do not follow q, k, v say nothing of the
  rest, which stay open; in order (the v last) they pair."""
  src = MemorySource(
    {
      "model.layers.0.self_attn.q_proj.weight": np.ones((6, 4), np.float32),
      "model.layers.0.self_attn.k_proj.weight": np.ones((6, 4), np.float32),
      "model.layers.0.self_attn.v_proj.weight": np.ones((8, 4), np.float32),
    }
  )
  shapes = [(4, 8), (4, 6), (4, 6)]
  target = {
    "layers_0": {"attention": {f"Dense_{j}": {"kernel": _sds(s)} for j, s in enumerate(shapes)}}
  }
  with pytest.raises(prj.MatchError, match=r"layers_0/attention/Dense_1/kernel"):
    prj.match(target, src)
  target = {
    "layers_0": {
      "attention": {f"Dense_{j}": {"kernel": _sds(s)} for j, s in enumerate(shapes[::-1])}
    }
  }
  got = {t: r for t, r, _ in prj.match(target, src).rows()}
  assert (
    got["layers_0/attention/Dense_0/kernel"]
    == "transpose(source('model.layers.0.self_attn.q_proj.weight'), (1, 0))"
  )


def _norms(*names, layer="model.layers.0"):
  """A layer's norms, each a distinct value (a swap changes what is restored)."""
  return {f"{layer}.{n}.weight": np.full(4, j, np.float32) for j, n in enumerate(names)}


@pytest.mark.parametrize(
  "first, second",
  [("attn_pre_gamma", "attn_post_gamma"), ("pre_gamma", "post_gamma"), ("ln_before", "ln_after")],
)
def test_a_pre_and_a_post_sibling_take_the_norms_in_call_order(first, second):
  """jax-llm-examples names Llama's norms ``attn_pre_gamma``/``attn_post_gamma``: both score
  alike on both tensors (nothing in a name says the pre-MLP norm is "after" the attention),
  so the word pre/post (before/after) orders them: the first applied is the pre."""
  ck = _norms("input_layernorm", "post_attention_layernorm")
  target = {"layers_0": {first: _sds((4,)), second: _sds((4,))}}
  m = prj.match(target, MemorySource(ck))
  why = {t: w for t, _, w in m.rows()}
  assert why[f"layers_0/{second}"].endswith(f"in order: {second} of 2 is the mlp norm")
  got = prj.restore(target, MemorySource(ck), recipes=m)["layers_0"]
  np.testing.assert_array_equal(got[first], ck["model.layers.0.input_layernorm.weight"])
  np.testing.assert_array_equal(got[second], ck["model.layers.0.post_attention_layernorm.weight"])


def test_pre_and_post_say_nothing_of_norms_whose_roles_are_unknown():
  ck = _norms("a_norm", "b_norm")
  target = {"layers_0": {"pre_gamma": _sds((4,)), "post_gamma": _sds((4,))}}
  with pytest.raises(prj.MatchError, match="layers_0/pre_gamma"):
    prj.match(target, MemorySource(ck))


@pytest.mark.parametrize(
  "names",
  [
    ("pre_attention_norm", "post_attention_norm", "pre_ffw_norm", "post_ffw_norm"),  # gemma
    ("input_norm", "post_attention_norm", "pre_mlp_norm", "post_mlp_norm"),
  ],
)
def test_a_sandwich_of_four_norms_in_the_targets_own_words(names):
  """Gemma 2's four norms as Google's gemma library names them: beside a pre-MLP norm the
  target's ``post_attention_norm`` is the attention's post-norm, as the checkpoint's is."""
  ck = _norms(
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
  )
  target = {"layers_0": {n: {"scale": _sds((4,))} for n in names}}
  got = prj.restore(target, MemorySource(ck), recipes=prj.match(target, MemorySource(ck)))
  for j, n in enumerate(names):
    np.testing.assert_array_equal(got["layers_0"][n]["scale"], np.full(4, j, np.float32))


def test_a_layout_choice_restores_bfloat16_parts_cast():
  """Without a config the fused qkv's layout is unknown: it is asked once, as a layout hint
  keyed by the fused tensor (every layout that tiles it on a line), and the chosen line
  restores each part cast to the leaf's dtype."""
  qkv = np.arange(18 * 4, dtype=np.float32).reshape(18, 4)
  # the up projection's shape says the checkpoint keeps [out, in]
  src = MemorySource(
    {"attn.qkv_proj.weight": qkv, "mlp.up_proj.weight": np.ones((8, 4), np.float32)}
  )
  target = {n: {"kernel": _sds((4, 6), jnp.bfloat16)} for n in "qkv"}
  target = {"attn": target, "mlp": {"up": {"kernel": _sds((4, 8), jnp.bfloat16)}}}
  with pytest.raises(prj.MatchError) as info:
    prj.match(target, src)
  entries = literal_entries(info.value)
  assert list(entries) == ["attn.qkv_proj"]  # one question for the three parts
  (line,) = (x for x in entries["attn.qkv_proj"] if "one after the other" in x)
  assert uncommented(line) == {"attn.qkv_proj": "contiguous"}
  got = prj.restore(target, src, recipes=prj.match(target, src, hints=uncommented(line)))
  for j, n in enumerate("qkv"):
    assert got["attn"][n]["kernel"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(
      np.asarray(got["attn"][n]["kernel"], np.float32), qkv[6 * j : 6 * j + 6].T
    )


# --- style rewrites: the suite's models as JAX code in the wild names them ------------------------

_CALL_ORDER = {  # a block's modules in the order its __call__ runs them
  None: ("attention_norm", "post_attention_norm", "mlp_norm", "post_mlp_norm"),
  "attention": ("query", "key", "value", "query_norm", "key_norm", "out"),
  "mlp": ("gate", "up", "ffn_in", "down", "ffn_out"),
}


_NUMBERINGS = {  # how a framework names the k-th module of a kind a block creates
  "flax": lambda kind, k: f"{'LayerNorm' if kind == 'norm' else 'Dense'}_{k}",
  "haiku": lambda kind, k: ("layer_norm" if kind == "norm" else "linear") + (f"_{k}" if k else ""),
}


def _auto_named(layer, numbering="flax"):
  """A block as ``@nn.compact`` (``LayerNorm_k``, ``Dense_k``) or haiku (``layer_norm``,
  ``linear_1``) names it, in call order."""
  out, renamed = {}, {}

  def kind(module):
    return "norm" if module.endswith("norm") else "linear"

  def number(modules, order):
    counts, names = {}, {}
    for m in sorted(modules, key=lambda m: order.index(m) if m in order else len(order)):
      if m not in order:
        names[m] = m
        continue
      k = kind(m)
      names[m] = _NUMBERINGS[numbering](k, counts.get(k, 0))
      counts[k] = counts.get(k, 0) + 1
    return names

  top = number(layer, _CALL_ORDER[None])
  for module, value in layer.items():
    if module in _CALL_ORDER and isinstance(value, dict):
      inner = number(value, _CALL_ORDER[module])
      out[top[module]] = {inner[m]: v for m, v in value.items()}
      renamed.update({f"{module}/{m}": f"{top[module]}/{inner[m]}" for m in value})
    else:
      out[top[module]] = value
      renamed[module] = top[module]
  return out, renamed


@pytest.mark.parametrize("numbering", sorted(_NUMBERINGS))
@pytest.mark.parametrize("config", [True, False], ids=["config", "no config"])
@pytest.mark.parametrize("name", CASES)
def test_auto_names_map_or_ask_with_the_truth_among_the_lines(name, config, numbering, tmp_path):
  """Every architecture with each block's modules named by the framework, in call order:
  ``match`` maps it, or asks with the true tensor among each entry's lines; the chooser's
  restore equals PyTorch's forward."""
  *model, target, src, truth = _case(name, config, tmp_path)
  back = {}
  for key in [k for k in target if k.startswith("layers_")]:
    target[key], renamed = _auto_named(target[key], numbering)
    back.update({f"{key}/{new}/": f"{key}/{old}/" for old, new in renamed.items()})
  choices = _restores_as_pytorch(*model, target, src, truth, back)
  print(name, config, "choices", choices)


_BLOCK_ORDER = (
  "attention_norm",
  "attention",
  "post_attention_norm",
  "mlp_norm",
  "mlp",
  "moe",
  "post_mlp_norm",
)
_SEQUENCE = {  # a sequential's modules, an activation (no parameters) taking its number too
  "attention": ("query", "key", "value", "query_norm", "key_norm", "out"),
  "mlp": ("gate", "up", "ffn_in", "act", "down", "ffn_out"),
}


def _sequential(layer):
  """A block as torch/timm numbered sequentials write it: every module its index in call order
  (``layers_0/1/0/kernel`` for the attention's query), an MLP's activation taking a number."""
  out, renamed = {}, {}
  top = [m for m in _BLOCK_ORDER if m in layer]
  for j, module in enumerate(top):
    value = layer[module]
    if module in _SEQUENCE:
      inner = [m for m in _SEQUENCE[module] if m in value or m == "act"]
      out[str(j)] = {str(inner.index(m)): v for m, v in value.items()}
      renamed.update({f"{module}/{m}": f"{j}/{inner.index(m)}" for m in value})
    else:
      out[str(j)] = value
      renamed[module] = str(j)
  return out, renamed


# the architectures whose blocks, their modules numbered (sequentials, haiku auto-names), still ask:
# which of gate and up (code calls them either way round), which of two norms of one width with
# no name (q and k norms; the block's norms where nothing but their names told them apart)
_ASKED_WITHOUT_NAMES = frozenset(
  {"gemma", "llama", "mistral", "olmo2", "phi3", "qwen2", "stablelm"}
)


@pytest.mark.parametrize("name", CASES)
def test_numbered_sequentials_map_or_ask_with_the_truth_among_the_lines(name, tmp_path):
  """List indices inside a block are its modules in call order, not layers
  (``layers_0/1/0/kernel`` is layer 0's, not layer (0, 1, 0)'s). An unnamed module whose
  kernels split heads is an attention, so its numbered q, k, v take their rows of a fused
  qkv in order; closure pairs the MLP's last leaves with its last tensors. Every architecture
  maps, or asks with the true tensor among the lines; the restore equals PyTorch's forward."""
  *model, target, src, truth = _case(name, True, tmp_path)
  back = {}
  for key in [k for k in target if k.startswith("layers_")]:
    target[key], renamed = _sequential(target[key])
    back.update({f"{key}/{new}/": f"{key}/{old}/" for old, new in renamed.items()})
  choices = _restores_as_pytorch(*model, target, src, truth, back)
  assert (choices > 0) == (name in _ASKED_WITHOUT_NAMES), choices


def test_numbered_modules_are_a_layers_own_not_layers():
  """``h_1/2/scale`` is layer 1's module 2: order pairs the siblings in every layer, and a
  ``{i}`` hint fills in the layer's number only (it was read as layer (1, 2): no tensor)."""
  src = _pair(*(f"h.{i}.ln_{j}.weight" for i in (0, 1) for j in (1, 2)), shape=(4,))
  target = {f"h_{i}": {str(j): {"scale": _sds((4,))} for j in (0, 2)} for i in (0, 1)}
  got = {t: r for t, r, _ in prj.match(target, src).rows()}
  assert got["h_1/0/scale"] == "source('h.1.ln_1.weight')"
  assert got["h_1/2/scale"] == "source('h.1.ln_2.weight')"
  swapped = {"h_{i}/0/scale": "h.{i}.ln_2.weight", "h_{i}/2/scale": "h.{i}.ln_1.weight"}
  got = {t: r for t, r, _ in prj.match(target, src, hints=swapped).rows()}
  assert got["h_1/0/scale"] == "source('h.1.ln_2.weight')"
  assert got["h_0/2/scale"] == "source('h.0.ln_1.weight')"


@pytest.mark.parametrize("block", ["InvertedResidual", "Bottleneck", "ResNetBlock"])
def test_a_residual_block_class_numbers_layers(block):
  """flax auto-names a model's repeated blocks by their class (MobileNet's
  ``InvertedResidual_3``, a ResNet's ``Bottleneck_2``): the number is the layer's, so each
  block's convs take that layer's tensors (``layer.1.expand``, not ``layer.0.expand``)."""
  ck = {
    f"layer.{i}.{m}.weight": rng.standard_normal((c, 4, 1, 1)).astype(np.float32)
    for i in (0, 1)
    for m, c in (("expand", 8), ("reduce", 6))
  }
  target = {
    f"{block}_{i}": {f"Conv_{j}": {"kernel": _sds((1, 1, 4, c))} for j, c in ((0, 8), (1, 6))}
    for i in (0, 1)
  }
  got = prj.restore(target, MemorySource(ck), recipes=prj.match(target, MemorySource(ck)))
  for i in (0, 1):
    for j, m in ((0, "expand"), (1, "reduce")):
      want = ck[f"layer.{i}.{m}.weight"].transpose(2, 3, 1, 0)
      np.testing.assert_array_equal(got[f"{block}_{i}"][f"Conv_{j}"]["kernel"], want)


@pytest.mark.parametrize("stack", ["ScanDecoderLayer_0", "decoder"])
@pytest.mark.parametrize("name", CASES)
def test_a_stack_no_word_names_maps_with_no_hints(name, stack, tmp_path):
  """An NNX-style stack (every layer on axis 0) under the name linen's ``nn.scan`` gives a
  lifted block (``ScanDecoderLayer_0``) or one the user gave it (``decoder``): its leaves all
  lead with the checkpoint's layer count, so they are the layers (``stacks.stacks``)."""
  *model, target, src, truth = _case(name, True, tmp_path, "nnx")
  target[stack] = target.pop("layers")
  assert _restores_as_pytorch(*model, target, src, truth, {f"{stack}/": "layers/"}) == 0


def _haiku_modules(target):
  """The target as haiku's ``params`` hold it: one dict key per module, its path joined by
  ``/~/`` under the model's own module (``transformer/~/layer_0/~/attn/~/q``: ``{"w", "b"}``);
  and the function that reads a name of it back in the suite's words."""
  out = {}
  for path, x in jax.tree_util.tree_flatten_with_path(target)[0]:
    *modules, leaf = prj.path_to_name(path).split("/")
    out.setdefault("/~/".join(["transformer", *modules]), {})[leaf] = x

  def back(name):
    module, leaf = name.rsplit("/", 1)
    return "/".join([*prj.name_to_path(module)[0].split("/~/")[1:], leaf])

  return out, back


@pytest.mark.parametrize("named", ["named", "auto-named"])
@pytest.mark.parametrize("name", CASES)
def test_haiku_module_paths_read_as_any_other_path(name, named, tmp_path):
  """haiku's ``transformer/~/layer_0/~/attn/~/q`` is one dict key, escaped in a name
  (``transformer~1~0~1layer_0~1~0~1attn~1~0~1q/w``): its words, its layer number and its
  numbered siblings (``linear``, ``linear_1``) are read as from any other path, so it maps
  as the same model with plain paths does (named: with no hint; auto-named: asking only
  what order cannot say), and restores as PyTorch runs."""
  style = "haiku" if named == "named" else "flax"
  *model, target, src, truth = _case(name, True, tmp_path, style)
  back: dict = {}
  if named == "auto-named":
    for key in [k for k in target if k.startswith("layers_")]:
      target[key], renamed = _auto_named(target[key], "haiku")
      back.update({f"{key}/{new}/": f"{key}/{old}/" for old, new in renamed.items()})
  target, unescape = _haiku_modules(target)
  choices = _restores_as_pytorch(*model, target, src, truth, lambda n: _renamer(back)(unescape(n)))
  assert choices == 0 or (named == "auto-named" and name in _ASKED_WITHOUT_NAMES), choices


def test_batch_statistics_the_target_lacks_are_named_with_where_they_go():
  """A target with a batch norm's scale and bias but not its running statistics (an equinox
  model, whose statistics live in its ``State``): no layer is missing, the statistics are,
  and the refusal says where a model keeps them; adding them as ``batch_stats`` restores."""
  ck = {}
  for i in (0, 1):
    ck[f"layer.{i}.conv.weight"] = rng.standard_normal((8, 4, 1, 1)).astype(np.float32)
    for leaf in ("weight", "bias", "running_mean", "running_var"):
      ck[f"layer.{i}.norm.{leaf}"] = rng.standard_normal(8).astype(np.float32)
  params = {
    f"layers_{i}": {
      "conv": {"kernel": _sds((1, 1, 4, 8))},
      "norm": {"scale": _sds((8,)), "bias": _sds((8,))},
    }
    for i in (0, 1)
  }
  with pytest.raises(prj.MatchError) as e:
    prj.match(params, MemorySource(ck))
  (problem,) = e.value.problems
  assert problem == (
    "the checkpoint has batch-norm statistics the target has no leaf for (4): "
    "layer.0.norm.running_mean, layer.0.norm.running_var, layer.1.norm.running_mean, "
    "layer.1.norm.running_var; a batch norm restored without them computes another function in "
    "inference: add them to the target where the model keeps them (flax's batch_stats "
    "collection beside params, {'params': ..., 'batch_stats': ...}; equinox's eqx.nn.State, as "
    "a tree of its arrays)"
  )
  stats = {f"layers_{i}": {"norm": {"mean": _sds((8,)), "var": _sds((8,))}} for i in (0, 1)}
  target = {"params": params, "batch_stats": stats}
  got = prj.restore(target, MemorySource(ck), recipes=prj.match(target, MemorySource(ck)))
  np.testing.assert_array_equal(
    got["batch_stats"]["layers_1"]["norm"]["var"], ck["layer.1.norm.running_var"]
  )
  np.testing.assert_array_equal(
    got["params"]["layers_1"]["norm"]["scale"], ck["layer.1.norm.weight"]
  )


def test_a_parameter_the_checkpoint_lacks_is_told_to_restore_the_rest_and_the_advice_works():
  """A pretrained backbone under a new classifier head: nothing in the checkpoint has the
  head's shapes. The refusal says so, names the module to leave out, and the target without
  it maps and restores (the head is the user's to initialize)."""
  ck = {
    "encoder.layer.0.output.dense.weight": rng.standard_normal((4, 6)).astype(np.float32),
    "encoder.layer.0.output.dense.bias": rng.standard_normal(4).astype(np.float32),
  }
  target = {
    "encoder": {"layers_0": {"out": {"kernel": _sds((6, 4)), "bias": _sds((4,))}}},
    "classifier": {"kernel": _sds((4, 3)), "bias": _sds((3,))},
  }
  with pytest.raises(prj.MatchError) as info:
    prj.match(target, MemorySource(ck))
  assert [p.targets for p in info.value.problems] == [("classifier/bias",), ("classifier/kernel",)]
  assert "the target without 'classifier', then initialize it as your model does" in str(info.value)
  rest = {k: v for k, v in target.items() if k != "classifier"}
  got = prj.restore(rest, MemorySource(ck), recipes=prj.match(rest, MemorySource(ck)))
  np.testing.assert_array_equal(
    got["encoder"]["layers_0"]["out"]["kernel"], ck["encoder.layer.0.output.dense.weight"].T
  )


def test_a_leaf_only_a_rearrangement_fits_names_the_tensor_of_as_many_values():
  """Gemma's ``q_einsum`` ``[heads, hidden, head_dim]`` over a ``q_proj`` ``[heads *
  head_dim, hidden]`` with no config to give the head count: not a missing parameter, the
  refusal names the tensor that holds its values."""
  ck = {"model.layers.0.self_attn.q_proj.weight": np.ones((32, 32), np.float32)}
  target = {"layer_0": {"attn": {"q_einsum": {"w": _sds((4, 32, 8))}}}}
  with pytest.raises(prj.MatchError) as info:
    prj.match(target, MemorySource(ck))
  text = str(info.value)
  assert "'model.layers.0.self_attn.q_proj.weight' (32, 32) has as many values" in text
  assert "a new head" not in text


def _opaque_case():
  """A layer's relative position table (``..._bias_table``: read as a bias) and a patch
  embedding outside the layers, under target names that say nothing: a bare ``tbl`` and a
  sequential's ``front/0`` (its index read as a layer)."""
  r = np.random.default_rng(3)
  shapes = {
    "embeddings.patch.weight": (8, 3, 4, 4),
    "encoder.layer.0.attention.relative_position_bias_table": (9, 2),
    "encoder.layer.0.attention.query.weight": (8, 4),
  }
  ck = {k: r.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
  target = {
    "front": [{"kernel": _sds((4, 4, 3, 8))}],
    "layers_0": {"attention": {"tbl": _sds((9, 2)), "query": {"kernel": _sds((4, 8))}}},
  }
  return ck, target


def test_a_leaf_whose_name_ties_to_nothing_is_offered_the_tensors_of_as_many_values():
  """No name, kind or level evidence: the refusal's lines are the tensors of its size, each
  in the layout a hint of it takes; uncommenting them restores the true values."""
  ck, target = _opaque_case()
  before = {k: v.copy() for k, v in ck.items()}
  with pytest.raises(prj.MatchError) as info:
    prj.match(target, MemorySource(ck))
  assert "those of as many values are its choices (hints below)" in str(info.value)
  entries = literal_entries(info.value)
  assert entries["front/0/kernel"][0].startswith('  # "front/0/kernel": "embeddings.patch.weight"')
  assert "its size only + conv kernel OIHW -> HWIO" in entries["front/0/kernel"][0]
  table = "encoder.layer.0.attention.relative_position_bias_table"
  assert entries["layers_0/attention/tbl"][0].startswith(f'  # "layers_0/attention/tbl": "{table}"')
  hints = {k: v for lines in entries.values() for k, v in uncommented(lines[0]).items()}
  got = prj.restore(
    target, MemorySource(ck), recipes=prj.match(target, MemorySource(ck), hints=hints)
  )
  np.testing.assert_array_equal(
    got["front"][0]["kernel"], before["embeddings.patch.weight"].transpose(2, 3, 1, 0)
  )
  np.testing.assert_array_equal(got["layers_0"]["attention"]["tbl"], before[table])


def test_a_name_hint_under_a_list_index_names_a_tensor_of_any_level():
  """``front/0/kernel``'s index is a place in a sequential, not the layer of the tensor its
  hint names; the hint is honoured (it was refused as fitting no layout of its own shape)."""
  ck, target = _opaque_case()
  table = "encoder.layer.0.attention.relative_position_bias_table"
  hints = {"front/0/kernel": "embeddings.patch.weight", "layers_0/attention/tbl": table}
  m = prj.match(target, MemorySource(ck), hints=hints)
  got = prj.restore(target, MemorySource(ck), recipes=m)
  np.testing.assert_array_equal(
    got["front"][0]["kernel"], ck["embeddings.patch.weight"].transpose(2, 3, 1, 0)
  )


# --- two items of a list, named alike but for their numbers (decide._same_place) ----------------


def _items(prefix=""):
  r = np.random.default_rng(5)
  return {
    f"{prefix}up.1.attns.{j}.attn1.to_{n}.weight": r.standard_normal((4, 4)).astype(np.float32)
    for j in (0, 1)
    for n in "qk"
  }


@pytest.mark.parametrize("prefix", ["", "unet."])
def test_an_item_takes_the_tensors_under_its_own_modules(prefix):
  """``up_1/attns_0/attn1/query`` is named like the ``to_q`` of both items: the one under the
  leaf's own modules (``up.1.attns.0``) is its tensor, the checkpoint's model prefix aside."""
  tensors = _items(prefix)
  target = {
    "up_1": {
      f"attns_{j}": {"attn1": {n: {"kernel": _sds((4, 4))} for n in ("query", "key")}}
      for j in (0, 1)
    },
    "conv": {"kernel": _sds((3, 3, 2, 4))},  # stored [out, in, h, w]: orients the square ones
  }
  tensors["conv.weight"] = np.ones((4, 2, 3, 3), np.float32)
  src = MemorySource(tensors)
  got = prj.restore(target, src, recipes=prj.match(target, src))
  for j in (0, 1):
    for n in ("query", "key"):
      want = tensors[f"{prefix}up.1.attns.{j}.attn1.to_{n[0]}.weight"].T
      np.testing.assert_array_equal(
        np.asarray(got["up_1"][f"attns_{j}"]["attn1"][n]["kernel"]), want
      )


def test_tensors_under_the_same_modules_alike_are_still_asked():
  """Two norms of one item named as nothing tells apart: the modules they share with the leaf
  are the same for both, so that says nothing and both are asked."""
  src = MemorySource({f"enc.items.0.ln_{j}.weight": np.ones(4, np.float32) for j in (1, 2)})
  target = {"enc": {"items_0": {n: {"scale": _sds((4,))} for n in ("norm_a", "norm_b")}}}
  with pytest.raises(prj.MatchError) as info:
    prj.match(target, src)
  assert len(info.value.problems) == 2
  alone = {"enc": {"items_0": {"norm_a": {"scale": _sds((4,))}}}}  # no rival leaf to clash with
  with pytest.raises(prj.MatchError, match="ambiguous"):
    prj.match(alone, src)


def test_a_question_alike_for_every_expert_is_asked_once_for_the_experts():
  """Gate and up of four auto-named experts (never told apart by order): one question under
  ``Expert_{i}``, said to be about experts, not layers."""
  r = np.random.default_rng(2)
  at = "model.layers.5.mlp.experts"
  ck = {
    f"{at}.{e}.{w}.weight": r.standard_normal((6, 4)).astype(np.float32)
    for e in range(4)
    for w in ("w1", "w3")
  }
  target = {
    "DecoderLayer_5": {
      "Moe_0": {
        f"Expert_{e}": {f"Dense_{j}": {"kernel": _sds((4, 6))} for j in (0, 1)} for e in range(4)
      }
    }
  }
  with pytest.raises(prj.MatchError) as info:
    prj.match(target, MemorySource(ck))
  said = [p for p in info.value.problems if "Expert_{i}/Dense_0" in p]
  assert len(said) == 1 and ", in 4 experts (0, 1, 2, 3), each alike:" in said[0], said
  assert "Expert_{i}/Dense_0/kernel (4, 6), in 4 experts: ambiguous" in info.value.hints_code
