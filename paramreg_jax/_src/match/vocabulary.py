"""The field's vocabulary: checkpoint and target names folded to *concepts*.

Separators and layer numbers are split off, and the names that frameworks and papers use for
one thing are folded together (``q_proj``/``query``/``wq`` -> ``q``, ``self_attn``/``attention``
-> ``attn``, ``weight``/``kernel``/``scale``/``embedding`` -> ``w``, ``input_layernorm`` ->
``attn norm`` ...). Two names are compared by the overlap of their concepts. Data, not logic:
a new architecture's names are a few lines here.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence

# --- names -> concepts ----------------------------------------------------------------------

# Component sequences with a meaning of their own (applied first, longest first).
_PHRASES: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
  (("attention", "self"), ("attn",)),  # BERT/ViT: attention.self.query
  (("attention", "attention"), ("attn",)),  # ViT: attention.attention.query
  (("attention", "output", "dense"), ("attn", "o")),
  (("attention", "output", "layernorm"), ("attn", "norm")),
  (("attention", "dense"), ("attn", "o")),  # GPT-NeoX, Falcon: attention.dense
  (("self_attention", "dense"), ("attn", "o")),
  (("self_attn", "dense"), ("attn", "o")),  # Persimmon
  (
    ("block_sparse_moe", "gate"),
    ("moe", "mlp", "router"),
  ),  # Mixtral's router, not a gate projection
  (("intermediate", "dense"), ("mlp", "up")),
  (("output", "dense"), ("mlp", "down")),
  (("output", "layernorm"), ("mlp", "norm")),
  (("densereludense", "wi"), ("mlp", "up")),  # T5 v1.0
  (("densereludense", "wi_0"), ("mlp", "gate")),  # T5 v1.1
  (("densereludense", "wi_1"), ("mlp", "up")),
  (("densereludense", "wo"), ("mlp", "down")),
  (("mlp", "v1"), ("mlp", "up")),  # DBRX's experts: mlp.w1 (gate), mlp.v1 (up), mlp.w2
  (("patch_embeddings", "projection"), ("patch", "embed")),  # ViT
  # haiku's MultiHeadAttention: query, key, value, then its output projection "linear"
  (("mha", "linear"), ("attn", "o")),
  (("multi_head_attention", "linear"), ("attn", "o")),
  (("attn", "c_attn"), ("attn", "qkv")),  # GPT-2 (Conv1D, [in, out])
  (("attn", "c_proj"), ("attn", "o")),
  (("mlp", "c_fc"), ("mlp", "up")),
  (("mlp", "c_proj"), ("mlp", "down")),
)

# what flax, haiku and torch call a module's weight
_WEIGHT_WORDS = ("weight", "kernel", "scale", "embedding", "gamma", "g")

# One component -> concepts.
_WORDS: dict[str, tuple[str, ...]] = {
  # containers and noise
  **{w: ("layers",) for w in ("layers", "layer", "h", "block", "blocks", "encoder_layer")},
  "resblocks": ("layers",),  # OpenAI's CLIP and open_clip: transformer.resblocks.{i}
  **{w: () for w in ("model", "transformer", "bert", "vit", "self", "base_model", "params")},
  **{w: () for w in ("token", "tok", "word", "words")},  # token_embed: the (token) embedding
  # parameter kinds
  **{w: ("w",) for w in _WEIGHT_WORDS},
  **{w: ("b",) for w in ("bias", "beta", "offset", "shift")},  # haiku/penzai: offset, shift
  # attention
  **{
    w: ("attn",)
    for w in (
      *("attn", "attention", "self_attn", "self_attention", "selfattention"),
      *("mha", "multi_head_attention", "multiheaddotproductattention"),  # haiku, flax
    )
  },
  **{w: ("xattn",) for w in ("xattn", "encdecattention", "cross_attn", "crossattention", "cross")},
  "encoder_attn": ("xattn",),
  "encoder_decoder_attention": ("xattn",),  # t5x, flax's WMT example
  **{w: ("relpos",) for w in ("relative_attention_bias", "relpos_bias")},
  **{w: ("q",) for w in ("q", "q_proj", "query", "wq", "q_lin")},
  **{w: ("k",) for w in ("k", "k_proj", "key", "wk", "k_lin")},
  **{w: ("v",) for w in ("v", "v_proj", "value", "wv", "v_lin")},
  **{w: ("o",) for w in ("o", "o_proj", "out_proj", "out", "wo", "out_lin", "output_proj")},
  **{f"b{p}": (c, "b") for p, c in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "o"))},
  **{w: ("qkv",) for w in ("qkv", "qkv_proj", "c_attn", "query_key_value", "wqkv")},
  "wkv": ("kv",),  # MaxText's latent attention: wkv_a, wkv_b (DeepSeek's kv_a_proj, kv_b_proj)
  # Gemma (google-deepmind/gemma): each projection an einsum named for its operands
  "einsum": (),
  "attn_vec_einsum": ("o",),
  "gating_einsum": ("gate_up",),
  "in_proj_weight": ("qkv", "w"),  # torch's nn.MultiheadAttention: q, k, v rows in one
  "in_proj_bias": ("qkv", "b"),
  # mlp
  **{
    w: ("mlp",)
    for w in ("mlp", "ffn", "ffw", "ff", "feed_forward", "feedforward", "densereludense")
  },  # ff: Jamba's pre_ff_layernorm, diffusers' ff.net
  **{w: ("gate",) for w in ("gate", "gate_proj", "w1")},
  **{w: ("up",) for w in ("up", "up_proj", "w3", "fc1", "fc_in", "c_fc", "lin1", "dense_h_to_4h")},
  **{w: ("down",) for w in ("down", "down_proj", "w2", "fc2", "fc_out", "lin2", "dense_4h_to_h")},
  "ffn_in": ("mlp", "up"),
  "ffn_out": ("mlp", "down"),
  "ffn_output": ("mlp", "down"),  # ALBERT: ffn, then ffn_output
  "w_in": ("up", "w"),
  "w_out": ("down", "w"),
  # t5x and MaxText: wi_0 is the activated (gate) input, wi_1 the linear one; wo (in an MLP,
  # see _fold) its output
  "wi_0": ("gate",),
  "wi_1": ("up",),
  "wi": ("up",),
  "b_in": ("up", "b"),
  "b_out": ("down", "b"),
  "b1": ("gate", "b"),
  "b2": ("down", "b"),
  "b3": ("up", "b"),
  **{w: ("gate_up",) for w in ("gate_up", "gate_up_proj")},
  # mixture of experts: the block's MLP (MaxText's flax-named MoeBlock_0 too)
  **{w: ("moe", "mlp") for w in ("moe", "block_sparse_moe", "sparse_moe", "switch_mlp")},
  "moeblock": ("moe", "mlp"),
  "mlpblock": ("mlp",),  # big_vision's MlpBlock_0
  "maphead": ("head",),  # big_vision's attention-pooling head (SigLIP: vision_model.head)
  **{w: ("experts",) for w in ("experts", "expert")},
  "norms": ("heads",),  # StableLM: q_layernorm.norms.{h}, one norm module per head
  **{w: ("router",) for w in ("router", "gating", "w_gate_router")},
  # norms
  **{w: ("norm",) for w in ("norm", "layernorm", "layer_norm", "ln", "rmsnorm", "rms_norm")},
  # batch and group norms (convolutional models): torch keeps a batch norm's running statistics
  # as ``running_mean``/``running_var`` beside its weight, flax as ``mean``/``var`` in the
  # ``batch_stats`` collection, keras as ``moving_mean``/``moving_variance``
  **{
    w: ("norm",)
    for w in ("bn", "batchnorm", "batch_norm", "normalization", "groupnorm", "group_norm", "gn")
  },
  "batch_stats": (),
  "convolution": ("conv",),
  # a shortcut with parameters is a projection (flax's ResNet: conv_proj, norm_proj)
  "shortcut": ("proj",),
  # torchvision's ResNet names a block's projection shortcut ``downsample`` (a conv and a batch
  # norm, ``downsample.0``/``.1``); a stage's downsampling (timm's ConvNeXt, Swin's patch
  # merging) is a projection as well
  **{w: ("proj",) for w in ("downsample", "downsampling")},
  **{w: ("mean",) for w in ("running_mean", "moving_mean", "mean_ema")},  # haiku: mean_ema
  **{w: ("var",) for w in ("running_var", "moving_var", "moving_variance", "variance", "var_ema")},
  "average": ("w",),  # haiku's ExponentialMovingAverage keeps its value as ``average``
  # a block's sequence mixer (attention, or a recurrence in its place) and its channel mixer
  # (the MLP): Griffin's temporal and channel blocks, MLP-Mixer's token and channel mixing
  **{w: ("attn",) for w in ("temporal_block", "token_mixing", "token_mixer")},
  **{w: ("mlp",) for w in ("channel_block", "channel_mixing", "channel_mixer")},
  "temporal_pre_norm": ("attn", "norm"),
  "channel_pre_norm": ("mlp", "norm"),
  "input_layernorm": ("attn", "norm"),
  "post_attention_layernorm": ("mlp", "norm"),  # Llama: the norm before the MLP
  # MaxText's (Llama, Mistral, DeepSeek decoders): the same two; its Gemma 2's post-norm is
  # ``post_self_attention_norm``, without "layer"
  "pre_self_attention_layer_norm": ("attn", "norm"),
  "post_self_attention_layer_norm": ("mlp", "norm"),
  "pre_feedforward_layernorm": ("mlp", "norm"),
  "post_feedforward_layernorm": ("mlp", "post", "norm"),
  "layernorm_before": ("attn", "norm"),
  "sa_layer_norm": ("attn", "norm"),  # DistilBERT
  "output_layer_norm": ("mlp", "norm"),
  "self_attn_layer_norm": ("attn", "norm"),  # OPT, Whisper
  "encoder_attn_layer_norm": ("xattn", "norm"),
  "ln_attn": ("attn", "norm"),  # Falcon (new decoder architecture)
  "ln_mlp": ("mlp", "norm"),
  "layernorm_after": ("mlp", "norm"),
  "attn_norm": ("attn", "norm"),
  "xattn_norm": ("xattn", "norm"),
  # a layer scale (CaiT, DINOv2, ConvNeXt): a learned per-channel gain on a sublayer's output;
  # the first (ls1, layer_scale1, gamma_1; BEiT's lambda_1) scales the attention's, the
  # second the MLP's
  **{w: ("layerscale",) for w in ("layer_scale", "layerscale", "layer_scale_parameter")},
  **{w: ("layerscale", "attn") for w in ("ls1", "layer_scale1", "gamma_1", "lambda_1")},
  **{w: ("layerscale", "mlp") for w in ("ls2", "layer_scale2", "gamma_2", "lambda_2")},
  "lambda1": ("w",),  # DINOv2: layer_scale1.lambda1
  # weight norm: torch's gain (``parametrizations.weight.original0``, ``weight_g``) is flax
  # nn.WeightNorm's ``scale``; the direction (``original1``, ``weight_v``) the module's weight
  "parametrizations": (),
  **{w: ("weightnorm",) for w in ("original0", "weightnorm")},
  "original1": (),
  "weight_g": ("weightnorm", "w"),
  "weight_v": ("w",),
  "norm1": ("attn", "norm"),  # timm / ViT-style blocks: norm1 before attention, norm2 before MLP
  "norm2": ("mlp", "norm"),
  "ln1": ("attn", "norm"),
  "ln2": ("mlp", "norm"),
  "norm_1": ("attn", "norm"),  # MPT
  "norm_2": ("mlp", "norm"),
  "norm_f": ("final", "norm"),
  "layernorm_embedding": ("embed", "norm"),  # BART
  "attention_norm": ("attn", "norm"),
  "mlp_norm": ("mlp", "norm"),
  "ffn_norm": ("mlp", "norm"),
  "ln_1": ("attn", "norm"),
  "ln_2": ("mlp", "norm"),
  "ln_f": ("final", "norm"),
  "final_norm": ("final", "norm"),
  "final_layernorm": ("final", "norm"),
  "final_layer_norm": ("final", "norm"),
  "decoder_norm": ("final", "norm"),  # t5x, MaxText: the stack's last norm
  "encoder_norm": ("final", "norm"),
  # embeddings and heads
  **{
    w: ("embed",)
    for w in (
      "embed",
      "embeddings",
      "embed_tokens",
      "wte",
      "word_embeddings",
      "tok_embeddings",
      "embed_in",
      "embedder",  # MaxText: token_embedder
    )
  },
  **{
    w: ("pos", "embed")
    for w in ("wpe", "position_embeddings", "pos_embed", "pos_embedding", "embed_positions")
  },
  **{w: ("pos",) for w in ("pos", "position", "positions", "positional")},
  "token_type_embeddings": ("type", "embed"),
  **{w: ("type",) for w in ("seg", "segment", "type", "token_type")},
  # GGUF (llama.cpp): blk.{i}.attn_q, ffn_gate, token_embd, output_norm, output
  "blk": ("layers",),
  "token_embd": ("embed",),
  "attn_output": ("attn", "o"),
  "ffn_gate_up": ("mlp", "gate_up"),
  "output_norm": ("final", "norm"),
  # GGUF's Mamba (``blk.{i}.ssm_in``) and transformers' (``mixer.in_proj``); ``ssm_a`` is read
  # through the values view as the ``A_log`` it stands for
  "mixer": ("ssm",),
  "ssm_in": ("ssm", "in", "proj"),
  "ssm_x": ("ssm", "x", "proj"),
  "ssm_dt": ("ssm", "dt", "proj"),
  "ssm_a": ("ssm", "a", "log"),
  "ssm_out": ("ssm", "o"),
  "embed_out": ("head",),  # GPT-NeoX
  **{w: ("cls",) for w in ("cls", "cls_token", "class_token", "class_embedding")},
  "token_embedding": ("embed",),  # CLIP; "embedding" alone is a leaf's kind
  **{w: ("pos", "embed") for w in ("position_embedding", "positional_embedding")},
  "visual": ("vision",),  # CLIP: visual_projection
  # a contrastive model's learned logit temperature and bias: big_vision's two towers call
  # them ``t`` and ``b`` (log-scale, as transformers' ``logit_scale``/``logit_bias``)
  "t": ("logit", "w"),
  "logit_scale": ("logit", "w"),
  "logit_bias": ("logit", "b"),
  "projection": ("proj",),
  **{w: ("pre", "norm") for w in ("pre_layrnorm", "pre_layernorm", "pre_norm")},  # CLIP's
  **{w: ("head",) for w in ("lm_head", "head", "output_layer", "unembed", "logits_dense")},
}

# every concept the vocabulary reads a word as
_MEANINGS = frozenset(
  c for meaning in (*_WORDS.values(), *(m for _, m in _PHRASES)) for c in meaning
)

_SEPARATORS = re.compile(r"[./~]")
_NUMBERS_ITEMS = frozenset({"layers", "experts", "heads"})  # a word whose next number indexes


def components(name: str) -> list[str]:
  """A key's or a target name's components, as :func:`concepts` reads them (``.``, ``/``,
  haiku's ``~``)."""
  return _SEPARATORS.split(name)


def names_a_table(name: str) -> bool:
  """Whether a name's own module (or its leaf, flax's ``embedding``) is a lookup table: ``embed``
  in the module that holds the weight, not in a module around it (``time_embedder/linear_2``
  is a linear layer of the time embedding, ``embed_tokens`` a table).

  Examples:
    >>> names_a_table("model.embed_tokens.weight"), names_a_table("tokens/embedding")
    (True, True)
    >>> names_a_table("adaln_single.emb.timestep_embedder.linear_2.weight")
    False
    >>> names_a_table("embed_proj/kernel")  # a flax Dense projecting the embeddings
    False
  """
  parts = [p.lower() for p in components(name) if p]
  if not parts:
    return False
  last = parts[-1]
  if last in ("embedding", "embeddings"):  # flax's and haiku's Embed
    return True
  if last == "kernel":  # flax's Dense and Conv (an Embed's is ``embedding``): ALBERT's embed_proj
    return False
  return "embed" in own_words(name)


def own_words(name: str) -> frozenset[str]:
  """The words of the module that holds a parameter (the parameter's own where it has no
  kind word), not of the modules around it: DBRX's ``norm_attn_norm.attn.out_proj.weight``
  is a projection in a block named for its norms. A sequential's item is its number, not its
  sequential (LDM's ``time_embed.0.weight`` is a linear layer of the time embedding).

  Examples:
    >>> "norm" in own_words("transformer.blocks.0.norm_attn_norm.attn.out_proj.weight")
    False
    >>> "norm" in own_words("layers_0/attn/q_norm/scale"), "norm" in own_words("final_norm")
    (True, True)
    >>> "embed" in own_words("time_embed.0.weight")
    False
  """
  words = [p.lower() for p in components(name) if p]  # an item's own word is its number
  if not words:
    return frozenset()
  own = words[-2] if words[-1] in _KIND_WORDS and len(words) > 1 else words[-1]
  return _fold((own,), False)[0]


# a sequential of the model's own, outside its layers: ``stem/0`` is the stem's first module,
# ``classifier.1`` the head's second, not layer 0 or 1
_SEQUENTIALS = frozenset({"stem", "head", "classifier", "downsample", "neck", "pooler"})


_ROLES = frozenset({"mlp", "attn", "xattn"})


def in_role(word: str) -> bool:
  """Whether ``word`` names a part of a layer (``mlp``, ``self_attn``): a list of layers
  under it (equinox's ``mlp/layers/0``) holds its modules, not the model's layers."""
  return bool(_ROLES & set(_WORDS.get(word.lower(), ())))


# the words for a part of a layer, not a norm or a scale of one (a block class may end in one:
# DeepSeekMoeBlock)
_ROLE_WORDS = tuple(
  w for w, t in _WORDS.items() if in_role(w) and not {"norm", "layerscale"} & {*t}
)


def indexes(previous: str, first: bool, inside: bool = False) -> bool:
  """Whether a number after the word ``previous`` indexes layers (or experts, heads): the
  first number of a name does, unless it numbers a sequential outside the layers
  (``stem/0``; a part of a layer's, ``merger.mlp.0``: layers hold MLPs, never the other way
  round); a later one only after a word that numbers its items (``experts.3``), and not
  after ``layers`` ``inside`` a part of a layer (``mlp/layers/1``)."""
  if first:
    return previous.lower() not in _SEQUENTIALS and not _holds_modules(previous)
  if inside and _WORDS.get(previous.lower()) == ("layers",):
    return False
  return numbers_items(previous)


# what a word whose number is a sequential's module can mean: a head, an embedding, a stem or a
# projection, never a stack of layers (vit-pytorch's ``mlp_head.1``, LDM's ``time_embed.0``)
_MODULE_WORDS = frozenset({"head", "embed", "stem", "proj"})


def _holds_modules(word: str) -> bool:
  """Whether ``word``, one the vocabulary may know only in parts (``mlp_head``, ``conv_stem``,
  ``time_embed``), names a module whose list holds its modules: a head, an embedding, a stem,
  a projection or a part of a layer, and nothing that numbers layers, experts or heads."""
  tokens = _fold((word.lower(),), False)[0]
  return not tokens & (_NUMBERS_ITEMS | {"stage"}) and bool(tokens & (_MODULE_WORDS | _ROLES))


def numbers_items(word: str) -> bool:
  """Whether the number after ``word`` indexes layers, experts or heads (``experts.3``,
  ``blocks/1``), not a sequential's module (``mlp/0``)."""
  return bool(_NUMBERS_ITEMS & set(_WORDS.get(word.lower(), ())))


def is_stage(word: str) -> bool:
  """Whether ``word`` numbers a stage in its own name (torchvision's ``layer2``): the first
  number of a name when nothing before it is numbered, and the number after it its block's
  (``layer2.1``); further in (``ffn.layer1``) a module and its place."""
  return bool(_STAGE.match(word.lower()))


_CONTAINER_INDEX = re.compile(r"^(layers|layer|h|block|blocks)_(\d+)$")  # linen: layers_3
# a stage numbered in its own name, as torchvision and timm's ResNets write them (``layer1``
# .. ``layer4``, ``stage2``): the stage's number, and the next number its block's (only as a
# name's first numbered component: see is_stage)
_STAGE = re.compile(r"^(layer|stage|block)(\d+)$")
# a module numbered in its own name where the vocabulary does not know the whole word
# (torchvision's ``conv1``, ``bn2``): the module (folded) and its place, ``#2``
_PLACED = re.compile(r"^([a-z]{2,}?)(\d+)$")
# a block class flax auto-names (``DecoderLayer_0``, big_vision's ``encoderblock_3``,
# ``ResNetBlock_1``, ``ConvNeXtStage_0``; a residual block named for itself, MobileNet's
# ``InvertedResidual_3``, a ResNet's ``Bottleneck_2``): its number is a layer's, unless the
# class is named for a part of a layer (``MlpBlock_0``, ``AttentionBlock_0``, ``MoeBlock_0``)
_BLOCK_CLASS = re.compile(
  r"^([a-z][a-z0-9_]*?|)_?(layers|layer|blocks|block|stages|stage|group|residual|bottleneck)_(\d+)$"
)


def _container(word: str, in_layer: bool = False) -> tuple[str, ...] | None:
  """The words a numbered container stands for (``layers_3`` -> layers; ``decoderlayer_0`` ->
  decoder, layers), or None when ``word`` (lower case) is not one. Inside a layer already
  numbered (``in_layer``), a block class named for a part of a layer is that part
  (``DeepSeekMoeBlock_0``); outside, it numbers layers (CLIP's ``ResidualAttentionBlock_3``)."""
  if "_" not in word:
    return None
  if m := _CONTAINER_INDEX.match(word):
    return (m.group(1),)
  m = _BLOCK_CLASS.match(word)
  if not m or word.rsplit("_", 1)[0] in _WORDS:
    return None
  pre = m.group(1)
  if _WORDS.get(pre) == ("layers",):  # haiku's ResNet: block_group_1, a stage of blocks
    return ("layers",)
  if _WORDS.get(pre) or (in_layer and _part_of_layer(pre)):  # MlpBlock_0: a layer's part
    return None
  if "_" in word[len(pre) : len(pre) + 1] or pre in ("encoder", "decoder"):
    return (pre, "layers")  # conv_layers_0: its words; DecoderLayer_0: the class's role
  return ("layers",)  # ResNetBlock_0, encoderblock_3: the class name says nothing more


def _part_of_layer(pre: str) -> bool:
  """Whether a block class's name ends in a word for a part of a layer (``deepseekmoe``,
  ``gatedmlp``, ``selfattention``): a module of the layer, not a layer."""
  return any(pre.endswith(w) for w in _ROLE_WORDS)


def is_container(word: str, in_layer: bool = False) -> bool:
  """Whether a component numbers a layer (``layers_3``, ``DecoderLayer_0``; ``in_layer``:
  after a layer's own number, see :func:`_container`)."""
  return _container(word.lower(), in_layer) is not None


def _container_number(word: str) -> int:
  return int(re.search(r"(\d+)$", word).group(1))  # type: ignore[union-attr]


# the name flax gives a module class lifted by nn.scan (``nn.scan(DecoderLayer)`` is
# ``ScanDecoderLayer``, auto-named ``ScanDecoderLayer_0``; ``nn.scan(nn.remat(Block))`` is
# ``ScanCheckpointBlock_0``)
_SCANNED = re.compile(r"^Scan[A-Z][A-Za-z0-9]*(_\d+)?$")


_T5_SUBLAYER = re.compile(r"(^|\.)(encoder|decoder)\.block\.(\d+)\.layer\.(\d+)\.")
# T5 numbers the sublayers of a block: what sublayer j is depends on the stack
_T5_ROLES = {"encoder": ("attn", "mlp"), "decoder": ("attn", "xattn", "mlp")}


def _t5_sublayer(name: str) -> str:
  """``encoder.block.3.layer.1.layer_norm`` -> ``encoder.block.3.mlp_norm`` (T5's sublayer
  number is a role, not a layer)."""
  if "block." not in name:
    return name
  m = _T5_SUBLAYER.search(name)
  if not m:
    return name
  stack, j = m.group(2), int(m.group(4))
  roles = _T5_ROLES[stack]
  role = roles[j] if j < len(roles) else f"sublayer{j}"
  head = name[: m.end()].rsplit("layer.", 1)[0]
  rest = name[m.end() :]
  if rest.startswith("layer_norm."):
    rest = f"{role}_norm." + rest[len("layer_norm.") :]
  return head + rest


@functools.lru_cache(maxsize=65536)
def _words(
  shape: tuple[str, ...], noise: frozenset[str]
) -> tuple[frozenset[str], str, bool, tuple[tuple[int, int | None], ...]]:
  """Tokens, kind, whether the kind was implied and where the indices are (``(word position, None)`` for a number,
  ``(position, 2)`` inside ``layers_3``) of a name whose numbers are ``#``. Cached: the 50,000
  keys of an MoE checkpoint share a handful of shapes."""
  parts: list[str] = []
  where: list[tuple[int, int | None]] = []
  inside = False  # in a part of a layer since the last index
  staged = False  # the word before was a stage (layer2): this number is its block's
  stacked = False  # under a stack of layers no number names (MaxText's ``moe_layers``)
  listed = _module_list(shape)
  for n, raw in enumerate(shape):
    word = raw.lower()
    if (n == 0 and word in noise) or (not where and not stacked and n in listed):
      continue
    if (where or stacked) and _EXPERT.match(word):  # a linen class's Expert_3 in a layer
      parts.append("experts")
      where.append((n, 2))
      inside = False
      continue
    container = _container(word, bool(where) or stacked)
    if container and n and _SEQUENTIAL.match(shape[n - 1]):
      continue  # linen's Sequential_0/layers_2: its third item (an MLP's), not a layer
    if not where and is_stage(word):
      container = (word.rstrip("0123456789"),)
    if _SCANNED.match(raw):  # linen's nn.scan over a block: its layers on a leading axis
      parts.append("layers")
    elif container:
      parts.extend(container)
      where.append((n, 2))
      inside, staged = False, is_stage(word)
      continue
    elif word == "#":
      # the first number is a layer's; a later one only after a word that numbers its items
      # (``experts.3``, ``norms.2``, ``blocks.1``): ``mlp/0`` is a sequential's first module
      # (under a stack no number names, a part of a layer's list holds modules: equinox's
      # mlp/layers/0 in a layer nnx.vmap stacked)
      if n == 0 or staged or indexes(shape[n - 1], not where and not inside, inside):
        where.append((n, None))
        inside = False
    elif word:
      parts.append(word)
      inside = inside or ((bool(where) or stacked) and in_role(word))
      stacked = stacked or "layers" in _fold((word,), False)[0]
    staged = False
  tokens, kind, bare = _fold(tuple(parts), bool(where) or stacked)
  return tokens, kind, bare, tuple(where)


# one expert of a layer numbered in its own name (``Expert_3``, ``experts_3``): as experts.3
_EXPERT = re.compile(r"^experts?_\d+$")
# linen's ``nn.Sequential`` module, auto-named: it names its items ``layers_0``, ``layers_1``
_SEQUENTIAL = re.compile(r"^[Ss]equential(_\d+)?$")


def _module_list(shape: tuple[str, ...]) -> tuple[int, ...]:
  """The positions of a ``layers`` word and its number that list a module's single linears,
  not the model's layers (DETR's ``bbox_predictor.layers.0.weight``: under a named module,
  each item holds its weight and bias and nothing else, while a layer holds modules)."""
  if len(shape) < 4 or shape[-2] != "#" or shape[-1].lower() not in _KIND_WORDS:
    return ()  # (a bare parameter right in a layer, BEiT's layer.3.lambda_1, is the layer's)
  word, owner = shape[-3].lower(), shape[-4].lower()
  if _WORDS.get(word) != ("layers",) or owner == "#" or _WORDS.get(owner, (owner,)) == ():
    return ()
  return (len(shape) - 3, len(shape) - 2)


_BY_FIRST: dict[str, tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]] = {}
for _phrase, _meaning in _PHRASES:  # phrases by their first word, in the table's order
  _BY_FIRST[_phrase[0]] = (*_BY_FIRST.get(_phrase[0], ()), (_phrase, _meaning))
