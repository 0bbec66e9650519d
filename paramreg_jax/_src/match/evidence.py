"""The checkpoint as ``match`` sees it (:class:`Checkpoint`: every key's concepts and shape,
grouped once, with what its config says, :mod:`config_facts`), and a target leaf read against
it (:func:`target_concepts`). ``match`` changes a layout only when evidence determines it
(the orientation and the stacking axis are read in ``axes``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Mapping
from typing import Any

from paramreg_jax._src.match import vocabulary
from paramreg_jax._src.match.config_facts import Facts
from paramreg_jax._src.match.vocabulary import Concepts
from paramreg_jax._src.match.vocabulary import concepts


@dataclasses.dataclass
class Checkpoint:
  """The checkpoint as ``match`` sees it: every key's concepts and shape, grouped once, and the
  evidence about it."""

  concepts: dict[str, Concepts]
  shapes: dict[str, tuple[int, ...]]
  facts: Facts = dataclasses.field(default_factory=Facts)
  # of its linear weights: "t" ([out, in]), "same", None (unknown), "conflict" (refuse)
  convention: str | None = None
  conflict: str | None = None  # the problem when the orientation evidence disagrees
  # what said the convention: "shapes" (the target's undecided linear weights), "config", None
  convention_by: str | None = None
  # how the target's other non-square linear weights (not named ``kernel``/``w``: a ``weight``
  # may be [out, in]) relate to their stored tensors by their shapes: "t", "same", "conflict"
  other_relation: str | None = None
  # the orientation the name hints' own pairs show ("t", "same"; None if they show none or
  # disagree): a hint says which tensor a parameter is, so its non-square shape is evidence
  hinted_convention: str | None = None
  # how the target's decided non-square linear weights relate to their stored tensors ("t",
  # "same"; None if none or they disagree): what orients the square ones a config cannot
  decided_relation: str | None = None
  # the same for bare stored parameters (no ``.weight``: CLIP's ``text_projection``,
  # gpt-oss's experts), whose layout is their author's, not the linear modules':
  # ``{target leaf named kernel/w: relation}``, from the decided non-square ones
  bare_relations: dict[bool, str] = dataclasses.field(default_factory=dict)
  # where the target's stacked leaves keep their layers: 0 (``nnx.scan``) or 1 (MaxText's
  # ``param_scan_axis``); None when no leaf's sizes say it (then both are offered)
  scan_axis: int | None = 0
  # ``{target tower: checkpoint tower}`` its anchors aligned (``towers.align``), last decision
  towers: dict[str, str] = dataclasses.field(default_factory=dict)
  # target subtrees whose leaves hold every layer on a leading axis though no word says so
  stacks: frozenset[str] = frozenset()
  # (target layer, checkpoint (stage, block)) where the target numbers its blocks across the
  # checkpoint's stages (``numbering``); empty where the numbers align as they are
  numbered: tuple[tuple[str, str], ...] = ()
  # ``{fused key: (layout, head size or None)}``: what the user's layout hints say
  layouts: dict[str, tuple[str, int | None]] = dataclasses.field(default_factory=dict)
  # ``{target stack: the checkpoint layers it holds, in order}`` where two or more stacks
  # hold the layers between them (``stacks.layer_splits``); a stack not named holds them all
  layer_sets: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
  # the problem when such stacks cannot be given their layers, and those stacks (their
  # leaves' own problems follow from it: not listed)
  split_problem: str | None = None
  unsplit: tuple[str, ...] = ()
  # ``{target leaf: (k, b)}``: a list of lists' item number, an index after the first ``k``
  # (``encoder/block/0/1/...``: ``numbering.lists_of_lists``)
  listed: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
  # ``{target container: checkpoint layer}`` of a stacked pattern's remainder (MaxText's
  # ``layers_remainder/layers_{r}``: the layers after the pattern's blocks)
  layer_at: dict[str, int] = dataclasses.field(default_factory=dict)
  # ``{target kernel: transpose_kernel}`` of an NNX target's ``nnx.ConvTranspose`` modules:
  # how each applies its kernel (``layouts.conv_transpose``)
  transposed_convs: dict[str, bool] = dataclasses.field(default_factory=dict)
  # ``{target leaf: how many layers the target has of it}`` (the leaves its name's layer
  # template, ``layers_{i}/attn/q/kernel``, names): a checkpoint that stacks its layers is
  # unstacked into as many (``candidates._unstacked``)
  target_layers: dict[str, int] = dataclasses.field(default_factory=dict)

  def restricted(self, keys: set[str]) -> Checkpoint:
    """The same checkpoint seen through only ``keys`` (a hint that names checkpoint keys)."""
    return dataclasses.replace(
      self,
      concepts={k: c for k, c in self.concepts.items() if k in keys},
      shapes={k: s for k, s in self.shapes.items() if k in keys},
    )

  def stack_layers(self, name: str, size: int) -> tuple[int, ...]:
    """The checkpoint layers a stacked target leaf of ``size`` layers holds, in order: its
    stack's share where stacks split the layers, else the first ``size``."""
    share = self.share(name)
    return share if share is not None and len(share) == size else tuple(range(size))

  def share(self, name: str) -> tuple[int, ...] | None:
    """The layers of a stack that holds some of the checkpoint's (``layer_sets``), for a
    leaf in it; None for any other leaf."""
    for root, layers in self.layer_sets.items():
      if in_stack(name, root):
        return layers
    return None

  @functools.cached_property
  def by_layer(self) -> dict[tuple[int, ...], list[str]]:
    """Keys by their layer numbers (``()`` for keys outside the layers)."""
    out: dict[tuple[int, ...], list[str]] = {}
    for k, c in self.concepts.items():
      out.setdefault(c.indices, []).append(k)
    return out

  @functools.cached_property
  def scanned(self) -> frozenset[tuple[int, int]]:
    """``{(axis, layers)}``: where a checkpoint trained scanned keeps its layers, as every
    tensor named for the layers with no layer number and two axes or more agrees (axis 0,
    ``nn.scan``'s; 1, MaxText's), and how many; empty for any other checkpoint. Two pairs
    where its tensors agree on both axes (then both are offered)."""
    stacked = [
      self.shapes[k]
      for k in self.by_layer.get((), ())
      if "layers" in self.concepts[k].tokens and len(self.shapes[k]) >= 2
    ]
    pairs = set()
    for axis in (0, 1):
      sizes = {s[axis] for s in stacked}
      if len(sizes) == 1 and (layers := sizes.pop()) >= 2:
        pairs.add((axis, layers))
    return frozenset(pairs)

  def one_layer(self, stored: tuple[int, ...], layers: int) -> tuple[int, ...] | None:
    """One layer's shape of a tensor of this scanned checkpoint that stacks ``layers``
    layers, where :attr:`scanned` says on which axis; None where it does not say one.

    Examples:
      >>> from paramreg_jax._src.match.vocabulary import concepts
      >>> keys = ["layers/mlp/wi/kernel", "layers/mlp/wo/kernel"]
      >>> ck = Checkpoint({k: concepts(k) for k in keys}, dict(zip(keys, [(32, 3, 48), (48, 3, 32)])))
      >>> ck.one_layer((32, 3, 48), 3), ck.one_layer((32, 3, 48), 32)
      ((32, 48), None)
    """
    axes = [a for a in (0, 1) if (a, layers) in self.scanned and a < len(stored)]
    if len(axes) != 1 or stored[axes[0]] != layers:
      return None
    return stored[: axes[0]] + stored[axes[0] + 1 :]

  @functools.cached_property
  def by_size(self) -> dict[int, list[str]]:
    """Keys by their number of values (what a refusal offers a leaf no name ties to)."""
    out: dict[int, list[str]] = {}
    for k in self.concepts:
      out.setdefault(math.prod(self.shapes[k]), []).append(k)
    return out

  @functools.cached_property
  def tokens(self) -> frozenset[str]:
    """Every concept some key has."""
    return frozenset().union(*(c.tokens for c in self.concepts.values()))

  @functools.cached_property
  def templates(self) -> dict[tuple[frozenset[str], str, str], dict[tuple[int, ...], str]]:
    """``{(concepts, kind, name template): {indices: key}}`` of the numbered tensors (one
    name template each: per layer, per expert). Two names with the same concepts stay apart
    (Qwen2-MoE's ``shared_expert.gate_proj`` and ``shared_expert_gate``)."""
    out: dict[tuple[frozenset[str], str, str], dict[tuple[int, ...], str]] = {}
    for k, c in self.concepts.items():
      if c.indices:
        out.setdefault((c.tokens, c.kind, _NUMBERS.sub("#", k)), {})[c.indices] = k
    return out

  @functools.cached_property
  def single_layer_keys(self) -> list[str]:
    """Keys whose name template occurs in one layer only (T5's relative position bias)."""
    return [next(iter(ks.values())) for ks in self.templates.values() if len(ks) == 1]


