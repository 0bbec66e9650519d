"""``match``: propose the recipes that restore a target from a foreign checkpoint.

From names, shapes and dtypes only (no payload read), ``match`` pairs every target parameter
with the checkpoint tensor(s) it comes from and derives the layout change:

1. **Names** become *concepts*: separators and layer numbers are split off, and the field's
   vocabularies are folded (``q_proj``/``query``/``wq`` -> ``q``, ``self_attn``/``attention``
   -> ``attn``, ``weight``/``kernel``/``scale``/``embedding`` -> ``w``, ``input_layernorm`` ->
   ``attn norm`` ...). Two names are compared by the overlap of their concepts.
2. **Candidates** are the tensors at the same layer (or, for a stacked target of shape
   ``(L, ...)``, the L per-layer tensors of one name template), of the same kind (weight or
   bias), whose shapes a layout change can turn into the target's: the same shape, a
   transpose (``[out, in]`` -> ``[in, out]``), heads split or merged (a reshape, after a
   transpose if needed), one part of a fused ``qkv``/``gate_up`` tensor, or a stack of layers.
3. **It never guesses**: a target gets a tensor only when that tensor is the single best
   candidate; ties are *ambiguous* (candidates listed, ranked), no candidate is *unmatched*, and
   a tensor claimed by two targets is ambiguous for both. A square kernel's orientation follows
   the checkpoint's convention, read from its non-square kernels (PyTorch ``Linear`` is
   ``[out, in]``, GPT-2's ``Conv1D`` is ``[in, out]``).

``hints`` (explicit recipes) settle what the names cannot; every proposal is validated by
:func:`plan_restore` before it is returned.
"""

from __future__ import annotations

import dataclasses
import functools
import html
import itertools
import json
import math
import re
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src import plan as plan_lib
from paramreg_jax._src import source as source_lib
from paramreg_jax._src import target as target_lib
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.recipes import sets

# --- names -> concepts ----------------------------------------------------------------------

# Component sequences with a meaning of their own (applied first, longest first).
_PHRASES: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
  (("attention", "self"), ("attn",)),  # BERT/ViT: attention.self.query
  (("attention", "attention"), ("attn",)),  # ViT: attention.attention.query
  (("attention", "output", "dense"), ("attn", "o")),
  (("attention", "output", "layernorm"), ("attn", "norm")),
  (("intermediate", "dense"), ("mlp", "up")),
  (("output", "dense"), ("mlp", "down")),
  (("output", "layernorm"), ("mlp", "norm")),
  (("densereludense", "wi"), ("mlp", "up")),  # T5 v1.0
  (("densereludense", "wi_0"), ("mlp", "gate")),  # T5 v1.1
  (("densereludense", "wi_1"), ("mlp", "up")),
  (("densereludense", "wo"), ("mlp", "down")),
  (("patch_embeddings", "projection"), ("patch", "embed")),  # ViT
  (("attn", "c_attn"), ("attn", "qkv")),  # GPT-2 (Conv1D, [in, out])
  (("attn", "c_proj"), ("attn", "o")),
  (("mlp", "c_fc"), ("mlp", "up")),
  (("mlp", "c_proj"), ("mlp", "down")),
)

# One component -> concepts.
_WORDS: dict[str, tuple[str, ...]] = {
  # containers and noise
  **{w: ("layers",) for w in ("layers", "layer", "h", "block", "blocks", "encoder_layer")},
  **{w: () for w in ("model", "transformer", "bert", "vit", "self", "base_model", "params")},
  # parameter kinds
  **{w: ("w",) for w in ("weight", "kernel", "scale", "embedding", "gamma", "g")},
  **{w: ("b",) for w in ("bias", "beta")},
  # attention
  **{w: ("attn",) for w in ("attn", "attention", "self_attn", "self_attention", "selfattention")},
  **{w: ("xattn",) for w in ("xattn", "encdecattention", "cross_attn", "crossattention")},
  "encoder_attn": ("xattn",),
  "relative_attention_bias": ("relpos",),
  **{w: ("q",) for w in ("q", "q_proj", "query", "wq", "q_lin")},
  **{w: ("k",) for w in ("k", "k_proj", "key", "wk", "k_lin")},
  **{w: ("v",) for w in ("v", "v_proj", "value", "wv", "v_lin")},
  **{w: ("o",) for w in ("o", "o_proj", "out_proj", "out", "wo", "out_lin", "output_proj")},
  **{w: ("qkv",) for w in ("qkv", "qkv_proj", "c_attn", "query_key_value", "wqkv")},
  # mlp
  **{w: ("mlp",) for w in ("mlp", "ffn", "feed_forward", "feedforward", "densereludense")},
  **{w: ("gate",) for w in ("gate", "gate_proj", "w1")},
  **{w: ("up",) for w in ("up", "up_proj", "w3", "fc1", "fc_in", "c_fc")},
  **{w: ("down",) for w in ("down", "down_proj", "w2", "fc2", "fc_out")},
  **{w: ("gate_up",) for w in ("gate_up", "gate_up_proj")},
  # norms
  **{w: ("norm",) for w in ("norm", "layernorm", "layer_norm", "ln", "rmsnorm", "rms_norm")},
  "input_layernorm": ("attn", "norm"),
  "post_attention_layernorm": ("mlp", "norm"),  # Llama: the norm before the MLP
  "pre_feedforward_layernorm": ("mlp", "norm"),
  "post_feedforward_layernorm": ("mlp", "post", "norm"),
  "layernorm_before": ("attn", "norm"),
  "layernorm_after": ("mlp", "norm"),
  "attn_norm": ("attn", "norm"),
  "xattn_norm": ("xattn", "norm"),
  "attention_norm": ("attn", "norm"),
  "mlp_norm": ("mlp", "norm"),
  "ffn_norm": ("mlp", "norm"),
  "ln_1": ("attn", "norm"),
  "ln_2": ("mlp", "norm"),
  "ln_f": ("final", "norm"),
  "final_norm": ("final", "norm"),
  "final_layernorm": ("final", "norm"),
  "final_layer_norm": ("final", "norm"),
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
      "shared",
    )
  },
  **{w: ("pos", "embed") for w in ("wpe", "position_embeddings", "pos_embed", "pos_embedding")},
  "token_type_embeddings": ("type", "embed"),
  **{w: ("head",) for w in ("lm_head", "head", "output_layer", "unembed")},
}

