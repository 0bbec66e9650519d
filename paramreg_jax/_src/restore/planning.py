"""``plan_restore``: resolve every target slot to a checkpoint key or recipe, from metadata only.

Planning reads no payload. It collects **every** problem (missing keys, unused checkpoint keys,
shape/dtype mismatches, recipe errors, alias problems, non-divisible shardings) and raises them
together as one ``RestorePlanError``; a plan that exists can be materialized and bound.
The user's backend checks each recipe (``ParameterBackend.preflight_recipe``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from paramreg_jax._src import api_types
from paramreg_jax._src import errors
from paramreg_jax._src import patterns as patterns_lib
from paramreg_jax._src.recipes import inference
from paramreg_jax._src.recipes import ops
from paramreg_jax._src.recipes import sets
from paramreg_jax._src.restore import contract
from paramreg_jax._src.restore import target as target_lib
from paramreg_jax._src.restore.jax_backend import backend as backend_lib
from paramreg_jax._src.restore.restore_plan import PlanEntry
from paramreg_jax._src.restore.restore_plan import RestorePlan
from paramreg_jax._src.sources import checkpoint_source as source_lib

DtypePolicy = api_types.DtypePolicy


def _strip(name: str) -> str:
  return name[2:] if name.startswith("n:") else name


def _recipes(recipes: Any) -> tuple[dict[str, ops.Recipe], list[sets.FusedSplit], dict[str, str]]:
  if recipes is None:
    return {}, [], {}
  if isinstance(recipes, sets.RecipeSet):
    return {_strip(k): v for k, v in recipes.items()}, list(recipes.splits), dict(recipes.aliases)
  if isinstance(recipes, (str, bytes)) or not isinstance(recipes, (Mapping, Iterable)):
    raise TypeError(
      f"recipes must be a mapping {{target name: recipe}}, a RecipeSet, or a list of those, "
      f"got {type(recipes).__name__} {recipes!r:.60}"
    )
  parts = [recipes] if isinstance(recipes, Mapping) else list(recipes)
  out: dict[str, ops.Recipe] = {}
  splits = []
  for part in parts:
    items = part.items() if isinstance(part, Mapping) else [part]
    if isinstance(part, sets.FusedSplit):
      splits.append(part)
    for name, recipe in items:
      if not isinstance(name, str) or not name.strip():
        raise errors.RecipeSetError(
          f"recipe target names must be non-empty strings (a parameter's name, e.g. "
          f"'encoder/kernel'), got {name!r}"
        )
      name = _strip(name)
      if name in out:
        raise errors.RestorePlanError(
          f"target {name!r} has two recipes", (f"n:{name}: two recipes",)
        )
      out[name] = ops.check_recipe(recipe, f"the recipe for {name!r}")
  return out, splits, {}


def plan_restore(
  target: api_types.PyTree,
  source: source_lib.CheckpointSource,
  *,
  recipes: api_types.Recipes | None = None,
  aliases: Mapping[str, str] | None = None,
  rename: api_types.RenameRules | None = None,
  exclude: api_types.Exclude | None = None,
  dtype_policy: api_types.DtypePolicy = "exact",
  backend: contract.ParameterBackend | None = None,
) -> RestorePlan:
  """Plans a restore of ``target`` from ``source`` using metadata only.

  Args:
    target: the tree to restore into: arrays or ``jax.ShapeDtypeStruct`` objects with
      shardings (an abstract tree from ``jax.eval_shape``/``nnx.eval_shape`` is enough), flax
      linen params, an ``nnx.State`` or ``nnx.Module``, an equinox module.
    source: a :class:`~paramreg_jax.sources.CheckpointSource`.
    recipes: ``{target name: recipe}`` (``RecipeSet``, ``fused_split`` results, or a list of such
      mappings); names are canonical names with or without ``n:``.
    aliases: ``{alias name: owner name}`` for tied weights: the alias gets the owner's array.
    rename: checkpoint key → target name rules (:func:`paramreg_jax.recipes.rename`, or its
      arguments); a key renamed to ``None`` is not loaded.
    exclude: globs (or a predicate) over names: target slots to leave as they are and checkpoint
      keys that may stay unused.
    dtype_policy: ``"exact"`` (a dtype difference is an error) or ``"cast"`` (convert).
    backend: the :class:`~paramreg_jax.ParameterBackend` that will materialize the plan: it
      checks every recipe (``preflight_recipe``); default :class:`~paramreg_jax.JaxBackend`.

  Returns:
    An immutable :class:`RestorePlan`.

  Raises:
    RestorePlanError: lists every problem at once; ``.problems`` holds them one per line.

  Examples:
    >>> import jax, numpy as np
    >>> from paramreg_jax import plan_restore, recipes
    >>> from paramreg_jax import MemorySource
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
  check_arguments(source, dtype_policy)
  _, _, slots = target_lib.slots(target)
  return plan_slots(slots, source, recipes, aliases, rename, exclude, dtype_policy, backend)


