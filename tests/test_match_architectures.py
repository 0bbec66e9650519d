"""``match`` on real Hugging Face checkpoints, checked by the forward pass.

Every case is a tiny checkpoint that ``transformers`` saved (``tests/make_hf_fixtures.py``), with
the output PyTorch computed from it. ``match`` maps it, with no hints, into targets written the
way a JAX user would (``tests/hf_models.py``: flax's attention layout per layer, an NNX stack,
a plain dict with Meta's names); the restored weights run the architecture's forward pass in JAX
and must reproduce PyTorch's output. A case that cannot be mapped must be refused with a message
naming the parameter: never restored with a wrong value.
"""

from __future__ import annotations

import hf_models as hf
import numpy as np
import pytest

import paramreg_jax as prj
from paramreg_jax.sources import SafetensorsSource

CASES = sorted(hf.ARCHS)
STYLES = sorted(hf.STYLES)


def run(name: str, style_name: str, *, untied_head: bool | None = None, **match_kwargs):
  arch, sizes, config, ref = hf.case(name)
  style = hf.STYLES[style_name]
  shapes = hf.canonical_shapes(arch, sizes)
  tied = config.get("tie_word_embeddings", True)
  if arch.head and (not tied if untied_head is None else untied_head):
    shapes = hf.with_head(shapes, arch, sizes)
  target = hf.target(style, shapes, arch, sizes)
  src = SafetensorsSource(hf.DATA / name / "model.safetensors")
  m = prj.match(target, src, **match_kwargs)
  restored = prj.restore(target, src, recipes=m)
  weights = hf.to_canonical(style, shapes, arch, sizes, restored)
  got = np.asarray(hf.forward(arch, sizes, weights, ref["input_ids"]))
  return m, got, ref["output"]


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("name", CASES)
def test_forward_pass_matches_pytorch(name, style):
  _, got, want = run(name, style)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5, err_msg=f"{name} into {style}")