_CONTAINER_INDEX = re.compile(r"^(layers|layer|h|block|blocks)_(\d+)$")  # linen: layers_3


_T5_SUBLAYER = re.compile(r"(^|\.)(encoder|decoder)\.block\.(\d+)\.layer\.(\d+)\.")
# T5 numbers the sublayers of a block: what sublayer j is depends on the stack
_T5_ROLES = {"encoder": ("attn", "mlp"), "decoder": ("attn", "xattn", "mlp")}


def _t5_sublayer(name: str) -> str:
  """``encoder.block.3.layer.1.layer_norm`` -> ``encoder.block.3.mlp_norm`` (T5's sublayer
  number is a role, not a layer)."""
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


@dataclasses.dataclass(frozen=True)
class Concepts:
  """A name folded to concepts: ``tokens`` (a set), the layer ``indices`` in order, ``kind``."""

  name: str
  tokens: frozenset[str]
  indices: tuple[int, ...]
  kind: str  # "w", "b", or "" (other)

  def similarity(self, other: Concepts) -> float:
    union = self.tokens | other.tokens
    return len(self.tokens & other.tokens) / len(union) if union else 0.0


def concepts(name: str) -> Concepts:
  """Folds a checkpoint key or a target name to concepts.

  Examples:
    >>> from paramreg_jax._src.match import concepts
    >>> c = concepts("model.layers.3.self_attn.q_proj.weight")
    >>> sorted(c.tokens), c.indices, c.kind
    (['attn', 'layers', 'q', 'w'], (3,), 'w')
    >>> sorted(concepts("layers_3/attn/q/kernel").tokens) == sorted(c.tokens)
    True
  """
  parts: list[str] = []
  indices: list[int] = []
  name = _t5_sublayer(name)
  for raw in re.split(r"[./]", name.strip("./")):
    word = raw.lower()
    m = _CONTAINER_INDEX.match(word)
    if m:
      parts.append(m.group(1))
      indices.append(int(m.group(2)))
    elif word.isdigit():
      indices.append(int(word))
    elif word:
      parts.append(word)
  i, folded = 0, list[str]()
  while i < len(parts):
    for phrase, meaning in _PHRASES:
      if tuple(parts[i : i + len(phrase)]) == phrase:
        folded.extend(meaning)
        i += len(phrase)
        break
    else:
      folded.append(parts[i])
      i += 1
  tokens: list[str] = []
  for word in folded:
    if word in _WORDS:
      tokens.extend(_WORDS[word])
    elif word in ("attn", "o", "qkv", "up", "down", "mlp", "norm"):  # phrase results
      tokens.append(word)
    else:  # attn_out, type_embed, proj_0: fold each part
      tokens.extend(t for sub in word.split("_") if sub for t in _WORDS.get(sub, (sub,)))
  kind = tokens[-1] if tokens and tokens[-1] in ("w", "b") else ""
  if not indices and set(tokens) <= {"norm", "w", "b"} and "norm" in tokens:
    tokens.append("final")  # model.norm.weight: the final norm
  return Concepts(name, frozenset(tokens), tuple(indices), kind)


# --- layouts ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Proposal:
  """One target parameter's proposed recipe and why."""

  target: str
  recipe: ops.Recipe | None
  reason: str
  keys: tuple[str, ...]
  alias_of: str | None = None


def _reshapes(src: tuple[int, ...], dst: tuple[int, ...]) -> bool:
  """Whether a row-major reshape ``src -> dst`` only splits or merges adjacent axes."""
  if math.prod(src) != math.prod(dst):
    return False
  a = set(itertools.accumulate(src, lambda x, y: x * y))
  b = set(itertools.accumulate(dst, lambda x, y: x * y))
  return a <= b or b <= a


def _layouts(src: tuple[int, ...], dst: tuple[int, ...], linear: bool) -> list[tuple[str, Any]]:
  """The ways ``src`` becomes ``dst``: ``[(reason, recipe builder)]`` (``"t"`` = transposed)."""
  out: list[tuple[str, Any]] = []
  if src == dst:
    out.append(("same", lambda r: r))
  if len(src) == 4 and dst == (src[2], src[3], src[1], src[0]) and src != dst:
    out.append(("conv", lambda r: ops.transpose(r, (2, 3, 1, 0))))  # OIHW -> HWIO
  if linear and len(src) == 2 and src[::-1] == dst:
    out.append(("t", lambda r: ops.transpose(r, (1, 0))))
  if len(src) == 2 and src != dst and src[::-1] != dst:
    if _reshapes(src[::-1], dst):
      out.append(("t+heads", lambda r: ops.reshape(ops.transpose(r, (1, 0)), dst)))
    if _reshapes(src, dst):
      out.append(("heads", lambda r: ops.reshape(r, dst)))
  elif len(src) != 2 and src != dst and _reshapes(src, dst):
    out.append(("heads", lambda r: ops.reshape(r, dst)))
  return out