del _phrase, _meaning


@functools.lru_cache(maxsize=65536)
def _fold(parts: tuple[str, ...], indexed: bool) -> tuple[frozenset[str], str, bool]:
  """The tokens, kind and bareness (no kind word: ``wq``, ``A_log``) of a name's words
  (without its numbers). Cached: the 50,000 keys of
  an MoE checkpoint differ only in their layer and expert numbers."""
  i, folded = 0, list[str]()
  while i < len(parts):
    for phrase, meaning in _BY_FIRST.get(parts[i], ()):
      if parts[i : i + len(phrase)] == phrase:
        folded.extend(meaning)
        i += len(phrase)
        break
    else:
      folded.append(parts[i])
      i += 1
  tokens: list[str] = []
  for at, word in enumerate(folded):
    if word == "gate" and "moe" in tokens and "experts" not in tokens:
      tokens.append("router")  # a mixture of experts' own gate (MaxText's MoeBlock_0/gate)
    elif word == "shared":  # T5's and BART's embedding, when it is the module: shared.weight
      last = all(_WORDS.get(w) in (("w",), ("b",)) for w in folded[at + 1 :])
      tokens.append("embed" if last else "shared")  # else a shared expert, a shared MLP
    elif word in _WORDS:
      tokens.extend(_WORDS[word])
    elif word in ("attn", "o", "qkv", "up", "down", "mlp", "norm"):  # phrase results
      tokens.append(word)
    else:  # attn_out, type_embed, MoeBlock_0: fold each part (a flax module's number is none)
      subs = [sub for sub in word.split("_") if sub and not sub.isdigit()]
      tokens.extend(t for sub in _compounds(subs) for t in _placed(sub))
  if "o" in tokens and {"mlp", "moe"} & set(tokens) and "attn" not in tokens:
    tokens = [("down" if t == "o" else t) for t in tokens]  # an MLP's output: mlp/wo, fc_out
  if "xattn" in tokens:  # cross_attn_norm: the cross-attention is not the self-attention
    tokens = [t for t in tokens if t != "attn"]
  kinds = [t for t in tokens if t in ("w", "b")]
  kind = kinds[-1] if kinds else "w"
  if not kinds:
    tokens.append("w")  # wq, embed, lm_head: a leaf without a kind suffix is a weight
  if not indexed and set(tokens) <= {"norm", "w", "b"} and "norm" in tokens:
    tokens.append("final")  # model.norm.weight: the final norm
  if not indexed and set(tokens) - {"w", "b"} == {"output"}:
    tokens = [("head" if t == "output" else t) for t in tokens]  # Meta: output.weight
  if indexed and "final" in tokens and "norm" in tokens:
    tokens = [("mlp" if t == "final" else t) for t in tokens]  # OPT: layers.3.final_layer_norm
  return frozenset(tokens), kind, not kinds


