"""The exception taxonomy: one root, one class per kind of failure.

Every error of the library derives from :class:`ParamRegError` (a ``ValueError``), so
``except paramreg_jax.ParamRegError`` catches all of them. Each message names the parameter key
or tree path, the expected and the actual value, and the fix.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any


class ParamRegError(ValueError):
  """Root of every error raised by paramreg_jax."""


# --- key grammar and registry ---------------------------------------------------------------


class MalformedKeyError(ParamRegError):
  """A canonical key or name does not follow the key grammar (empty name, bad index, bad escape)."""


class UnknownKeyPrefixError(MalformedKeyError):
  """A key has neither the ``n:`` nor the ``p:`` prefix (for example a raw pointer string)."""


class KeyCollisionError(ParamRegError):
  """Two different leaves of one tree map to the same canonical name."""


class ShapeMismatchError(ParamRegError):
  """A slot's recorded shape or dtype differs from the one offered."""


class OrderingContractError(ShapeMismatchError):
  """A positional slot restored from a checkpoint is claimed by a leaf of another shape/dtype.

  Positional (``p:<index>``) identity is the flatten order: the resuming run must present its
  leaves in the same order, with the same shapes, as the run that wrote the checkpoint.
  """


class NamedSlotHijackError(ParamRegError):
  """The positional path tried to claim a slot that was registered under a name."""


class PatternError(ParamRegError):
  """A glob rule matched nothing, or a parameter matched no rule."""


# --- keyed optimizer state -----------------------------------------------------------------


class StateMismatchError(ParamRegError):
  """A keyed optimizer state is used with parameters it was not built for."""


class ReconcileError(ParamRegError):
  """A keyed optimizer state cannot be fitted to the new parameters as asked."""


# --- checkpoint sources (the store) ---------------------------------------------------------


class StoreError(ParamRegError):
  """A checkpoint source cannot serve a request (unknown key, malformed file, unsafe path)."""


class UnknownTensorError(StoreError, KeyError):
  """A key is not in the checkpoint."""

  def __str__(self) -> str:  # KeyError would repr() the message
    return str(self.args[0]) if self.args else ""


class MalformedSafetensorsError(StoreError):
  """A safetensors file is truncated, has a bad header, bad offsets or an unknown dtype."""


class MalformedIndexError(StoreError):
  """A sharded safetensors index (``model.safetensors.index.json``) is malformed."""


class MalformedGGUFError(StoreError):
  """A ``.gguf`` file that is not one, is truncated, or has a tensor outside the file."""


class MalformedConfigError(StoreError):
  """A checkpoint's ``config.json`` exists but is not a JSON object."""


class UnsafeShardPathError(StoreError):
  """A shard index points outside its directory (``../``, absolute paths, links out)."""


class MissingShardError(StoreError):
  """A shard named by an index does not exist."""


class ContradictoryIndexMappingError(StoreError):
  """An index maps a tensor to a shard that does not hold it, or two shards hold it."""


class InvalidRegionError(StoreError):
  """A read region (tuple of slices) is out of bounds or strided."""


class SourceIOError(StoreError, OSError):
  """Reading payload bytes failed (I/O error, corrupt data); ``.key`` is the checkpoint key."""

  def __init__(self, message: str, key: str | None = None):
    super().__init__(message)
    self.key = key

  def __str__(self) -> str:
    return str(self.args[0]) if self.args else ""


# --- recipes -----------------------------------------------------------------------------


class RecipeError(ParamRegError):
  """A derived-weight recipe is invalid for its source; names the recipe node."""


class EmptySourceKeyError(RecipeError):
  """``source('')``: a source key must be a non-empty string."""


class UnknownSourceKeyError(RecipeError, KeyError):
  """A recipe reads a key the checkpoint does not have."""

  def __str__(self) -> str:
    return str(self.args[0]) if self.args else ""


class SelectionError(RecipeError):
  """Root of invalid tensor selections."""


class InvalidSelectionAxisError(SelectionError):
  """A selection axis is not below the tensor's rank."""


class InvalidRangeError(SelectionError):
  """A ``Range`` is empty, negative or past the end of its axis."""


class InvalidIndicesError(SelectionError):
  """``Indices`` are empty, negative or past the end of their axis."""


class EmptyInputsError(RecipeError):
  """``concatenate``/``stack`` of no inputs."""


class DtypeMismatchError(RecipeError):
  """Joined inputs have different dtypes."""