def _is_linear(c: Concepts, shape: tuple[int, ...]) -> bool:
  """A 2-D weight that multiplies (so its orientation matters); not a lookup table or a norm."""
  return c.kind == "w" and len(shape) == 2 and not c.tokens & {"embed", "norm", "relpos"}


# --- the result ------------------------------------------------------------------------------


class Match(sets.RecipeSet):
  """The proposed mapping: a :class:`RecipeSet` (pass it as ``recipes=``) that explains itself.

  Attributes:
    proposals: one :class:`Proposal` per target parameter, in target order.
    ignored_keys: checkpoint keys no target parameter needs (``restore`` skips them).

  Examples:
    >>> import jax, numpy as np
    >>> import paramreg_jax as prj
    >>> from paramreg_jax.sources import MemorySource
    >>> src = MemorySource({"attn.q_proj.weight": np.zeros((4, 2), np.float32), "step": np.zeros((), np.int32)})
    >>> m = prj.match({"attn": {"q": {"kernel": jax.ShapeDtypeStruct((2, 4), np.float32)}}}, src)
    >>> dict(m), m.ignored_keys
    ({'attn/q/kernel': Transpose(input=Source(key='attn.q_proj.weight', selection=Full()), axes=(1, 0))}, ('step',))
    >>> m.rows()
    [('attn/q/kernel', "transpose(source('attn.q_proj.weight'), (1, 0))", 'name + transpose')]
  """

  def __init__(self, proposals: list[Proposal], ignored_keys: Iterable[str], source: Any):
    self.proposals = tuple(proposals)
    self.source = source
    outputs = {p.target: p.recipe for p in proposals if p.recipe is not None}
    aliases = {p.target: str(p.alias_of) for p in proposals if p.alias_of is not None}
    super().__init__(outputs, aliases=aliases, ignore=ignored_keys)

  def __repr__(self) -> str:
    return f"Match({len(self.proposals)} parameters from {self.source!r}; print() it for the table)"

  def rows(self) -> list[tuple[str, str, str]]:
    """``(target, checkpoint expression, reason)`` per parameter."""
    return [
      (p.target, f"alias of {p.alias_of}" if p.alias_of else str(p.recipe), p.reason)
      for p in self.proposals
    ]

  def __str__(self) -> str:
    rows = self.rows()
    width = max((len(t) for t, _, _ in rows), default=0)
    lines = [f"Match: {len(rows)} parameters from {self.source!r}"]
    lines += [f"  {t:<{width}}  <- {expr}   [{why}]" for t, expr, why in rows]
    if self.ignored_keys:
      shown = ", ".join(self.ignored_keys[:6]) + (", ..." if len(self.ignored_keys) > 6 else "")
      lines.append(f"  not used: {shown}")
    return "\n".join(lines)

  def _repr_html_(self) -> str:
    body = "".join(
      f"<tr><td><code>{html.escape(t)}</code></td><td><code>{html.escape(e)}</code></td>"
      f"<td>{html.escape(w)}</td></tr>"
      for t, e, w in self.rows()
    )
    return (
      f"<p>Match: {len(self.proposals)} parameters</p><table><tr><th>target</th>"
      f"<th>checkpoint</th><th>why</th></tr>{body}</table>"
    )

  def to_python(self, name: str = "recipes") -> str:
    """Equivalent hand-written code (pin it in your repository).

    Examples:
      >>> import jax, numpy as np
      >>> import paramreg_jax as prj
      >>> from paramreg_jax.sources import MemorySource
      >>> src = MemorySource({"fc.weight": np.zeros((3, 2), np.float32)})
      >>> m = prj.match({"fc": {"kernel": jax.ShapeDtypeStruct((2, 3), np.float32)}}, src)
      >>> print(m.to_python())
      import paramreg_jax as prj
      from paramreg_jax import recipes as R
      <BLANKLINE>
      recipes = R.RecipeSet(
        {
          "fc/kernel": R.transpose(R.source('fc.weight'), (1, 0)),
        },
        aliases={},
      )
    """
    lines = [
      "import paramreg_jax as prj",
      "from paramreg_jax import recipes as R",
      "",
      f"{name} = R.RecipeSet(",
      "  {",
    ]
    for p in self.proposals:
      if p.recipe is not None:
        lines.append(f"    {json.dumps(p.target)}: {_code(p.recipe)},")
    lines.append("  },")
    aliases = {p.target: p.alias_of for p in self.proposals if p.alias_of}
    lines.append(f"  aliases={aliases!r},")
    if self.ignored_keys:
      lines.append(f"  ignore={list(self.ignored_keys)!r},")
    lines.append(")")
    return "\n".join(lines)


