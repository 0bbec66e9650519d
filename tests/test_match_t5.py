"""``match`` on real T5 checkpoints (an encoder-decoder), checked by the forward pass.

Two tiny ``T5ForConditionalGeneration`` checkpoints that ``transformers`` saved
(``tests/make_hf_fixtures.py``): T5 v1.0 (relu MLP, head tied to ``shared``) and v1.1 (gated-gelu
``wi_0``/``wi_1``, untied head). Each is restored through ``match``, with no hints, into a
flax-style target (a module per layer) and an NNX-style one (layers stacked, heads split), and
the logits are compared with PyTorch's. T5's numbered sublayers (``layer.1`` is the MLP in the
encoder and the cross-attention in the decoder) and its relative position bias (stored in block
0 only) are what ``match`` must read right.
"""

from __future__ import annotations

import json
import math

import hf_models as hf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_match_refusals import literal_entries
from test_match_refusals import uncommented

import paramreg_jax as prj
from paramreg_jax import SafetensorsSource


def config(name):
  return json.loads((hf.DATA / name / "config.json").read_text())


def bucket(rel, bidirectional, buckets, max_distance):
  """T5's relative position bucket (transformers' ``_relative_position_bucket``)."""
  out = np.zeros_like(rel)
  if bidirectional:
    buckets //= 2
    out += (rel > 0).astype(rel.dtype) * buckets
    rel = np.abs(rel)
  else:
    rel = -np.minimum(rel, 0)
  exact = buckets // 2
  with np.errstate(divide="ignore", invalid="ignore"):  # log(0) where rel < exact anyway
    large = exact + (
      np.log(rel.astype(np.float32) / exact) / math.log(max_distance / exact) * (buckets - exact)
    ).astype(rel.dtype)
  return out + np.where(rel < exact, rel, np.minimum(large, buckets - 1))


def position_bias(c, table, q_len, k_len, bidirectional):
  rel = np.arange(k_len)[None, :] - np.arange(q_len)[:, None]
  b = bucket(
    rel, bidirectional, c["relative_attention_num_buckets"], c["relative_attention_max_distance"]
  )
  return jnp.transpose(table[b], (2, 0, 1))  # [heads, q, k]


def norm(x, w, eps):
  return w * x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + eps)


def attention(c, p, x, kv, bias):
  h, d = c["num_heads"], c["d_kv"]
  split = lambda y: y.reshape(*y.shape[:2], h, d)  # noqa: E731
  q, k, v = split(x @ p["q"]), split(kv @ p["k"]), split(kv @ p["v"])
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) + bias  # T5 does not scale by sqrt(d)
  out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), v)
  return out.reshape(*x.shape[:2], h * d) @ p["o"]


def mlp(c, p, x):
  if c["feed_forward_proj"].startswith("gated"):
    return (jax.nn.gelu(x @ p["gate"], approximate=True) * (x @ p["up"])) @ p["down"]
  return jax.nn.relu(x @ p["up"]) @ p["down"]


def forward(c, w, ids, decoder_ids):
  """Logits of ``T5ForConditionalGeneration`` from canonical ``[in, out]`` weights."""
  eps = c["layer_norm_epsilon"]
  x = w["shared"][ids]
  bias = position_bias(c, w["encoder"]["relpos"], ids.shape[1], ids.shape[1], True)
  for p in w["encoder"]["layers"]:
    x = x + attention(
      c, p["attn"], norm(x, p["attn_norm"], eps), norm(x, p["attn_norm"], eps), bias
    )
    x = x + mlp(c, p["mlp"], norm(x, p["mlp_norm"], eps))
  enc = norm(x, w["encoder"]["final_norm"], eps)
  t = decoder_ids.shape[1]
  y = w["shared"][decoder_ids]
  causal = np.where(np.tril(np.ones((t, t), bool)), 0.0, -1e30)
  self_bias = position_bias(c, w["decoder"]["relpos"], t, t, False) + causal
  for p in w["decoder"]["layers"]:
    h = norm(y, p["attn_norm"], eps)
    y = y + attention(c, p["attn"], h, h, self_bias)
    y = y + attention(c, p["xattn"], norm(y, p["xattn_norm"], eps), enc, 0.0)
    y = y + mlp(c, p["mlp"], norm(y, p["mlp_norm"], eps))
  y = norm(y, w["decoder"]["final_norm"], eps)
  if c.get("scale_decoder_outputs", c.get("tie_word_embeddings", True)):  # T5 v1.0
    y = y * c["d_model"] ** -0.5
  return y @ (w["lm_head"] if "lm_head" in w else w["shared"].T)


