"""``plan_export``: which parameter pieces make each checkpoint tensor, from metadata only.

The input is a :class:`~paramreg_jax.RestorePlan` (what the parameters were restored with). Each
planned parameter's recipe is inverted (:mod:`.invert`); the pieces of every checkpoint tensor
must cover it exactly (overlaps are allowed and checked for equal values when written). A
tensor no parameter reads is copied from the source unchanged. Every problem is collected and
raised at once, before anything is written.
"""

from __future__ import annotations

import dataclasses
import html

import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src import html_table
from paramreg_jax._src import text_width
from paramreg_jax._src.export import invert as inv
from paramreg_jax._src.restore import restore_plan as plan_lib
from paramreg_jax._src.sources.checkpoint_source import CheckpointSource


@dataclasses.dataclass(frozen=True)
class Piece:
  """One parameter's contribution to a checkpoint tensor."""

  param: str  # the parameter's canonical key
  placement: inv.Placement


@dataclasses.dataclass(frozen=True)
class TensorPlan:
  """How one checkpoint tensor is written: from ``pieces`` of parameters, or copied."""

  key: str
  shape: tuple[int, ...]
  dtype: np.dtype
  pieces: tuple[Piece, ...] = ()
  copied: bool = False  # no parameter reads it: copied from the source

  @property
  def nbytes(self) -> int:
    return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclasses.dataclass(frozen=True)
class ExportPlan:
  """An immutable, validated export plan (see :func:`plan_export`).

  Attributes:
    tensors: one :class:`TensorPlan` per checkpoint tensor, in the source's key order.
    restore_plan: the restore plan it inverts.
    skipped: checkpoint tensors left out (``copy_unmapped=False``).
    companions: files copied as they are from beside the source's weights (the generation
      config, tokenizer and special-token files, chat templates); set by ``export``.
    replaced: what ``export(..., overwrite=True)`` removed: every file that was under the
      destination before (relative names); set by ``export``.

  Examples:
    >>> import jax, numpy as np
    >>> import paramreg_jax as prj
    >>> from paramreg_jax import recipes as R
    >>> src = prj.MemorySource({"fc.weight": np.ones((3, 2), np.float32)})
    >>> target = {"fc": {"kernel": jax.ShapeDtypeStruct((2, 3), np.float32)}}
    >>> plan = prj.plan_restore(target, src, recipes={"fc/kernel": R.transpose(R.source("fc.weight"), (1, 0))})
    >>> print(prj.plan_export(plan))
    ExportPlan: 1 tensors (0.00 MiB) from 1 parameters, 0 copied from the source
      fc.weight  (3, 2)  float32  <- n:fc/kernel  transpose (1, 0)
  """

  tensors: tuple[TensorPlan, ...]
  restore_plan: plan_lib.RestorePlan
  skipped: tuple[str, ...] = ()
  companions: tuple[str, ...] = ()
  replaced: tuple[str, ...] = ()

  @property
  def nbytes(self) -> int:
    return sum(t.nbytes for t in self.tensors)

  def rows(self) -> list[tuple[str, str, str, str]]:
    out = []
    for t in self.tensors:
      if t.copied:
        how = "copied from the source"
      else:
        how = "; ".join(
          f"{p.param}" + (f"  {_describe(p.placement)}" if _describe(p.placement) else "")
          for p in t.pieces
        )
      out.append((t.key, str(t.shape), str(t.dtype), how))
    return out

  def __str__(self) -> str:
    rows = self.rows()
    params = {p.param for t in self.tensors for p in t.pieces}
    head = (
      f"ExportPlan: {len(self.tensors)} tensors ({self.nbytes / 2**20:.2f} MiB) from "
      f"{len(params)} parameters, {sum(t.copied for t in self.tensors)} copied from the source"
    )
    if self.skipped:
      head += f", {len(self.skipped)} skipped"
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(3)]
    lines = [head]
    for r in rows:
      line = f"  {r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  <- {r[3]}"
      if len(line) <= text_width.WIDTH:
        lines.append(line.rstrip())
      else:  # the tensor on its line, where it comes from under it (its pieces wrapped)
        lines.append(f"  {r[0]}  {r[1]}  {r[2]}")
        lines += text_width.items("    <- ", r[3].split("; "), sep="; ")
    if self.companions:
      lines.append(f"  copied beside the weights: {', '.join(self.companions)}")
    if self.replaced:
      shown = ", ".join(self.replaced[:6]) + (", ..." if len(self.replaced) > 6 else "")
      lines.append(f"  replaced (removed from the destination): {shown}")
    return "\n".join(lines)

  __repr__ = __str__

  def _repr_html_(self) -> str:
    cells = [[html_table.code(c) for c in r] for r in self.rows()]
    head = html.escape(str(self).splitlines()[0])
    headers = ["tensor", "shape", "dtype", "from"]
    return f"<p>{head}</p>" + html_table.table(headers, cells, wrap=[0, 3])


