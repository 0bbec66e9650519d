"""Generates the tiny Hugging Face checkpoints under ``tests/data/unseen/`` (run once, committed).

Architectures the forward-pass suites (``make_hf_fixtures.py``) do not have: ConvNeXt, DINOv2,
BEiT, SegFormer, CLIP, SigLIP, wav2vec 2.0, Qwen3, Swin, ELECTRA, GPTBigCode, ResNet,
DeepSeek-V3 (latent attention, shared and routed experts), Qwen2-MoE, ModernBERT, Gemma 2, Phi,
Mamba, LLaVA (a CLIP vision tower, a projector and a Llama), DeiT, an MAE, MobileNetV2,
EfficientNet, RWKV, Jamba, VideoMAE, Gemma 3, BLIP, a wav2vec 2.0 Conformer, RecurrentGemma
(Griffin), Qwen2-VL, DETR, a GPT-OSS MoE block, DBRX, GLM, Llama 4, and a diffusion VAE, UNet and
transformer (diffusers' ``AutoencoderKL``, ``UNet2DConditionModel``, PixArt), each randomly
initialised at toy size and saved as ``save_pretrained`` writes it (``model.safetensors``, or
diffusers' ``diffusion_pytorch_model.safetensors``; ``config.json``).
``tests/test_match_unseen.py`` writes targets for them in the styles JAX code is written in
(flax auto-names, big_vision, timm sequentials, haiku, equinox, stacked layers, linen list
attributes) and checks every restored leaf against a conversion written out by hand.

The test suite needs none of torch, transformers or diffusers. To regenerate::

    pip install torch transformers diffusers
    python tests/make_unseen_fixtures.py           # all
    python tests/make_unseen_fixtures.py convnext  # one
"""

from __future__ import annotations

import pathlib
import sys

import torch
import transformers as tf

OUT = pathlib.Path(__file__).parent / "data" / "unseen"
_TOWER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
_TEXT = dict(**_TOWER, vocab_size=99, max_position_embeddings=16)
_VISION = dict(**_TOWER, image_size=32, patch_size=8)