def target(c, stacked):
  """A flax-style (a module per layer) or NNX-style (stacked, heads split) T5 target."""
  d, f, h, dk, n = c["d_model"], c["d_ff"], c["num_heads"], c["d_kv"], c["num_layers"]
  lead = (n,) if stacked else ()
  sds = lambda *s: jax.ShapeDtypeStruct((*lead, *s), np.float32)  # noqa: E731
  if stacked:
    proj = {"q": {"kernel": sds(d, h, dk)}, "k": {"kernel": sds(d, h, dk)}}
    proj |= {"v": {"kernel": sds(d, h, dk)}, "o": {"kernel": sds(h, dk, d)}}
  else:
    proj = {x: {"kernel": sds(d, h * dk)} for x in "qkv"} | {"o": {"kernel": sds(h * dk, d)}}
  gated = c["feed_forward_proj"].startswith("gated")
  ff = {"up": {"kernel": sds(d, f)}, "down": {"kernel": sds(f, d)}}
  if gated:
    ff["gate"] = {"kernel": sds(d, f)}
  out = {"embed": {"embedding": jax.ShapeDtypeStruct((c["vocab_size"], d), np.float32)}}
  if not c.get("tie_word_embeddings", True):
    out["lm_head"] = {"kernel": jax.ShapeDtypeStruct((d, c["vocab_size"]), np.float32)}
  for stack in ("encoder", "decoder"):
    block = {"attn": dict(proj), "attn_norm": {"scale": sds(d)}, "mlp": dict(ff)}
    block["mlp_norm"] = {"scale": sds(d)}
    if stack == "decoder":
      block |= {"xattn": dict(proj), "xattn_norm": {"scale": sds(d)}}
    layers = {"layers": block} if stacked else {f"layers_{i}": block for i in range(n)}
    out[stack] = {
      **layers,
      "final_norm": {"scale": jax.ShapeDtypeStruct((d,), np.float32)},
      "relative_attention_bias": {
        "embedding": jax.ShapeDtypeStruct((c["relative_attention_num_buckets"], h), np.float32)
      },
    }
  return out


def canonical(c, restored, stacked):
  """The restored tree read as the model reads it: [in, out] kernels with heads merged."""
  r = jax.tree.map(np.asarray, restored)
  n = c["num_layers"]
  w = {"shared": r["embed"]["embedding"]}
  if "lm_head" in r:
    w["lm_head"] = r["lm_head"]["kernel"]
  for stack in ("encoder", "decoder"):
    s = r[stack]
    layers = []
    for i in range(n):
      block = jax.tree.map(lambda x, i=i: x[i], s["layers"]) if stacked else s[f"layers_{i}"]
      layer = {}
      for a in ("attn", "xattn") if stack == "decoder" else ("attn",):
        layer[a] = {
          x: block[a][x]["kernel"].reshape(c["d_model"], -1)
          if x != "o"
          else block[a]["o"]["kernel"].reshape(-1, c["d_model"])
          for x in "qkvo"
        }
        layer[f"{a}_norm"] = block[f"{a}_norm"]["scale"]
      layer["mlp"] = {k: v["kernel"] for k, v in block["mlp"].items()}
      layer["mlp_norm"] = block["mlp_norm"]["scale"]
      layers.append(layer)
    w[stack] = {
      "layers": layers,
      "final_norm": s["final_norm"]["scale"],
      "relpos": s["relative_attention_bias"]["embedding"],
    }
  return w


@pytest.mark.parametrize("stacked", [False, True], ids=["flax", "nnx"])
@pytest.mark.parametrize("name", ["t5", "t5_gated"])
def test_t5_forward_pass_matches_pytorch_with_no_hints(name, stacked):
  c = config(name)
  ref = dict(np.load(hf.DATA / name / "reference.npz"))
  src = SafetensorsSource(hf.DATA / name / "model.safetensors")
  tree = target(c, stacked)
  m = prj.match(tree, src)
  assert src.stats.reads == 0
  restored = prj.restore(tree, src, recipes=m)
  got = np.asarray(
    forward(c, canonical(c, restored, stacked), ref["input_ids"], ref["decoder_input_ids"])
  )
  np.testing.assert_allclose(got, ref["output"], atol=1e-5, rtol=1e-5, err_msg=str(m))