def _layer_loop(codes: list[str]) -> str | None:
  """``[<code of layer i> for i in range(n)]`` when the codes differ only in the layer number
  of their checkpoint keys (``.3.``, ``/3/``, ``_3.``), else None."""
  for sep_l, sep_r in ((".", "."), ("/", "/"), ("_", "."), ("_", "/")):
    template = codes[0].replace(f"{sep_l}0{sep_r}", f"{sep_l}{{i}}{sep_r}")
    if template == codes[0]:
      continue
    if all(template.replace("{i}", str(i)) == c for i, c in enumerate(codes)):
      in_keys = sum(k.count("{i}") for k in re.findall(r"R\.source\('([^']*)'", template))
      if in_keys == template.count("{i}"):  # the number only ever varies inside the keys
        loop = template.replace("R.source('", "R.source(f'")
        return f"[{loop} for i in range({len(codes)})]"
  return None


def _code(r: ops.Recipe) -> str:
  """Python source that builds ``r`` with ``paramreg_jax.recipes as R``."""
  if isinstance(r, ops.Source):
    sel = r.selection
    if isinstance(sel, ops.sel_lib.Range):
      return f"R.source({r.key!r}, prj.Range({sel.axis}, {sel.start}, {sel.stop}))"
    return f"R.source({r.key!r})"
  if isinstance(r, ops.Transpose):
    return f"R.transpose({_code(r.input)}, {r.axes})"
  if isinstance(r, ops.Reshape):
    return f"R.reshape({_code(r.input)}, {r.shape})"
  if isinstance(r, ops.Stack):
    codes = [_code(x) for x in r.inputs]
    loop = _layer_loop(codes)
    inner = loop or "[" + ", ".join(codes) + "]"
    return f"R.stack({inner}, axis={r.axis})"
  if isinstance(r, ops.Concatenate):
    return "R.concatenate([" + ", ".join(_code(x) for x in r.inputs) + f"], axis={r.axis})"
  if isinstance(r, ops.Cast):
    return f"R.cast({_code(r.input)}, {r.dtype.name!r})"
  raise TypeError(f"match does not emit {type(r).__name__}")


# --- matching --------------------------------------------------------------------------------


@dataclasses.dataclass
class _Checkpoint:
  """The checkpoint as ``match`` sees it: every key's concepts and shape, grouped once."""

  concepts: dict[str, Concepts]
  shapes: dict[str, tuple[int, ...]]
  convention: str | None = None  # of its linear weights: "t" ([out, in]), "same", or unknown

  @functools.cached_property
  def by_layer(self) -> dict[tuple[int, ...], list[str]]:
    """Keys by their layer numbers (``()`` for keys outside the layers)."""
    out: dict[tuple[int, ...], list[str]] = {}
    for k, c in self.concepts.items():
      out.setdefault(c.indices, []).append(k)
    return out

  @functools.cached_property
  def layer_templates(self) -> dict[tuple[frozenset[str], str], dict[int, str]]:
    """``{(concepts, kind): {layer: key}}`` of the per-layer tensors (one name template each)."""
    out: dict[tuple[frozenset[str], str], dict[int, str]] = {}
    for k, c in self.concepts.items():
      if len(c.indices) == 1 and "layers" in c.tokens:
        out.setdefault((c.tokens, c.kind), {})[c.indices[0]] = k
    return out

  @functools.cached_property
  def single_layer_keys(self) -> list[str]:
    """Keys whose name template occurs in one layer only (T5's relative position bias)."""
    templates: dict[tuple[frozenset[str], str], list[str]] = {}
    for k, c in self.concepts.items():
      if c.indices:
        templates.setdefault((c.tokens, c.kind), []).append(k)
    return [ks[0] for ks in templates.values() if len(ks) == 1]


@dataclasses.dataclass
class _Candidate:
  score: float
  keys: tuple[str, ...]
  reason: str
  build: Any  # () -> recipe
  # (key, axis) of a fused tensor this is a part of; (layer keys, axis) when stacked
  fused: tuple[str | tuple[str, ...], int] | None = None