def _compounds(subs: list[str]) -> list[str]:
  """A word's parts with each longest run the vocabulary knows whole kept whole:
  ``replicated_layer_norm`` is ``replicated`` and ``layer_norm`` (a norm), never a ``layer``
  and a norm (mesh-transformer-jax's final norm read as a layer's)."""
  out, i = [], 0
  while i < len(subs):
    j = next((j for j in range(len(subs), i + 1, -1) if "_".join(subs[i:j]) in _WORDS), i + 1)
    out.append("_".join(subs[i:j]))
    i = j
  return out


def own_number(word: str) -> tuple[str, int] | None:
  """``("conv", 2)`` for a module numbered in its own name (torchvision's ``conv2``, ``bn1``),
  else None."""
  m = _PLACED.match(word.lower())
  return (m.group(1), int(m.group(2))) if m else None


def _placed(word: str) -> tuple[str, ...]:
  """A word's concepts; one the vocabulary does not know that ends in a number is a module
  and its place (``conv2`` -> conv, ``#2``; ``bn1`` -> norm, ``#1``)."""
  if word in _WORDS:
    return _WORDS[word]
  if own := own_number(word):
    return (*_WORDS.get(own[0], (own[0],)), f"#{own[1]}")
  if m := _TOWER_CLASS.match(word):  # flax's VisionTransformer_0: the vision tower's module
    return (_WORDS.get(m.group(1), (m.group(1),))[0], m.group(2))
  return (word,)