def _describe(p: inv.Placement) -> str:
  parts = inv.describe(p.ops)
  for axis, r in enumerate(p.region):
    if r is not None and r[0] == "range":
      parts.append(f"-> {r[1]}:{r[2]} on axis {axis}")
    elif r is not None:
      parts.append(f"-> {len(r[1])} gathered indices on axis {axis}")
  return ", ".join(parts)


def plan_export(plan: plan_lib.RestorePlan, *, copy_unmapped: bool = True) -> ExportPlan:
  """Plans writing parameters restored through ``plan`` back into its checkpoint's layout.

  Each parameter's recipe is run backwards: transposes, reshapes, casts and views undone,
  stacked axes unstacked into per-layer tensors, the parts of a fused tensor joined, a tied
  weight written once. Metadata only: nothing is read or written.

  Args:
    plan: the :class:`~paramreg_jax.RestorePlan` the parameters were restored with.
    copy_unmapped: copy checkpoint tensors that no parameter reads (buffers, an unused head)
      from the source unchanged; ``False`` leaves them out of the export.

  Returns:
    An immutable :class:`ExportPlan`.

  Raises:
    ExportPlanError: lists every problem at once: a recipe that cannot be run backwards, a
      checkpoint tensor that the parameters cover only in part (a ``select`` that kept part
      of it), each naming the parameter or tensor.

  Examples:
    >>> import jax, numpy as np
    >>> import paramreg_jax as prj
    >>> from paramreg_jax import recipes as R
    >>> src = prj.MemorySource({"qkv": np.zeros((6, 2), np.float32)})
    >>> target = {n: jax.ShapeDtypeStruct((2, 2), np.float32) for n in "qk"}
    >>> split = R.fused_split("qkv", 0, {"q": 2, "k": 2, "v": 2})
    >>> plan = prj.plan_restore(target, src, recipes={"q": split["q"], "k": split["k"]})
    >>> prj.plan_export(plan)
    Traceback (most recent call last):
    ...
    paramreg_jax.errors.ExportPlanError: cannot plan the export: 1 problem(s); nothing was written:
      - checkpoint tensor 'qkv' (6, 2): rows 4:6 of axis 0 come from no parameter (the restore kept only part of it), so it cannot be rebuilt; map every part to a parameter, or export with copy_unmapped=False and drop it from the mapping
  """
  if not isinstance(plan, plan_lib.RestorePlan):
    raise TypeError(f"plan_export takes a RestorePlan, got {type(plan).__name__}")
  src = plan.source
  problems: list[str] = []
  pieces: dict[str, list[Piece]] = {}
  for entry in plan.entries:
    if entry.kind == "alias":
      continue
    if entry.kind == "direct":
      assert entry.source_key is not None
      stored = src.metadata(entry.source_key)
      shape = tuple(stored.shape)
      placement = inv.Placement(
        entry.source_key, (None,) * len(shape), (), shape, np.dtype(stored.dtype)
      )
      pieces.setdefault(entry.source_key, []).append(Piece(entry.key, placement))
      continue
    assert entry.recipe is not None
    try:
      for placement in inv.invert(entry.recipe, src):
        pieces.setdefault(placement.key, []).append(Piece(entry.key, placement))
    except inv.NotInvertible as e:
      problems.append(f"{entry.key}: {e}; it cannot be written back to the checkpoint's layout")
  tensors: list[TensorPlan] = []
  skipped: list[str] = []
  for key in src.keys():
    meta = src.metadata(key)
    shape, dtype = tuple(meta.shape), np.dtype(meta.dtype)
    mine = pieces.get(key)
    if not mine:
      if copy_unmapped:
        tensors.append(TensorPlan(key, shape, dtype, copied=True))
      else:
        skipped.append(key)
      continue
    gap = _uncovered(mine, shape)
    if gap is not None:
      if copy_unmapped:
        problems.append(
          f"checkpoint tensor {key!r} {shape}: {gap} come from no parameter (the restore kept "
          "only part of it), so it cannot be rebuilt; map every part to a parameter, or export "
          "with copy_unmapped=False and drop it from the mapping"
        )
      else:
        skipped.append(key)
      continue
    tensors.append(TensorPlan(key, shape, dtype, tuple(mine)))
  if problems:
    raise errors.ExportPlanError(
      errors.collected("plan the export", problems, "nothing was written"), tuple(problems)
    )
  return ExportPlan(tuple(tensors), plan, tuple(skipped))