def match(target: Any, source: Any, *, hints: Mapping[str, Any] | None = None) -> Match:
  """Proposes the complete recipe set that restores ``target`` from ``source``, from metadata.

  Args:
    target: an abstract tree, linen params, an ``nnx.State``/``nnx.Module`` or an equinox
      module (as :func:`plan_restore` takes).
    source: a checkpoint source (``SafetensorsSource``, ``OrbaxSource``, ...).
    hints: ``{target name: recipe}`` for what names and shapes cannot settle (they win, and
      their checkpoint keys are not offered to other parameters).

  Returns:
    A :class:`Match`: ``restore(target, source, recipes=match(...))`` works; ``print`` it for
    the table, ``.to_python()`` for the code.

  Raises:
    MatchError: some parameters are unmatched or ambiguous (each listed with its ranked
      candidates; ``.partial`` holds what was matched), or the proposal does not plan.

  Examples:
    >>> import jax, numpy as np
    >>> import paramreg_jax as prj
    >>> from paramreg_jax.sources import MemorySource
    >>> src = MemorySource({f"model.layers.{i}.mlp.up_proj.weight": np.zeros((8, 4), np.float32)
    ...                     for i in range(3)})
    >>> target = {"layers": {"mlp": {"up": {"kernel": jax.ShapeDtypeStruct((3, 4, 8), np.float32)}}}}
    >>> print(prj.match(target, src))
    Match: 1 parameters from MemorySource(3 tensors)
      layers/mlp/up/kernel  <- stack(3 × transpose(source('model.layers.{i}.mlp.up_proj.weight'), (1, 0)), axis=0)   [name + transpose, stacked 3 layers]
  """
  source_lib.check_source(source, "match")
  _, _, slots = target_lib.slots(target)
  if not slots:
    raise errors.MatchError(
      f"match: the target holds no array parameters (got {type(target).__name__} "
      f"{target!r:.60}); pass an abstract tree (jax.eval_shape or nnx.eval_shape output), "
      "linen params, an nnx.State or nnx.Module, or an equinox module"
    )
  hints = {str(k).removeprefix("n:"): v for k, v in (hints or {}).items()}
  names = [s.name for s in slots]
  unknown = [h for h in hints if h not in set(names)]
  if unknown:
    raise errors.MatchError(
      "hints name parameters the target does not have: "
      + "; ".join(f"{h!r}{errors.did_you_mean(h, names)}" for h in unknown),
      tuple(unknown),
    )
  by_name = {s.name: s for s in slots}
  bad_hints = []
  for name, recipe in hints.items():  # a hint is the user's own recipe: checked as one, now
    try:
      meta = ops.infer(ops._check_recipe(recipe, f"hint for {name!r}"), source)
    except errors.RecipeError as e:
      bad_hints.append(f"hint for {name!r}: {e}")
      continue
    slot = by_name[name]
    if (meta.shape, meta.dtype) != (tuple(slot.shape), np.dtype(slot.dtype)):
      bad_hints.append(
        f"hint for {name!r}: {recipe} produces {meta}, the parameter is "
        f"{tuple(slot.shape)} {np.dtype(slot.dtype).name}"
      )
  if bad_hints:
    raise errors.MatchError(
      errors.collected("use the hints", bad_hints, "nothing was chosen"), tuple(bad_hints)
    )
  hinted_keys = {k for r in hints.values() for k in ops.source_keys(r)}
  src_concepts = {
    k: concepts(k) for k in source.keys() if k not in hinted_keys
  }  # every checkpoint key, folded once
  _gemma2_norms(src_concepts)
  ck = _Checkpoint(src_concepts, {k: tuple(source.metadata(k).shape) for k in src_concepts})
  ck.convention = _linear_convention(slots, ck)
  proposals: dict[str, Proposal] = {}
  ranked: dict[str, list[_Candidate]] = {}
  for slot in slots:
    if slot.name in hints:
      recipe = ops._check_recipe(hints[slot.name], f"hint for {slot.name!r}")
      proposals[slot.name] = Proposal(slot.name, recipe, "hint", ops.source_keys(recipe))
      continue
    ranked[slot.name] = _candidates(concepts(slot.name), tuple(slot.shape), ck)
  problems = _choose(slots, ranked, proposals, ck.shapes)
  _tie_heads(slots, ranked, proposals, problems)
  _cast_to_targets(slots, proposals, source)
  used = {k for p in proposals.values() for k in p.keys} | hinted_keys
  ordered = [proposals[s.name] for s in slots if s.name in proposals]
  ignored = [k for k in source.keys() if k not in used]
  extra = sorted(
    {src_concepts[k].indices for k in ignored if k in src_concepts and src_concepts[k].indices}
  )
  if extra and not problems:
    layer_keys = [k for k in ignored if k in src_concepts and src_concepts[k].indices]
    problems.append(
      f"the checkpoint has layer tensors the target does not use ({len(layer_keys)}, at "
      f"{', '.join(str(list(i)) for i in extra[:6])}): {', '.join(layer_keys[:4])}"
      f"{', ...' if len(layer_keys) > 4 else ''}; a model with fewer layers than the "
      "checkpoint? Pass the unused ones as hints or restore into the full model"
    )
  result = Match(ordered, ignored, source)
  if problems:
    raise errors.MatchError(
      errors.collected("match the checkpoint to the target", problems, "nothing was chosen")
      + "\nResolve each with hints={target name: recipe} (or rename the target's modules).",
      tuple(problems),
      result,
    )
  try:
    plan_lib.plan_restore(target, source, recipes=result)
  except errors.RestorePlanError as e:
    raise errors.MatchError(
      f"the proposed mapping does not plan (a bug in match, or a checkpoint it misreads): {e}",
      e.problems,
      result,
    ) from e
  return result


def _gemma2_norms(src: dict[str, Concepts]) -> None:
  """Gemma 2/3 normalise both sides of each sublayer: there ``post_attention_layernorm`` is the
  attention's *post*-norm (``pre_feedforward_layernorm`` is the MLP's), while in Llama it is
  the norm before the MLP. The checkpoint itself says which: it has ``pre_feedforward``."""
  if not any("pre_feedforward_layernorm" in k for k in src):
    return
  for k, c in src.items():
    if "post_attention_layernorm" in k:
      tokens = (c.tokens - {"mlp"}) | {"attn", "post"}
      src[k] = dataclasses.replace(c, tokens=frozenset(tokens))


def _cast_to_targets(slots: list[Any], proposals: dict[str, Proposal], source: Any) -> None:
  """A stored dtype other than the parameter's becomes an explicit, reported cast."""
  for slot in slots:
    p = proposals.get(slot.name)
    if p is None or p.recipe is None or p.reason == "hint":
      continue
    want = np.dtype(slot.dtype)
    if ops.infer(p.recipe, source).dtype != want:
      recipe = ops.cast(p.recipe, want)
      proposals[slot.name] = dataclasses.replace(
        p, recipe=recipe, reason=f"{p.reason}, cast to {want.name}"
      )


