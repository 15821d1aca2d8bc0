"""Cloud TPU slice names (`v4-128`, `v5p-256`, `v6e-64`, ...) as compile targets.

A slice name becomes a topology description from libtpu
(`jax.experimental.topologies.get_topology_desc`): TPU devices that no process
owns, which a `Mesh` can span and `jit(...).lower(...).compile()` can compile
for, with no TPU attached. Names follow Cloud TPU's accelerator types: v2, v3,
v4 and v5p count TensorCores (two per chip), v5e and v6e count chips.
`v3-4096` and `v3-8192` are the TPU-v3 multipods of Google's MLPerf v0.7
submissions (2,048 and 4,096 chips), which Cloud TPU never sold; `v4-6912` (3,456
chips, 12x12x24) the slice of Google's v2.0 submission.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from mlbench.errors import UserError

if TYPE_CHECKING:
  from mlbench import system

# Chips -> chip grid, per interconnect shape (Cloud TPU documentation's slice shapes).
_GRID_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16),
            256: (16, 16), 512: (16, 32), 1024: (32, 32), 2048: (32, 64), 4096: (32, 128)}
_GRID_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4),
            128: (4, 4, 8), 256: (4, 8, 8), 512: (8, 8, 8), 1024: (8, 8, 16),
            2048: (8, 16, 16), 3456: (12, 12, 24), 4096: (16, 16, 16), 6144: (16, 16, 24)}


@dataclasses.dataclass(frozen=True)
class Generation:
  """One TPU generation: how its slice names count and which chip grids it has."""

  prefix: str          # in slice names: v4-128
  platform_name: str   # in libtpu topology names: v4:4x4x4
  accelerator: str     # key in accelerators.yaml
  cores_per_name_unit: int  # slice names count TensorCores (2 per chip) or chips (1)
  grids: dict[int, tuple[int, ...]]
  max_chips: int
  chip_config: str = "default"


GENERATIONS = {
    "v2": Generation("v2", "v2", "tpu_v2", 2, _GRID_2D, 256),
    "v3": Generation("v3", "v3", "tpu_v3", 2, _GRID_2D, 4096),
    # v4 shows each chip as one device (megacore), as on a real v4 slice.
    "v4": Generation("v4", "v4", "tpu_v4", 2, _GRID_3D, 4096, chip_config="megacore"),
    "v5p": Generation("v5p", "v5p", "tpu_v5p", 2, _GRID_3D, 6144),
    "v5e": Generation("v5e", "v5e", "tpu_v5e", 1, _GRID_2D, 256),
    "v5litepod": Generation("v5litepod", "v5e", "tpu_v5e", 1, _GRID_2D, 256),
    "v6e": Generation("v6e", "v6e", "tpu_v6e", 1, _GRID_2D, 256),
}


@dataclasses.dataclass(frozen=True)
class Slice:
  """A named TPU slice: its chips, their grid and the libtpu topology that describes it."""

  name: str
  generation: Generation
  chips: int
  grid: tuple[int, ...]

  @property
  def topology_name(self) -> str:
    return f"{self.generation.platform_name}:{'x'.join(map(str, self.grid))}"

  @property
  def accelerator(self) -> Any:
    from mlbench import accelerators

    return accelerators.table()[self.generation.accelerator]


def valid_names() -> list[str]:
  """Every slice name `parse` accepts, smallest first per generation."""
  return [f"{g.prefix}-{chips * g.cores_per_name_unit}" for g in GENERATIONS.values()
          for chips in sorted(g.grids) if chips <= g.max_chips
          and (g.cores_per_name_unit == 1 or chips >= 4)]


def parse(name: str) -> Slice:
  """`v4-128` -> the 64-chip v4 slice (4x4x4); a clear error listing valid names."""
  m = re.fullmatch(r"(v2|v3|v4|v5p|v5e|v5litepod|v6e)-(\d+)", name.strip().lower())
  if m is None or name.strip().lower() not in valid_names():
    raise UserError(f"unknown TPU slice '{name}'; use one of: {', '.join(valid_names())}")
  gen = GENERATIONS[m.group(1)]
  chips = int(m.group(2)) // gen.cores_per_name_unit
  return Slice(name=name.strip().lower(), generation=gen, chips=chips, grid=gen.grids[chips])


# What libtpu reads at start-up instead of asking a TPU VM's metadata server: without
# them it prints "could not determine TPU accelerator type" and an INVALID_ARGUMENT
# line on stderr even though compiling for a described topology needs neither. And
# compiling touches no TPU, so several processes may load libtpu at once (it otherwise
# takes /tmp/libtpu_lockfile and aborts the second).
_QUIET_LIBTPU = {"TPU_SKIP_MDS_QUERY": "1", "TPU_ACCELERATOR_TYPE": "v4-8",
                 "TPU_WORKER_HOSTNAMES": "localhost", "TPU_WORKER_ID": "0",
                 "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


@contextlib.contextmanager
def _quiet_libtpu() -> Iterator[None]:
  saved = {k: os.environ.get(k) for k in _QUIET_LIBTPU}
  for k, v in _QUIET_LIBTPU.items():
    os.environ.setdefault(k, v)
  try:
    yield
  finally:
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)


def devices(slice_: Slice) -> list[Any]:
  """The slice's TPU devices (owned by no process), from libtpu's topology description."""
  try:
    from jax.experimental import topologies
    import libtpu  # noqa: F401  (the TPU compiler; a clear error below if missing)
  except ImportError as e:
    raise UserError("compiling for a TPU topology needs libtpu: pip install 'mlbench[tpu]'") from e
  hosts = (1, 1, 1) if slice_.chips == 1 else (2, 2, 1)
  with _quiet_libtpu():
    topo = topologies.get_topology_desc(
        platform="tpu", topology_name=slice_.topology_name,
        chip_config_name=slice_.generation.chip_config, chips_per_host_bounds=hosts, num_slices=1)
  return list(topo.devices)


def runtime(slice_: Slice) -> Any:
  """A `Runtime` over the slice's devices, as if one process drove them all (compile only)."""
  from mlbench.train.runtime import Runtime

  devs = devices(slice_)
  return Runtime(process_index=0, process_count=1, devices=devs, local_devices=devs)


def machine(slice_: Slice, devs: list[Any]) -> system.Machine:
  """A system description of the slice for the plan (no host is probed: there is none)."""
  from mlbench import system

  acc = slice_.accelerator
  return system.Machine(processor="", sockets=0, cores=0, vcpus=0, frequency="", caches="",
                        memory_bytes=0, os="", accelerator=devs[0].device_kind,
                        accelerators=len(devs), accelerator_memory_bytes=acc.device_hbm_bytes,
                        nodes=1)
