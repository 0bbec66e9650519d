"""``optax._src.alias`` with every optimizer factory's result wrapped in ``paramreg_jax.keyed``.

tests/test_optax_conformance.py runs optax's own ``alias_test.py`` (shipped in the optax wheel)
with ``from optax._src import alias`` pointing here. Not collected by pytest.
"""

import functools
from typing import Any

from optax._src import alias as _alias
from optax._src import base

import paramreg_jax


def __getattr__(name: str) -> Any:
  value = getattr(_alias, name)
  if name.startswith("_") or isinstance(value, type) or not callable(value):
    return value

  @functools.wraps(value)
  def keyed_factory(*args: Any, **kwargs: Any) -> Any:
    tx = value(*args, **kwargs)
    return paramreg_jax.keyed(tx) if isinstance(tx, base.GradientTransformation) else tx

  return keyed_factory