def _linear_convention(slots: list[Any], ck: _Checkpoint) -> str | None:
  """``"t"`` if the checkpoint's non-square linear weights are the transpose of the target's
  (PyTorch ``[out, in]``), ``"same"`` if they match as stored (``Conv1D``), None if unknown."""
  votes = {"t": 0, "same": 0}
  for slot in slots:
    tc = concepts(slot.name)
    shape, indices = tuple(slot.shape), tc.indices
    if not indices and "layers" in tc.tokens and len(shape) == 3:
      shape, indices = shape[1:], (0,)  # a stacked kernel: compare with layer 0
    if not _is_linear(tc, shape) or shape[0] == shape[1]:
      continue
    for k in ck.by_layer.get(indices, ()):
      sc, sshape = ck.concepts[k], ck.shapes[k]
      if not _is_linear(sc, sshape) or sc.similarity(tc) < 0.75:
        continue
      if sshape == shape:
        votes["same"] += 1
      elif sshape[::-1] == shape:
        votes["t"] += 1
  if votes["t"] and not votes["same"]:
    return "t"
  if votes["same"] and not votes["t"]:
    return "same"
  return None


def _candidates(tc: Concepts, shape: tuple[int, ...], ck: _Checkpoint) -> list[_Candidate]:
  out = []
  # one tensor per target (same layer)
  for k in ck.by_layer.get(tc.indices, ()):
    out.extend(_single(tc, shape, k, ck))
  # a tensor that only one layer has (T5's relative position bias) may sit outside the layers
  if not tc.indices:
    for k in ck.single_layer_keys:
      out.extend(_single(tc, shape, k, ck))
  # a fused target (qkv, gate_up) from its separate parts
  out.extend(_joined(tc, shape, ck.by_layer.get(tc.indices, []), ck))
  # a stacked target: (L, ...) from the L per-layer tensors of one name template
  if not tc.indices and "layers" in tc.tokens and len(shape) >= 2:
    out.extend(_stacked(tc, shape, ck))
    out.extend(_stacked_joined(tc, shape, ck))
  out.sort(key=lambda c: -c.score)
  return out


_FUSED_PARTS = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}


def _joined(
  tc: Concepts, shape: tuple[int, ...], keys: Iterable[str], ck: _Checkpoint
) -> list[_Candidate]:
  """A fused target (``qkv``, ``gate_up``) as the concatenation of its separate parts."""
  fused = next((f for f in _FUSED_PARTS if f in tc.tokens), None)
  if fused is None or len(shape) not in (1, 2):
    return []
  base = tc.tokens - {fused}
  chosen, scores = [], []
  for part in _FUSED_PARTS[fused]:
    want = Concepts("", base | {part}, (), tc.kind)
    src = ck.concepts
    ranked = sorted(
      (
        (want.similarity(src[k]), k)
        for k in keys
        if src[k].kind == tc.kind and src[k].tokens & set(_FUSED_PARTS[fused]) == {part}
      ),
      reverse=True,
    )
    if not ranked or (len(ranked) > 1 and ranked[0][0] == ranked[1][0]):
      return []
    scores.append(ranked[0][0])
    chosen.append(ranked[0][1])
  shapes = [ck.shapes[k] for k in chosen]
  transpose = len(shape) == 2 and ck.convention == "t"
  if len(shape) == 1:
    if any(len(s) != 1 for s in shapes) or sum(s[0] for s in shapes) != shape[0]:
      return []
  else:
    if ck.convention is None or any(len(s) != 2 for s in shapes):
      return []
    outs = [s[0] if transpose else s[1] for s in shapes]
    ins = {s[1] if transpose else s[0] for s in shapes}
    if ins != {shape[0]} or sum(outs) != shape[1]:
      return []

  def build() -> ops.Recipe:
    parts: list[ops.Recipe] = [ops.source(k) for k in chosen]
    if transpose:
      parts = [ops.transpose(p, (1, 0)) for p in parts]
    return ops.concatenate(parts, axis=len(shape) - 1)

  score = sum(scores) / len(scores)
  return [_Candidate(score, tuple(chosen), f"joined {'+'.join(_FUSED_PARTS[fused])}", build)]


def _stacked_joined(tc: Concepts, shape: tuple[int, ...], ck: _Checkpoint) -> list[_Candidate]:
  """A stacked fused target: layer 0's joined parts, repeated for every layer."""
  layers = shape[0]
  per_layer = Concepts(tc.name, tc.tokens, (), tc.kind)
  firsts = _joined(per_layer, shape[1:], ck.by_layer.get((0,), []), ck)
  if not firsts:
    return []
  first = firsts[0]
  src = ck.concepts
  template = {src[k].tokens: k for k in first.keys}
  keys_by_layer = []
  for i in range(layers):
    at = {src[k].tokens: k for k in ck.by_layer.get((i,), []) if src[k].kind == tc.kind}
    if not all(t in at for t in template):
      return []
    keys_by_layer.append([at[t] for t in template])
  zero = first.build()

  def build() -> ops.Recipe:
    layer_recipes = []
    for keys in keys_by_layer:
      r = zero
      for old, new in zip(first.keys, keys):
        r = _rekey(r, old, new)
      layer_recipes.append(r)
    return ops.stack(layer_recipes, axis=0)

  all_keys = tuple(k for keys in keys_by_layer for k in keys)
  reason = f"{first.reason}, stacked {layers} layers"
  return [_Candidate(first.score, all_keys, reason, build)]