# a module class named for the tower it is (``VisionTransformer``, ``TextEncoder``), lower case
_TOWER_CLASS = re.compile(r"^(vision|visual|text|audio|image|speech)([a-z]{3,})$")


def as_layernorm(name: str) -> str:
  """A target's name with ``X_norm`` read as transformers' ``X_layernorm`` where the vocabulary
  knows that (``input_norm``, ``post_attention_norm``): a user abbreviating the checkpoint's
  words means its norm. (Only for targets: a GGUF's own ``post_attention_norm`` is the
  attention's post-norm, in its own words.)"""
  parts = name.split("/")
  for i, word in enumerate(parts):
    low = word.lower()
    if low not in _WORDS and low.endswith("_norm") and f"{low[:-5]}_layernorm" in _WORDS:
      parts[i] = f"{low[:-5]}_layernorm"
  return "/".join(parts)


# a torch buffer that counts, not a weight: no JAX model holds it (flax's BatchNorm keeps only
# ``mean`` and ``var``), so a checkpoint's copy in every layer is left unused without a word
_BOOKKEEPING = frozenset({"num_batches_tracked"})


def bookkeeping(key: str) -> bool:
  """Whether a checkpoint key is a counter no model parameter stands for
  (``bn1.num_batches_tracked``)."""
  return _SEPARATORS.split(key)[-1] in _BOOKKEEPING


