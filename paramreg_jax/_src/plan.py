"""``plan_restore``: resolve every target slot to a checkpoint key or recipe, from metadata only.

Planning reads no payload. It collects **every** problem (missing keys, unused checkpoint keys,
shape/dtype mismatches, recipe errors, alias problems, non-divisible shardings) and raises them
together as one ``RestorePlanError``; a plan that exists can be materialized and bound.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any
from typing import Literal

import jax
import numpy as np

from paramreg_jax._src import backend as backend_lib
from paramreg_jax._src import errors
from paramreg_jax._src import patterns as patterns_lib
from paramreg_jax._src import source as source_lib
from paramreg_jax._src import target as target_lib
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.recipes import sets

DtypePolicy = Literal["exact", "cast"]


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
    >>> from paramreg_jax.sources import MemorySource
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
    >>> from paramreg_jax.sources import MemorySource
    >>> src = MemorySource({"w": np.ones(2, np.float32), "step": np.int32(7)})
    >>> plan = plan_restore({"w": jax.ShapeDtypeStruct((2,), np.float32)}, src, exclude=["step"])
    >>> plan.keys, plan.ignored, plan.counts()
    (('n:w',), ('step',), {'direct': 1, 'recipe': 0, 'alias': 0})
  """

  entries: tuple[PlanEntry, ...]
  source: Any
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
    rows = "".join(
      f"<tr><td><code>{html.escape(e.key)}</code></td><td>{e.shape}</td><td>{e.dtype.name}</td>"
      f"<td>{e.kind}</td><td><code>{html.escape(e.origin)}</code></td>"
      f"<td>{html.escape(target_lib.describe_sharding(e.sharding))}</td></tr>"
      for e in self.entries
    )
    c = self.counts()
    head = (
      f"<b>RestorePlan</b>: {len(self.entries)} parameters ({c['direct']} direct, "
      f"{c['recipe']} recipe, {c['alias']} alias), {self.nbytes / 2**20:.2f} MiB"
    )
    return (
      f"{head}<table><thead><tr><th>key</th><th>shape</th><th>dtype</th><th>kind</th>"
      f"<th>from</th><th>sharding</th></tr></thead><tbody>{rows}</tbody></table>"
    )

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


def _matcher(exclude: Any) -> Callable[[str], bool]:
  """``exclude`` (globs over names, or a predicate on names) as a predicate."""
  if exclude is None:
    return lambda name: False
  if callable(exclude):
    return exclude
  if isinstance(exclude, str):
    exclude = [exclude]
  regexes = [patterns_lib.glob_to_regex(p) for p in exclude]
  return lambda name: any(r.fullmatch(name) for r in regexes)


def _strip(name: str) -> str:
  return name[2:] if name.startswith("n:") else name


def _recipes(recipes: Any) -> tuple[dict[str, ops.Recipe], list[sets.FusedSplit], dict[str, str]]:
  if recipes is None:
    return {}, [], {}
  if isinstance(recipes, sets.RecipeSet):
    return {_strip(k): v for k, v in recipes.items()}, list(recipes.splits), dict(recipes.aliases)
  parts = [recipes] if isinstance(recipes, Mapping) else list(recipes)
  out: dict[str, ops.Recipe] = {}
  splits = []
  for part in parts:
    items = part.items() if isinstance(part, Mapping) else [part]
    if isinstance(part, sets.FusedSplit):
      splits.append(part)
    for name, recipe in items:
      name = _strip(name)
      if name in out:
        raise errors.RestorePlanError(
          f"target {name!r} has two recipes", (f"n:{name}: two recipes",)
        )
      out[name] = ops._check_recipe(recipe, f"the recipe for {name!r}")
  return out, splits, {}