def _single(tc: Concepts, shape: tuple[int, ...], key: str, ck: _Checkpoint) -> list[_Candidate]:
  sc, sshape, convention = ck.concepts[key], ck.shapes[key], ck.convention
  if sc.kind != tc.kind:
    return []
  out = []
  score = tc.similarity(sc)
  for how, build in _layouts(sshape, shape, _is_linear(sc, sshape)):
    if _oriented(how, convention, tc, sc, sshape):
      out.append(_Candidate(score, (key,), _REASONS[how], lambda b=build: b(ops.source(key))))
  # one part of a fused tensor (qkv, gate_up): the target's own concept stands for the fused one
  part = tc.tokens & {"q", "k", "v", "gate", "up"}
  fused = "qkv" if part & {"q", "k", "v"} else "gate_up"
  if len(part) == 1 and fused in sc.tokens and len(sshape) in (1, 2):
    rest_t = Concepts("", tc.tokens - part, (), "")
    score = rest_t.similarity(Concepts("", sc.tokens - {fused}, (), ""))
    axis = 1 if len(sshape) == 2 and convention == "same" else 0
    if len(sshape) == 1 or convention is not None:  # a weight's fused axis needs the convention
      out.append(_Candidate(score, (key,), f"part of fused {fused}", None, fused=(key, axis)))
  return out


_REASONS = {
  "same": "name",
  "t": "name + transpose",
  "heads": "name + heads reshaped",
  "t+heads": "name + transpose + heads reshaped",
  "conv": "name + conv kernel OIHW -> HWIO",
}


def _oriented(
  how: str, convention: str | None, tc: Concepts, sc: Concepts, src: tuple[int, ...]
) -> bool:
  """Whether a layout fits the checkpoint's orientation of linear weights."""
  if not (_is_linear(sc, src) and _is_linear(tc, (0, 0))):
    return how in ("same", "heads", "conv")
  if convention is None:
    return True  # both offered: a square kernel is then ambiguous, never guessed
  transposed = how.startswith("t")
  return transposed == (convention == "t")


def _stacked(tc: Concepts, shape: tuple[int, ...], ck: _Checkpoint) -> list[_Candidate]:
  out = []
  layers = shape[0]
  per_layer = Concepts(tc.name, tc.tokens, (), tc.kind)
  for (_, kind), by_index in ck.layer_templates.items():
    if kind != tc.kind or sorted(by_index) != list(range(layers)):
      continue
    keys = [by_index[i] for i in range(layers)]
    for single in _single(per_layer, shape[1:], keys[0], ck):
      if single.fused is not None:
        out.append(
          _Candidate(
            single.score, tuple(keys), single.reason, None, fused=(tuple(keys), single.fused[1])
          )
        )
        continue
      first = single.build()

      def build(first: ops.Recipe = first, keys: list[str] = keys) -> ops.Recipe:
        return ops.stack([_rekey(first, keys[0], k) for k in keys], axis=0)

      out.append(
        _Candidate(single.score, tuple(keys), f"{single.reason}, stacked {layers} layers", build)
      )
  return out


def _rekey(recipe: ops.Recipe, old: str, new: str) -> ops.Recipe:
  if isinstance(recipe, ops.Source):
    return ops.Source(new, recipe.selection) if recipe.key == old else recipe
  fields = {}
  for f in dataclasses.fields(recipe):  # type: ignore[arg-type]
    value = getattr(recipe, f.name)
    if isinstance(value, ops.Recipe):
      value = _rekey(value, old, new)
    elif isinstance(value, tuple) and value and isinstance(value[0], ops.Recipe):
      value = tuple(_rekey(v, old, new) for v in value)
    fields[f.name] = value
  return type(recipe)(**fields)


_MIN_SCORE = 0.5


def _choose(
  slots: list[Any],
  ranked: dict[str, list[_Candidate]],
  proposals: dict[str, Proposal],
  source_shapes: dict[str, tuple[int, ...]],
) -> list[str]:
  """Picks each target's single best candidate; records every unmatched or ambiguous one."""
  problems: list[str] = []
  picked: dict[str, _Candidate] = {}
  for slot in slots:
    cands = [c for c in ranked.get(slot.name, []) if c.score >= _MIN_SCORE]
    if slot.name in proposals:
      continue
    if not cands:
      continue  # maybe a tied head; decided in _tie_heads
    best = cands[0]
    rivals = [c for c in cands[1:] if c.score == best.score and c.keys != best.keys]
    same_keys = [
      c
      for c in cands[1:]
      if c.score == best.score and c.keys == best.keys and c.reason != best.reason
    ]
    if rivals or same_keys:
      shown = "; ".join(f"{_shown(c)} ({c.score:.2f})" for c in [best, *rivals, *same_keys][:4])
      problems.append(f"{slot.name}: ambiguous between {shown}")
      continue
    picked[slot.name] = best
  # fused parts: the targets sharing one fused tensor split it in their target order
  groups: dict[str | tuple[str, ...], list[str]] = {}
  for name, cand in picked.items():
    if cand.fused is not None:
      groups.setdefault(cand.fused[0], []).append(name)
  shapes = {s.name: tuple(s.shape) for s in slots}
  for group, names in groups.items():
    axis = picked[names[0]].fused[1]  # type: ignore[index]
    problem = _split_fused(group, axis, names, shapes, source_shapes, proposals)
    if problem:
      problems.append(problem)
  # a checkpoint key is never used by two targets
  owners: dict[str, list[str]] = {}
  for name, cand in picked.items():
    if cand.fused is None:
      for k in cand.keys:
        owners.setdefault(k, []).append(name)
  clashes = {k: ns for k, ns in owners.items() if len(ns) > 1}
  for name, cand in picked.items():
    if cand.fused is not None:
      continue
    clash = sorted({n for k in cand.keys for n in clashes.get(k, ()) if n != name})
    if clash:
      problems.append(
        f"{name}: ambiguous: {_shown(cand)} is also the best match of {', '.join(clash)}"
      )
      continue
    proposals[name] = Proposal(name, cand.build(), cand.reason, cand.keys)
  return problems