def known(word: str) -> bool:
  """Whether the vocabulary gives ``word`` a meaning (or knows it as noise)."""
  return word in _WORDS or any(word in phrase for phrase, _ in _PHRASES)


@dataclasses.dataclass(frozen=True)
class Concepts:
  """A name folded to concepts: ``tokens`` (a set), the layer ``indices`` in order, ``kind``."""

  name: str
  tokens: frozenset[str]
  indices: tuple[int, ...]
  kind: str  # "w" or "b"
  bare: bool = False  # no kind word in the name (``wq``, ``A_log``): the kind is implied

  def similarity(self, other: Concepts) -> float:
    """The share of concepts the two names have in common, a word abbreviating another
    (``dist`` of ``distillation``) counting as one.

    Examples:
      >>> a, b = concepts("head_dist/kernel"), concepts("distillation_classifier.weight")
      >>> round(a.similarity(b), 2)
      0.5
    """
    union = self.tokens | other.tokens
    if not union:
      return 0.0
    short = _abbreviated(self.tokens - other.tokens, other.tokens - self.tokens)
    return (len(self.tokens & other.tokens) + short) / (len(union) - short)


@functools.lru_cache(maxsize=65536)
def _abbreviated(mine: frozenset[str], theirs: frozenset[str]) -> int:
  """How many words of one name abbreviate a word of the other's, each word paired once: the
  shorter of at least three letters begins the longer, which is at least two letters longer
  (``dist`` and ``distillation``, ``emb`` and ``embed``; not ``head`` and ``heads``). Words the
  vocabulary already reads (``attn``, ``pos``) say what they mean and are not abbreviations."""
  pairs, used = 0, set[str]()
  for a in sorted(mine):
    for b in sorted(theirs - used):
      lo, hi = sorted((a, b), key=len)
      abbreviates = len(lo) >= 3 and lo[0].isalpha() and len(hi) >= len(lo) + 2
      if abbreviates and hi.startswith(lo) and lo not in _MEANINGS:
        pairs += 1
        used.add(b)
        break
  return pairs


