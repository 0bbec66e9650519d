"""Layer mismatch: where the checkpoint and the target hold different numbers of layers, the one
problem that says so, beside the leaves' own (a scanned checkpoint that stacks another number
of layers than the target has; layer tensors no leaf took)."""

from __future__ import annotations

from typing import Any

from paramreg_jax._src.match import evidence
from paramreg_jax._src.match import hints
from paramreg_jax._src.match import refusal
from paramreg_jax._src.match.vocabulary import concepts


def scanned(slots: list[Any], ck: evidence.Checkpoint, problems: list[str]) -> list[str]:
  """Where a scanned checkpoint stacks another number of layers than the target has of a
  refused leaf with no tensor of its layer: the one cause of those leaves' problems, said
  once, with the recipe that takes one layer of a stacked tensor."""
  if not ck.scanned or not problems:
    return []
  stacked = {n for _, n in ck.scanned}
  refused = {h for x in problems for h in refusal.heads(x)}
  off = sorted(
    s.name
    for s in slots
    if s.name in refused
    and len(concepts(s.name).indices) == 1
    and ck.target_layers.get(s.name, 0) not in stacked
  )
  if not off:
    return []
  key = next(k for k in ck.by_layer.get((), ()) if "layers" in ck.concepts[k].tokens)
  axis, layers = min(ck.scanned)
  stored = ck.shapes[key]
  item = stored[:axis] + stored[axis + 1 :]
  return [
    f"the checkpoint stacks its layers ({layers} on axis {axis}: {key!r} {stored}), the "
    f"target has {ck.target_layers[off[0]]} of {hints.layer_template(off[0])!r} "
    f"({len(off)} leaves refused for it): restore into a model of {layers} layers, or give "
    "each leaf its layer's slice of its tensor as a recipe hint, as for layer i of that "
    f"one: R.reshape(R.source({key!r}, prj.Range({axis}, i, i + 1)), {item})"
  ]


def unused(ignored: list[str], ck: evidence.Checkpoint) -> list[str]:
  """The checkpoint's layer tensors no leaf took (a model of fewer layers, or batch-norm
  statistics the target keeps nowhere), said once."""
  layer_keys = [k for k in ignored if k in ck.concepts and ck.concepts[k].indices]
  if not layer_keys:
    return []
  extra = sorted({ck.concepts[k].indices for k in layer_keys})
  if all(ck.concepts[k].tokens & {"mean", "var"} for k in layer_keys):
    return [
      f"the checkpoint has batch-norm statistics the target has no leaf for "
      f"({len(layer_keys)}): {', '.join(layer_keys[:4])}{', ...' if len(layer_keys) > 4 else ''}"
      "; a batch norm restored without them computes another function in inference: add them "
      "to the target where the model keeps them (flax's batch_stats collection beside params, "
      "{'params': ..., 'batch_stats': ...}; equinox's eqx.nn.State, as a tree of its arrays)"
    ]
  return [
    f"the checkpoint has layer tensors the target does not use ({len(layer_keys)}, at "
    f"{', '.join(str(list(i)) for i in extra[:6])}): {', '.join(layer_keys[:4])}"
    f"{', ...' if len(layer_keys) > 4 else ''}; a model with fewer layers than the "
    "checkpoint? Pass the unused ones as hints or restore into the full model"
  ]
