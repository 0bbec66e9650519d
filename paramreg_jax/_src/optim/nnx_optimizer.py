"""``reconcile_optimizer``: the flax NNX one-liner after model surgery (an ``nnx.Optimizer``'s
state reconciled by key, in place)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from paramreg_jax._src import errors
from paramreg_jax._src.optim import mirrors as mirrors_lib
from paramreg_jax._src.optim.reconcile import reconcile
from paramreg_jax._src.optim.report import SurgeryReport


def reconcile_optimizer(optimizer: Any, model: Any, restored: Any, **options: Any) -> SurgeryReport:
  """Loads a restored ``nnx.state(optimizer)`` of an older model into ``optimizer``, by key.

  The one-liner for flax NNX after model surgery: build the new model and its
  ``nnx.Optimizer`` as usual, restore the old optimizer state with orbax (no target needed),
  then ``report = prj.reconcile_optimizer(optimizer, model, restored)``. The optimizer's state
  (and its step) are replaced in place, keeping the new optimizer's variable metadata
  (shardings); nothing changes if reconciling fails.

  Args:
    optimizer: the new ``nnx.Optimizer`` (built for ``model``).
    model: the new model.
    restored: ``nnx.state(old_optimizer)`` (live or restored without a target), or just its
      optax state.
    **options: ``on_missing``, ``on_unexpected``, ``on_shape_mismatch``, ``on_incomplete``,
      ``rename`` (see :func:`reconcile`).

  Returns:
    The :class:`SurgeryReport`.

  Raises:
    ReconcileError: ``restored`` is not a state of ``optimizer.tx`` (the message lists each
      difference), ``optimizer`` was not built for ``model``, or an option refuses a change
      (``on_missing="error"``, ...); nothing is changed.

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> from flax import nnx
    >>> import paramreg_jax as prj
    >>> old_model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    >>> old = nnx.Optimizer(old_model, prj.keyed(optax.adam(1e-3)), wrt=nnx.Param)
    >>> class Bigger(nnx.Module):
    ...   def __init__(self, rngs):
    ...     self.kernel = old_model.kernel
    ...     self.bias = old_model.bias
    ...     self.extra = nnx.Param(jnp.zeros(4))
    >>> model = Bigger(nnx.Rngs(1))
    >>> optimizer = nnx.Optimizer(model, prj.keyed(optax.adam(1e-3)), wrt=nnx.Param)
    >>> print(prj.reconcile_optimizer(optimizer, model, nnx.state(old)))
    SurgeryReport: 2 kept, 1 added, 0 dropped, 0 re-initialised
      kept:          n:bias, n:kernel
      added:         n:extra
  """
  from flax import nnx

  pure = getattr(nnx, "as_pure", None) or nnx.pure
  params = pure(nnx.state(model, optimizer.wrt))
  new_state, report = reconcile(optimizer.tx, restored, params, **options)
  variables = jax.tree.leaves(optimizer.opt_state, is_leaf=lambda x: isinstance(x, nnx.Variable))
  values = jax.tree.leaves(new_state)
  if len(variables) != len(values) or any(
    np.shape(v.get_value()) != np.shape(x) for v, x in zip(variables, values)
  ):
    raise errors.ReconcileError(
      "the optimizer's state does not have the structure its transformation builds for the "
      "model's parameters; build the optimizer with nnx.Optimizer(model, tx, wrt=...) for this "
      "model. Nothing was changed"
    )
  step = None
  if isinstance(restored, Mapping) and "step" in restored:
    step = dict(mirrors_lib.state_leaves({"step": restored["step"]})).get(("step",))
  for variable, value in zip(variables, values):
    variable.set_value(value)
  if step is not None:
    optimizer.step.set_value(jnp.asarray(step, optimizer.step.get_value().dtype))
  return report
