"""Reading an optimizer state by parameter key: :func:`state_keys` and :func:`param_state`.

The state has the optimizer's own structure; its keys come from the parameters' paths (see
:mod:`paramreg_jax._src.optim.keyed`), so both take the parameters beside the state. Live NNX states
(``nnx.state(optimizer)``, ``optimizer.opt_state``) are read as their plain values.
"""

from __future__ import annotations

from typing import Any

import jax

from paramreg_jax._src import errors
from paramreg_jax._src.optim.mirrors import ParamIndex
from paramreg_jax._src.optim.mirrors import is_masked
from paramreg_jax._src.optim.mirrors import mirrors
from paramreg_jax._src.optim.mirrors import optimizer_state
from paramreg_jax._src.registry import assign as registry_lib
from paramreg_jax._src.registry import keys as keys_lib


def _is_nnx(x: Any) -> bool:
  """A flax NNX ``State`` or ``Variable`` (checked without importing flax)."""
  return type(x).__module__.startswith("flax.nnx") and (
    hasattr(x, "to_pure_dict") or hasattr(x, "get_value")
  )


def plain_tree(tree: Any) -> Any:
  """``tree`` with NNX ``State`` objects as nested dicts and ``Variable`` objects as their values, so a live
  ``nnx.state(optimizer)`` (or ``optimizer.opt_state``) and ``nnx.state(model, nnx.Param)``
  mirror each other as plain trees do; anything else unchanged."""

  def plain(x: Any) -> Any:
    if not _is_nnx(x):
      return x
    return x.to_pure_dict() if hasattr(x, "to_pure_dict") else x.get_value()

  if _is_nnx(tree):
    return plain(tree)
  if not any(_is_nnx(x) for x in jax.tree_util.tree_leaves(tree, is_leaf=_is_nnx)):
    return tree
  return jax.tree.map(plain, tree, is_leaf=_is_nnx)


def _optax_state(state: Any) -> Any:
  return plain_tree(optimizer_state(state))


def state_keys(state: Any, params: Any = None, *, by: registry_lib.By = "name") -> frozenset[str]:
  """The parameter keys a (keyed or plain) optax state holds state for.

  Args:
    state: an optimizer state (live, or restored by orbax without a target), also a live
      ``nnx.state(optimizer)`` or ``optimizer.opt_state``.
    params: the parameters the state belongs to; needed because the state has the optimizer's
      own structure (its keys come from the parameters' paths). Without it, only the keys
      stored in a state saved by the first keyed design are found.
    by: ``"name"`` or ``"position"`` keys.

  Returns:
    The keys of every parameter with at least one state leaf (masked ones have none). A
    state that mirrors none of ``params`` (a stateless optimizer, or other parameters) holds
    state for no key: the set is empty.

  Raises:
    ValueError: ``by`` is not ``"name"`` or ``"position"``.
    TypeError: without ``params``, a state that stores no keys (pass ``params``).

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> from paramreg_jax import keyed, state_keys
    >>> params = {"w": jnp.zeros(2), "b": jnp.zeros(1)}
    >>> state = keyed(optax.adam(1e-3)).init(params)
    >>> sorted(state_keys(state, params))
    ['n:b', 'n:w']
  """
  state = _optax_state(state)
  if params is not None:
    index = ParamIndex.of(plain_tree(params), by)
    return frozenset(k for _, _, keys in mirrors(state, index) for k in keys if k is not None)
  found = {
    keys_lib.entry_to_component(path[-1])
    for path, _ in jax.tree_util.tree_flatten_with_path(state)[0]
    if path and keys_lib.is_canonical_key(keys_lib.entry_to_component(path[-1]))
  }
  if not found:
    raise TypeError(
      "state_keys(state) found no stored keys: an optimizer state has the optimizer's own "
      "structure, so pass the parameters it belongs to: state_keys(state, params)"
    )
  return frozenset(found)


def param_state(
  state: Any, params: Any, key: str, *, by: registry_lib.By = "name"
) -> dict[str, Any]:
  """Every state leaf of one parameter, by where it sits in the state.

  Args:
    state: an optimizer state built for ``params`` (also a live ``nnx.state(optimizer)``).
    params: the parameters.
    key: the parameter's canonical key (``"n:dense/kernel"``).
    by: ``"name"`` or ``"position"`` keys.

  Returns:
    ``{path of the mirror in the state: leaf}``, e.g. ``{"0/mu": ..., "0/nu": ...}`` for Adam;
    empty for a parameter that has no state (masked out).

  Raises:
    KeyError: ``key`` is not a parameter key of ``params`` (the closest keys are suggested).

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> from paramreg_jax import param_state
    >>> params = {"dense": {"kernel": jnp.ones((2, 2))}}
    >>> state = optax.adam(1e-3).init(params)
    >>> sorted(param_state(state, params, "n:dense/kernel"))
    ['0/mu', '0/nu']
  """
  state = _optax_state(state)
  index = ParamIndex.of(plain_tree(params), by)
  if key not in index.keys:
    raise KeyError(
      f"{key}: not a parameter key of these params ({len(index.keys)} parameters)"
      + errors.did_you_mean(key, index.keys)
    )
  out: dict[str, Any] = {}
  for prefix, node, keys in mirrors(state, index):
    leaves = jax.tree_util.tree_leaves(node, is_leaf=is_masked)
    for k, leaf in zip(keys, leaves):
      if k == key:
        out["/".join(prefix) or "<root>"] = leaf
  return out