def check_arguments(source: source_lib.CheckpointSource, dtype_policy: Any) -> None:
  """The checks :func:`plan_restore` makes before it looks at the target."""
  source_lib.check_source(source, "plan_restore")
  if dtype_policy not in ("exact", "cast"):
    raise ValueError(f"dtype_policy must be 'exact' or 'cast', got {dtype_policy!r}")


def plan_slots(
  slots: list[target_lib.TargetSlot],
  source: source_lib.CheckpointSource,
  recipes: Any,
  aliases: Any,
  rename: Any,
  exclude: Any,
  dtype_policy: api_types.DtypePolicy,
  backend: contract.ParameterBackend | None = None,
) -> RestorePlan:
  """:func:`plan_restore` of a target already flattened into ``slots`` (``restore`` flattens
  once for the plan and the bind)."""
  recipe_map, splits, set_aliases = _recipes(recipes)
  if aliases is not None and not isinstance(aliases, Mapping):
    raise errors.AliasError(f"aliases must be a mapping alias -> owner name, got {aliases!r:.60}")
  for a, o in (aliases or {}).items():
    if not (isinstance(a, str) and isinstance(o, str)):
      raise errors.AliasError(
        f"aliases map a parameter name to its owner's name (strings), got {a!r}: {o!r}"
      )
  alias_map = {_strip(a): _strip(o) for a, o in {**set_aliases, **(aliases or {})}.items()}
  excluded = patterns_lib.exclude_matcher(exclude)
  backend = backend_lib.default() if backend is None else backend
  p = _Planning(source, slots, excluded, recipe_map, alias_map, dtype_policy, backend)
  renamed, dropped = _resolve_names(p, rename)
  dropped += list(getattr(recipes, "ignored_keys", ()))  # a match's deliberately unused keys
  _check_declarations(p, splits)
  excluded_keys = _plan_entries(p, renamed)
  _plan_aliases(p)
  ignored = _account_for_unused_keys(p, dropped)
  if p.problems:
    raise errors.RestorePlanError(
      errors.collected(f"plan the restore from {source!r}", p.problems, "nothing was read"),
      tuple(p.problems),
    )
  return RestorePlan(
    tuple(sorted(p.entries, key=lambda e: e.key)), source, tuple(excluded_keys), tuple(ignored)
  )


