"""How long ``match`` takes on a Llama-sized catalogue: 32 layers, ~290 tensors, metadata only;
and ``match`` + ``plan_restore`` on a 50,000-tensor mixture-of-experts catalogue (32 layers x 520
experts x 3 per-expert matrices, stacked into [layers, experts, ...] parameters).

Run: python benchmarks/match.py [--layers 32] [--repeat 5]
Goals: under 1 s (issue 12); under 2 s for the 50,000 tensors (issue 22). No payload exists: the
source is a catalogue of shapes, a fresh one for every run (inference is cached per source).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

import paramreg_jax as prj
from paramreg_jax.sources import TensorMetadata


class Catalogue(prj.MemorySource):
  """Metadata only (a 7B-shaped checkpoint without 13 GB of zeros)."""

  def __init__(self, shapes: dict[str, tuple[int, ...]]):
    super().__init__({})
    self._meta = {k: TensorMetadata(s, np.dtype(np.float32)) for k, s in shapes.items()}
    self._keys = tuple(sorted(shapes))

  def keys(self) -> tuple[str, ...]:
    return self._keys

  def metadata(self, key: str) -> TensorMetadata:
    return self._meta[key]  # a catalogue parsed once, as SafetensorsSource's header is


def llama(
  layers: int, d: int = 4096, heads: int = 32, kv: int = 8, ff: int = 11008, vocab: int = 32000
):
  dh = d // heads
  shapes = {
    "model.embed_tokens.weight": (vocab, d),
    "model.norm.weight": (d,),
    "lm_head.weight": (vocab, d),
  }
  sds = lambda *s: jax.ShapeDtypeStruct(s, np.float32)  # noqa: E731
  target = {
    "embed": {"embedding": sds(vocab, d)},
    "final_norm": {"scale": sds(d)},
    "lm_head": {"kernel": sds(d, vocab)},
  }
  for i in range(layers):
    p = f"model.layers.{i}"
    shapes |= {
      f"{p}.self_attn.q_proj.weight": (heads * dh, d),
      f"{p}.self_attn.k_proj.weight": (kv * dh, d),
      f"{p}.self_attn.v_proj.weight": (kv * dh, d),
      f"{p}.self_attn.o_proj.weight": (d, heads * dh),
      f"{p}.mlp.gate_proj.weight": (ff, d),
      f"{p}.mlp.up_proj.weight": (ff, d),
      f"{p}.mlp.down_proj.weight": (d, ff),
      f"{p}.input_layernorm.weight": (d,),
      f"{p}.post_attention_layernorm.weight": (d,),
    }
  target["layers"] = {
    "attn": {
      "q": {"kernel": sds(layers, d, heads, dh)},
      "k": {"kernel": sds(layers, d, kv, dh)},
      "v": {"kernel": sds(layers, d, kv, dh)},
      "o": {"kernel": sds(layers, heads, dh, d)},
    },
    "mlp": {
      n: {"kernel": sds(layers, d, ff) if n != "down" else sds(layers, ff, d)}
      for n in ("gate", "up", "down")
    },
    "attn_norm": {"scale": sds(layers, d)},
    "mlp_norm": {"scale": sds(layers, d)},
  }
  linen = {k: v for k, v in target.items() if k != "layers"}
  for i in range(layers):
    linen[f"layers_{i}"] = jax.tree.map(lambda x: sds(*x.shape[1:]), target["layers"])
  return Catalogue(shapes), target, linen


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--layers", type=int, default=32)
  ap.add_argument("--repeat", type=int, default=5)
  args = ap.parse_args()
  src, stacked, linen = llama(args.layers)
  print(f"{len(src.keys())} tensors, {args.layers} layers (Llama-7B shapes, metadata only)")
  for name, target in (("stacked (NNX scan)", stacked), ("per-layer (linen)", linen)):
    times = []
    for _ in range(args.repeat):
      t0 = time.perf_counter()
      m = prj.match(target, src)
      times.append(time.perf_counter() - t0)
    print(
      f"  {name}: {len(m)} parameters matched, median {statistics.median(times) * 1e3:.0f} ms, best {min(times) * 1e3:.0f} ms (goal < 1000 ms)"
    )
  layers, experts = 32, 520
  shapes = {
    f"model.layers.{i}.block_sparse_moe.experts.{e}.{w}.weight": (8, 16) if w == "w2" else (16, 8)
    for i in range(layers)
    for e in range(experts)
    for w in ("w1", "w2", "w3")
  }
  sds = lambda *shape: jax.ShapeDtypeStruct(shape, np.float32)  # noqa: E731
  moe = {
    "layers": {
      "moe": {
        "experts": {
          "w1": {"kernel": sds(layers, experts, 8, 16)},
          "w2": {"kernel": sds(layers, experts, 16, 8)},
          "w3": {"kernel": sds(layers, experts, 8, 16)},
        }
      }
    }
  }
  times = []
  for _ in range(args.repeat):
    src = Catalogue(shapes)  # fresh: nothing inferred yet
    t0 = time.perf_counter()
    m = prj.match(moe, src)
    prj.plan_restore(moe, src, recipes=m)
    times.append(time.perf_counter() - t0)
  print(
    f"{len(shapes)} per-expert tensors into 3 stacked parameters: match + plan_restore median "
    f"{statistics.median(times):.2f} s, best {min(times):.2f} s (goal < 2 s)"
  )


if __name__ == "__main__":
  main()
