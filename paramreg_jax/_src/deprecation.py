"""Names that moved stay importable from their old module for one release, with a warning."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any


def moved(old_module: str, homes: dict[str, str]) -> Callable[[str], Any]:
  """A module ``__getattr__`` for ``old_module``: each name in ``homes`` (name -> the module it
  now lives in) is returned from its new home with a ``DeprecationWarning`` saying where."""

  def __getattr__(name: str) -> Any:
    home = homes.get(name)
    if home is None:
      raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
    new = f"{home}.{name}"
    warnings.warn(
      f"{old_module}.{name} moved to {new}; import it from {home} (the old name goes after "
      "paramreg_jax 0.1)",
      DeprecationWarning,
      stacklevel=2,
    )
    return getattr(importlib.import_module(home), name)

  return __getattr__