# --- T5 as t5x writes it ------------------------------------------------------------------------


def t5x_target(c):
  """T5 as t5x's ``network.py`` names it: ``token_embedder``, ``relpos_bias/rel_embedding``
  ``[heads, buckets]`` (transformers stores ``[buckets, heads]``), ``pre_*_layer_norm``,
  ``self_attention``/``encoder_decoder_attention`` with 2-D kernels, ``wi``/``wi_0``/``wi_1``
  and ``wo``, ``encoder_norm``/``decoder_norm``, ``logits_dense``."""
  d, f, h, dk, n = c["d_model"], c["d_ff"], c["num_heads"], c["d_kv"], c["num_layers"]

  def sds(*s):
    return jax.ShapeDtypeStruct(s, np.float32)

  def attention():
    qkv = {x: {"kernel": sds(d, h * dk)} for x in ("query", "key", "value")}
    return qkv | {"out": {"kernel": sds(h * dk, d)}}

  wi = ("wi_0", "wi_1") if c["feed_forward_proj"].startswith("gated") else ("wi",)
  mlp = {x: {"kernel": sds(d, f)} for x in wi} | {"wo": {"kernel": sds(f, d)}}
  norm = {"scale": sds(d)}
  table = {"rel_embedding": sds(h, c["relative_attention_num_buckets"])}
  encoder = {
    f"layers_{i}": {
      "pre_attention_layer_norm": norm,
      "attention": attention(),
      "pre_mlp_layer_norm": norm,
      "mlp": mlp,
    }
    for i in range(n)
  }
  decoder = {
    f"layers_{i}": {
      "pre_self_attention_layer_norm": norm,
      "self_attention": attention(),
      "pre_cross_attention_layer_norm": norm,
      "encoder_decoder_attention": attention(),
      "pre_mlp_layer_norm": norm,
      "mlp": mlp,
    }
    for i in range(n)
  }
  decoder["decoder_norm"], decoder["relpos_bias"] = norm, table
  encoder["encoder_norm"], encoder["relpos_bias"] = norm, table
  out = {"token_embedder": {"embedding": sds(c["vocab_size"], d)}}
  if not c.get("tie_word_embeddings", True):
    decoder["logits_dense"] = {"kernel": sds(d, c["vocab_size"])}
  return out | {"encoder": encoder, "decoder": decoder}


def t5x_canonical(c, restored):
  r = jax.tree.map(np.asarray, restored)
  w = {"shared": r["token_embedder"]["embedding"]}
  if "logits_dense" in r["decoder"]:
    w["lm_head"] = r["decoder"]["logits_dense"]["kernel"]
  names = {"gate": "wi_0", "up": "wi_1"} if "wi_0" in r["encoder"]["layers_0"]["mlp"] else {}
  names = names or {"up": "wi"}
  for stack, attentions in (
    ("encoder", {"attn": ("attention", "pre_attention_layer_norm")}),
    (
      "decoder",
      {
        "attn": ("self_attention", "pre_self_attention_layer_norm"),
        "xattn": ("encoder_decoder_attention", "pre_cross_attention_layer_norm"),
      },
    ),
  ):
    s, layers = r[stack], []
    for i in range(c["num_layers"]):
      block, layer = s[f"layers_{i}"], {}
      for a, (module, norm_) in attentions.items():
        p = block[module]
        layer[a] = {x: p[t]["kernel"] for x, t in zip("qkvo", ("query", "key", "value", "out"))}
        layer[f"{a}_norm"] = block[norm_]["scale"]
      layer["mlp"] = {k: block["mlp"][v]["kernel"] for k, v in names.items()}
      layer["mlp"]["down"] = block["mlp"]["wo"]["kernel"]
      layer["mlp_norm"] = block["pre_mlp_layer_norm"]["scale"]
      layers.append(layer)
    w[stack] = {
      "layers": layers,
      "final_norm": s[f"{stack}_norm"]["scale"],
      "relpos": s["relpos_bias"]["rel_embedding"].T,
    }
  return w