def _uncovered(pieces: list[Piece], shape: tuple[int, ...]) -> str | None:
  """What part of a tensor of ``shape`` no piece covers (``None``: all of it is covered)."""
  regions = [p.placement.region for p in pieces]
  if any(all(r is None for r in region) for region in regions):
    return None
  restricted = {axis for region in regions for axis, r in enumerate(region) if r is not None}
  if len(restricted) == 1:
    (axis,) = restricted
    count = np.zeros(shape[axis], np.int64)
    for region in regions:
      r = region[axis]
      if r[0] == "range":
        count[r[1] : r[2]] += 1
      else:
        count[list(r[1])] += 1
    missing = np.flatnonzero(count == 0)
    if missing.size == 0:
      return None
    return f"rows {_runs(missing)} of axis {axis}"
  mask = np.zeros(shape, np.bool_)
  for region in regions:
    index = tuple(
      slice(None) if r is None else slice(r[1], r[2]) if r[0] == "range" else list(r[1])
      for r in region
    )
    mask[np.ix_(*[np.arange(n)[i] for n, i in zip(shape, index)])] = True
  if mask.all():
    return None
  return f"{int((~mask).sum())} of its {mask.size} elements"


def _runs(indices: np.ndarray) -> str:
  runs: list[str] = []
  start = prev = int(indices[0])
  for i in [*map(int, indices[1:]), None]:
    if i is not None and i == prev + 1:
      prev = i
      continue
    runs.append(f"{start}:{prev + 1}")
    if i is not None:
      start = prev = i
  return ", ".join(runs[:5]) + (" ..." if len(runs) > 5 else "")


# Files a Hugging Face model folder holds beside its weights that loaders need as they are
# (``from_pretrained`` + ``generate``, a tokenizer load): copied by ``export``.
COMPANIONS = (
  "generation_config.json",
  "tokenizer.json",
  "tokenizer_config.json",
  "special_tokens_map.json",
  "added_tokens.json",
  "vocab.json",
  "vocab.txt",
  "merges.txt",
  "tokenizer.model",
  "spiece.model",
  "sentencepiece.bpe.model",
  "chat_template.jinja",
  "chat_template.json",
  "preprocessor_config.json",
  "processor_config.json",
)


def companion_names(source: CheckpointSource) -> tuple[str, ...]:
  """The companion files the source has beside its weights (a source without a folder: none)."""
  return tuple(n for n in COMPANIONS if source.has_companion(n))