def target_indices(name: str, indices: tuple[int, ...], ck: Checkpoint) -> tuple[int, ...]:
  """A target leaf's layer numbers as the checkpoint counts them: none for a place of a
  stacked pattern (``layers/layers_3``: it stacks layers 3, 9, ...), the layer after the
  pattern for its remainder's (``layers_remainder/layers_1``), ``indices`` otherwise; a list
  of lists' item number (``ck.listed``) in its place."""
  indices = with_item(indices, ck.listed.get(name))
  for stack in ck.layer_sets:
    if indices and _PLACE.search(stack) and name.startswith(f"{stack}/"):
      return ()
  for container, layer in ck.layer_at.items():
    if name.startswith(f"{container}/"):
      return (layer, *indices[1:])
  return indices


def with_item(indices: tuple[int, ...], item: tuple[int, int] | None) -> tuple[int, ...]:
  """``indices`` with a list of lists' item number (``numbering.lists_of_lists``) in its
  place: ``(k, b)`` puts ``b`` after the first ``k``."""
  if item is None:
    return indices
  k, b = item
  return (*indices[:k], b, *indices[k:])


_PLACE = re.compile(r"/[A-Za-z]+_\d+$")  # a stack that is a numbered container: a place


_NUMBERS = re.compile(r"\d+")