def same_path(target: str, key: str) -> bool:
  """Whether a target leaf and a checkpoint key are one path: the same components in order
  (the key may have one leading component more, its model's prefix: ``model.``,
  ``segformer.``), the last read as its kind (``kernel``, ``scale`` and ``weight`` alike), and
  a list's item numbered either way (linen's ``resnets_0`` for a list attribute is
  ``resnets.0``).

  Examples:
    >>> same_path("encoder/block/0/1/layer_norm_1/scale", "encoder.block.0.1.layer_norm_1.weight")
    True
    >>> same_path("layers/0/norm/scale", "model.layers.0.norm.weight")
    True
    >>> same_path("encoder/block/0/1/layer_norm_1/scale", "encoder.block.0.1.layer_norm_2.weight")
    False
    >>> same_path("mid_block/resnets_1/norm1/scale", "decoder.mid_block.resnets.1.norm1.weight")
    True
  """
  t, k = _path(target), _path(key)
  return len(t) >= 2 and len(k) - len(t) in (0, 1) and k[len(k) - len(t) :] == t


def shared_modules(target: str, key: str) -> int:
  """How many modules a target leaf and a checkpoint key share from the top, in order (a list's
  item numbered either way, the key's model prefix skipped where that shares more); the
  leaf's own module and kind are not counted.

  Examples:
    >>> shared_modules("up_1/attns_0/attn1/key/kernel", "up.1.attns.0.attn1.to_k.weight")
    5
    >>> shared_modules("up_1/attns_0/attn1/key/kernel", "up.1.attns.1.attn1.to_k.weight")
    3
  """
  t, k = _path(target)[:-2], _path(key)[:-1]
  return max(len(common_start([t, k])), len(common_start([t, k[1:]])))


