"""Jitted keyed(adamw) step time / jitted adamw step time, as a ratio in one run.

Run: python benchmarks/keyed_optax.py [--leaves 500] [--params 50e6] [--steps 20] [--wide 10000]
Targets (issue 9): step ratio <= 1.02 (the keyed state *is* optax's state; the check runs at
trace time only); on a --wide-leaf tree, tx.init and the first (trace + compile) call <= 1.1x.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import optax

import paramreg_jax as prj


def make_params(n_leaves: int, n_params: float):
  per_leaf = max(1, int(n_params) // n_leaves)
  width = 256
  rows = max(1, per_leaf // width)
  keys = jax.random.split(jax.random.key(0), n_leaves)
  return {
    f"block_{i // 10}": {f"w{k}": jax.random.normal(keys[i + k], (rows, width)) for k in range(10)}
    for i in range(0, n_leaves, 10)
  }


def bench(tx, params, steps: int):
  def step_fn(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  step = jax.jit(step_fn, donate_argnums=(0, 1))
  state = tx.init(params)
  grads = jax.tree.map(lambda p: 1e-3 * jnp.ones_like(p), params)
  params = jax.tree.map(jnp.copy, params)
  t0 = time.perf_counter()
  params, state = step(params, state, grads)
  jax.block_until_ready(params)
  first = time.perf_counter() - t0
  for _ in range(3):  # warm-up
    params, state = step(params, state, grads)
  jax.block_until_ready(params)
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    params, state = step(params, state, grads)
    jax.block_until_ready(params)
    times.append(time.perf_counter() - t0)
  return first, times


def best(fn, repeat=3):
  out = []
  for _ in range(repeat):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    out.append(time.perf_counter() - t0)
  return min(out)


def wide(n_leaves: int) -> None:
  """tx.init and the first jitted step on a tree of many small leaves (host work dominates)."""
  params = {
    f"m{i // 100}": {f"w{i % 100}": jnp.full((4,), i, jnp.float32) for i in range(i, i + 100)}
    for i in range(0, n_leaves, 100)
  }
  n = len(jax.tree.leaves(params))
  plain, keyed = optax.adamw(1e-3), prj.keyed(optax.adamw(1e-3))
  init_plain = best(lambda: plain.init(params))
  init_keyed = best(lambda: keyed.init(params))
  firsts = {}
  for name, tx in (("plain", plain), ("keyed", keyed)):  # ~3 min each for 10k leaves on 2 cores
    state = tx.init(params)
    step = jax.jit(lambda p, s, tx=tx: tx.update(p, s, p))  # a new function: traced anew
    t0 = time.perf_counter()
    jax.block_until_ready(step(params, state))
    firsts[name] = time.perf_counter() - t0
  fp, fk = firsts["plain"], firsts["keyed"]
  print(
    f"{n} leaves: tx.init adamw {init_plain:.3f} s, keyed {init_keyed:.3f} s, ratio "
    f"{init_keyed / init_plain:.2f} (target <= 1.1); first jitted step {fp:.2f} s vs {fk:.2f} s, "
    f"ratio {fk / fp:.2f} (target <= 1.1)"
  )


def reconcile_ratio(n_leaves: int = 2000) -> None:
  """``reconcile`` of an unchanged state against ``tx.init``, at ``n_leaves`` parameters: the
  work a resume does when nothing changed (goal <= 2x)."""
  params = {f"layer{i}": {"w": jnp.ones((4, 4)), "b": jnp.zeros(4)} for i in range(n_leaves // 2)}
  for name, inner in (
    ("adamw", optax.adamw(1e-3)),
    ("chain(clip, adamw)", optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))),
  ):
    tx = prj.keyed(inner)
    state = tx.init(params)
    t_init = best(lambda tx=tx: jax.block_until_ready(tx.init(params)))
    t_rec = best(
      lambda tx=tx, state=state: jax.block_until_ready(prj.reconcile(tx, state, params)[0])
    )
    print(
      f"reconcile, nothing changed, {n_leaves} leaves, {name}: {t_rec:.3f} s vs tx.init "
      f"{t_init:.3f} s, ratio {t_rec / t_init:.2f} (goal <= 2)"
    )


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--leaves", type=int, default=500)
  ap.add_argument("--params", type=float, default=50e6)
  ap.add_argument("--steps", type=int, default=20)
  ap.add_argument("--wide", type=int, default=10_000)
  args = ap.parse_args()
  reconcile_ratio()
  wide(args.wide)
  params = make_params(args.leaves, args.params)
  n = sum(x.size for x in jax.tree.leaves(params))
  print(
    f"{len(jax.tree.leaves(params))} leaves, {n / 1e6:.1f}M parameters, {args.steps} timed steps"
  )
  first_plain, plain = bench(optax.adamw(1e-3), params, args.steps)
  first_keyed, keyed = bench(prj.keyed(optax.adamw(1e-3)), params, args.steps)
  # interleave a second round to cancel drift on a noisy machine
  _, plain2 = bench(optax.adamw(1e-3), params, args.steps)
  _, keyed2 = bench(prj.keyed(optax.adamw(1e-3)), params, args.steps)
  mp, mk = statistics.median(plain + plain2), statistics.median(keyed + keyed2)
  print(
    f"step (median): adamw {mp * 1e3:.1f} ms, keyed(adamw) {mk * 1e3:.1f} ms, ratio {mk / mp:.3f} (target <= 1.02)"
  )
  print(
    f"first call (trace + compile): adamw {first_plain:.2f} s, keyed {first_keyed:.2f} s, ratio {first_keyed / first_plain:.2f}"
  )


if __name__ == "__main__":
  main()