@dataclasses.dataclass
class _Planning:
  """What every phase of :func:`plan_restore` reads, and the entries and problems it adds."""

  source: source_lib.CheckpointSource
  slots: list[target_lib.TargetSlot]
  excluded: Callable[[str], bool]
  recipes: dict[str, ops.Recipe]
  aliases: dict[str, str]
  dtype_policy: DtypePolicy
  backend: contract.ParameterBackend
  entries: list[PlanEntry] = dataclasses.field(default_factory=list)
  problems: list[str] = dataclasses.field(default_factory=list)
  # derived in __post_init__
  source_keys: tuple[str, ...] = dataclasses.field(init=False)
  by_name: dict[str, target_lib.TargetSlot] = dataclasses.field(init=False)
  by_recipes: set[str] = dataclasses.field(init=False)
  meant: set[str] = dataclasses.field(init=False)
  used: set[str] = dataclasses.field(init=False)

  def __post_init__(self) -> None:
    self.source_keys = tuple(self.source.keys())
    self.by_name = {s.name: s for s in self.slots}
    # A recipe's misspelt key is reported once, with "did you mean"; the key it most likely
    # meant is not reported again as uncovered by the rename rules or as unused.
    self.by_recipes = {k for r in self.recipes.values() for k in inference.source_keys(r)}
    self.meant = {
      m
      for k in self.by_recipes - set(self.source_keys)
      for m in errors.closest_keys(k, self.source_keys, n=1)
    }
    self.used = set(self.meant)


def _resolve_names(p: _Planning, rename: Any) -> tuple[dict[str, str], list[str]]:
  """Phase 1: checkpoint key -> target name (``renamed``), and keys renamed to ``None``."""
  if rename is None:
    return {k: k for k in p.source_keys}, []
  _swapped_rename(p, rename)
  rules = rename if isinstance(rename, sets.Rename) else sets.rename(rename)
  # keys that recipes read need no rename rule; rename sees every other key, excluded ones too
  # (exclude only allows a checkpoint key to stay unused: a rule may still give it a target)
  loaded = [k for k in p.source_keys if k not in p.by_recipes | p.meant]
  try:
    renamed = rules.apply(loaded)
  except errors.RecipeSetError as e:
    p.problems.extend(ln.strip().removeprefix("- ") for ln in str(e).splitlines()[1:])
    renamed = {t: k for k in loaded if (t := rules(k)) is not None}  # avoid cascades
  return renamed, [k for k in loaded if rules(k) is None]


def _swapped_rename(p: _Planning, rename: Any) -> None:
  """A problem for exact ``rename`` entries that run target -> checkpoint (the direction of
  ``match``'s hints) instead of checkpoint -> target, with the swapped dict to paste."""
  if not isinstance(rename, Mapping):
    return
  keys = set(p.source_keys)
  swapped = {
    k: v
    for k, v in rename.items()
    if isinstance(k, str)
    and isinstance(v, str)
    and k not in keys
    and v in keys
    and _strip(k) in p.by_name
  }
  if swapped:
    fixed = {v: k for k, v in swapped.items()}
    p.problems.append(
      f"rename maps checkpoint keys to target names, and {len(swapped)} entr"
      f"{'y runs' if len(swapped) == 1 else 'ies run'} the other way (target -> checkpoint, "
      f"as match's hints do): swapped? Pass rename={fixed!r}"
    )


def _check_declarations(p: _Planning, splits: list[sets.FusedSplit]) -> None:
  """Phase 2: recipes and aliases name real target parameters; fused splits fit the source."""
  for name in list(p.recipes) + list(p.aliases):
    if name not in p.by_name:
      p.problems.append(
        f"n:{name}: has a recipe or alias, but the target has no such parameter"
        + errors.did_you_mean(name, p.by_name)
      )
  for split in splits:
    try:
      split.check(p.source)
    except errors.RecipeError as e:
      p.problems.append(str(e))


def _plan_entries(p: _Planning, renamed: dict[str, str]) -> list[str]:
  """Phase 3: a direct or recipe entry for every slot that is not excluded or an alias;
  returns the excluded slots' keys."""
  excluded_keys = []
  missing: list[target_lib.TargetSlot] = []
  for slot in p.slots:
    if p.excluded(slot.name):
      excluded_keys.append(slot.key)
      continue
    recipe = p.recipes.get(slot.name)
    reads = (
      inference.source_keys(recipe)
      if recipe
      else [renamed[slot.name]]
      if slot.name in renamed
      else []
    )
    if not _slot_is_placeable(p, slot):
      p.used.update(reads)  # what it would read is accounted for, not "unused"
      continue
    if slot.name in p.aliases:
      continue  # planned after their owners
    if recipe is None and slot.name in renamed:
      entry = _plan_direct(p, slot, renamed[slot.name])
    elif recipe is None:
      missing.append(slot)
      entry = None
    else:
      entry = _plan_recipe(p, slot, recipe)
    p.used.update(reads)
    if entry is not None:
      p.entries.append(entry)
  _report_missing(p, missing)
  return excluded_keys


