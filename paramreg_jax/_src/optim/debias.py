"""``debias_added``: parameters added by surgery take their first Adam steps like a fresh Adam.

Adam's bias correction divides by ``1 - b1**t`` and ``sqrt(1 - b2**t)`` with one step count
``t`` for every parameter. After :func:`~paramreg_jax.reconcile` gives a new parameter zero
moments at ``t = 10_000``, the correction is ~1 while its moments are still warming up: its
first update is ``(1 - b1) / sqrt(1 - b2)`` = 3.2x the learning rate for Adam's defaults (a
fresh Adam's is 1x), and stays 3-6x for about ``1 / (1 - b2)`` steps.

Chained after Adam, ``debias_added`` keeps each parameter's own age (steps since its state was
created) and rescales its update by the ratio of its own bias correction to Adam's shared one.
For parameters as old as the optimizer the ratio is exactly 1 (updates are bit-identical); an
added parameter steps as a fresh Adam would (up to ``eps``).
"""

from __future__ import annotations

import numbers
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax


class DebiasAddedState(NamedTuple):
  """``steps``: the optimizer's steps; ``ages``: each parameter's steps (a params-shaped tree of
  int32 scalars, so :func:`~paramreg_jax.reconcile` keeps, adds and drops them by key).

  Examples:
    >>> import jax.numpy as jnp
    >>> from paramreg_jax import debias_added
    >>> debias_added().init({"w": jnp.ones(3)}).ages
    {'w': Array(0, dtype=int32)}
  """

  steps: jax.Array
  ages: Any


def debias_added(b1: float = 0.9, b2: float = 0.999) -> optax.GradientTransformation:
  """Rescales each parameter's Adam update to its own bias correction (chain it after Adam).

  Args:
    b1: Adam's ``b1`` (the same value).
    b2: Adam's ``b2``.

  Returns:
    An optax transformation. Use it from the start (``optax.chain(optax.adam(lr, b1, b2),
    debias_added(b1, b2))``), so that a later :func:`reconcile` keeps every surviving
    parameter's age and gives an added one age 0.

  Raises:
    ValueError: ``b1`` or ``b2`` is not a number in ``[0, 1)``.

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> import paramreg_jax as prj
    >>> tx = prj.keyed(optax.chain(optax.adam(0.1), prj.debias_added()))
    >>> params = {"w": jnp.ones(2)}
    >>> state = tx.init(params)
    >>> for _ in range(100):
    ...   _, state = tx.update({"w": jnp.ones(2)}, state, params)
    >>> params = {"w": jnp.ones(2), "new": jnp.ones(2)}
    >>> state, report = prj.reconcile(tx, state, params)
    >>> updates, _ = tx.update({"w": jnp.ones(2), "new": jnp.ones(2)}, state, params)
    >>> round(float(updates["new"][0]), 4)  # a fresh Adam's first step: -lr
    -0.1
  """

  for name, b in (("b1", b1), ("b2", b2)):
    if isinstance(b, bool) or not isinstance(b, numbers.Real) or not 0 <= b < 1:
      raise ValueError(f"debias_added({name}=...) must be Adam's {name}, in [0, 1); got {b!r}")

  def init(params: Any) -> DebiasAddedState:
    ages = jax.tree.map(lambda _: jnp.zeros([], jnp.int32), params)
    return DebiasAddedState(jnp.zeros([], jnp.int32), ages)

  def correction(t: jax.Array) -> jax.Array:
    t = t.astype(jnp.float32)
    return jnp.sqrt(1 - b2**t) / (1 - b1**t)

  def update(updates: Any, state: DebiasAddedState, params: Any = None) -> tuple[Any, Any]:
    del params
    count = optax.safe_int32_increment(state.steps)
    ages = jax.tree.map(optax.safe_int32_increment, state.ages)
    shared = correction(count)

    def rescale(u: jax.Array, age: jax.Array) -> jax.Array:
      ratio = jnp.where(age == count, 1.0, correction(age) / shared)
      return (u * ratio).astype(u.dtype)

    return jax.tree.map(rescale, updates, ages), DebiasAddedState(count, ages)

  return optax.GradientTransformation(init, update)
