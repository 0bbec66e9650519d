"""The exception taxonomy: one root, one class per kind of failure.

Every error of the library derives from :class:`ParamRegError` (a ``ValueError``), so
``except paramreg_jax.ParamRegError`` catches all of them. Each message names the parameter key
or tree path, the expected and the actual value, and the fix.
"""

from __future__ import annotations

from collections.abc import Iterable


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


def bullet_list(lines: Iterable[str]) -> str:
  """Formats collected failures as an indented bullet list (one helper for every report)."""
  return "".join(f"\n  - {line}" for line in lines)
