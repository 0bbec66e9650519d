"""paramreg_jax: stable, path-derived identities for JAX parameters.

Every parameter gets a canonical key from its tree path (``n:encoder/0/kernel``); optimizer
state, checkpoint entries, recipes, reports and errors all use it.
"""

from paramreg_jax import errors as errors
from paramreg_jax import recipes as recipes
from paramreg_jax import sources as sources
from paramreg_jax import typing as typing
from paramreg_jax._src import surface as _surface
from paramreg_jax._src.devices import use_cpu_devices
from paramreg_jax._src.errors import BindError
from paramreg_jax._src.errors import ExportError
from paramreg_jax._src.errors import MatchError
from paramreg_jax._src.errors import MaterializationError
from paramreg_jax._src.errors import ParamRegError
from paramreg_jax._src.errors import ReconcileError
from paramreg_jax._src.errors import RestorePlanError
from paramreg_jax._src.errors import StateMismatchError
from paramreg_jax._src.export import ExportPlan
from paramreg_jax._src.export import convert
from paramreg_jax._src.export import export
from paramreg_jax._src.export import plan_export
from paramreg_jax._src.load import Loaded
from paramreg_jax._src.load import load
from paramreg_jax._src.match import Match
from paramreg_jax._src.match import match
from paramreg_jax._src.optim.debias import DebiasAddedState
from paramreg_jax._src.optim.debias import debias_added
from paramreg_jax._src.optim.keyed import keyed
from paramreg_jax._src.optim.nnx_optimizer import reconcile_optimizer
from paramreg_jax._src.optim.reconcile import reconcile
from paramreg_jax._src.optim.report import SurgeryReport
from paramreg_jax._src.optim.resize import layer_map
from paramreg_jax._src.optim.state_access import param_state
from paramreg_jax._src.optim.state_access import state_keys
from paramreg_jax._src.patterns import label_by_pattern
from paramreg_jax._src.patterns import mask_by_pattern
from paramreg_jax._src.registry.assign import assign_ids
from paramreg_jax._src.registry.assign import assign_keys
from paramreg_jax._src.registry.ids import ParamId
from paramreg_jax._src.registry.keys import INDEXED_KEY_PREFIX
from paramreg_jax._src.registry.keys import NAMED_KEY_PREFIX
from paramreg_jax._src.registry.keys import name_to_path
from paramreg_jax._src.registry.keys import path_to_name
from paramreg_jax._src.registry.registry import ParamRegistry
from paramreg_jax._src.restore.bind import bind
from paramreg_jax._src.restore.contract import Materialization
from paramreg_jax._src.restore.contract import MaterializationContext
from paramreg_jax._src.restore.contract import ParameterBackend
from paramreg_jax._src.restore.jax_backend.backend import JaxBackend
from paramreg_jax._src.restore.materialize import MaterializedUnit
from paramreg_jax._src.restore.materialize import materialize
from paramreg_jax._src.restore.pipeline import restore
from paramreg_jax._src.restore.planning import plan_restore
from paramreg_jax._src.restore.restore_plan import PlanEntry
from paramreg_jax._src.restore.restore_plan import RestorePlan
from paramreg_jax._src.sources.gguf import GGUFSource
from paramreg_jax._src.sources.memory import MemorySource
from paramreg_jax._src.sources.opening import open_source
from paramreg_jax._src.sources.orbax import OrbaxSource
from paramreg_jax._src.sources.safetensors import SafetensorsSource
from paramreg_jax._src.sources.selection import Full
from paramreg_jax._src.sources.selection import Indices
from paramreg_jax._src.sources.selection import Range

__version__ = "0.1.0.dev0"

# a name exported elsewhere: an AttributeError that says where
__getattr__ = _surface.elsewhere("paramreg_jax")

__all__ = (
  "INDEXED_KEY_PREFIX",
  "NAMED_KEY_PREFIX",
  "BindError",
  "DebiasAddedState",
  "ExportError",
  "ExportPlan",
  "Full",
  "GGUFSource",
  "Indices",
  "JaxBackend",
  "Loaded",
  "Match",
  "MatchError",
  "Materialization",
  "MaterializationContext",
  "MaterializationError",
  "MaterializedUnit",
  "MemorySource",
  "OrbaxSource",
  "ParamId",
  "ParamRegError",
  "ParamRegistry",
  "ParameterBackend",
  "PlanEntry",
  "Range",
  "ReconcileError",
  "RestorePlan",
  "RestorePlanError",
  "SafetensorsSource",
  "StateMismatchError",
  "SurgeryReport",
  "assign_ids",
  "assign_keys",
  "bind",
  "convert",
  "debias_added",
  "export",
  "keyed",
  "label_by_pattern",
  "layer_map",
  "load",
  "mask_by_pattern",
  "match",
  "materialize",
  "name_to_path",
  "open_source",
  "param_state",
  "path_to_name",
  "plan_export",
  "plan_restore",
  "reconcile",
  "reconcile_optimizer",
  "restore",
  "state_keys",
  "use_cpu_devices",
)
