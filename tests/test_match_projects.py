"""The suite's Hugging Face checkpoints into the layouts other JAX projects write by hand.

Each target is a tree as that project's own conversion script produces it, written out here
leaf by leaf (the transposes, head splits and stacks): EasyLM's Llama (``wq``, ``w1``/``w3``,
``attention_norm``/``ffn_norm``, ``kernel``-named norms), Google's gemma library (``q_einsum``,
``kv_einsum`` stacking k and v, ``gating_einsum`` stacking gate and up, both orientations;
on BERT its ``qkv_einsum`` and ``post_attention_norm``/``post_ffw_norm`` post-norms),
jax-llm-examples (bare ``q``/``k``/``v``/``o`` split into heads, ``attn_pre_gamma``/
``attn_post_gamma``), keras-hub's BERT (``query_dense`` ``[hidden, heads, head_dim]``, norms'
``gamma``/``beta``), a fused ``qkv_proj``/``gate_up_proj`` as TPU serving code keeps it, a
nanoGPT-style BERT with one ``c_attn``, and GPT-2 under ``nn.scan`` with the block's modules
auto-named (``ScanBlock_0/Dense_2``: closure over the stack decides what order cannot), and
mesh-transformer-jax's GPT-J (``layer_0/~/linear`` .. ``linear_5``, order alone). None
names its parameters as transformers does; each must map with no hint and every restored
leaf equal the hand conversion.
"""

from __future__ import annotations

import pathlib

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

import paramreg_jax as prj

D = pathlib.Path(__file__).parent / "data" / "hf"


def ld(name):
  return load_file(str(D / name / "model.safetensors"))


def T(x):
  return np.ascontiguousarray(x.T)


def dense(c, module):
  """A torch ``Linear`` at ``module`` as flax's ``Dense``: its kernel ``[in, out]``, its bias."""
  return {"kernel": T(c[module + ".weight"]), "bias": c[module + ".bias"]}


def layer_norm(c, module):
  """A torch ``LayerNorm`` at ``module`` as flax's: ``scale`` and ``bias``."""
  return {"scale": c[module + ".weight"], "bias": c[module + ".bias"]}


def easylm():
  c = ld("llama")
  L = 2
  h = {}
  for i in range(L):
    p = f"model.layers.{i}."
    h[str(i)] = {
      "attention": {
        k: {"kernel": T(c[p + f"self_attn.{n}_proj.weight"])}
        for k, n in (("wq", "q"), ("wk", "k"), ("wv", "v"), ("wo", "o"))
      },
      "feed_forward": {
        "w1": {"kernel": T(c[p + "mlp.gate_proj.weight"])},
        "w2": {"kernel": T(c[p + "mlp.down_proj.weight"])},
        "w3": {"kernel": T(c[p + "mlp.up_proj.weight"])},
      },
      "attention_norm": {"kernel": c[p + "input_layernorm.weight"]},
      "ffn_norm": {"kernel": c[p + "post_attention_layernorm.weight"]},
    }
  return "llama", {
    "transformer": {
      "wte": {"embedding": c["model.embed_tokens.weight"]},
      "h": h,
      "ln_f": {"kernel": c["model.norm.weight"]},
    },
    "lm_head": {"kernel": T(c["lm_head.weight"])},
  }


def gemma_layer(c, p, heads, kv_heads, head_dim, width, *, transposed_gating=True):
  """One layer at checkpoint prefix ``p`` as Google's gemma library keeps it: ``q_einsum``
  ``[heads, width, head_dim]``, ``kv_einsum`` ``[2, kv_heads, width, head_dim]``,
  ``attn_vec_einsum`` ``[heads, head_dim, width]``, ``gating_einsum`` stacking gate and up
  (``[2, ffw, width]`` transposed, as Gemma 2 keeps it, or ``[2, width, ffw]``)."""

  def split(name, n):  # [n * head_dim, width] -> [n, width, head_dim]
    return c[p + f"self_attn.{name}_proj.weight"].reshape(n, head_dim, width).transpose(0, 2, 1)

  o = c[p + "self_attn.o_proj.weight"].T.reshape(heads, head_dim, width)
  gate, up = c[p + "mlp.gate_proj.weight"], c[p + "mlp.up_proj.weight"]
  gating = np.stack([gate, up]) if transposed_gating else np.stack([gate.T, up.T])
  return {
    "attn": {
      "q_einsum": {"w": np.ascontiguousarray(split("q", heads))},
      "kv_einsum": {
        "w": np.ascontiguousarray(np.stack([split("k", kv_heads), split("v", kv_heads)]))
      },
      "attn_vec_einsum": {"w": np.ascontiguousarray(o)},
    },
    "mlp": {
      "gating_einsum": np.ascontiguousarray(gating),
      "linear": T(c[p + "mlp.down_proj.weight"]),
    },
  }