CASES = {
  "convnext": lambda: tf.ConvNextForImageClassification(
    tf.ConvNextConfig(
      num_channels=3,
      patch_size=4,
      num_stages=3,
      hidden_sizes=[8, 16, 24],
      depths=[2, 2, 2],
      num_labels=5,
      image_size=32,
    )
  ),
  "dinov2": lambda: tf.Dinov2Model(
    tf.Dinov2Config(**{**_VISION, "intermediate_size": 128}, layerscale_value=0.5)
  ),
  "clip": lambda: tf.CLIPModel(
    tf.CLIPConfig(text_config=_TEXT, vision_config=_VISION, projection_dim=24)
  ),
  "siglip": lambda: tf.SiglipModel(tf.SiglipConfig(text_config=_TEXT, vision_config=_VISION)),
  "wav2vec2": lambda: tf.Wav2Vec2Model(
    tf.Wav2Vec2Config(
      **_TOWER,
      conv_dim=(16, 16),
      conv_stride=(5, 2),
      conv_kernel=(10, 3),
      num_conv_pos_embeddings=16,
      num_conv_pos_embedding_groups=4,
      feat_extract_norm="group",
    )
  ),
  "qwen3": lambda: tf.Qwen3ForCausalLM(
    tf.Qwen3Config(
      vocab_size=99,
      hidden_size=32,
      intermediate_size=64,
      num_hidden_layers=2,
      num_attention_heads=4,
      num_key_value_heads=2,
      head_dim=8,
      tie_word_embeddings=False,
    )
  ),
  "resnet": lambda: tf.ResNetForImageClassification(
    tf.ResNetConfig(
      num_channels=3,
      embedding_size=8,
      hidden_sizes=[8, 16],
      depths=[2, 2],  # the flax example numbers these four blocks 0..3 across the stages
      layer_type="basic",
      num_labels=5,
    )
  ),
  "swin": lambda: tf.SwinModel(
    tf.SwinConfig(
      image_size=32, patch_size=4, embed_dim=8, depths=[2, 2], num_heads=[2, 4], window_size=4
    )
  ),
  # BEiT: layer scales named lambda_1/lambda_2, no key bias, a relative position table per layer
  "beit": lambda: tf.BeitModel(
    tf.BeitConfig(
      **_VISION,
      use_relative_position_bias=True,
      layer_scale_init_value=0.5,
      use_mean_pooling=True,
    )
  ),
  # SegFormer (MiT): stages of blocks numbered twice (block.{s}.{b}), spatial reduction
  "segformer": lambda: tf.SegformerModel(
    tf.SegformerConfig(
      num_encoder_blocks=2,
      depths=[2, 2],
      sr_ratios=[2, 1],
      hidden_sizes=[8, 16],
      patch_sizes=[7, 3],
      strides=[4, 2],
      num_attention_heads=[1, 2],
      mlp_ratios=[4, 4],
    )
  ),
  "electra": lambda: tf.ElectraModel(tf.ElectraConfig(**_TEXT, embedding_size=16)),
  "gpt_bigcode": lambda: tf.GPTBigCodeForCausalLM(
    tf.GPTBigCodeConfig(
      vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=16, multi_query=True
    )
  ),
  # mixture-of-experts and attention designs of their own (see test_match_unseen.py)
  "deepseek_v3": lambda: tf.DeepseekV3ForCausalLM(
    tf.DeepseekV3Config(
      vocab_size=99,
      hidden_size=32,
      intermediate_size=48,
      moe_intermediate_size=16,
      num_hidden_layers=3,
      first_k_dense_replace=1,  # layer 0 a dense MLP, layers 1 and 2 experts
      num_attention_heads=4,
      num_key_value_heads=4,
      q_lora_rank=24,
      kv_lora_rank=20,
      qk_rope_head_dim=4,
      qk_nope_head_dim=8,
      v_head_dim=8,
      n_routed_experts=4,
      n_shared_experts=1,
      num_experts_per_tok=2,
      n_group=1,
      topk_group=1,
      tie_word_embeddings=False,
    )
  ),
  "qwen2_moe": lambda: tf.Qwen2MoeForCausalLM(
    tf.Qwen2MoeConfig(
      vocab_size=99,
      hidden_size=32,
      intermediate_size=48,
      moe_intermediate_size=16,
      shared_expert_intermediate_size=40,
      num_experts=4,
      num_experts_per_tok=2,
      num_hidden_layers=2,
      num_attention_heads=4,
      num_key_value_heads=2,
      tie_word_embeddings=False,
    )
  ),
  "modernbert": lambda: tf.ModernBertForMaskedLM(
    tf.ModernBertConfig(
      vocab_size=99,
      hidden_size=32,
      intermediate_size=48,
      num_hidden_layers=3,
      num_attention_heads=4,
      max_position_embeddings=64,
      global_attn_every_n_layers=2,
      local_attention=8,
      pad_token_id=0,
      bos_token_id=1,
      eos_token_id=2,
      cls_token_id=1,
      sep_token_id=2,
    )
  ),
  "gemma2": lambda: tf.Gemma2ForCausalLM(
    tf.Gemma2Config(
      vocab_size=99,
      hidden_size=32,
      intermediate_size=48,
      num_hidden_layers=2,
      num_attention_heads=4,
      num_key_value_heads=2,
      head_dim=8,
    )
  ),
  "mamba": lambda: tf.MambaForCausalLM(
    tf.MambaConfig(
      vocab_size=99,
      hidden_size=16,
      state_size=4,
      num_hidden_layers=2,
      expand=2,
      conv_kernel=4,
      time_step_rank=3,
    )
  ),
  "phi": lambda: tf.PhiForCausalLM(
    tf.PhiConfig(
      vocab_size=99,
      hidden_size=32,
      intermediate_size=48,
      num_hidden_layers=2,
      num_attention_heads=4,
      partial_rotary_factor=0.5,
    )
  ),
  # three towers of different architectures: a CLIP vision tower, a projector, a Llama
  "llava": lambda: tf.LlavaForConditionalGeneration(
    tf.LlavaConfig(
      vision_config=tf.CLIPVisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=16,
        patch_size=8,
      ),
      text_config=tf.LlamaConfig(
        vocab_size=64,
        hidden_size=24,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
      ),
      image_token_index=63,
    )
  ),
  # DeiT: a class and a distillation token of one shape, and a head for each
  "deit": lambda: tf.DeiTForImageClassificationWithTeacher(tf.DeiTConfig(**_VISION, num_labels=5)),
  # an MAE: an encoder and a one-layer decoder of another width
  "vit_mae": lambda: tf.ViTMAEForPreTraining(
    tf.ViTMAEConfig(
      **_VISION,
      decoder_hidden_size=24,
      decoder_num_hidden_layers=1,
      decoder_num_attention_heads=4,
      decoder_intermediate_size=48,
    )
  ),
  # MobileNetV2: units of a conv and a batch norm, the depthwise and expanding ones as wide
  "mobilenet_v2": lambda: tf.MobileNetV2ForImageClassification(
    tf.MobileNetV2Config(
      num_channels=3, image_size=32, depth_multiplier=0.25, finegrained_output=False, num_labels=5
    )
  ),
  # Gemma 3: four norms per layer and a query and a key norm
  "gemma3": lambda: tf.Gemma3ForCausalLM(
    tf.Gemma3TextConfig(
      **{**_TEXT, "max_position_embeddings": 64},
      num_key_value_heads=2,
      head_dim=8,
      sliding_window=8,
    )
  ),
  # EfficientNet: MBConv blocks, the first without an expansion (its norms are others')
  "efficientnet": lambda: tf.EfficientNetForImageClassification(
    tf.EfficientNetConfig(
      num_channels=3,
      image_size=32,
      width_coefficient=0.25,
      depth_coefficient=0.3,
      num_labels=5,
      hidden_dim=320,
    )
  ),
  # RWKV: bare time-mix parameters of one shape in the attention and the feed-forward
  "rwkv": lambda: tf.RwkvForCausalLM(
    tf.RwkvConfig(
      vocab_size=99,
      hidden_size=32,
      num_hidden_layers=2,
      attention_hidden_size=32,
      intermediate_size=64,
      context_length=16,
    )
  ),
  # Jamba: Mamba and attention layers, MLPs and mixtures of experts, alternating
  "jamba": lambda: tf.JambaForCausalLM(
    tf.JambaConfig(
      **{**_TEXT, "num_hidden_layers": 4},
      num_key_value_heads=2,
      num_experts=2,
      num_experts_per_tok=1,
      expert_layer_period=2,
      expert_layer_offset=1,
      attn_layer_period=2,
      attn_layer_offset=1,
      mamba_d_state=4,
      mamba_d_conv=4,
      mamba_expand=2,
      mamba_dt_rank=4,
      use_mamba_kernels=False,
    )
  ),
  # VideoMAE: a Conv3d tubelet embedding, a query and a value bias apart from their weights
  "videomae": lambda: tf.VideoMAEModel(
    tf.VideoMAEConfig(
      **{**_VISION, "image_size": 16},
      num_frames=4,
      tubelet_size=2,
      use_mean_pooling=False,
    )
  ),
  # BLIP: a vision tower (fused qkv) and a text tower with cross-attention, three norms a layer
  "blip": lambda: tf.BlipModel(
    tf.BlipConfig(
      text_config={**_TEXT, "encoder_hidden_size": 32},
      vision_config=_VISION,
      projection_dim=24,
    )
  ),
  # wav2vec 2.0 Conformer: a macaron block (two feed-forwards around attention) and a
  # convolution module (pointwise, depthwise, batch norm, pointwise), rotary attention
  "conformer": lambda: tf.Wav2Vec2ConformerModel(
    tf.Wav2Vec2ConformerConfig(
      **_TOWER,
      conv_dim=(8, 8),
      conv_stride=(5, 2),
      conv_kernel=(10, 3),
      num_conv_pos_embeddings=4,
      num_conv_pos_embedding_groups=2,
      conv_depthwise_kernel_size=3,
      position_embeddings_type="rotary",
    )
  ),
  # RecurrentGemma (Griffin): recurrent blocks (a gated linear recurrence, a causal conv) and
  # local attention, alternating
  "recurrent_gemma": lambda: tf.RecurrentGemmaForCausalLM(
    tf.RecurrentGemmaConfig(
      **{**_TEXT, "num_hidden_layers": 3},
      num_key_value_heads=1,
      lru_width=32,
      attention_window_size=8,
      conv1d_width=4,
      block_types=("recurrent", "recurrent", "attention"),
    )
  ),
  # Qwen2-VL: a vision tower (a Conv3d patch embedding, fused qkv, a merger MLP over 2x2
  # merged patches) and a Qwen2 language model (q/k/v biases, no o bias)
  "qwen2_vl": lambda: tf.Qwen2VLForConditionalGeneration(
    tf.Qwen2VLConfig(
      text_config={
        **_TEXT,
        "max_position_embeddings": 64,
        "num_key_value_heads": 2,
        "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]},
      },
      vision_config=dict(
        depth=2,
        embed_dim=16,
        hidden_size=32,
        num_heads=2,
        mlp_ratio=2,
        in_channels=3,
        patch_size=4,
        spatial_merge_size=2,
        temporal_patch_size=2,
      ),
    )
  ),
  # DETR: a ResNet backbone (batch norms with running statistics), a 1x1 conv projection, an
  # encoder and a decoder of one width (self- and cross-attention), learned queries, a box MLP
  "detr": lambda: tf.DetrForObjectDetection(
    tf.DetrConfig(
      use_timm_backbone=False,
      use_pretrained_backbone=False,
      backbone_config=tf.ResNetConfig(
        embedding_size=8,
        hidden_sizes=[8, 16],
        depths=[1, 1],
        layer_type="basic",
        out_features=["stage2"],
      ),
      d_model=32,
      encoder_layers=2,
      decoder_layers=2,
      encoder_attention_heads=4,
      decoder_attention_heads=4,
      encoder_ffn_dim=64,
      decoder_ffn_dim=64,
      num_queries=5,
      num_labels=3,
    )
  ),
}


