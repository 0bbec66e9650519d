"""The host-memory budget of a restore: source bytes held at once besides the restored arrays."""

from __future__ import annotations

import os

_MIB = 1 << 20
# Windows alive at once: being read, read and waiting, being built. Each gets 1/DEPTH of the
# budget; the reader never waits for the builders and vice versa.
DEPTH = 3


def default_max_inflight_bytes(remote: bool = False) -> int:
  """The default host budget: 1/64 of the memory available now, between 4 and 16 MiB, or
  between 4 and 64 MiB for a source at a URL.

  A local disk does not need more: three windows of about 5 MiB (being read, read, being
  built) already keep it and the build threads busy, and a larger budget was no faster
  (docs/benchmarks.md): it only raises the peak. Over a network each window waits for its
  requests, and the reader needs more ahead of the builders to keep the wire busy (an HTTP
  restore took 3x the local one at 16 MiB, 1.6x at 64 MiB: ``benchmarks/remote.py``). A
  single shard whose blocks are larger is still read whole.

  Examples:
    >>> from paramreg_jax._src.restore.jax_backend.budget import default_max_inflight_bytes
    >>> 4 << 20 <= default_max_inflight_bytes() <= 16 << 20
    True
  """
  available = None
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          available = int(line.split()[1]) * 1024
          break
  except OSError:
    pass
  if available is None:
    try:
      available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
      available = 1 << 31
  return int(min((64 if remote else 16) * _MIB, max(4 * _MIB, available // 64)))