def in_stack(name: str, stack: str) -> bool:
  """Whether target leaf ``name`` is in ``stack``: a subtree (``decoder/moe_layers``), or a
  group of a stack's modules named alike but for a last word (``decoder/layers/*_local``:
  MaxText's Gemma 2 keeps a local and a global layer in each of its stacked layers)."""
  root, _, word = stack.partition("/*_")
  if not name.startswith(f"{root}/"):
    return False
  return not word or name[len(root) + 1 :].split("/", 1)[0].endswith(f"_{word}")


def model_prefix(keys: list[str]) -> frozenset[str]:
  """A leading component most keys share and the vocabulary does not know: the model's own
  prefix (``gpt_neox.``, ``roberta.``), noise when comparing names. Where two leading
  components hold layers (CLIP's ``text_model.`` and ``vision_model.``), they are towers, and
  neither is noise: stripping one only would make its names read closer than the other's."""
  counts: dict[str, int] = {}
  numbers: dict[str, set[str]] = {}  # the layer numbers under each leading component
  for k in keys:
    first = re.split(r"[./]", k, maxsplit=1)[0].lower()
    counts[first] = counts.get(first, 0) + 1
    if m := re.search(r"[./](\d+)[./]", k):
      numbers.setdefault(first, set()).add(m.group(1))
  if sum(len(ns) > 1 for ns in numbers.values()) > 1:
    return frozenset()
  return frozenset(
    w
    for w, n in counts.items()
    if 2 * n >= len(keys)
    and w not in ("encoder", "decoder", "embeddings")
    and not vocabulary.known(w)
  )


def norm_roles(src: dict[str, Concepts], facts: Facts) -> None:
  """Gives the checkpoint's norms and routers their roles where the model type (or the
  checkpoint's own keys) says more than the name.

  - ``post_attention_layernorm`` is Llama's norm before the MLP, but the attention's post-norm
    in Gemma 2/3 and OLMo 2 (their config's model type says so; a checkpoint whose MLP has a
    norm of its own, ``pre_feedforward_layernorm`` or ``post_feedforward_layernorm``, says so
    itself).
  - ``mlp.gate`` beside ``mlp.experts`` is the router of a mixture of experts (transformers 5
    stores Mixtral and Qwen-MoE this way), not a gate projection.
  """
  post = facts.post_norms or any(_MLP_NORM.search(k) for k in src)
  moe = any(".experts." in k for k in src)
  if not (post or moe):
    return
  for k, c in src.items():
    if post and "post_attention_layernorm" in k:
      tokens = (c.tokens - {"mlp"}) | {"attn", "post"}
      src[k] = dataclasses.replace(c, tokens=frozenset(tokens))
    elif moe and _ROUTER.search(k):
      src[k] = dataclasses.replace(c, tokens=(c.tokens - {"gate"}) | {"moe", "router"})