def _diffusers(cls: str, **config) -> torch.nn.Module:
  """A diffusers model, saved as diffusers saves it (``diffusion_pytorch_model.safetensors``)."""
  import diffusers  # only here: the other fixtures need transformers alone

  return getattr(diffusers, cls)(**config)


CASES |= {
  # convs, group norms, and one attention block in each tower whose weights are all square
  "vae": lambda: _diffusers(
    "AutoencoderKL",
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 2,
    up_block_types=("UpDecoderBlock2D",) * 2,
    block_out_channels=(8, 16),
    layers_per_block=1,
    latent_channels=4,
    norm_num_groups=4,
    sample_size=16,
  ),
  # Stable Diffusion's: resnets with a time projection, transformer blocks with self- and
  # cross-attention (attn1, attn2: square to_q, to_out.0), a GEGLU feed-forward
  # (ff.net.0.proj), two attention items in one up block
  "unet": lambda: _diffusers(
    "UNet2DConditionModel",
    sample_size=8,
    in_channels=4,
    out_channels=4,
    block_out_channels=(8, 16),
    layers_per_block=1,
    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    cross_attention_dim=12,
    attention_head_dim=2,
    norm_num_groups=4,
  ),
  # PixArt-alpha: blocks with self- and cross-attention of one width (every projection
  # square), a bare scale_shift_table per block, and square linear layers inside an embedder
  # (timestep_embedder.linear_2)
  "pixart": lambda: _diffusers(
    "PixArtTransformer2DModel",
    num_attention_heads=2,
    attention_head_dim=8,
    in_channels=4,
    out_channels=8,
    num_layers=2,
    cross_attention_dim=16,
    norm_num_groups=4,
    sample_size=8,
    patch_size=2,
    caption_channels=12,
    interpolation_scale=1,
  ),
}


