"""Generates the tiny quantized checkpoints under ``tests/data/quantized/`` (run once, committed).

* ``llama-q8_0.gguf`` and ``llama-q4_k.gguf``: a randomly initialised Llama (GQA, untied head)
  written as llama.cpp writes one (its metadata, q and k rows permuted for llama.cpp's rotary
  layout, norms in F32). Q8_0 is quantized with ``gguf.quants``; Q4_K, which ``gguf`` can only
  dequantize, holds random valid blocks (small scales, so the forward stays finite).
  ``llama-*.npz``: fixed ``input_ids``, the logits of ``transformers`` loading that very
  file and the q/k weights of its first layer as it reads them (``from_pretrained(..., gguf_file=...)``, which dequantizes it and undoes the
  permutation), in float32. ``config.json``: the Hugging Face config it loads as.
* ``llama-f32.gguf``, ``llama-f16.gguf``, ``llama-bf16.gguf``: a smaller Llama stored
  unquantized (q and k still permuted, as llama.cpp writes every Llama whatever the type),
  ``llama-plain.npz`` its input ids and per-type logits from transformers' GGUF loader, and
  ``llama-plain-config.json`` the config it loads as.
* ``phi3-f32.gguf`` and ``phi3-q8_0.gguf``: a Phi-3 (``attn_qkv`` and a fused ``ffn_up`` of
  ``[gate | up]``), ``phi3.npz`` and ``phi3-config.json`` likewise.
* ``gemma2-f32.gguf`` and ``gemma2-q8_0.gguf``: a Gemma 2 (four norms per layer, stored with 1
  added as llama.cpp stores them), ``gemma2-logits.npz`` transformers' logits for each and
  ``gemma2-config.json`` its config, ``gemma2-f32.npz``/``gemma2-q8_0.npz`` the parameters
  transformers' GGUF loader reads from each (its ``state_dict``, float32).
* ``gpt_oss_square.safetensors``: gpt-oss experts with square shapes, fused ``gate_up_proj``
  and both biases; ``gpt_oss_square_reference.npz``: transformers' dequantization of them as
  its ``GptOssExperts`` holds them.
* ``fp8.safetensors``: a DeepSeek-V3 style FP8 matrix with ``weight_scale_inv`` 128 x 128
  block scales, and ``fp8_reference.npy``: ``weight_dequant`` of it (float32).
* ``gpt_oss_moe.safetensors``: gpt-oss style MXFP4 experts (``*_blocks`` and ``*_scales``), and
  ``gpt_oss_reference.npz``: transformers' ``convert_moe_packed_tensors`` of them.

The test suite needs neither torch nor transformers: it reads these files::

    pip install torch transformers gguf
    python tests/make_gguf_fixtures.py
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import gguf
import numpy as np
import torch
import transformers as tf
from safetensors.numpy import save_file

OUT = pathlib.Path(__file__).parent / "data" / "quantized"
SIZES = dict(
  vocab_size=64,
  hidden_size=256,
  intermediate_size=512,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  max_position_embeddings=64,
  rms_norm_eps=1e-6,
  tie_word_embeddings=False,
)


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
  """llama.cpp's ``convert_hf_to_gguf`` permutation of q/k rows (its rotary layout)."""
  return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _q4_k_blocks(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
  """Random valid Q4_K blocks with small float16 ``d``/``dmin`` (finite, modest values)."""
  blocks = rng.integers(0, 256, (rows * cols // 256, 144), dtype=np.uint8)
  d = (rng.random(blocks.shape[0]) * 1e-4 + 1e-5).astype(np.float16)
  dmin = (rng.random(blocks.shape[0]) * 4e-4 + 1e-5).astype(np.float16)
  blocks[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
  blocks[:, 2:4] = dmin.view(np.uint8).reshape(-1, 2)
  return blocks.reshape(rows, cols // 256 * 144)


_BLOCK = {  # llama.cpp's name -> transformers' for a decoder layer's linear weights
  "attn_q": "self_attn.q_proj",
  "attn_k": "self_attn.k_proj",
  "attn_v": "self_attn.v_proj",
  "attn_output": "self_attn.o_proj",
  "ffn_gate": "mlp.gate_proj",
  "ffn_up": "mlp.up_proj",
  "ffn_down": "mlp.down_proj",
}


def _block(sd: dict[str, np.ndarray], i: int, heads: tuple[int, int] | None = None) -> dict:
  """Layer ``i``'s linear weights that ``sd`` has, under llama.cpp's names; ``heads`` (q, kv
  head counts): q and k permuted as llama.cpp's converter permutes them."""
  p = f"model.layers.{i}."
  out = {
    f"blk.{i}.{g}.weight": sd[f"{p}{h}.weight"] for g, h in _BLOCK.items() if f"{p}{h}.weight" in sd
  }
  if heads is not None:
    for part, n in zip(("q", "k"), heads):
      out[f"blk.{i}.attn_{part}.weight"] = _permute(out[f"blk.{i}.attn_{part}.weight"], n)
  return out


def _gguf_tensors(model: tf.LlamaForCausalLM) -> dict[str, np.ndarray]:
  """The model's tensors under llama.cpp's names, q and k permuted."""
  sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
  heads, kv = SIZES["num_attention_heads"], SIZES["num_key_value_heads"]
  out = {
    "token_embd.weight": sd["model.embed_tokens.weight"],
    "output_norm.weight": sd["model.norm.weight"],
    "output.weight": sd["lm_head.weight"],
  }
  for i in range(SIZES["num_hidden_layers"]):
    p = f"model.layers.{i}."
    out[f"blk.{i}.attn_norm.weight"] = sd[p + "input_layernorm.weight"]
    out[f"blk.{i}.ffn_norm.weight"] = sd[p + "post_attention_layernorm.weight"]
    out |= _block(sd, i, (heads, kv))
  return out


def write_gguf(path: pathlib.Path, model: tf.LlamaForCausalLM, kind: str) -> None:
  s = SIZES
  w = gguf.GGUFWriter(str(path), "llama")
  w.add_name("tiny-llama")
  w.add_context_length(s["max_position_embeddings"])
  w.add_embedding_length(s["hidden_size"])
  w.add_block_count(s["num_hidden_layers"])
  w.add_feed_forward_length(s["intermediate_size"])
  w.add_rope_dimension_count(s["hidden_size"] // s["num_attention_heads"])
  w.add_head_count(s["num_attention_heads"])
  w.add_head_count_kv(s["num_key_value_heads"])
  w.add_layer_norm_rms_eps(s["rms_norm_eps"])
  w.add_rope_freq_base(10000.0)
  w.add_vocab_size(s["vocab_size"])
  rng = np.random.default_rng(5)
  qtype = gguf.GGMLQuantizationType[kind]
  for name, value in _gguf_tensors(model).items():
    if value.ndim == 1:  # norms stay F32, as llama.cpp keeps them
      w.add_tensor(name, value.astype(np.float32))
    elif kind == "Q8_0":
      w.add_tensor(name, gguf.quants.quantize(value, qtype), raw_dtype=qtype)
    else:
      w.add_tensor(name, _q4_k_blocks(rng, *value.shape), raw_dtype=qtype)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def llama() -> None:
  torch.manual_seed(0)
  config = tf.LlamaConfig(**SIZES)
  model = tf.LlamaForCausalLM(config).eval()
  with torch.no_grad():
    for p in model.parameters():
      if p.ndim == 1:
        p.add_(0.1 * torch.randn_like(p))
  ids = np.random.default_rng(0).integers(3, SIZES["vocab_size"], size=(2, 7)).astype(np.int32)
  for kind in ("Q8_0", "Q4_K"):
    name = f"llama-{kind.lower()}.gguf"
    write_gguf(OUT / name, model, kind)
    loaded = tf.AutoModelForCausalLM.from_pretrained(
      OUT, gguf_file=name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
      logits = loaded(input_ids=torch.tensor(ids).long()).logits.float().numpy()
    attn = loaded.model.layers[0].self_attn  # the weights transformers reads, un-permuted
    np.savez(
      OUT / f"llama-{kind.lower()}.npz",
      input_ids=ids,
      output=logits,
      q_proj_0=attn.q_proj.weight.detach().float().numpy(),
      k_proj_0=attn.k_proj.weight.detach().float().numpy(),
    )
    print(f"{name}: logits {logits.shape}, {(OUT / name).stat().st_size} bytes")
  (OUT / "config.json").write_text(json.dumps(loaded.config.to_dict(), indent=1, default=str))


def fp8() -> None:
  """DeepSeek-V3's layout: ``weight`` float8_e4m3fn, ``weight_scale_inv`` float32 per block."""
  rng = np.random.default_rng(1)
  x = torch.tensor(rng.standard_normal((300, 260)).astype(np.float32)).to(torch.float8_e4m3fn)
  s = torch.tensor((rng.random((3, 3)) + 0.5).astype(np.float32))
  ref = x.float().clone()
  for i in range(3):  # weight_dequant: each 128 x 128 block times its scale
    for j in range(3):
      ref[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128] *= s[i, j]
  import ml_dtypes

  weight = x.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
  save_file(
    {
      "model.layers.0.mlp.up_proj.weight": weight,
      "model.layers.0.mlp.up_proj.weight_scale_inv": s.numpy(),
    },
    str(OUT / "fp8.safetensors"),
  )
  np.save(OUT / "fp8_reference.npy", ref.numpy())
  print("fp8.safetensors: [300, 260] float8_e4m3fn with [3, 3] block scales")


def gpt_oss() -> None:
  """gpt-oss's MXFP4 experts, and transformers' own dequantization of them."""
  from transformers.integrations.mxfp4 import convert_moe_packed_tensors

  rng = np.random.default_rng(2)
  blocks = rng.integers(0, 256, (2, 96, 2, 16), dtype=np.uint8)  # 2 experts, [96, 64]
  scales = rng.integers(118, 130, (2, 96, 2), dtype=np.uint8)
  ref = convert_moe_packed_tensors(torch.tensor(blocks), torch.tensor(scales), dtype=torch.float32)
  save_file(
    {
      "model.layers.0.mlp.experts.down_proj_blocks": blocks,
      "model.layers.0.mlp.experts.down_proj_scales": scales,
    },
    str(OUT / "gpt_oss_moe.safetensors"),
  )
  np.savez(OUT / "gpt_oss_reference.npz", down_proj=ref.float().numpy())
  print(f"gpt_oss_moe.safetensors: blocks {blocks.shape}, reference {tuple(ref.shape)}")


def gpt_oss_square() -> None:
  """gpt-oss's experts as the real model has them: square (hidden = expert width), fused
  ``gate_up_proj`` with its ``gate_up_proj_bias``, and ``down_proj`` with its bias; the
  reference is transformers' own dequantization, laid out as its ``GptOssExperts`` holds them
  (``gate_up_proj`` ``[E, hidden, 2 * width]``, ``down_proj`` ``[E, width, hidden]``)."""
  from transformers.integrations.mxfp4 import convert_moe_packed_tensors

  rng = np.random.default_rng(4)
  e, h, f = 2, 64, 64
  p = "model.layers.0.mlp.experts."
  tensors = {
    p + "gate_up_proj_blocks": rng.integers(0, 256, (e, 2 * f, h // 32, 16), dtype=np.uint8),
    p + "gate_up_proj_scales": rng.integers(118, 130, (e, 2 * f, h // 32), dtype=np.uint8),
    p + "gate_up_proj_bias": rng.standard_normal((e, 2 * f)).astype(np.float32),
    p + "down_proj_blocks": rng.integers(0, 256, (e, h, f // 32, 16), dtype=np.uint8),
    p + "down_proj_scales": rng.integers(118, 130, (e, h, f // 32), dtype=np.uint8),
    p + "down_proj_bias": rng.standard_normal((e, h)).astype(np.float32),
  }
  save_file(tensors, str(OUT / "gpt_oss_square.safetensors"))
  ref = {}
  for name in ("gate_up_proj", "down_proj"):
    values = convert_moe_packed_tensors(
      torch.tensor(tensors[p + name + "_blocks"]),
      torch.tensor(tensors[p + name + "_scales"]),
      dtype=torch.float32,
    )
    ref[name] = values.float().numpy()  # [E, in, out]: as GptOssExperts holds it
    ref[name + "_bias"] = tensors[p + name + "_bias"]
  np.savez(OUT / "gpt_oss_square_reference.npz", **ref)
  print("gpt_oss_square.safetensors:", {k: v.shape for k, v in ref.items()})


SMALL = dict(SIZES, hidden_size=64, intermediate_size=128, num_attention_heads=4)


def _writer(path: pathlib.Path, arch: str, s: dict, head_dim: int) -> gguf.GGUFWriter:
  w = gguf.GGUFWriter(str(path), arch)
  w.add_name(f"tiny-{arch}")
  w.add_context_length(s["max_position_embeddings"])
  w.add_embedding_length(s["hidden_size"])
  w.add_block_count(s["num_hidden_layers"])
  w.add_feed_forward_length(s["intermediate_size"])
  w.add_rope_dimension_count(head_dim)
  w.add_head_count(s["num_attention_heads"])
  w.add_head_count_kv(s["num_key_value_heads"])
  w.add_layer_norm_rms_eps(s["rms_norm_eps"])
  w.add_rope_freq_base(10000.0)
  w.add_vocab_size(s["vocab_size"])
  return w


def _add(w: gguf.GGUFWriter, tensors: dict[str, np.ndarray], kind: str) -> None:
  """Norms (1-D) stay F32 as llama.cpp keeps them, and rows no block fits (a conv kernel of
  4); matrices in ``kind``."""
  qtype = gguf.GGMLQuantizationType[kind]
  for name, value in tensors.items():
    if value.ndim == 1 or kind == "F32" or value.shape[-1] % 32:
      w.add_tensor(name, value.astype(np.float32))
    elif kind == "F16":
      w.add_tensor(name, value.astype(np.float16))
    else:
      w.add_tensor(name, gguf.quants.quantize(value, qtype), raw_dtype=qtype)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def _logits(name: str, ids: np.ndarray, **config: Any) -> tuple[np.ndarray, Any]:
  loaded = tf.AutoModelForCausalLM.from_pretrained(
    OUT, gguf_file=name, dtype=torch.float32, attn_implementation="eager", **config
  ).eval()
  with torch.no_grad():
    return loaded(input_ids=torch.tensor(ids).long()).logits.float().numpy(), loaded


def _randomized(model: Any) -> Any:
  with torch.no_grad():
    for p in model.parameters():
      if p.ndim == 1:
        p.add_(0.1 * torch.randn_like(p))
  return model.eval()


def plain_llama() -> None:
  """A Llama in F32, F16 and BF16: q and k permuted exactly as in a quantized file."""
  torch.manual_seed(1)
  model = _randomized(tf.LlamaForCausalLM(tf.LlamaConfig(**SMALL)))
  sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
  heads, kv = SMALL["num_attention_heads"], SMALL["num_key_value_heads"]
  tensors = {
    "token_embd.weight": sd["model.embed_tokens.weight"],
    "output_norm.weight": sd["model.norm.weight"],
    "output.weight": sd["lm_head.weight"],
  }
  for i in range(SMALL["num_hidden_layers"]):
    p = f"model.layers.{i}."
    tensors |= {
      f"blk.{i}.attn_norm.weight": sd[p + "input_layernorm.weight"],
      f"blk.{i}.ffn_norm.weight": sd[p + "post_attention_layernorm.weight"],
    }
    tensors |= _block(sd, i, (heads, kv))
  ids = np.random.default_rng(1).integers(3, SMALL["vocab_size"], size=(2, 7)).astype(np.int32)
  out = {"input_ids": ids}
  for kind in ("F32", "F16", "BF16"):
    name = f"llama-{kind.lower()}.gguf"
    _add(_writer(OUT / name, "llama", SMALL, SMALL["hidden_size"] // heads), tensors, kind)
    out[kind], loaded = _logits(name, ids)
    print(f"{name}: {(OUT / name).stat().st_size} bytes")
  np.savez(OUT / "llama-plain.npz", **out)
  (OUT / "llama-plain-config.json").write_text(
    json.dumps(loaded.config.to_dict(), indent=1, default=str)
  )


def phi3() -> None:
  """Phi-3: fused ``attn_qkv`` ([q | k | v]) and ``ffn_up`` ([gate | up]), as transformers'
  own ``qkv_proj`` and ``gate_up_proj``; q and k not permuted (llama.cpp's NeoX rotary)."""
  torch.manual_seed(2)
  config = tf.Phi3Config(**SMALL, pad_token_id=0)
  model = _randomized(tf.Phi3ForCausalLM(config))
  sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
  tensors = {
    "token_embd.weight": sd["model.embed_tokens.weight"],
    "output_norm.weight": sd["model.norm.weight"],
    "output.weight": sd["lm_head.weight"],
  }
  for i in range(SMALL["num_hidden_layers"]):
    p = f"model.layers.{i}."
    tensors |= {
      f"blk.{i}.attn_norm.weight": sd[p + "input_layernorm.weight"],
      f"blk.{i}.ffn_norm.weight": sd[p + "post_attention_layernorm.weight"],
      f"blk.{i}.attn_qkv.weight": sd[p + "self_attn.qkv_proj.weight"],
      f"blk.{i}.attn_output.weight": sd[p + "self_attn.o_proj.weight"],
      f"blk.{i}.ffn_up.weight": sd[p + "mlp.gate_up_proj.weight"],
      f"blk.{i}.ffn_down.weight": sd[p + "mlp.down_proj.weight"],
    }
  ids = np.random.default_rng(2).integers(3, SMALL["vocab_size"], size=(2, 7)).astype(np.int32)
  out = {"input_ids": ids}
  head_dim = SMALL["hidden_size"] // SMALL["num_attention_heads"]
  for kind in ("F32", "Q8_0"):
    name = f"phi3-{kind.lower()}.gguf"
    _add(_writer(OUT / name, "phi3", SMALL, head_dim), tensors, kind)
    out[kind], loaded = _logits(name, ids, pad_token_id=0)  # its default is past this vocab
    print(f"{name}: {(OUT / name).stat().st_size} bytes")
  np.savez(OUT / "phi3.npz", **out)
  (OUT / "phi3-config.json").write_text(json.dumps(loaded.config.to_dict(), indent=1, default=str))


def gemma2() -> None:
  """Gemma 2: four norms per layer, written with 1 added (llama.cpp's ``Gemma2Model``); the
  reference is every parameter transformers' GGUF loader reads back."""
  torch.manual_seed(3)
  s = dict(SMALL, head_dim=16, tie_word_embeddings=True)
  model = _randomized(tf.Gemma2ForCausalLM(tf.Gemma2Config(**s)))
  sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
  tensors = {
    "token_embd.weight": sd["model.embed_tokens.weight"],
    "output_norm.weight": sd["model.norm.weight"] + 1,
  }
  names = {
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
  }
  for i in range(s["num_hidden_layers"]):
    p = f"model.layers.{i}."
    tensors |= {f"blk.{i}.{g}.weight": sd[p + h + ".weight"] + 1 for g, h in names.items()}
    tensors |= _block(sd, i)
  for kind in ("F32", "Q8_0"):
    name = f"gemma2-{kind.lower()}.gguf"
    w = _writer(OUT / name, "gemma2", s, s["head_dim"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    _add(w, tensors, kind)
    read = _reread(name)
    np.savez(OUT / f"gemma2-{kind.lower()}.npz", **read)
    print(f"{name}: {(OUT / name).stat().st_size} bytes, {len(read)} parameters")
  gemma2_logits()


def gemma2_logits() -> None:
  """Transformers' logits for the Gemma 2 files (eager attention: its soft-capping), and the
  config its GGUF loader built, for the forward-pass test."""
  ids = np.random.default_rng(3).integers(3, 64, size=(2, 7)).astype(np.int32)
  out = {"input_ids": ids}
  for kind in ("F32", "Q8_0"):
    out[kind], loaded = _logits(f"gemma2-{kind.lower()}.gguf", ids)
  np.savez(OUT / "gemma2-logits.npz", **out)
  (OUT / "gemma2-config.json").write_text(
    json.dumps(loaded.config.to_dict(), indent=1, default=str)
  )


def _reread(name: str) -> dict[str, np.ndarray]:
  loaded = tf.AutoModelForCausalLM.from_pretrained(OUT, gguf_file=name, dtype=torch.float32)
  return {k: v.detach().float().numpy() for k, v in loaded.state_dict().items()}


def mamba() -> None:
  """Mamba: ``ssm_a`` stored as ``A = -exp(A_log)``, the conv kernel without its middle axis,
  as llama.cpp's converter writes them; ``mamba-{kind}.npz`` every parameter transformers'
  GGUF loader reads back (``log(-A)``)."""
  torch.manual_seed(4)
  config = tf.MambaConfig(
    vocab_size=64,
    hidden_size=64,
    state_size=16,
    num_hidden_layers=2,
    expand=2,
    conv_kernel=4,
    time_step_rank=4,
    tie_word_embeddings=True,
  )
  model = tf.MambaForCausalLM(config).eval()
  sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
  tensors = {
    "token_embd.weight": sd["backbone.embeddings.weight"],
    "output_norm.weight": sd["backbone.norm_f.weight"],
  }
  names = {
    "in_proj.weight": "ssm_in.weight",
    "x_proj.weight": "ssm_x.weight",
    "dt_proj.weight": "ssm_dt.weight",
    "dt_proj.bias": "ssm_dt.bias",
    "out_proj.weight": "ssm_out.weight",
    "conv1d.bias": "ssm_conv1d.bias",
    "D": "ssm_d",
  }
  for i in range(config.num_hidden_layers):
    p = f"backbone.layers.{i}."
    tensors[f"blk.{i}.attn_norm.weight"] = sd[p + "norm.weight"]
    tensors |= {f"blk.{i}.{g}": sd[p + "mixer." + h] for h, g in names.items()}
    tensors[f"blk.{i}.ssm_a"] = -np.exp(sd[p + "mixer.A_log"])
    tensors[f"blk.{i}.ssm_conv1d.weight"] = sd[p + "mixer.conv1d.weight"][:, 0, :]
  for kind in ("F32", "Q8_0"):
    name = f"mamba-{kind.lower()}.gguf"
    w = gguf.GGUFWriter(str(OUT / name), "mamba")
    w.add_name("tiny-mamba")
    w.add_context_length(64)
    w.add_embedding_length(config.hidden_size)
    w.add_block_count(config.num_hidden_layers)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_ssm_conv_kernel(config.conv_kernel)
    w.add_ssm_inner_size(config.intermediate_size)
    w.add_ssm_state_size(config.state_size)
    w.add_ssm_time_step_rank(config.time_step_rank)
    w.add_layer_norm_rms_eps(config.layer_norm_epsilon)
    w.add_vocab_size(config.vocab_size)
    _add(w, {k: v for k, v in tensors.items()}, kind)
    read = _reread(name)
    np.savez(OUT / f"mamba-{kind.lower()}.npz", **read)
    print(f"{name}: {(OUT / name).stat().st_size} bytes, {len(read)} parameters")


def nemotron() -> None:
  """Nemotron: its layer norms stored with 1 added (``norm.weight``), as llama.cpp writes them;
  ``nemotron-{kind}.npz`` every parameter transformers' GGUF loader reads back."""
  torch.manual_seed(5)
  s = dict(SMALL, head_dim=16, partial_rotary_factor=0.5)
  model = _randomized(tf.NemotronForCausalLM(tf.NemotronConfig(**s)))
  sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
  tensors = {
    "token_embd.weight": sd["model.embed_tokens.weight"],
    "output_norm.weight": sd["model.norm.weight"] + 1,
    "output_norm.bias": sd["model.norm.bias"],
    "output.weight": sd["lm_head.weight"],
  }
  for i in range(s["num_hidden_layers"]):
    p = f"model.layers.{i}."
    for g, h in (("attn_norm", "input_layernorm"), ("ffn_norm", "post_attention_layernorm")):
      tensors[f"blk.{i}.{g}.weight"] = sd[p + h + ".weight"] + 1
      tensors[f"blk.{i}.{g}.bias"] = sd[p + h + ".bias"]
    tensors |= _block(sd, i)
  for kind in ("F32", "Q8_0"):
    name = f"nemotron-{kind.lower()}.gguf"
    _add(_writer(OUT / name, "nemotron", s, s["head_dim"]), tensors, kind)
    read = _reread(name)
    np.savez(OUT / f"nemotron-{kind.lower()}.npz", **read)
    print(f"{name}: {(OUT / name).stat().st_size} bytes, {len(read)} parameters")


if __name__ == "__main__":
  import sys

  OUT.mkdir(parents=True, exist_ok=True)
  cases = {"llama": llama, "plain_llama": plain_llama, "phi3": phi3, "gemma2": gemma2}
  cases |= {"gemma2_logits": gemma2_logits, "mamba": mamba, "nemotron": nemotron}
  cases |= {"fp8": fp8, "gpt_oss": gpt_oss, "gpt_oss_square": gpt_oss_square}
  for case in sys.argv[1:] or list(cases):
    cases[case]()