def fused_inputs(src: dict[str, Concepts], shapes: Mapping[str, Any]) -> None:
  """Reads a gated MLP's one input projection as the fused gate and up it is, by its shape:
  an ``up`` (ModernBERT's ``mlp.Wi``, T5's ``wi``) with no ``gate`` beside it, twice as wide
  as the ``down`` beside it takes (``[2F, D]`` beside ``[D, F]``, or ``[D, 2F]`` beside
  ``[F, D]``). A plain MLP's ``up`` is as wide as its ``down`` takes and stays an ``up``.
  Which half is the gate is the layout's (the config's, else asked)."""
  parents: dict[str, list[str]] = {}
  for k, c in src.items():
    if k in shapes and len(shapes[k]) == 2 and c.kind == "w":
      parents.setdefault(k.rsplit(".", 2)[0], []).append(k)
  for keys in parents.values():
    roles = {r: [k for k in keys if r in src[k].tokens] for r in ("gate", "gate_up", "up", "down")}
    if roles["gate"] or roles["gate_up"] or len(roles["up"]) != 1 or len(roles["down"]) != 1:
      continue
    (up,), (down,) = roles["up"], roles["down"]
    (a, b), (c, d) = shapes[up], shapes[down]
    if (a == 2 * d and b == c) or (b == 2 * c and a == d):
      src[up] = dataclasses.replace(src[up], tokens=(src[up].tokens - {"up"}) | {"gate_up"})


_ROUTER = re.compile(r"(^|\.)mlp\.gate\.weight$")
_MLP_NORM = re.compile(r"(pre|post)_feedforward_layernorm")
_STACKS = frozenset({"encoder", "decoder"})  # which of a model's stacks, where it has two
# a target's names, with ``_norm`` for ``_layernorm`` as the vocabulary folds them
_POST_ATTN = re.compile(r"post_attention_(layer)?norm")
_MLP_NORM_TARGET = re.compile(r"(pre|post)_(feedforward|ffw|ffn|mlp)_(layer)?norm")


def target_concepts(name: str, slot_names: list[str], ck: Checkpoint) -> Concepts:
  """A target parameter's concepts, with the role of a norm named as transformers names
  Gemma 2's: its ``post_attention_layernorm`` is the attention's post-norm where the
  checkpoint's model type says so or the target's MLP has a norm of its own too (a pre- or
  post-norm: ``pre_ffw_norm``, ``post_feedforward_layernorm``, as Gemma 2 and OLMo 2 have).
  A stack the checkpoint does not have (MaxText's ``decoder/`` over a decoder-only model)
  says nothing, nor the words of a stack that holds some of the layers (``moe_layers``):
  they say which layers, not which parameter."""
  facts = ck.facts
  c = concepts(vocabulary.as_layernorm(_plain(name, ck)))
  c = dataclasses.replace(c, name=name, indices=target_indices(name, c.indices, ck))
  if any(name.startswith(f"{p}/") for p in ck.stacks):  # a stack no word names (stacks.stacks)
    c = dataclasses.replace(c, tokens=c.tokens | {"layers"})
  if c.tokens & _STACKS - ck.tokens:
    c = dataclasses.replace(c, tokens=c.tokens - (_STACKS - ck.tokens))
  c = _three_norms(c, name, slot_names)
  if _POST_ATTN.search(name) and (
    facts.post_norms or any(_MLP_NORM_TARGET.search(n) for n in slot_names)
  ):
    return dataclasses.replace(c, tokens=frozenset((c.tokens - {"mlp"}) | {"attn", "post"}))
  return c


# a norm numbered in its own name: timm's norm1/norm2, GPT-2's ln_1/ln_2, a decoder's norm3
_NUMBERED_NORM = re.compile(r"^(norm|ln|layernorm|layer_norm)_?([1-3])$")


def _three_norms(c: Concepts, name: str, slot_names: list[str]) -> Concepts:
  """A target leaf read by :func:`three_norm_tokens` among its module's siblings."""
  parts = name.split("/")
  if len(parts) < 2 or not _NUMBERED_NORM.match(parts[-2].lower()):
    return c
  prefix = "/".join(parts[:-2]) + "/" if len(parts) > 2 else ""
  siblings = {n[len(prefix) :].split("/")[0] for n in slot_names if n.startswith(prefix)}
  return dataclasses.replace(c, tokens=three_norm_tokens(c.tokens, parts[-2], siblings))


def three_norms(src: dict[str, Concepts]) -> None:
  """The checkpoint's numbered norms read by :func:`three_norm_tokens` (diffusers' transformer
  blocks: ``norm1``, ``norm2``, ``norm3`` beside ``attn1``, ``attn2``, ``ff``)."""
  norms = [k for k in src if _NUMBERED_NORM.match(k.rpartition(".")[0].rpartition(".")[2].lower())]
  if not norms:
    return  # (most checkpoints: no module map to build)
  children: dict[str, set[str]] = {}  # each module's own modules, whatever lies below them
  for k in src:
    parts = k.split(".")[:-1]
    for i in range(1, len(parts)):
      children.setdefault(".".join(parts[:i]), set()).add(parts[i])
  for k in norms:
    parent, _, module = k.rpartition(".")[0].rpartition(".")
    src[k] = dataclasses.replace(
      src[k], tokens=three_norm_tokens(src[k].tokens, module, children[parent])
    )


