"""assign_ids vs jax.tree_util.tree_flatten_with_path on the same tree, as ratios in one run.

Run: python benchmarks/registry.py
Targets (issue 2): first assignment <= 2.0x the flatten; re-assignment of an already
registered tree of the same treedef <= 1.2x.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp

from paramreg_jax import ParamRegistry
from paramreg_jax import assign_ids
from paramreg_jax._src.registry import assign as registry_lib


def make_tree(n_leaves: int):
  """A nested model-like tree: layers of 10 named leaves, shared small arrays."""
  leaf = jnp.zeros((2,))
  n_layers = n_leaves // 10
  return {"model": {f"layer_{i}": {f"p{j}": leaf for j in range(10)} for i in range(n_layers)}}


def timeit(fn, repeat: int) -> float:
  times = []
  for _ in range(repeat):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def main() -> None:
  print(
    f"{'leaves':>8} {'flatten_with_path':>18} {'first assign':>14} {'ratio':>6} "
    f"{'re-assign':>10} {'ratio':>6}"
  )
  for n in (1_000, 10_000, 100_000):
    tree = make_tree(n)
    repeat = 7 if n < 100_000 else 3
    floor = timeit(lambda: jax.tree_util.tree_flatten_with_path(tree), repeat)

    def first():
      registry_lib.clear_caches()
      assign_ids(ParamRegistry(), tree)

    t_first = timeit(first, repeat)
    reg, _ = assign_ids(ParamRegistry(), tree)
    t_again = timeit(lambda: assign_ids(reg, tree), repeat)
    print(
      f"{n:>8} {floor * 1e3:>16.2f}ms {t_first * 1e3:>12.2f}ms {t_first / floor:>6.2f} "
      f"{t_again * 1e3:>8.2f}ms {t_again / floor:>6.2f}"
    )


if __name__ == "__main__":
  main()