class RecipeShapeMismatchError(RecipeError):
  """Joined inputs have incompatible shapes."""


class InvalidJoinAxisError(RecipeError):
  """The join axis is out of range (``>= rank`` to concatenate, ``> rank`` to stack)."""


class ElementCountMismatchError(RecipeError):
  """``reshape`` changes the element count."""


class InvalidPermutationError(RecipeError):
  """``transpose`` axes are not a permutation of ``0..rank-1``."""


class ByteCountMismatchError(RecipeError):
  """``view`` changes the byte count."""


class ZeroSizedOutputError(RecipeError):
  """A recipe produces zero bytes."""


class UnsupportedDtypeError(RecipeError):
  """A dtype a recipe cannot represent (object, string, ...), or an op it cannot apply."""


class UndefinedValueError(RecipeError):
  """A recipe met a stored value it is not defined for (``neg_log`` of a value at or above
  zero): loading it would give NaN or infinity without an error."""


class UnknownQuantizationError(RecipeError):
  """A ``dequantize`` names a block format the library does not know."""


class QuantizedLayoutError(RecipeError):
  """Quantized data whose blocks or scales do not fit the shape it claims."""


class RecipeSetError(RecipeError):
  """A ``RecipeSet``, ``fused_split`` or ``rename`` declaration is invalid."""


class UnknownPartError(RecipeSetError, KeyError):
  """A fused split has no part of that name (the message suggests the closest)."""

  def __str__(self) -> str:  # KeyError would show the message quoted
    return str(self.args[0]) if self.args else ""


class AliasError(RecipeSetError):
  """An alias declaration is invalid (empty, unknown destination, collision, cycle)."""


# --- restore: plan, materialize, bind ----------------------------------------------------------


class RestorePlanError(ParamRegError):
  """A restore plan cannot be built; ``.problems`` lists every problem found (all at once)."""

  def __init__(self, message: str, problems: tuple[str, ...] = ()):
    super().__init__(message)
    self.problems = problems


class MatchError(ParamRegError):
  """``match`` cannot propose a complete mapping: ``.problems`` lists every unmatched or
  ambiguous parameter, one per concept (each a ``str`` that carries ``.targets`` and its
  ``.choices``, best evidence first); ``.hints_code`` is the same as a ``hints = {...}``
  literal to edit (every choice a commented line); ``.partial`` is what it did match."""

  def __init__(
    self,
    message: str,
    problems: tuple[str, ...] = (),
    partial: Any = None,
    hints_code: str = "hints = {}",
  ):
    super().__init__(message)
    self.problems = problems
    self.partial = partial
    self.hints_code = hints_code


class MaterializationError(ParamRegError):
  """Reading or building a weight failed; nothing built so far is kept, the target is untouched.

  ``.key`` names the weight; ``.nothing_kept`` is True once the whole unit was discarded (the
  message then says so)."""

  def __init__(self, message: str, key: str | None = None, *, nothing_kept: bool = False):
    if nothing_kept:
      message = f"{message}; nothing was kept, the target is untouched"
    super().__init__(message)
    self.key = key
    self.nothing_kept = nothing_kept


class ExportPlanError(ParamRegError):
  """Parameters cannot be written back to a checkpoint's layout: ``.problems`` lists every
  recipe that cannot be run backwards and every tensor the parameters cover only in part."""

  def __init__(self, message: str, problems: tuple[str, ...] = ()):
    super().__init__(message)
    self.problems = problems


class ExportError(ParamRegError):
  """Writing an export failed (I/O, a parameter that does not fit the plan, two parameters
  that disagree about one tensor); no file exists under the final names. ``.key`` names the
  tensor or parameter."""

  def __init__(self, message: str, key: str | None = None):
    super().__init__(message)
    self.key = key


class BindError(ParamRegError):
  """A materialized unit does not fit the target; ``.problems`` lists every mismatch."""

  def __init__(self, message: str, problems: tuple[str, ...] = ()):
    super().__init__(message)
    self.problems = problems


# The taxonomy's public home is ``paramreg_jax.errors``: tracebacks and API pages name it.
for _cls in list(globals().values()):
  if isinstance(_cls, type) and issubclass(_cls, ParamRegError):
    _cls.__module__ = "paramreg_jax.errors"
del _cls


