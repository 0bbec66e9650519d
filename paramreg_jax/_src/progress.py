"""The progress bars of restore and export: tqdm's notebook widget where Jupyter can draw it,
its text bar everywhere else (a kernel without ``ipywidgets`` included, where ``tqdm.auto``
would warn "IProgress not found" and fall back anyway)."""

from __future__ import annotations

import importlib.util
from typing import Any


def bar(**options: Any) -> Any:
  """A ``tqdm`` bar with ``options``, drawn by the widget when ``ipywidgets`` is installed.

  Examples:
    >>> from paramreg_jax._src import progress
    >>> b = progress.bar(total=4, unit="B", disable=True)
    >>> b.update(4); b.close()
  """
  if importlib.util.find_spec("ipywidgets") is not None:
    from tqdm.auto import tqdm
  else:
    from tqdm.std import tqdm
  return tqdm(**options)
