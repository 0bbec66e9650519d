"""``match`` into a quantized target: a module's integer values, scales and minimums are one
weight.

A model that holds a GGUF at its quantized size keeps, per weight, integer ``values`` of the
weight's shape, and float ``scales`` (and, for Q2_K/Q4_K/Q5_K, ``mins``) with one entry per
group of consecutive values along one axis: ``x = scales * values [- mins]``. ``match``
decides such a module as one float weight of the values' shape, as it decides any weight
(names, shapes, orientation, stacking, q/k rows), then reads each part from the blocks
(:func:`~paramreg_jax.recipes.block_values`, ``block_scales``, ``block_mins``) through the same
transposes and stacking. A weight the checkpoint does not store in a kept block format, a
format whose groups are not the target's, or a layout that moves values within a group is
refused for the leaves it concerns, never approximated.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from paramreg_jax._src.match.proposal import Proposal
from paramreg_jax._src.recipes import inference
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.recipes.ops import block_part
from paramreg_jax._src.recipes.quant import formats as quant_formats
from paramreg_jax._src.restore import target as target_lib
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource

_SCALE = re.compile(r"scale", re.I)
_MIN = re.compile(r"(^|_)min", re.I)
_WEIGHT_LEAVES = frozenset({"kernel", "weight", "w"})
_SUB_BYTE = frozenset({"int2", "uint2", "int4", "uint4"})  # ml_dtypes' integers (kind "V")


@dataclasses.dataclass(frozen=True)
class Group:
  """One quantized weight of the target: its parts, the axis its groups run along, their
  size, and the float weight ``match`` decides in their place."""

  values: target_lib.TargetSlot
  scales: target_lib.TargetSlot
  mins: target_lib.TargetSlot | None
  axis: int
  group: int
  weight: target_lib.TargetSlot


def is_integer(dtype: np.dtype) -> bool:
  return dtype.kind in "iu" or dtype.name in _SUB_BYTE


def collapse(
  slots: list[target_lib.TargetSlot],
) -> tuple[list[target_lib.TargetSlot], dict[str, Group]]:
  """The slots with each quantized weight's parts replaced by one float weight, and the
  groups by the weight's name (empty for a target with no integer leaves)."""
  by_parent: dict[str, list[target_lib.TargetSlot]] = {}
  for s in slots:
    by_parent.setdefault(s.name.rpartition("/")[0], []).append(s)
  groups: dict[str, Group] = {}
  for parent, members in by_parent.items():
    found = _group(parent, members)
    if found is not None:
      groups[found.weight.name] = found
  if not groups:
    return slots, {}
  parts = {s.name: g for g in groups.values() for s in (g.values, g.scales, g.mins) if s}
  out = []
  for s in slots:
    g = parts.get(s.name)
    if g is None:
      out.append(s)
    elif s is g.values:
      out.append(g.weight)
  return out, groups


def _group(parent: str, members: list[target_lib.TargetSlot]) -> Group | None:
  """The quantized weight among one module's leaves: one integer leaf and a float sibling
  named ``*scale*`` with the values' shape but one axis divided by a group size."""
  ints = [s for s in members if is_integer(s.dtype)]
  if len(ints) != 1:
    return None
  (values,) = ints
  scales = [s for s in members if _SCALE.search(_leaf(s)) and _axis(values, s) is not None]
  if len(scales) != 1:
    return None
  (scale,) = scales
  axis, group = _axis(values, scale)  # type: ignore[misc]
  mins = [
    s
    for s in members
    if s is not scale and _MIN.search(_leaf(s)) and s.shape == scale.shape and s.dtype.kind == "f"
  ]
  leaf = _leaf(values)
  name = parent if parent.rpartition("/")[2] in _WEIGHT_LEAVES else f"{parent}/kernel"
  if not parent or leaf in _WEIGHT_LEAVES:
    name = values.name
  # The virtual weight keeps the values' key and shape: only its name and dtype are a float's.
  weight = dataclasses.replace(values, name=name, dtype=np.dtype(np.float32))
  return Group(values, scale, mins[0] if len(mins) == 1 else None, axis, group, weight)


def _leaf(s: target_lib.TargetSlot) -> str:
  return s.name.rpartition("/")[2]