def _randomize(model: torch.nn.Module) -> None:
  """Every floating tensor random, norms and running statistics too (a fresh model's are ones
  and zeros: a norm restored from the wrong norm would compare equal by value)."""
  with torch.no_grad():
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
      if t.is_floating_point():
        t.normal_(0.0, 0.5)
        if name.endswith("running_var"):
          t.abs_().add_(0.5)


class _Upsampler(torch.nn.Module):
  """Two transposed convolutions, as DPT's reassemble stage (``resize``, in and out alike)
  and SAM's mask decoder (``output_upscaling``, fewer out) have them."""

  def __init__(self) -> None:
    super().__init__()
    self.resize = torch.nn.ConvTranspose2d(4, 4, kernel_size=2, stride=2)
    self.upscale = torch.nn.ConvTranspose2d(4, 3, kernel_size=3, stride=2, padding=1)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    return self.upscale(self.resize(x))


def conv_transpose() -> None:
  """``conv_transpose/``: the upsampler's weights and a forward pass (``reference.npz``:
  ``x``, ``y`` NCHW) to compare a flax ``nn.ConvTranspose`` port with."""
  from safetensors.torch import save_file

  torch.manual_seed(0)
  model = _Upsampler().eval()
  _randomize(model)
  out = OUT / "conv_transpose"
  out.mkdir(parents=True, exist_ok=True)
  save_file({k: v.contiguous() for k, v in model.state_dict().items()}, out / "model.safetensors")
  x = torch.randn(1, 4, 3, 3)
  with torch.no_grad():
    y = model(x)
  import numpy as np

  np.savez(out / "reference.npz", x=x.numpy(), y=y.numpy())
  print("conv_transpose ->", out)