def three_norm_tokens(tokens: frozenset[str], module: str, siblings: set[str]) -> frozenset[str]:
  """A block's numbered norm (``module``) read by its place where the block has three: a
  decoder's ``norm1``, ``norm2``, ``norm3`` are its self-attention's, its cross-attention's
  and its MLP's where a sibling is a cross-attention (``norm2`` is the MLP's only in a block
  of two), and say no sublayer otherwise (then told apart by other evidence, or asked)."""
  m = _NUMBERED_NORM.match(module.lower())
  numbered = [k for s in siblings if (k := _NUMBERED_NORM.match(s.lower()))]
  if m is None or "3" not in {k.group(2) for k in numbered}:
    return tokens
  if {k.group(1) for k in numbered} != {m.group(1)}:
    return tokens
  cross = any("xattn" in concepts(s).tokens for s in siblings)
  role = {"1": "attn", "2": "xattn", "3": "mlp"}[m.group(2)] if cross else None
  return frozenset(
    (tokens - {"attn", "xattn", "mlp", f"#{m.group(2)}"}) | ({role} if role else set())
  )


def gate_and_up(c: Concepts, shape: tuple[int, ...], slot_names: list[str]) -> Concepts:
  """A layer's MLP ``up`` that keeps two of its matrices on a leading axis of 2, in an MLP with
  no gate of its own (recurrentgemma's ``mlp_block/ffw_up/w`` ``[2, d, f]``): its gate and its
  up, stacked (gate first, as Gemma's ``gating_einsum``). Anything else: ``c`` unchanged."""
  tokens = c.tokens
  if not ("up" in tokens and "mlp" in tokens and c.indices) or tokens & {"gate", "gate_up"}:
    return c
  if len(shape) < 2 or shape[0] != 2 or "experts" in tokens:
    return c
  parent = c.name.rsplit("/", 2)[0]
  siblings = (n for n in slot_names if n.startswith(parent + "/") and n != c.name)
  if any("gate" in concepts(n).tokens for n in siblings):
    return c
  return dataclasses.replace(c, tokens=(tokens - {"up"}) | {"gate_up"})


def _plain(name: str, ck: Checkpoint) -> str:
  """``name`` read without the words of a stack that holds some of the layers: they say
  which layers (``moe_layers``, a group's ``_local``, a place's ``layers_3``), not which
  parameter, and would color the rest (``moe_layers/out`` is the attention's output, not
  an MLP's)."""
  for stack in ck.layer_sets:
    if in_stack(name, stack):
      root, _, word = stack.partition("/*_")
      first, _, rest = name[len(root) + 1 :].partition("/")
      if word:
        first = first.removesuffix(f"_{word}")
      return "/".join(filter(None, (root.rpartition("/")[0], "layers", first, rest)))
  return name


# Concepts of a projection: a bare name (no kind word, like Meta's ``wq``) is a linear weight only
# with one of these; a bare ``A_log`` or ``D`` (an SSM's state parameters) is not.
_PROJECTIONS = frozenset(
  {"q", "k", "v", "o", "qkv", "up", "down", "gate", "gate_up", "head", "router", "proj"}
)


def is_linear(c: Concepts, shape: tuple[int, ...]) -> bool:
  """A stored 2-D weight that multiplies (so its orientation matters); not a lookup table, a
  norm, or a bare parameter that is no projection (an SSM's ``A_log``)."""
  return linear_target(c, shape) and (not c.bare or bool(c.tokens & _PROJECTIONS))


def linear_target(c: Concepts, shape: tuple[int, ...]) -> bool:
  """A target parameter that may be a linear weight: 2-D, named as no lookup table or norm.
  (A target's name is the user's: ``mlp/x`` may well be a kernel, so no bare rule here; a
  stored ``A_log`` is not linear, and that is what orientation asks.)"""
  # a depthwise conv stored 2-D (Mamba's ``ssm_conv1d`` [channels, kernel]) multiplies nothing
  if c.kind != "w" or len(shape) != 2 or c.tokens & {"relpos", "conv1d"}:
    return False
  # a norm by its own module's name (a per-head q_norm [heads, head_dim]), not by a module
  # around it: DBRX's ``norm_attn_norm.attn.out_proj`` multiplies
  if "norm" in vocabulary.own_words(c.name):
    return False
  # a table is named so by its own module: a linear layer inside an embedder (DiT's
  # ``t_embedder.mlp.2``, PixArt's ``timestep_embedder.linear_2``) multiplies
  return "embed" not in c.tokens or not vocabulary.names_a_table(c.name)
