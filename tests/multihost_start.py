"""How every multi-process worker of the suite starts: on the CPU, with ``devices`` virtual
devices and gloo collectives, as process ``process_id`` of ``processes`` on 127.0.0.1."""

import os


def start(process_id: str, port: str, *, processes: int = 2, devices: int = 4):
  os.environ["JAX_PLATFORMS"] = "cpu"
  import jax

  from paramreg_jax._src.devices import use_cpu_devices

  use_cpu_devices(devices)
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{port}",
    num_processes=processes,
    process_id=int(process_id),
    initialization_timeout=60,
  )
  return jax