def plan_restore(
  target: Any,
  source: Any,
  *,
  recipes: Mapping[str, ops.Recipe] | sets.RecipeSet | Iterable[Any] | None = None,
  aliases: Mapping[str, str] | None = None,
  rename: sets.Rename | Mapping[str, str | None] | Iterable[tuple[str, str | None]] | None = None,
  exclude: Iterable[str] | Callable[[str], bool] | str | None = None,
  dtype_policy: DtypePolicy = "exact",
) -> RestorePlan:
  """Plans a restore of ``target`` from ``source`` using metadata only.

  Args:
    target: the tree to restore into: arrays or ``jax.ShapeDtypeStruct``s with shardings (an
      abstract tree from ``jax.eval_shape``/``nnx.eval_shape`` is enough), flax linen params,
      an ``nnx.State`` or ``nnx.Module``, an equinox module.
    source: a :class:`~paramreg_jax.sources.CheckpointSource`.
    recipes: ``{target name: recipe}`` (``RecipeSet``, ``fused_split`` results, or a list of such
      mappings); names are canonical names with or without ``n:``.
    aliases: ``{alias name: owner name}`` for tied weights: the alias gets the owner's array.
    rename: checkpoint key → target name rules (:func:`paramreg_jax.recipes.rename`, or its
      arguments); a key renamed to ``None`` is not loaded.
    exclude: globs (or a predicate) over names: target slots to leave as they are and checkpoint
      keys that may stay unused.
    dtype_policy: ``"exact"`` (a dtype difference is an error) or ``"cast"`` (convert).

  Returns:
    An immutable :class:`RestorePlan`.

  Raises:
    RestorePlanError: lists every problem at once; ``.problems`` holds them one per line.

  Examples:
    >>> import jax, numpy as np
    >>> from paramreg_jax import plan_restore, recipes
    >>> from paramreg_jax.sources import MemorySource
    >>> src = MemorySource({"fc.weight": np.ones((3, 2), np.float32), "fc.bias": np.zeros(3, np.float32)})
    >>> target = {"fc": {"kernel": jax.ShapeDtypeStruct((2, 3), np.float32), "bias": jax.ShapeDtypeStruct((3,), np.float32)}}
    >>> plan = plan_restore(target, src, recipes={"fc/kernel": recipes.transpose(recipes.source("fc.weight"), (1, 0))},
    ...                     rename={r"fc\\.bias": "fc/bias"})
    >>> print(plan)  # doctest: +NORMALIZE_WHITESPACE
    RestorePlan: 2 parameters from MemorySource(2 tensors) (1 direct, 1 recipe, 0 alias; 0.00 MiB to build)
      n:fc/bias    (3,)           float32   <- 'fc.bias'
      n:fc/kernel  (2, 3)         float32   <- transpose(source('fc.weight'), (1, 0))
    >>> src.stats.reads
    0
  """
  if dtype_policy not in ("exact", "cast"):
    raise ValueError(f"dtype_policy must be 'exact' or 'cast', got {dtype_policy!r}")
  _, _, slots = target_lib.slots(target)
  by_name = {s.name: s for s in slots}
  excluded = _matcher(exclude)
  recipe_map, splits, set_aliases = _recipes(recipes)
  alias_map = {_strip(a): _strip(o) for a, o in {**set_aliases, **(aliases or {})}.items()}
  backend = backend_lib.JaxBackend()
  problems: list[str] = []

  # checkpoint key -> target name
  source_keys = tuple(source.keys())
  by_recipes = {k for r in recipe_map.values() for k in ops.source_keys(r)}
  # A recipe's misspelt key is reported once, with "did you mean"; the key it most likely meant
  # is not reported again as uncovered by the rename rules or as unused.
  known = set(source_keys)
  meant = {m for k in by_recipes - known for m in errors.closest_keys(k, source_keys, n=1)}
  renamed: dict[str, str] = {}
  dropped: list[str] = []
  if rename is not None:
    rules = rename if isinstance(rename, sets.Rename) else sets.rename(rename)
    # keys that recipes read need no rename rule
    loaded = [k for k in source_keys if not excluded(k) and k not in by_recipes | meant]
    try:
      renamed = rules.apply(loaded)
    except errors.RecipeSetError as e:
      problems.extend(ln.strip().removeprefix("- ") for ln in str(e).splitlines()[1:])
      renamed = {t: k for k in loaded if (t := rules(k)) is not None}  # avoid cascades
    dropped = [k for k in loaded if rules(k) is None]
  else:
    renamed = {k: k for k in source_keys}

  for name in list(recipe_map) + list(alias_map):
    if name not in by_name:
      problems.append(f"n:{name}: has a recipe or alias, but the target has no such parameter")
  for split in splits:
    try:
      split.check(source)
    except errors.RecipeError as e:
      problems.append(str(e))

  entries: list[PlanEntry] = []
  used: set[str] = set(meant)
  excluded_keys = []
  for slot in slots:
    if excluded(slot.name):
      excluded_keys.append(slot.key)
      continue
    where = slot.key
    try:
      slot.sharding.shard_shape(slot.shape)
    except Exception as e:  # jax raises ValueError/TypeError for uneven shardings
      problems.append(
        f"{where}: sharding {target_lib.describe_sharding(slot.sharding)} does not divide {slot.shape} evenly ({e})"
      )
      continue
    stored = np.dtype(jax.dtypes.canonicalize_dtype(slot.dtype))
    if stored != slot.dtype:
      problems.append(
        f"{where}: the target is {slot.dtype.name}, but with jax_enable_x64 off JAX stores it as "
        f"{stored.name}, so it could never bind; call jax.config.update('jax_enable_x64', True) "
        f"first, or make the target {stored.name} (dtype_policy='cast' converts the checkpoint)"
      )
      recipe = recipe_map.get(slot.name)  # what it would read is accounted for, not "unused"
      used.update(
        ops.source_keys(recipe) if recipe else [renamed[slot.name]] if slot.name in renamed else []
      )
      continue
    if slot.name in alias_map:
      continue  # checked after owners
    recipe = recipe_map.get(slot.name)
    if recipe is None and slot.name in renamed:
      key = renamed[slot.name]
      meta = source.metadata(key)
      used.add(key)
      entry = PlanEntry(slot.key, "direct", slot.shape, slot.dtype, slot.sharding, source_key=key)
      if meta.shape != slot.shape:
        hint = (
          "add a transpose recipe or fix the target"
          if sorted(meta.shape) == sorted(slot.shape)
          else "add a recipe (reshape, select, ...) or fix the target"
        )
        problems.append(
          f"{where}: checkpoint {key!r} has shape {meta.shape}, target expects {slot.shape}; {hint}"
        )
        continue
      if meta.dtype != slot.dtype:
        if dtype_policy == "cast":
          entry = PlanEntry(
            slot.key,
            "recipe",
            slot.shape,
            slot.dtype,
            slot.sharding,
            recipe=ops.cast(ops.source(key), slot.dtype),
          )
        else:
          problems.append(
            f"{where}: checkpoint {key!r} has dtype {meta.dtype.name}, target expects "
            f"{slot.dtype.name}; pass dtype_policy='cast' or add a cast recipe"
          )
          continue
      entries.append(entry)
      continue
    if recipe is None:
      near = [k for k in source_keys if k.split("/")[-1] == slot.name.split("/")[-1]][:3]
      hint = f" (checkpoint keys with the same leaf name: {', '.join(near)})" if near else ""
      problems.append(
        f"{where}: missing from the checkpoint{hint}; add a recipe, a rename rule, or exclude it"
      )
      continue
    used.update(ops.source_keys(recipe))
    try:
      backend.preflight_recipe(recipe, source)
      meta = ops.infer(recipe, source)
    except errors.RecipeError as e:
      problems.append(f"{where}: {e}")
      continue
    if meta.shape != slot.shape:
      problems.append(
        f"{where}: recipe {recipe} produces {meta.shape}, target expects {slot.shape}"
      )
      continue
    if meta.dtype != slot.dtype:
      if dtype_policy == "cast":
        recipe = ops.cast(recipe, slot.dtype)
      else:
        problems.append(
          f"{where}: recipe {recipe} produces {meta.dtype.name}, target expects {slot.dtype.name}; "
          "pass dtype_policy='cast' or end the recipe with cast()"
        )
        continue
    entries.append(
      PlanEntry(slot.key, "recipe", slot.shape, slot.dtype, slot.sharding, recipe=recipe)
    )

  try:
    resolved = sets.resolve_aliases(alias_map, set(by_name) - set(alias_map))
  except errors.AliasError as e:
    problems.append(str(e))
    resolved = {}
  planned = {e.key for e in entries}
  for alias, owner in resolved.items():
    if alias not in by_name or excluded(alias):
      continue
    a, o = by_name[alias], by_name[owner]
    if o.key not in planned and not excluded(owner):
      continue  # the owner's own problem is already reported
    if excluded(owner):
      problems.append(
        f"{a.key}: aliases {o.key}, which is excluded; exclude the alias too or load the owner"
      )
      continue
    if (a.shape, a.dtype) != (o.shape, o.dtype):
      problems.append(
        f"{a.key}: aliases {o.key}, but is {a.shape} {a.dtype.name} and the owner is {o.shape} {o.dtype.name}"
      )
      continue
    if not a.sharding.is_equivalent_to(o.sharding, len(a.shape)):
      problems.append(
        f"{a.key}: aliases {o.key}, but its sharding {target_lib.describe_sharding(a.sharding)} differs "
        f"from the owner's {target_lib.describe_sharding(o.sharding)}; a tied weight is one array"
      )
      continue
    entries.append(PlanEntry(a.key, "alias", a.shape, a.dtype, a.sharding, owner=o.key))

  ignored = sorted(set(dropped) | {k for k in source_keys if excluded(k) and k not in used})
  unused = sorted(k for k in source_keys if k not in used and k not in ignored)
  for k in unused:
    problems.append(
      f"checkpoint key {k!r} is not used by any parameter; rename it, exclude it, or map it with a recipe"
    )
  if problems:
    raise errors.RestorePlanError(
      errors.collected(f"plan the restore from {source!r}", problems, "nothing was read"),
      tuple(problems),
    )
  return RestorePlan(
    tuple(sorted(entries, key=lambda e: e.key)), source, tuple(excluded_keys), tuple(ignored)
  )