def gpt_oss_experts() -> None:
  """``gpt_oss_experts{,_wide}/``: one GPT-OSS MoE block (its router and experts, named as in
  the full model), its ``config.json``, and a forward pass (``reference.npz``: ``x``, ``y``).
  Its experts are bare ``[E, in, out]`` parameters with gate and up alternating; ``square``
  has hidden = expert width as the released models do, ``wide`` hidden = twice it (where
  ``[E, D, 2I]`` and transformers 5's usual ``[E, 2I, D]`` have the same shape)."""
  import numpy as np
  from safetensors.torch import save_file
  from transformers.models.gpt_oss import modeling_gpt_oss

  for name, hidden, width in (("gpt_oss_experts", 8, 8), ("gpt_oss_experts_wide", 6, 3)):
    torch.manual_seed(0)
    config = tf.GptOssConfig(
      hidden_size=hidden,
      intermediate_size=width,
      num_local_experts=4,
      num_experts_per_tok=2,
      num_hidden_layers=1,
      num_attention_heads=2,
      num_key_value_heads=1,
      head_dim=4,
      vocab_size=16,
    )
    block = modeling_gpt_oss.GptOssMLP(config).eval()
    _randomize(block)
    out = OUT / name
    out.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.layers.0.mlp.{k}": v.contiguous() for k, v in block.state_dict().items()}
    save_file(tensors, out / "model.safetensors")
    config.to_json_file(out / "config.json")
    x = torch.randn(1, 5, hidden)
    with torch.no_grad():
      y, _ = block(x)
    np.savez(out / "reference.npz", x=x.numpy(), y=y.numpy())
    print(name, "->", out)