def _report_missing(p: _Planning, missing: list[target_lib.TargetSlot]) -> None:
  """One problem per missing parameter, led by one note when the names differ from the
  checkpoint's keys by a prefix (linen ``variables`` passed instead of ``params``)."""
  if not missing:
    return
  keys = set(p.source_keys)
  prefix = _common_extra_prefix([s.name for s in missing], keys)
  if prefix is not None:
    extra, where = prefix
    example = missing[0].name
    stripped = example[len(extra) :] if where == "target" else extra + example
    fix = (
      f"pass the subtree under {extra.rstrip('/')!r} as the target (linen variables hold "
      "their parameters under 'params')"
      if where == "target"
      else f"rename the checkpoint's keys without their {extra!r} prefix"
    )
    p.problems.append(
      f"{len(missing)} parameter name(s) differ from the checkpoint's keys by the prefix "
      f"{extra!r}, which the {'target' if where == 'target' else 'checkpoint'} has and the "
      f"{'checkpoint' if where == 'target' else 'target'} does not (e.g. n:{example} <-> "
      f"{stripped!r}): {fix}"
    )
  for slot in missing:
    if prefix is not None:
      extra, where = prefix
      near = [slot.name[len(extra) :] if where == "target" else extra + slot.name]
      hint = f" (the checkpoint has {near[0]!r}: see the prefix note)"
    else:
      leaf = slot.name.split("/")[-1]
      near = [k for k in p.source_keys if k.split("/")[-1] == leaf][:3]
      hint = f" (checkpoint keys with the same leaf name: {', '.join(near)})" if near else ""
    p.problems.append(
      f"{slot.key}: missing from the checkpoint{hint}; add a recipe, a rename rule, or exclude it"
    )


def _common_extra_prefix(names: list[str], keys: set[str]) -> tuple[str, str] | None:
  """``(prefix, "target")`` when every missing name is a checkpoint key with ``prefix`` in
  front, ``(prefix, "checkpoint")`` when every one is a key without its prefix; else None."""
  first = names[0]
  for i in range(len(first)):
    if first[i] == "/" and first[i + 1 :] in keys:
      extra = first[: i + 1]
      if all(n.startswith(extra) and n[len(extra) :] in keys for n in names):
        return extra, "target"
  for key in keys:
    if key.endswith("/" + first):
      extra = key[: -len(first)]
      if all(extra + n in keys for n in names):
        return extra, "checkpoint"
  return None


def _slot_is_placeable(p: _Planning, slot: target_lib.TargetSlot) -> bool:
  """The slot's sharding divides its shape, and JAX can hold its dtype as it is."""
  try:
    slot.sharding.shard_shape(slot.shape)
  except Exception as e:  # jax raises ValueError/TypeError for uneven shardings
    p.problems.append(
      f"{slot.key}: sharding {target_lib.describe_sharding(slot.sharding)} does not divide "
      f"{slot.shape} evenly ({e})"
    )
    return False
  stored = np.dtype(jax.dtypes.canonicalize_dtype(slot.dtype))
  if stored != slot.dtype:
    p.problems.append(
      f"{slot.key}: the target is {slot.dtype.name}, but with jax_enable_x64 off JAX stores it as "
      f"{stored.name}, so it could never bind; call jax.config.update('jax_enable_x64', True) "
      f"first, or make the target {stored.name} (dtype_policy='cast' converts the checkpoint)"
    )
    return False
  return True