def _split_fused(
  group: str | tuple[str, ...],
  axis: int,
  names: list[str],
  shapes: dict[str, tuple[int, ...]],
  source_shapes: dict[str, tuple[int, ...]],
  proposals: dict[str, Proposal],
) -> str | None:
  """Proposes consecutive ``Range`` parts of a fused tensor (or of each layer's, stacked) for
  ``names`` in q, k, v (gate, up) order; returns a problem if their widths do not tile it."""
  keys = (group,) if isinstance(group, str) else group
  stacked = not isinstance(group, str)
  order = {"q": 0, "k": 1, "v": 2, "gate": 0, "up": 1}
  names.sort(key=lambda n: min(order.get(t, 9) for t in concepts(n).tokens))
  stored = source_shapes[keys[0]]
  per_layer = {n: shapes[n][1:] if stacked else shapes[n] for n in names}
  # each part's width along the fused axis is its target's output size
  widths = [
    math.prod(per_layer[n]) if len(stored) == 1 else math.prod(per_layer[n][1:]) for n in names
  ]
  if sum(widths) != stored[axis]:
    return (
      f"{', '.join(names)}: parts of fused {keys[0]!r} {stored}, but their widths {widths} sum "
      f"to {sum(widths)}, not its axis {axis} ({stored[axis]}): a part is missing or misread"
    )
  start = 0
  for name, width in zip(names, widths):
    shape = per_layer[name]
    layers = []
    for key in keys:
      recipe: ops.Recipe = ops.source(key, ops.sel_lib.Range(axis, start, start + width))
      if len(stored) == 2 and axis == 0:  # [out, in] parts: transpose to [in, out]
        recipe = ops.transpose(recipe, (1, 0))
      natural = (width,) if len(stored) == 1 else (stored[1 - axis], width)
      if shape != natural:
        recipe = ops.reshape(recipe, shape)  # heads split
      layers.append(recipe)
    reason = f"part of fused {keys[0]!r}"
    if stacked:
      proposals[name] = Proposal(
        name, ops.stack(layers, axis=0), f"{reason}, stacked {len(keys)} layers", keys
      )
    else:
      proposals[name] = Proposal(name, layers[0], reason, keys)
    start += width
  return None


def _shown(c: _Candidate) -> str:
  if len(c.keys) > 2:
    return f"{c.keys[0]!r} .. {c.keys[-1]!r} ({len(c.keys)} layers)"
  return ", ".join(repr(k) for k in c.keys)


def _tie_heads(
  slots: list[Any],
  ranked: dict[str, list[_Candidate]],
  proposals: dict[str, Proposal],
  problems: list[str],
) -> None:
  """Targets left without a candidate: a head tied to the embedding, else unmatched."""
  embed = next(
    (
      s
      for s in slots
      if s.name in proposals
      and {"embed", "w"} <= concepts(s.name).tokens
      and not concepts(s.name).tokens & {"pos", "type"}
    ),
    None,
  )
  for slot in slots:
    if slot.name in proposals or any(slot.name in p for p in problems):
      continue
    tc = concepts(slot.name)
    if "head" in tc.tokens and tc.kind == "w" and embed is not None:
      eshape, shape = tuple(embed.shape), tuple(slot.shape)
      if shape == eshape:
        proposals[slot.name] = Proposal(slot.name, None, "tied to the embedding", (), embed.name)
        continue
      if shape == eshape[::-1]:
        owner = proposals[embed.name]
        recipe = ops.transpose(owner.recipe, (1, 0))  # type: ignore[arg-type]
        proposals[slot.name] = Proposal(
          slot.name, recipe, "tied to the embedding, transposed", owner.keys
        )
        continue
    near = ranked.get(slot.name, [])
    tied = [c for c in near if c.score == near[0].score] if near else []
    if len(tied) > 1:  # several fit the shape and none the name better than the others
      shown = "; ".join(f"{_shown(c)} ({c.reason})" for c in tied[:4])
      problems.append(
        f"{slot.name} {tuple(slot.shape)}: ambiguous: its name matches no checkpoint name, and "
        f"{len(tied)} tensors fit its shape equally: {shown}"
      )
      continue
    hint = (
      "; closest: " + "; ".join(f"{_shown(c)} ({c.score:.2f}, {c.reason})" for c in near[:3])
      if near
      else ""
    )
    problems.append(
      f"{slot.name} {tuple(slot.shape)}: unmatched: no checkpoint tensor at "
      f"{'layer ' + str(tc.indices) if tc.indices else 'this level'} fits its name and shape{hint}"
    )