def gemma_library():
  c = ld("gemma")
  t = {
    "embedder": {"input_embedding": c["model.embed_tokens.weight"]},
    "final_norm": {"scale": c["model.norm.weight"]},
  }
  for i in range(2):
    p = f"model.layers.{i}."
    t[f"layer_{i}"] = {
      "pre_attention_norm": {"scale": c[p + "input_layernorm.weight"]},
      "pre_ffw_norm": {"scale": c[p + "post_attention_layernorm.weight"]},
      **gemma_layer(c, p, 4, 1, 8, 32),
    }
  return "gemma", {"transformer": t}


def keras_hub_bert():
  c = ld("bert")
  L = 2
  H = 4
  Dm = 32
  Dh = 8

  def qkv(w):
    return np.ascontiguousarray(w.T.reshape(Dm, H, Dh))

  def qb(b):
    return np.ascontiguousarray(b.reshape(H, Dh))

  t = {
    "token_embedding": {"embeddings": c["embeddings.word_embeddings.weight"]},
    "position_embedding": {"embeddings": c["embeddings.position_embeddings.weight"]},
    "segment_embedding": {"embeddings": c["embeddings.token_type_embeddings.weight"]},
    "embeddings_layer_norm": {
      "gamma": c["embeddings.LayerNorm.weight"],
      "beta": c["embeddings.LayerNorm.bias"],
    },
    "pooled_dense": {"kernel": T(c["pooler.dense.weight"]), "bias": c["pooler.dense.bias"]},
  }
  for i in range(L):
    p = f"encoder.layer.{i}."
    a = p + "attention.self."
    t[f"transformer_layer_{i}"] = {
      "self_attention_layer": {
        "query_dense": {"kernel": qkv(c[a + "query.weight"]), "bias": qb(c[a + "query.bias"])},
        "key_dense": {"kernel": qkv(c[a + "key.weight"]), "bias": qb(c[a + "key.bias"])},
        "value_dense": {"kernel": qkv(c[a + "value.weight"]), "bias": qb(c[a + "value.bias"])},
        "output_dense": {
          "kernel": np.ascontiguousarray(
            c[p + "attention.output.dense.weight"].T.reshape(H, Dh, Dm)
          ),
          "bias": c[p + "attention.output.dense.bias"],
        },
      },
      "self_attention_layer_norm": {
        "gamma": c[p + "attention.output.LayerNorm.weight"],
        "beta": c[p + "attention.output.LayerNorm.bias"],
      },
      "feedforward_intermediate_dense": {
        "kernel": T(c[p + "intermediate.dense.weight"]),
        "bias": c[p + "intermediate.dense.bias"],
      },
      "feedforward_output_dense": {
        "kernel": T(c[p + "output.dense.weight"]),
        "bias": c[p + "output.dense.bias"],
      },
      "feedforward_layer_norm": {
        "gamma": c[p + "output.LayerNorm.weight"],
        "beta": c[p + "output.LayerNorm.bias"],
      },
    }
  return "bert", t


def gemma_library_llama():  # Llama's weights in the gemma library's layout, 2 kv heads
  c = ld("llama")
  t = {
    "embedder": {"input_embedding": c["model.embed_tokens.weight"]},
    "final_norm": {"scale": c["model.norm.weight"]},
    "unembed": T(c["lm_head.weight"]),
  }
  for i in range(2):
    p = f"model.layers.{i}."
    t[f"layer_{i}"] = {
      "pre_attention_norm": {"scale": c[p + "input_layernorm.weight"]},
      "pre_ffw_norm": {"scale": c[p + "post_attention_layernorm.weight"]},
      **gemma_layer(c, p, 4, 2, 8, 32, transposed_gating=False),
    }
  return "llama", {"transformer": t}