def _plan_direct(p: _Planning, slot: target_lib.TargetSlot, key: str) -> PlanEntry | None:
  meta = source_lib.metadata_of(p.source, key)
  if meta.shape != slot.shape:
    hint = (
      "add a transpose recipe or fix the target"
      if sorted(meta.shape) == sorted(slot.shape)
      else "add a recipe (reshape, select, ...) or fix the target"
    )
    p.problems.append(
      f"{slot.key}: checkpoint {key!r} has shape {meta.shape}, target expects {slot.shape}; {hint}"
    )
    return None
  if meta.dtype == slot.dtype:
    return PlanEntry(slot.key, "direct", slot.shape, slot.dtype, slot.sharding, source_key=key)
  if p.dtype_policy == "cast":
    recipe = ops.cast(ops.source(key), slot.dtype)
    return PlanEntry(slot.key, "recipe", slot.shape, slot.dtype, slot.sharding, recipe=recipe)
  p.problems.append(
    f"{slot.key}: checkpoint {key!r} has dtype {meta.dtype.name}, target expects "
    f"{slot.dtype.name}; pass dtype_policy='cast' or add a cast recipe"
  )
  return None


def _plan_recipe(p: _Planning, slot: target_lib.TargetSlot, recipe: ops.Recipe) -> PlanEntry | None:
  try:
    p.backend.preflight_recipe(recipe, p.source)
    meta = inference.infer(recipe, p.source)
  except errors.RecipeError as e:
    p.problems.append(f"{slot.key}: {e}")
    return None
  if meta.shape != slot.shape:
    p.problems.append(
      f"{slot.key}: recipe {recipe} produces {meta.shape}, target expects {slot.shape}"
    )
    return None
  if meta.dtype != slot.dtype:
    if p.dtype_policy != "cast":
      p.problems.append(
        f"{slot.key}: recipe {recipe} produces {meta.dtype.name}, target expects "
        f"{slot.dtype.name}; pass dtype_policy='cast' or end the recipe with cast()"
      )
      return None
    recipe = ops.cast(recipe, slot.dtype)
  return PlanEntry(slot.key, "recipe", slot.shape, slot.dtype, slot.sharding, recipe=recipe)


def _plan_aliases(p: _Planning) -> None:
  """Phase 4: tied weights share their (planned) owner's array."""
  try:
    resolved = sets.resolve_aliases(p.aliases, set(p.by_name) - set(p.aliases))
  except errors.AliasError as e:
    p.problems.append(str(e))
    return
  planned = {e.key for e in p.entries}
  for alias, owner in resolved.items():
    if alias not in p.by_name or p.excluded(alias):
      continue
    a, o = p.by_name[alias], p.by_name[owner]
    if o.key not in planned and not p.excluded(owner):
      continue  # the owner's own problem is already reported
    if p.excluded(owner):
      problem = f"aliases {o.key}, which is excluded; exclude the alias too or load the owner"
    elif (a.shape, a.dtype) != (o.shape, o.dtype):
      problem = (
        f"aliases {o.key}, but is {a.shape} {a.dtype.name} and the owner is {o.shape} "
        f"{o.dtype.name}"
      )
    elif not a.sharding.is_equivalent_to(o.sharding, len(a.shape)):
      problem = (
        f"aliases {o.key}, but its sharding {target_lib.describe_sharding(a.sharding)} differs "
        f"from the owner's {target_lib.describe_sharding(o.sharding)}; a tied weight is one array"
      )
    else:
      p.entries.append(PlanEntry(a.key, "alias", a.shape, a.dtype, a.sharding, owner=o.key))
      continue
    p.problems.append(f"{a.key}: {problem}")


def _account_for_unused_keys(p: _Planning, dropped: list[str]) -> list[str]:
  """Phase 5: every checkpoint key is loaded, deliberately ignored, or a problem; returns the
  ignored ones (renamed to ``None`` or excluded)."""
  ignored = sorted(set(dropped) | {k for k in p.source_keys if p.excluded(k) and k not in p.used})
  for k in sorted(p.source_keys):
    if k not in p.used and k not in ignored:
      p.problems.append(
        f"checkpoint key {k!r} is not used by any parameter; rename it, exclude it, or map it "
        "with a recipe"
      )
  return ignored