@pytest.mark.parametrize("name", ["t5", "t5_gated"])
def test_a_t5x_tree_maps_with_no_hints_and_runs_as_pytorch(name):
  """The cross-attention by its t5x name, the relative bias table transposed, the towers
  (encoder, decoder) aligned by their anchors."""
  c = config(name)
  ref = dict(np.load(hf.DATA / name / "reference.npz"))
  src = SafetensorsSource(hf.DATA / name / "model.safetensors")
  tree = t5x_target(c)
  m = prj.match(tree, src)
  why = {t: r for t, _, r in m.rows()}
  assert why["encoder/relpos_bias/rel_embedding"].startswith("name + transpose")
  restored = prj.restore(tree, src, recipes=m)
  got = np.asarray(
    forward(c, t5x_canonical(c, restored), ref["input_ids"], ref["decoder_input_ids"])
  )
  np.testing.assert_allclose(got, ref["output"], atol=1e-5, rtol=1e-5, err_msg=str(m))


def _square_table_checkpoint():
  """T5-XL's relative-position table is 32 buckets by 32 heads: square. Two encoder layers,
  a table of 8 buckets by 8 heads."""
  rng = np.random.default_rng(0)
  at = "encoder.block.{}.layer.{}."
  ck = {
    at.format(0, 0) + "SelfAttention.relative_attention_bias.weight": rng.standard_normal((8, 8)),
    **{
      at.format(i, 0) + f"SelfAttention.{r}.weight": rng.standard_normal((16, 16))
      for i in range(2)
      for r in "qk"
    },
    **{
      at.format(i, 1) + "DenseReluDense.wi.weight": rng.standard_normal((32, 16)) for i in range(2)
    },
  }
  return {k: v.astype(np.float32) for k, v in ck.items()}


def _square_table_target(table):
  sds = lambda *s: jax.ShapeDtypeStruct(s, np.float32)  # noqa: E731
  layers = {
    f"layers_{i}": {
      "attention": {"query": {"kernel": sds(16, 16)}, "key": {"kernel": sds(16, 16)}},
      "mlp": {"wi": {"kernel": sds(16, 32)}},
    }
    for i in range(2)
  }
  return {"encoder": {"relpos_bias": {table: sds(8, 8)}, **layers}}


def test_a_square_relative_position_table_is_asked_either_way_round():
  """transformers keeps the table ``[buckets, heads]``, t5x ``[heads, buckets]``; with as
  many buckets as heads (T5-XL: 32 and 32) the shape says nothing, and it was read as
  stored: t5x's table silently transposed. Asked, both ways on the lines; the transposed
  line restores the table t5x holds."""
  ck = _square_table_checkpoint()
  cfg = {"model_type": "t5", "num_heads": 8, "relative_attention_num_buckets": 8, "d_model": 16}
  target = _square_table_target("rel_embedding")
  with pytest.raises(prj.MatchError) as e:
    prj.match(target, prj.MemorySource(ck), config=cfg)
  name = "encoder/relpos_bias/rel_embedding"
  assert [p.split(":")[0] for p in e.value.problems] == [name]
  lines = literal_entries(e.value)[name]
  chosen = [x for x in lines if "R.transpose(" in x]
  assert len(lines) == 2 and len(chosen) == 1, lines
  m = prj.match(target, prj.MemorySource(ck), config=cfg, hints=uncommented(chosen[0]))
  got = prj.restore(target, prj.MemorySource(ck), recipes=m)
  table = ck["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
  np.testing.assert_array_equal(np.asarray(got["encoder"]["relpos_bias"]["rel_embedding"]), table.T)


def test_a_square_table_in_an_embed_module_is_kept_as_stored():
  """A flax ``nn.Embed``'s ``embedding`` is ``[num, features]``, as torch's: not asked."""
  ck = _square_table_checkpoint()
  target = _square_table_target("embedding")
  m = prj.match(target, prj.MemorySource(ck))
  got = prj.restore(target, prj.MemorySource(ck), recipes=m)
  table = ck["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
  np.testing.assert_array_equal(np.asarray(got["encoder"]["relpos_bias"]["embedding"]), table)