def jax_llm_examples():  # jax-ml/jax-llm-examples llama3 names
  c = ld("llama")
  L = 2
  H, K, Dh, Dm = 4, 2, 8, 32
  layers = []
  for i in range(L):
    p = f"model.layers.{i}."
    layers.append(
      {
        "q": np.ascontiguousarray(c[p + "self_attn.q_proj.weight"].T.reshape(Dm, H, Dh)),
        "k": np.ascontiguousarray(c[p + "self_attn.k_proj.weight"].T.reshape(Dm, K, Dh)),
        "v": np.ascontiguousarray(c[p + "self_attn.v_proj.weight"].T.reshape(Dm, K, Dh)),
        "o": np.ascontiguousarray(c[p + "self_attn.o_proj.weight"].T.reshape(H, Dh, Dm)),
        "attn_pre_gamma": c[p + "input_layernorm.weight"],
        "attn_post_gamma": c[p + "post_attention_layernorm.weight"],
        "ffw": {
          "w_gate": T(c[p + "mlp.gate_proj.weight"]),
          "w_up": T(c[p + "mlp.up_proj.weight"]),
          "w_down": T(c[p + "mlp.down_proj.weight"]),
        },
      }
    )
  return "llama", {
    "embedding": c["model.embed_tokens.weight"],
    "layers": layers,
    "gamma_final": c["model.norm.weight"],
    "lm_head": T(c["lm_head.weight"]),
  }


def fused_llama():  # vLLM/tpu-inference style: fused qkv and gate_up in the target
  c = ld("llama")
  L = 2
  layers = {}
  for i in range(L):
    p = f"model.layers.{i}."
    a = p + "self_attn."
    layers[str(i)] = {
      "attn": {
        "qkv_proj": {
          "kernel": np.ascontiguousarray(
            np.concatenate(
              [c[a + "q_proj.weight"], c[a + "k_proj.weight"], c[a + "v_proj.weight"]]
            ).T
          )
        },
        "o_proj": {"kernel": T(c[a + "o_proj.weight"])},
      },
      "mlp": {
        "gate_up_proj": {
          "kernel": np.ascontiguousarray(
            np.concatenate([c[p + "mlp.gate_proj.weight"], c[p + "mlp.up_proj.weight"]]).T
          )
        },
        "down_proj": {"kernel": T(c[p + "mlp.down_proj.weight"])},
      },
      "input_layernorm": {"scale": c[p + "input_layernorm.weight"]},
      "post_attention_layernorm": {"scale": c[p + "post_attention_layernorm.weight"]},
    }
  return "llama", {
    "model": {
      "embed_tokens": {"embedding": c["model.embed_tokens.weight"]},
      "layers": layers,
      "norm": {"scale": c["model.norm.weight"]},
    },
    "lm_head": {"kernel": T(c["lm_head.weight"])},
  }


def nanogpt_bert():  # a BERT with one fused qkv dense, as nanoGPT-style code writes it
  c = ld("bert")
  t = {
    "wte": {"embedding": c["embeddings.word_embeddings.weight"]},
    "wpe": {"embedding": c["embeddings.position_embeddings.weight"]},
    "wtt": {"embedding": c["embeddings.token_type_embeddings.weight"]},
    "ln_emb": layer_norm(c, "embeddings.LayerNorm"),
    "pooler": dense(c, "pooler.dense"),
  }
  for i in range(2):
    p = f"encoder.layer.{i}."
    a = p + "attention.self."
    t[f"block_{i}"] = {
      "attn": {
        "c_attn": {
          "kernel": np.ascontiguousarray(
            np.concatenate([c[a + n + ".weight"] for n in ("query", "key", "value")]).T
          ),
          "bias": np.concatenate([c[a + n + ".bias"] for n in ("query", "key", "value")]),
        },
        "c_proj": dense(c, p + "attention.output.dense"),
      },
      "ln_1": layer_norm(c, p + "attention.output.LayerNorm"),
      "mlp": {"c_fc": dense(c, p + "intermediate.dense"), "c_proj": dense(c, p + "output.dense")},
      "ln_2": layer_norm(c, p + "output.LayerNorm"),
    }
  return "bert", t


def gemma_library_bert():  # the gemma library's MHA layout (qkv_einsum [3, H, D, Dh]), post-norms
  c = ld("bert")
  H, Dh, Dm = 4, 8, 32
  t = {
    "embedder": {"input_embedding": c["embeddings.word_embeddings.weight"]},
    "pos": {"embedding": c["embeddings.position_embeddings.weight"]},
    "seg": {"embedding": c["embeddings.token_type_embeddings.weight"]},
    "emb_norm": layer_norm(c, "embeddings.LayerNorm"),
    "pooler": dense(c, "pooler.dense"),
  }
  for i in range(2):
    p = f"encoder.layer.{i}."
    a = p + "attention.self."
    w = np.stack(
      [
        c[a + n + ".weight"].reshape(H, Dh, Dm).transpose(0, 2, 1)
        for n in ("query", "key", "value")
      ]
    )
    b = np.stack([c[a + n + ".bias"].reshape(H, Dh) for n in ("query", "key", "value")])
    t[f"layer_{i}"] = {
      "attn": {
        "qkv_einsum": {"w": np.ascontiguousarray(w), "b": b},
        "attn_vec_einsum": {
          "w": np.ascontiguousarray(c[p + "attention.output.dense.weight"].T.reshape(H, Dh, Dm)),
          "b": c[p + "attention.output.dense.bias"],
        },
      },
      "post_attention_norm": layer_norm(c, p + "attention.output.LayerNorm"),
      "mlp": {"up": dense(c, p + "intermediate.dense"), "down": dense(c, p + "output.dense")},
      "post_ffw_norm": layer_norm(c, p + "output.LayerNorm"),
    }
  return "bert", t


