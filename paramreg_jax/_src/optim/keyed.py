"""``keyed``: any optax transformation, with parameter identity derived from tree paths.

``keyed(tx).init(params)`` *is* ``tx.init(params)``: the same pytree, leaf for leaf. Moments keep
the parameters' structure, metadata boxes (``nn.Partitioned``, NNX variables) included, so every
optax, flax and equinox utility that pairs state with parameters keeps working, and ``update``
returns ``tx``'s updates bit for bit. What ``keyed`` adds is identity, derived from paths and
never stored in the state:

* ``update`` checks, at trace time (nothing runs inside a jitted step), that the state is what
  ``tx.init`` builds for the parameters it is updating; otherwise a ``StateMismatchError`` names
  every missing, unexpected and reshaped parameter key, instead of optax's structure error or,
  worse, a silent broadcast;
* :func:`state_keys` and :func:`param_state` read a state by canonical key;
* :func:`~paramreg_jax.reconcile` fits a state from an older model to new parameters by key.

Parameter-shaped subtrees of a state ("mirrors": Adam's ``mu``/``nu``, traces, accumulators) are
found by structure: a subtree mirrors the parameters when it has their structure, with
``optax.MaskedNode`` standing for masked subtrees (so prefix masks and labels work); its leaves
may have other shapes (adafactor's factored moments). A bare-array parameter is mirrored by a
leaf of its shape and dtype.
"""

from __future__ import annotations

from typing import Any

import optax

from paramreg_jax._src import api_types
from paramreg_jax._src.optim import check as check_lib
from paramreg_jax._src.registry import assign as registry_lib


def as_transformation(tx: Any, where: str) -> optax.GradientTransformation:
  """``tx`` as an optax ``GradientTransformation``: itself, ``MultiSteps.gradient_transformation()``,
  or any object with ``init`` and ``update`` (as optax's own wrappers accept)."""
  if isinstance(tx, optax.GradientTransformation):
    return tx
  to_tx = getattr(tx, "gradient_transformation", None)
  if callable(to_tx):  # optax.MultiSteps
    return to_tx()
  init, update = getattr(tx, "init", None), getattr(tx, "update", None)
  if callable(init) and callable(update):
    return optax.GradientTransformationExtraArgs(init, update)
  raise TypeError(
    f"{where} takes an optax transformation (e.g. optax.adam(1e-3), or an object with init and "
    f"update such as optax.MultiSteps), got {type(tx).__name__}"
  )


def keyed(
  tx: optax.GradientTransformation | api_types.Transformation, *, by: registry_lib.By = "name"
) -> optax.GradientTransformation:
  """Wraps an optax transformation so its state is checked and read by parameter key.

  Args:
    tx: any ``optax.GradientTransformation`` (or ``GradientTransformationExtraArgs``), or an
      object with ``init`` and ``update`` such as ``optax.MultiSteps(...)``.
    by: ``"name"`` (keys from tree paths, order-independent) or ``"position"``.

  Returns:
    A transformation of ``tx``'s own kind. ``init`` is ``tx.init`` (the same state pytree);
    ``update`` checks the state against the parameters at trace time, then calls
    ``tx.update`` (bit-identical updates; extra keyword arguments reach ``tx`` as they would
    without the wrapper).

  Raises:
    StateMismatchError: (at update) the state is not what ``tx.init`` builds for these
      parameters: missing, unexpected or reshaped parameter keys, all named. Run
      :func:`reconcile` after changing the model.

  Examples:
    >>> import jax, jax.numpy as jnp, optax
    >>> from paramreg_jax import keyed, state_keys
    >>> params = {"dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.zeros(2)}}
    >>> tx = keyed(optax.adam(1e-2))
    >>> state = tx.init(params)
    >>> jax.tree.structure(state) == jax.tree.structure(optax.adam(1e-2).init(params))
    True
    >>> sorted(state_keys(state, params))
    ['n:dense/bias', 'n:dense/kernel']
    >>> grads = jax.tree.map(jnp.ones_like, params)
    >>> updates, state = tx.update(grads, state, params)
    >>> tx.update(grads, state, {"dense": {"kernel": jnp.ones((3, 2)), "bias": jnp.zeros(2)}})
    Traceback (most recent call last):
    ...
    paramreg_jax.errors.StateMismatchError: the optimizer state does not match the parameters it is updating: 0 parameter(s) without state, 0 state key(s) without a parameter, 1 reshaped parameter(s). After changing the model, run `state, report = paramreg_jax.reconcile(tx, state, params)` once before updating:
      - n:dense/kernel: state 0/mu was built for (2, 2), the parameter is (3, 2)
      - n:dense/kernel: state 0/nu was built for (2, 2), the parameter is (3, 2)
  """
  if by not in ("name", "position"):
    raise ValueError(f"by must be 'name' or 'position', got {by!r}")
  checker = check_lib.Checker(as_transformation(tx, "keyed"), by)
  inner = checker.tx
  if isinstance(inner, optax.GradientTransformationExtraArgs):

    def update_fn(updates: Any, state: Any, params: Any = None, **extra: Any) -> Any:
      checker.check(state, updates, params, extra)
      return inner.update(updates, state, params, **extra)

    return optax.GradientTransformationExtraArgs(checker.init, update_fn)

  def update_plain(updates: Any, state: Any, params: Any = None) -> Any:
    checker.check(state, updates, params, {})
    return inner.update(updates, state, params)

  return optax.GradientTransformation(checker.init, update_plain)


def keyed_info(tx: Any) -> tuple[optax.GradientTransformation, registry_lib.By] | None:
  """``(inner tx, by)`` if ``tx`` was made by :func:`keyed`, else ``None``."""
  checker = getattr(getattr(tx, "init", None), "__self__", None)
  return (checker.tx, checker.by) if isinstance(checker, check_lib.Checker) else None
