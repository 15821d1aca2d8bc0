"""Process setup: simulated CPU devices, jax.distributed, and JAX flags.

Called once by the CLI before anything touches a device; importing mlbench
modules never does any of this.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlbench.errors import UserError


@dataclasses.dataclass(frozen=True)
class Runtime:
  """What this process is part of."""

  process_index: int
  process_count: int
  devices: list[Any]
  local_devices: list[Any]

  @property
  def is_leader(self) -> bool:
    """Process 0 writes logs, results and the human-readable output."""
    return self.process_index == 0


def setup(*, cpu_devices: int | None = None) -> Runtime:
  """Configures JAX for this process and returns what it sees.

  Args:
    cpu_devices: simulate this many CPU devices (a pod on one host). Must be
      set before JAX initialises its backends, so call this first.
  """
  import jax

  if cpu_devices is not None:
    if cpu_devices < 1:
      raise UserError(f"--cpu-devices must be >= 1, got {cpu_devices}")
    try:
      jax.config.update("jax_num_cpu_devices", int(cpu_devices))
    except RuntimeError as e:  # The backend is already up (e.g. a second run() in-process).
      if len(jax.devices("cpu")) != cpu_devices:
        raise UserError(f"cannot switch to {cpu_devices} CPU devices after JAX started with "
                        f"{len(jax.devices('cpu'))}; run in a fresh process") from e
  return Runtime(process_index=jax.process_index(), process_count=jax.process_count(),
                 devices=jax.devices(), local_devices=jax.local_devices())


def clear_page_cache() -> bool:
  """Flushes and drops the OS page cache, as MLPerf requires before a run.

  Returns:
    Whether the cache was dropped (it needs root on Linux).
  """
  import os

  try:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
      f.write("3\n")
    return True
  except OSError:
    return False
