"""``match``: propose the recipes that restore a target from a foreign checkpoint.

From names, shapes and dtypes only (no payload read), ``match`` pairs every target parameter
with the checkpoint tensor(s) it comes from and derives the layout change. The package follows
the concept (data flows down the list):

1. ``vocabulary``: **names** become *concepts*: separators, layer and expert numbers and the
   model's own prefix are split off, and the field's vocabularies are folded (``q_proj``/
   ``query``/``wq`` -> ``q``, ``weight``/``kernel``/``scale``/``embedding`` -> ``w``,
   ``input_layernorm`` -> ``attn norm`` ...). Two names are compared by their overlap.
   ``unnumbered``: the target's names as read, haiku's unnumbered first layer (``block``
   beside ``block_1``) numbered 0; what ``match`` says names the target's own.
2. ``evidence``: what the checkpoint says about itself (``config.json``: model type, head
   counts, tied embeddings, fused layouts); ``axes``: how each target leaf keeps its axes
   next to the stored tensor's (``[in, out]`` or ``[out, in]``), from the config and the
   target's own shapes; ``stacks``: which target subtrees stack the checkpoint's layers, on
   which axis, and every way stacks that split the layers may hold them (``shares``
   chooses one, or asks).
3. ``candidates``: the tensors a layout change can turn into each target: one tensor in a
   reading ``layouts`` allows its orientation (the same shape, a transpose, heads split or
   merged, a conv kernel), one part of a fused tensor, the parts joined, each stacked over
   layers (and experts).
4. ``decide`` (with ``coherence``): **it never guesses**. A target gets a tensor only when
   that tensor is its single best candidate, or its decided siblings (one target module comes
   from one checkpoint module) or the other layers (a choice holds in every layer) single it
   out; a fused tensor is split only in a layout known for that checkpoint; a head is tied
   only on evidence; conflicting evidence refuses, listing every candidate, never a pick.
   ``fused`` splits a fused tensor only in its known layout; ``order`` pairs numbered
   siblings in call order; ``closure`` pairs the last leaves of a layer with its last
   tensors where only one pairing exists.
5. ``report``: the :class:`Match` (a ``RecipeSet``): table, HTML, facts, ``to_python``;
   ``refusal``: what was not decided, one question per concept, as a ``hints = {...}``
   literal to uncomment and as data on the ``MatchError``; ``layer_mismatch``: where the
   checkpoint and the target hold different numbers of layers, said once.

``hints`` (``hints.py``) settle what the evidence cannot, each only the leaf it names.

Every proposal is validated by :func:`plan_restore` before it is returned.
"""

from paramreg_jax._src.match.proposal import Match
from paramreg_jax._src.match.proposal import Proposal
from paramreg_jax._src.match.propose import match
from paramreg_jax._src.match.vocabulary import Concepts
from paramreg_jax._src.match.vocabulary import concepts

__all__ = ["Concepts", "Match", "Proposal", "concepts", "match"]