def collected(what: str, problems: Sequence[str], outcome: str) -> str:
  """``cannot <what>: N problem(s); <outcome>:`` and the problems as bullets (one format for
  every all-at-once report). Problems that differ only in the names they quote are one
  bullet: the first in full, then the names of the others (``.problems`` keeps each).

  Examples:
    >>> print(collected("restore", [f"'w{i}' is float32, not bfloat16" for i in range(5)], "x"))
    cannot restore: 5 problem(s); x:
      - 'w0' is float32, not bfloat16
        (and 4 more alike: 'w1', 'w2', 'w3', 'w4')
  """
  return f"cannot {what}: {len(problems)} problem(s); {outcome}:" + bullet_list(_alike(problems))


_QUOTED = re.compile(r"'[^'\n]*'")
_HEAD = re.compile(r"^[^\s']+?(?=: )")  # a problem that starts with the key it is about
_ALIKE = 3  # problems of one form from which they are one bullet
_NAMED = 8  # names the bullet lists of the others


def _name(problem: str) -> str:
  found = _HEAD.search(problem) or _QUOTED.search(problem)
  return found.group(0) if found else problem


def _alike(problems: Sequence[str]) -> list[str]:
  """``problems`` with each group of at least ``_ALIKE`` one-line problems of one form (the
  same words around different quoted names) folded into its first."""
  forms: dict[str, list[int]] = {}
  for i, p in enumerate(problems):
    if "\n" not in p and (_QUOTED.search(p) or _HEAD.search(p)):
      forms.setdefault(_QUOTED.sub("'…'", _HEAD.sub("…", p)), []).append(i)
  folded = {i: ids for ids in forms.values() if len(ids) >= _ALIKE for i in ids[:1]}
  hidden = {i for ids in folded.values() for i in ids[1:]}
  out = []
  for i, p in enumerate(problems):
    if i in hidden:
      continue
    if i in folded:
      others = [_name(problems[j]) for j in folded[i][1:]]
      shown = ", ".join(others[:_NAMED]) + (", ..." if len(others) > _NAMED else "")
      p = f"{p}\n    (and {len(others)} more alike: {shown})"
    out.append(p)
  return out


def bullet_list(lines: Iterable[str]) -> str:
  """Formats collected failures as an indented bullet list (one helper for every report)."""
  return "".join(f"\n  - {line}" for line in lines)


def closest_keys(key: str, known: Iterable[str], n: int = 3) -> list[str]:
  """The known keys a typo of ``key`` most likely meant (the same letters in another case
  first, then the closest spelling)."""
  known = list(known)
  same = [k for k in known if k.lower() == key.lower() and k != key]
  close = difflib.get_close_matches(key, known, n=n, cutoff=0.75)
  return list(dict.fromkeys(same + close))[:n]


def did_you_mean(key: str, known: Iterable[str]) -> str:
  """``"; did you mean 'x'?"`` for the closest known keys, or ``""`` (one helper for every
  unknown-key message)."""
  near = closest_keys(key, known)
  return f"; did you mean {' or '.join(map(repr, near))}?" if near else ""


def note_interrupted(error: BaseException, key: Any) -> None:
  """Notes on an interrupt which parameter was being materialized (once: the innermost place
  that knows says it)."""
  if hasattr(error, "add_note") and not getattr(error, "__notes__", None):
    error.add_note(f"paramreg_jax: interrupted while materializing {key}; nothing was kept")


# arguments users pass to the other half of match -> restore, and where they belong
_ELSEWHERE = {
  ("match", "rename"): "rename= is restore's (checkpoint key -> target name rules); match "
  "takes hints={target name: checkpoint name}",
  ("match", "recipes"): "match proposes the recipes; pass its result to restore(..., recipes=m)",
  ("restore", "hints"): "hints= is match's: m = prj.match(target, source, hints={...}); then "
  "prj.restore(target, source, recipes=m)",
  ("restore", "config"): "config= is match's (a checkpoint's config.json); restore reads what "
  "the recipes say",
}


def refuse_arguments(fn: str, given: dict[str, Any], accepted: Iterable[str]) -> None:
  """A ``TypeError`` naming ``fn``, each argument it does not take, and where it belongs (or
  the closest it does take); nothing if ``given`` is empty."""
  if not given:
    return
  accepted = list(accepted)
  said = [
    f"{name}=: "
    + _ELSEWHERE.get((fn, name), f"not an argument of {fn}{did_you_mean(name, accepted)}")
    for name in given
  ]
  raise TypeError(f"{fn}() got unexpected keyword arguments: " + "; ".join(said))