def gpt2_scanned_compact():  # linen nn.scan over an @nn.compact block: auto names, layers first
  c = ld("gpt2")

  def st(name):
    return np.ascontiguousarray(np.stack([c[f"transformer.h.{i}.{name}"] for i in range(2)]))

  def mod(kind, name):
    w = "scale" if kind == "norm" else "kernel"
    return {w: st(name + ".weight"), "bias": st(name + ".bias")}

  block = {
    "LayerNorm_0": mod("norm", "ln_1"),
    "LayerNorm_1": mod("norm", "ln_2"),
    "Dense_0": mod("dense", "attn.c_attn"),  # GPT-2's Conv1D is [in, out] already
    "Dense_1": mod("dense", "attn.c_proj"),
    "Dense_2": mod("dense", "mlp.c_fc"),
    "Dense_3": mod("dense", "mlp.c_proj"),
  }
  return "gpt2", {
    "wte": {"embedding": c["transformer.wte.weight"]},
    "wpe": {"embedding": c["transformer.wpe.weight"]},
    "ScanBlock_0": block,
    "ln_f": {"scale": c["transformer.ln_f.weight"], "bias": c["transformer.ln_f.bias"]},
  }


def mesh_transformer_jax_gptj():
  """GPT-J as kingoflolz/mesh-transformer-jax (haiku) names it: each layer one module whose
  q, k, v, o, fc_in and fc_out are ``linear`` .. ``linear_5`` in call order (nothing but the
  order names them), the final norm ``projection_shard/~/replicated_layer_norm`` beside the
  head (it shares only "norm" with ``transformer.ln_f``: the one norm outside the layers)."""
  c, p, t = ld("gptj"), "causal_transformer_shard/~/", {}
  t[p + "embedding_shard"] = {"embed": c["transformer.wte.weight"]}
  for i in range(2):
    q, layer = f"transformer.h.{i}.", f"{p}layer_{i}/~/"
    t[layer + "layer_norm"] = {"scale": c[q + "ln_1.weight"], "offset": c[q + "ln_1.bias"]}
    for j, n in enumerate(("q_proj", "k_proj", "v_proj", "out_proj")):
      t[layer + ("linear" if j == 0 else f"linear_{j}")] = {"w": T(c[q + f"attn.{n}.weight"])}
    for j, n in ((4, "fc_in"), (5, "fc_out")):
      t[layer + f"linear_{j}"] = {"w": T(c[q + f"mlp.{n}.weight"]), "b": c[q + f"mlp.{n}.bias"]}
  t[p + "projection_shard/~/replicated_layer_norm"] = {
    "scale": c["transformer.ln_f.weight"],
    "offset": c["transformer.ln_f.bias"],
  }
  t[p + "projection_shard/~/linear"] = {"w": T(c["lm_head.weight"]), "b": c["lm_head.bias"]}
  return "gptj", t


LAYOUTS = {
  f.__name__: f
  for f in (
    easylm,
    gemma_library,
    gemma_library_llama,
    gemma_library_bert,
    jax_llm_examples,
    keras_hub_bert,
    fused_llama,
    nanogpt_bert,
    gpt2_scanned_compact,
    mesh_transformer_jax_gptj,
  )
}


@pytest.mark.parametrize("case", sorted(LAYOUTS))
def test_maps_with_no_hint_and_every_leaf_is_the_projects_conversion(case):
  name, expect = LAYOUTS[case]()
  src = prj.open_source(str(D / name))
  target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), expect)
  got = prj.restore(target, src, recipes=prj.match(target, src))
  flat = jax.tree_util.tree_flatten_with_path(expect)[0]
  assert len(flat) == len(jax.tree.leaves(got))
  for (path, want), leaf in zip(flat, jax.tree.leaves(got)):
    np.testing.assert_array_equal(np.asarray(leaf), want, err_msg=jax.tree_util.keystr(path))