def _axis(values: target_lib.TargetSlot, scale: target_lib.TargetSlot) -> tuple[int, int] | None:
  """``(axis, group size)`` when ``scale``'s shape is ``values``' with one axis divided."""
  if scale.dtype.kind != "f" or len(scale.shape) != len(values.shape):
    return None
  differ = [i for i, (a, b) in enumerate(zip(values.shape, scale.shape)) if a != b]
  if len(differ) != 1:
    return None
  (i,) = differ
  a, b = values.shape[i], scale.shape[i]
  return (i, a // b) if b and a % b == 0 and a // b > 1 else None


def expand(
  proposals: list[Proposal], groups: dict[str, Group], source: CheckpointSource, problems: list[str]
) -> list[Proposal]:
  """Each quantized weight's proposal (over the stored blocks) as one proposal per part; a
  weight that cannot be kept quantized is a problem naming its leaves."""
  if not groups:
    return proposals
  out = []
  for p in proposals:
    g = groups.get(p.target)
    if g is None:
      out.append(p)
      continue
    if p.recipe is None:
      problems.append(
        f"{g.values.name}: its weight {p.target} is an alias of {p.alias_of}; a "
        "quantized weight restores from blocks of its own, not as an alias"
      )
      continue
    try:
      out += _parts(p, g, source)
    except _NotKept as e:
      problems.append(f"{_names(g)}: {e}")
  return out


class _NotKept(Exception):
  pass


def _names(g: Group) -> str:
  return ", ".join(s.name for s in (g.values, g.scales, g.mins) if s is not None)


def _parts(p: Proposal, g: Group, source: CheckpointSource) -> list[Proposal]:
  formats: set[str] = set()
  values = _rewrite(p.recipe, "values", formats, source)
  (fmt_name,) = formats if len(formats) == 1 and formats != {"unquantized"} else _mixed(formats)
  fmt = quant_formats.FORMATS[fmt_name]
  kept = fmt.kept
  if kept is None:
    raise _NotKept(
      f"the checkpoint stores it as {fmt_name}, which cannot be kept quantized (kept: "
      f"{', '.join(block_part.kept_formats())}); make the target's weight float and dequantize"
    )
  group = fmt.block // kept.groups
  if group != g.group:
    raise _NotKept(
      f"{fmt_name} has one scale per {group} values, the target one per {g.group} (scales "
      f"{g.scales.shape} for values {g.values.shape}); give the scales the shape with axis "
      f"{g.axis} of {g.values.shape[g.axis] // group}"
    )
  if kept.mins and g.mins is None:
    raise _NotKept(
      f"{fmt_name} subtracts a minimum per group (x = scale * q - min); the target has no "
      f"float leaf named '*min*' of shape {g.scales.shape} beside {g.values.name}"
    )
  if g.mins is not None and not kept.mins:
    raise _NotKept(f"{fmt_name} has no minimums (x = scale * q); {g.mins.name} has nothing to hold")
  out = [(g.values, values)]
  out.append((g.scales, _rewrite(p.recipe, "scales", set(), source)))
  if g.mins is not None:
    out.append((g.mins, _rewrite(p.recipe, "mins", set(), source)))
  result = []
  for slot, recipe in out:
    meta = inference.infer(recipe, source)
    if tuple(meta.shape) != slot.shape or np.dtype(meta.dtype) != slot.dtype:
      raise _NotKept(
        f"{slot.name} would be {np.dtype(meta.dtype).name}{list(meta.shape)} from {recipe}, "
        f"the target holds {slot.dtype.name}{list(slot.shape)}; {fmt_name} keeps values as "
        f"{kept.values_dtype.name} and scales as {kept.scales_dtype.name}"
      )
    reason = f"{p.reason}, kept {fmt_name} {'values' if slot is g.values else 'scales'}"
    if slot is g.mins:
      reason = f"{p.reason}, kept {fmt_name} minimums"
    result.append(Proposal(slot.name, recipe, reason, inference.source_keys(recipe)))
  return result


def _mixed(formats: set[str]) -> tuple[str]:
  if formats == {"unquantized"}:
    raise _NotKept(
      "the checkpoint stores this weight unquantized (no blocks to keep); make the target's "
      "weight float, or quantize the checkpoint"
    )
  raise _NotKept(
    f"its layers are stored in different formats ({', '.join(sorted(formats))}, a mixed "
    "file such as Q4_K_M); a stacked quantized leaf holds one format: keep the layers apart, "
    "or make the target's weight float"
  )


def _rewrite(recipe: Any, part: str, formats: set[str], source: CheckpointSource) -> ops.Recipe:
  """``recipe`` with each ``dequantize`` replaced by the part of its blocks, through the
  transposes, stacking and selections of rows above it; any other op above the blocks is
  refused (it could move values within a group)."""
  if isinstance(recipe, ops.Dequantize):
    formats.add(recipe.format)
    fmt = quant_formats.FORMATS.get(recipe.format)
    if fmt is None or fmt.kept is None or (part == "mins" and not fmt.kept.mins):
      return recipe  # refused by the caller, naming the format
    return block_part.BlockPart(recipe.input, recipe.format, part)
  if isinstance(recipe, ops.Transpose):
    return dataclasses.replace(recipe, input=_rewrite(recipe.input, part, formats, source))
  if isinstance(recipe, ops.Select) and _rows_only(recipe, source):
    return dataclasses.replace(recipe, input=_rewrite(recipe.input, part, formats, source))
  if isinstance(recipe, ops.Stack):
    inputs = tuple(_rewrite(x, part, formats, source) for x in recipe.inputs)
    return dataclasses.replace(recipe, inputs=inputs)
  if isinstance(recipe, ops.Source):
    formats.add("unquantized")
    return recipe
  raise _NotKept(
    f"its values are read through {type(recipe).__name__.lower()} ({recipe}), which would "
    "move values within their quantization groups; make the target's weight float"
  )


def _rows_only(select: ops.Select, source: CheckpointSource) -> bool:
  """Whether ``select`` picks blocks' rows: along an axis other than the last of a
  ``dequantize`` (the axis the blocks run along)."""
  if not isinstance(select.input, ops.Dequantize):
    return False
  rank = len(inference.infer(select.input, source).shape)
  return getattr(select.selection, "axis", rank - 1) % rank != rank - 1
