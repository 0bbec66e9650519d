"""The ``ParameterBackend`` contract is what the pipeline calls: a backend that only implements
the Protocol's six methods (no subclass of ``JaxBackend``) restores, the plan asks the user's
backend, and each operation is called as documented (one ``materialize_all``, one
``finish_all``, ``validate_bind`` for every slot before any ``bind``)."""

import warnings

import jax
import numpy as np
import pytest

import paramreg_jax as prj
from paramreg_jax import recipes as R
from paramreg_jax._src.restore import contract


class Recording:
  """A backend of its own (delegating to a JaxBackend), recording every call in order."""

  def __init__(self):
    self.inner = prj.JaxBackend()
    self.calls = []

  def preflight_recipe(self, recipe, source):
    self.calls.append(("preflight_recipe", str(recipe)))
    return self.inner.preflight_recipe(recipe, source)

  def materialize_all(self, source, requests):
    self.calls.append(("materialize_all", tuple(c.key for _, c in requests)))
    return self.inner.materialize_all(source, requests)

  def finish_all(self, materializations):
    self.calls.append(("finish_all", tuple(m.key for m in materializations)))
    return self.inner.finish_all(materializations)

  def share_materialized_weight(self, weight):
    self.calls.append(("share_materialized_weight",))
    return self.inner.share_materialized_weight(weight)

  def validate_bind(self, parameter, weight):
    self.calls.append(("validate_bind", tuple(parameter.shape)))
    return self.inner.validate_bind(parameter, weight)

  def bind(self, parameter, weight):
    self.calls.append(("bind", tuple(parameter.shape)))
    return self.inner.bind(parameter, weight)


def _setup():
  w = np.arange(6, dtype=np.float32).reshape(2, 3)
  src = prj.MemorySource({"fc.weight": w, "b": np.ones(3, np.float32)})
  target = {
    "fc": {"kernel": jax.ShapeDtypeStruct((3, 2), np.float32)},
    "b": jax.ShapeDtypeStruct((3,), np.float32),
    "tied": jax.ShapeDtypeStruct((3,), np.float32),
  }
  recipes = {"fc/kernel": R.transpose(R.source("fc.weight"), (1, 0))}
  return w, src, target, recipes


def test_a_protocol_only_backend_restores_and_is_called_as_documented():
  w, src, target, recipes = _setup()
  backend = Recording()
  assert isinstance(backend, prj.ParameterBackend)
  out = prj.restore(target, src, recipes=recipes, aliases={"tied": "b"}, backend=backend)
  np.testing.assert_array_equal(np.asarray(out["fc"]["kernel"]), w.T)
  np.testing.assert_array_equal(np.asarray(out["tied"]), np.ones(3, np.float32))
  names = [c[0] for c in backend.calls]
  assert names[0] == "preflight_recipe"  # the plan asked this backend
  assert names.count("materialize_all") == 1 and names.count("finish_all") == 1
  assert names.index("materialize_all") < names.index("finish_all")
  assert names.count("share_materialized_weight") == 1
  validates = [i for i, n in enumerate(names) if n == "validate_bind"]
  binds = [i for i, n in enumerate(names) if n == "bind"]
  assert len(validates) == len(binds) == 3 and max(validates) < min(binds)


def test_the_plan_asks_the_users_backend_and_names_the_parameter():
  _, src, target, recipes = _setup()

  class Refusing(Recording):
    def preflight_recipe(self, recipe, source):
      raise prj.errors.UnsupportedDtypeError(f"{recipe}: this device cannot hold it")

  with pytest.raises(prj.RestorePlanError, match=r"n:fc/kernel: .*this device cannot hold it"):
    prj.plan_restore(target, src, recipes=recipes, aliases={"tied": "b"}, backend=Refusing())
  # the default backend plans it
  prj.plan_restore(target, src, recipes=recipes, aliases={"tied": "b"})


def test_a_failing_unit_wait_names_the_weight_and_keeps_nothing():
  _, src, target, recipes = _setup()

  class Breaking(Recording):
    def finish_all(self, materializations):
      if any(m.key == "n:fc/kernel" for m in materializations):
        raise RuntimeError("device lost")
      return super().finish_all(materializations)

  plan = prj.plan_restore(target, src, recipes=recipes, aliases={"tied": "b"})
  with pytest.raises(prj.MaterializationError, match=r"^n:fc/kernel: RuntimeError: device lost"):
    prj.materialize(plan, backend=Breaking())


def test_the_seeds_per_weight_operations_are_one_element_unit_calls():
  """The seed's ``materialize(lease)``, ``materialize_recipe``, ``materialized_weight`` and
  ``finish_materialization`` are ``materialize_all``/``.weight``/``finish_all`` of one request,
  without a warning."""
  src = prj.MemorySource({"w": np.arange(4, dtype=np.float32)})
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  ctx = contract.MaterializationContext("n:w", (4,), np.dtype(np.float32), sharding)
  backend = prj.JaxBackend()
  lease = src.lease("w", prj.Range(0, 1, 3))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    [m] = backend.materialize_all(
      src,
      [
        (
          R.source(lease.key, lease.selection),
          ctx.for_slot("n:w", (2,), np.dtype(np.float32), sharding),
        )
      ],
    )
    [weight] = backend.finish_all([m])
    [again] = backend.finish_all(backend.materialize_all(src, [(R.source("w"), ctx)]))
  assert m.weight is not None
  np.testing.assert_array_equal(np.asarray(weight), [1.0, 2.0])
  np.testing.assert_array_equal(np.asarray(again), np.arange(4, dtype=np.float32))
