"""The way back: parameters written in the layout of the checkpoint they came from.

``invert`` runs recipes backwards (metadata only), ``plan`` checks that they rebuild every
checkpoint tensor (``plan_export``), ``writer`` lays out and stages Hugging Face safetensors
shards, and ``export`` drives them: plan -> write -> commit. ``convert`` restores a foreign
checkpoint once and saves it as orbax in the target's own layout.
"""

from paramreg_jax._src.export.convert import convert
from paramreg_jax._src.export.driver import export
from paramreg_jax._src.export.plan import ExportPlan
from paramreg_jax._src.export.plan import plan_export

__all__ = ("ExportPlan", "convert", "export", "plan_export")