def dbrx() -> None:
  """``dbrx{,_square}/``: DBRX at toy size (``save_pretrained``) and its first block's MoE
  feed-forward on an input (``reference.npz``: ``x``, ``y``). Its experts are flattened
  ``[E * I, D]`` bare parameters: ``w1`` (gate) and ``v1`` (up) ``[out, in]`` per expert,
  ``w2`` (down) ``[in, out]``; ``square`` has the expert width equal to the hidden size."""
  for name, width in (("dbrx", 12), ("dbrx_square", 16)):
    torch.manual_seed(0)
    config = tf.DbrxConfig(
      d_model=16,
      n_heads=2,
      n_layers=2,
      max_seq_len=32,
      vocab_size=32,
      attn_config={"kv_n_heads": 1, "clip_qkv": None, "rope_theta": 10000.0},
      ffn_config={"ffn_hidden_size": width, "moe_num_experts": 4, "moe_top_k": 2},
    )
    model = tf.DbrxForCausalLM(config).eval()
    _randomize(model)
    _pretrained(name, model, model.transformer.blocks[0].ffn, 16)


def glm() -> None:
  """``glm/``: GLM at toy size (``save_pretrained``) and its first layer's MLP on an input
  (``reference.npz``: ``x``, ``y``): ``gate_up_proj`` fused, ``[gate | up]`` by its code."""
  torch.manual_seed(0)
  config = tf.GlmConfig(
    hidden_size=16,
    intermediate_size=24,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    vocab_size=32,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
  )
  model = tf.GlmForCausalLM(config).eval()
  _randomize(model)
  _pretrained("glm", model, model.model.layers[0].mlp, 16)


def _pretrained(
  name: str, model: torch.nn.Module, block: torch.nn.Module, width: int, rows: int = 0
) -> None:
  """``model`` under ``name/`` as ``save_pretrained`` writes it, and ``block``'s output on a
  random ``[1, 5, width]`` input, or ``[rows, width]`` (``reference.npz``: ``x``, ``y``)."""
  import numpy as np

  out = OUT / name
  out.mkdir(parents=True, exist_ok=True)
  model.save_pretrained(out)
  x = torch.randn(rows, width) if rows else torch.randn(1, 5, width)
  with torch.no_grad():
    y = block(x)
  np.savez(out / "reference.npz", x=x.numpy(), y=y.numpy())
  print(name, "->", out)


def llama4() -> None:
  """``llama4/``: Llama 4's text model at toy size (``save_pretrained``; layer 0 dense, layer 1
  MoE) and layer 1's experts on 5 tokens each (``reference.npz``: ``x`` ``[E * 5, D]``, ``y``).
  Its experts are bare ``gate_up_proj`` ``[E, D, 2I]`` (``[gate | up]`` on the last axis, by
  its code's ``chunk(2, dim=-1)``) and ``down_proj`` ``[E, I, D]``, used as ``x @ W``; the
  hidden size is twice the expert width, so ``gate_up_proj`` is square."""
  torch.manual_seed(0)
  config = tf.Llama4TextConfig(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=8,
    intermediate_size_mlp=24,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    num_local_experts=4,
    interleave_moe_layer_step=2,
    max_position_embeddings=32,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
  )
  model = tf.Llama4ForCausalLM(config).eval()
  _randomize(model)
  # the experts read [E * tokens, D] rows: 5 tokens for each of the 4
  _pretrained("llama4", model, model.model.layers[1].feed_forward.experts, 16, rows=4 * 5)


_FUNCTIONS = {
  "conv_transpose": conv_transpose,
  "gpt_oss_experts": gpt_oss_experts,
  "dbrx": dbrx,
  "glm": glm,
  "llama4": llama4,
}


def main(names: list[str]) -> None:
  for name, make in _FUNCTIONS.items():
    if name in names or not names:
      make()
  names = [n for n in names if n not in _FUNCTIONS]
  if not names and sys.argv[1:]:
    return
  for name in names or list(CASES):
    torch.manual_seed(0)
    model = CASES[name]().eval()
    _randomize(model)
    out = OUT / name
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    print(name, len(model.state_dict()), "tensors ->", out)


if __name__ == "__main__":
  main(sys.argv[1:])
