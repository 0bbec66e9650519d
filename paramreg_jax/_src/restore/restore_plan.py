"""A restore plan: what ``plan_restore`` resolved for every slot (``RestorePlan``,
``PlanEntry``), immutable, and how it prints (text, HTML, JSON)."""

from __future__ import annotations

import dataclasses
import html
from typing import Any
from typing import Literal

import numpy as np

from paramreg_jax._src import api_types
from paramreg_jax._src import html_table
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.restore import target as target_lib
from paramreg_jax._src.sources import checkpoint_source as source_lib

DtypePolicy = api_types.DtypePolicy


@dataclasses.dataclass(frozen=True)
class PlanEntry:
  """How one target slot gets its weight.

  Attributes:
    key: the target's canonical key (``n:dense/kernel``).
    kind: ``"direct"`` (one checkpoint tensor), ``"recipe"`` or ``"alias"``.
    source_key: the checkpoint key of a direct entry.
    recipe: the recipe of a recipe entry (a cast is added under ``dtype_policy="cast"``).
    owner: the key whose weight an alias shares.
    shape, dtype, sharding: what the slot needs.

  Examples:
    >>> import jax, numpy as np
    >>> from paramreg_jax import plan_restore
    >>> from paramreg_jax import MemorySource
    >>> plan = plan_restore({"w": jax.ShapeDtypeStruct((2,), np.float32)}, MemorySource({"w": np.ones(2, np.float32)}))
    >>> entry = plan["n:w"]
    >>> entry.kind, entry.source_key, entry.nbytes
    ('direct', 'w', 8)
  """

  key: str
  kind: Literal["direct", "recipe", "alias"]
  shape: tuple[int, ...]
  dtype: np.dtype
  sharding: Any
  source_key: str | None = None
  recipe: ops.Recipe | None = None
  owner: str | None = None

  @property
  def nbytes(self) -> int:
    return source_lib.nbytes_of(self.shape, self.dtype)

  @property
  def origin(self) -> str:
    if self.kind == "direct":
      return repr(self.source_key)
    if self.kind == "alias":
      return f"alias of {self.owner}"
    return str(self.recipe)


@dataclasses.dataclass(frozen=True, repr=False)
class RestorePlan:
  """An immutable, validated restore plan (see :func:`plan_restore`).

  Attributes:
    entries: one :class:`PlanEntry` per planned slot, sorted by key.
    source: the checkpoint source.
    excluded: target keys left as they are.
    ignored: checkpoint keys deliberately not loaded (excluded or renamed to ``None``).

  Examples:
    >>> import jax, numpy as np
    >>> from paramreg_jax import plan_restore
    >>> from paramreg_jax import MemorySource
    >>> src = MemorySource({"w": np.ones(2, np.float32), "step": np.int32(7)})
    >>> plan = plan_restore({"w": jax.ShapeDtypeStruct((2,), np.float32)}, src, exclude=["step"])
    >>> plan.keys, plan.ignored, plan.counts()
    (('n:w',), ('step',), {'direct': 1, 'recipe': 0, 'alias': 0})
  """

  entries: tuple[PlanEntry, ...]
  source: source_lib.CheckpointSource
  excluded: tuple[str, ...] = ()
  ignored: tuple[str, ...] = ()

  def __getitem__(self, key: str) -> PlanEntry:
    for e in self.entries:
      if e.key == key:
        return e
    raise KeyError(key)

  @property
  def keys(self) -> tuple[str, ...]:
    return tuple(e.key for e in self.entries)

  @property
  def nbytes(self) -> int:
    """Bytes of the weights to build (aliases excluded: they share their owner's array)."""
    return sum(e.nbytes for e in self.entries if e.kind != "alias")

  def counts(self) -> dict[str, int]:
    out = {"direct": 0, "recipe": 0, "alias": 0}
    for e in self.entries:
      out[e.kind] += 1
    return out

  def __str__(self) -> str:
    c = self.counts()
    lines = [
      f"RestorePlan: {len(self.entries)} parameters from {self.source!r} "
      f"({c['direct']} direct, {c['recipe']} recipe, {c['alias']} alias; "
      f"{self.nbytes / 2**20:.2f} MiB to build)"
    ]
    width = max((len(e.key) for e in self.entries), default=0)
    for e in self.entries:
      lines.append(f"  {e.key:<{width}}  {e.shape!s:<14} {e.dtype.name:<9} <- {e.origin}")
    if self.excluded:
      lines.append(f"  excluded (kept as they are): {', '.join(self.excluded)}")
    if self.ignored:
      lines.append(f"  checkpoint keys not loaded: {', '.join(self.ignored)}")
    return "\n".join(lines)

  def __repr__(self) -> str:
    c = self.counts()
    return (
      f"RestorePlan({len(self.entries)} parameters from {self.source!r}: {c['direct']} direct, "
      f"{c['recipe']} recipe, {c['alias']} alias)"
    )

  def _repr_html_(self) -> str:
    rows = [
      [
        html_table.code(e.key),
        str(e.shape),
        e.dtype.name,
        e.kind,
        html_table.code(e.origin),
        html.escape(target_lib.describe_sharding(e.sharding)),
      ]
      for e in self.entries
    ]
    c = self.counts()
    head = (
      f"<b>RestorePlan</b>: {len(self.entries)} parameters ({c['direct']} direct, "
      f"{c['recipe']} recipe, {c['alias']} alias), {self.nbytes / 2**20:.2f} MiB"
    )
    headers = ["key", "shape", "dtype", "kind", "from", "sharding"]
    return head + html_table.table(headers, rows, wrap=[4], words=[5])

  def to_json(self) -> dict[str, Any]:
    """A JSON-friendly summary (used by ``paramreg-jax plan --json``)."""
    return {
      "source": repr(self.source),
      "entries": [
        {
          "key": e.key,
          "kind": e.kind,
          "shape": list(e.shape),
          "dtype": e.dtype.name,
          "from": e.origin,
        }
        for e in self.entries
      ],
      "excluded": list(self.excluded),
      "ignored": list(self.ignored),
      "nbytes": self.nbytes,
    }
