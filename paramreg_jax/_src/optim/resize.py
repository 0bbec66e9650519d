"""Keeping the optimizer state of a resized parameter: what still means something survives.

A vocabulary that grows (``embed`` ``[V, D]`` -> ``[V + k, D]``), an MLP widened, a stack of
layers made deeper or shallower: the rows, columns or layers that exist in both shapes keep
their moments; the rest get what ``tx.init`` gives them. ``reconcile(...,
on_shape_mismatch=...)`` takes ``"overlap"`` (the leading overlap, per axis), or a callable
``(key, old_leaf, fresh_leaf) -> leaf``; :func:`layer_map` builds one for depth changes.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from paramreg_jax._src import errors

Resize = Callable[[str, Any, Any], Any]


def _array(x: Any) -> Any:
  """``x`` to compute with: on the host where this process holds all of it (whatever its
  mesh's axis types: an Explicit-axes array refuses a scatter between two shardings), else
  as it is (``apply`` puts the result in the new parameter's sharding)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return x
  return np.asarray(x)


def overlap(key: str, old: Any, fresh: Any) -> Any:
  """``fresh`` with its leading region that ``old`` also has replaced by ``old``'s values (the
  same rank and dtype; else ``fresh``: nothing overlaps in a meaningful way)."""
  del key
  if np.ndim(old) != np.ndim(fresh) or jnp.result_type(old) != jnp.result_type(fresh):
    return fresh
  region = tuple(slice(0, min(a, b)) for a, b in zip(np.shape(old), np.shape(fresh)))
  old_a, fresh_a = _array(old), _array(fresh)
  if isinstance(fresh_a, np.ndarray) and isinstance(old_a, np.ndarray):
    out = fresh_a.copy()
    out[region] = old_a[region]
    return out
  return jnp.asarray(fresh_a).at[region].set(jnp.asarray(old_a)[region])


def describe(old: Any, fresh: Any, out: Any) -> str:
  """What of the old state a resize kept, in words."""
  if out is fresh:
    return (
      f"{tuple(np.shape(old))} -> {tuple(np.shape(fresh))}: nothing kept (rank or dtype changed)"
    )
  kept = [min(a, b) for a, b in zip(np.shape(old), np.shape(fresh))]
  region = ", ".join(f"0:{n}" for n in kept)
  return f"{tuple(np.shape(old))} -> {tuple(np.shape(fresh))}: kept [{region}], fresh elsewhere"


def layer_map(sources: Sequence[int | None], *, axis: int = 0) -> Resize:
  """A resize policy for stacked layers: new layer ``i`` takes old layer ``sources[i]``
  (``None``: fresh, as ``tx.init`` gives it); an old layer may feed several new ones.

  Args:
    sources: for each new index along ``axis``, the old index it keeps, or ``None``.
    axis: the stacked axis (``0`` for ``nnx.scan``/``nn.scan`` layers).

  Returns:
    ``(key, old_leaf, fresh_leaf) -> leaf`` for ``reconcile(..., on_shape_mismatch=...)``;
    leaves of other shapes (an unrelated resize) keep their overlap.

  Raises:
    ReconcileError: at once, an entry of ``sources`` that is not an int >= 0 or ``None``; when
      ``reconcile`` applies it, an old index beyond the old state's ``axis`` (the message names
      the key).

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> import paramreg_jax as prj
    >>> tx = prj.keyed(optax.adam(1e-3))
    >>> old = tx.init({"layers": jnp.ones((2, 3))})
    >>> old = old[0]._replace(mu={"layers": jnp.array([[1.0] * 3, [2.0] * 3])}), old[1]
    >>> deeper = {"layers": jnp.ones((4, 3))}  # depth up-scaling: 0, 0, 1, 1
    >>> state, report = prj.reconcile(tx, old, deeper, on_shape_mismatch=prj.layer_map([0, 0, 1, 1]))
    >>> state[0].mu["layers"][:, 0].tolist()
    [1.0, 1.0, 2.0, 2.0]
  """
  picks = list(sources)
  if any(s is not None and (isinstance(s, bool) or not isinstance(s, int) or s < 0) for s in picks):
    raise errors.ReconcileError(
      f"layer_map: sources must be old layer indices (ints >= 0) or None, got {picks!r}"
    )

  def resize(key: str, old: Any, fresh: Any) -> Any:
    if np.ndim(old) != np.ndim(fresh) or np.shape(fresh)[axis] != len(picks):
      return overlap(key, old, fresh)
    if np.delete(np.shape(old), axis).tolist() != np.delete(np.shape(fresh), axis).tolist():
      return overlap(key, old, fresh)
    n = np.shape(old)[axis]
    bad = [s for s in picks if s is not None and s >= n]
    if bad:
      raise errors.ReconcileError(
        f"{key}: layer_map takes old layers {bad}, but the old state has {n} along axis {axis}"
      )
    old_a, fresh_a = _array(old), _array(fresh)
    xp = np if isinstance(old_a, np.ndarray) and isinstance(fresh_a, np.ndarray) else jnp
    rows = [
      xp.take(old_a, s, axis=axis) if s is not None else xp.take(fresh_a, i, axis=axis)
      for i, s in enumerate(picks)
    ]
    return xp.stack(rows, axis=axis).astype(fresh_a.dtype)

  return resize


def apply(policy: Any, key: str, old: Any, fresh: Any) -> tuple[Any, str, bool]:
  """The resized leaf, what was kept, and whether anything was; a policy whose result does
  not fit is an error."""
  out = overlap(key, old, fresh) if policy == "overlap" else policy(key, old, fresh)
  if np.shape(out) != np.shape(fresh) or jnp.result_type(out) != jnp.result_type(fresh):
    raise errors.ReconcileError(
      f"{key}: on_shape_mismatch gave a {tuple(np.shape(out))} {jnp.result_type(out)} leaf, the "
      f"new state needs {tuple(np.shape(fresh))} {jnp.result_type(fresh)}"
    )
  kept = out is not fresh  # judged before the result is placed (a placed copy is never fresh)
  how = (
    describe(old, fresh, out)
    if policy == "overlap"
    else (f"{tuple(np.shape(old))} -> {tuple(np.shape(fresh))}: by the on_shape_mismatch callable")
  )
  out = jax.device_put(out, fresh.sharding) if isinstance(fresh, jax.Array) else out
  return out, how, kept