def common_start(paths: Sequence[Sequence[str]]) -> list[str]:
  """The leading components every path shares."""
  out: list[str] = []
  for parts in zip(*paths):
    if len(set(parts)) != 1:
      break
    out.append(parts[0])
  return out


def _path(name: str) -> tuple[str, ...]:
  parts = [p.lower() for p in _ITEM_OR_SEPARATOR.split(name.strip("./")) if p]
  return (*parts[:-1], _KIND_WORDS.get(parts[-1], parts[-1])) if parts else ()


# a separator, or the "_" before a component's last number (``resnets_0``: item 0 of resnets)
_ITEM_OR_SEPARATOR = re.compile(r"[./]|_(?=\d+(?:[./]|$))")


# a leaf's last component, as its kind: flax, haiku and torch name one parameter three ways
_KIND_WORDS = {
  **{w: "weight" for w in (*_WEIGHT_WORDS, "w")},
  **{w: "bias" for w in ("bias", "beta", "b")},
}

# the last words that name a module's weight (the leaf its bias and statistics follow)
WEIGHT_LEAVES = frozenset(w for w, kind in _KIND_WORDS.items() if kind == "weight")


@functools.lru_cache(maxsize=262144)
def concepts(name: str, noise: frozenset[str] = frozenset()) -> Concepts:
  """Folds a checkpoint key or a target name to concepts.

  A leaf without a kind suffix (``wq``, ``embed``, ``final_norm``) is a weight. ``noise`` names
  a leading component that carries no meaning here (the model's own prefix, ``gpt_neox.``).

  Examples:
    >>> from paramreg_jax._src.match import concepts
    >>> c = concepts("model.layers.3.self_attn.q_proj.weight")
    >>> sorted(c.tokens), c.indices, c.kind
    (['attn', 'layers', 'q', 'w'], (3,), 'w')
    >>> sorted(concepts("layers_3/attn/q/kernel").tokens) == sorted(c.tokens)
    True
  """
  name = _t5_sublayer(name)
  # a target name's component holding "/" or "~" is escaped (haiku's "layer_0/~/mlp" module
  # names are one dict key: "layer_0~1~0~1mlp"); its words are words all the same
  name = name.replace("~1", "/").replace("~0", "~")
  words = _SEPARATORS.split(name.strip("./~"))
  shape = tuple("#" if w.isdigit() else w for w in words)
  tokens, kind, bare, where = _words(shape, noise)
  indices = [int(words[i]) if group is None else _container_number(words[i]) for i, group in where]
  if not indices and (listed := _module_list(shape)):
    tokens |= {f"@{int(words[listed[1]])}"}  # its item's place in the list, counted from 0
  return Concepts(name, tokens, tuple(indices), kind, bare)
