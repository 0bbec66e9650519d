"""Virtual CPU devices that never deadlock, and one guard for the library's own collectives.

XLA:CPU runs every device's part of a program on one client thread pool of
``max(cores, devices)`` threads. A program with collectives (all-reduce, all-to-all, an
all-gather from resharding) blocks a pool thread per device until all of them reach the
rendezvous. With 8 virtual devices on a 2-core machine the pool has 8 threads; once more than
one such program is in flight, participants of a later program can hold threads that the
earlier program's last participant needs, and XLA aborts the process after 40 s
(``Termination timeout for 'all reduce' ... only 7 of them arrived``). Measured on 2 cores with
a jitted sharded step dispatched back to back: pools of 8-10 threads abort every run, 12 half
of them, 16 none (also under a competing CPU-bound process); waiting for each program before
dispatching the next never aborts.

Two defences, both here:

* :func:`use_cpu_devices` asks for ``count`` virtual devices **and** a pool of ``2 * count``
  threads (``PJRT_NPROC``), before jax creates its CPU client. The demo, the notebooks and
  the test suite use it.
* :func:`settle` waits for a multi-device array on the CPU backend, so the library itself
  (``reconcile``'s resharding, the demo's steps; ``materialize`` runs no XLA program) never
  has more than one of its collective programs in flight, whatever the pool size.
"""

from __future__ import annotations

import os
from typing import Any
from typing import TypeVar

import jax

T = TypeVar("T")

_COUNT_FLAG = "--xla_force_host_platform_device_count"


def use_cpu_devices(count: int = 8) -> None:
  """Simulates ``count`` CPU devices safely; call it before jax's first computation.

  Sets ``--xla_force_host_platform_device_count=count`` (the documented way to get several
  CPU devices) and, unless you set it yourself, ``PJRT_NPROC=2 * count``: XLA:CPU's default
  thread pool of ``max(cores, count)`` threads can deadlock when several sharded programs
  with collectives are in flight (docs/howto/cpu_devices.md).

  Args:
    count: the number of CPU devices ``jax.devices()`` should report.

  Returns:
    ``None``; ``jax.devices()`` then reports ``count`` CPU devices.

  Raises:
    ValueError: ``count`` is not a positive int.
    RuntimeError: jax has already created its CPU client with another device count (restart
      the process or kernel and call this first).

  Examples:
    >>> import jax, paramreg_jax as prj
    >>> prj.use_cpu_devices(len(jax.devices()))  # already initialised: a no-op if it matches
  """
  if not isinstance(count, int) or isinstance(count, bool) or count < 1:
    raise ValueError(f"use_cpu_devices: count must be a positive int, got {count!r}")
  from jax._src import xla_bridge

  if xla_bridge.backends_are_initialized():
    have = len(jax.devices("cpu"))
    if have != count:
      raise RuntimeError(
        f"use_cpu_devices({count}): jax already created its CPU client with {have} device(s); "
        "call use_cpu_devices before the first jax computation (restart the process or kernel)"
      )
    return
  flags = os.environ.get("XLA_FLAGS", "")
  kept = [f for f in flags.split() if not f.startswith(_COUNT_FLAG)]
  os.environ["XLA_FLAGS"] = " ".join([*kept, f"{_COUNT_FLAG}={count}"])  # child processes too
  if hasattr(jax.config, "jax_num_cpu_devices"):  # takes precedence over the flag when set
    jax.config.update("jax_num_cpu_devices", count)
  if "PJRT_NPROC" not in os.environ and "NPROC" not in os.environ:
    os.environ["PJRT_NPROC"] = str(max(2 * count, os.cpu_count() or 1))


def _needs_settling(x: Any) -> bool:
  sharding = getattr(x, "sharding", None)
  if sharding is None or len(sharding.device_set) < 2:
    return False
  return next(iter(sharding.device_set)).platform == "cpu"


def settle(tree: T) -> T:
  """Waits for the multi-device CPU arrays of ``tree``; returns it (a no-op elsewhere).

  Call it on the result of every library-dispatched program that may contain collectives,
  so at most one is in flight (XLA:CPU deadlocks otherwise; module docstring).
  """
  pending = [
    x
    for x in jax.tree.leaves(tree)
    if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) and _needs_settling(x)
  ]
  if pending:
    jax.block_until_ready(pending)
  return tree
