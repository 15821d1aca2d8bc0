"""The system a run runs on: this host probed, and its MLPerf system description.

`probe` finds what the process can tell of its host and devices (processor, caches,
memory, OS, accelerators); `describe` makes of it the `systems/<system>.json` that
system_desc_checker accepts, and `ensure_system` writes it into the results folder once
(`mlbench.storage.results.system_file`): never replaced, and a later run with a different
division is refused.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
from importlib import metadata
from pathlib import Path
from typing import Any

from mlbench.storage import paths, results, writes
from mlbench.errors import UserError

# Allowed `status` values of systems/<system>.json (system_desc_checker, >= 4.0)
# and the `submission_status` value each one logs as (compliance rules <= 4.0).
STATUS_TO_LOG = {
    "Available on-premise": "onprem",
    "Available cloud": "cloud",
    "Preview": "preview",
    "Research, Development, or Internal (RDI)": "research",
}
DEFAULT_STATUS = "Research, Development, or Internal (RDI)"


@dataclasses.dataclass(frozen=True)
class Machine:
  """What this host and its devices are, as far as the process can tell."""

  processor: str
  sockets: int
  cores: int
  vcpus: int
  frequency: str
  caches: str
  memory_bytes: int
  os: str
  accelerator: str
  accelerators: int
  accelerator_memory_bytes: int
  nodes: int


def _cpuinfo() -> list[dict[str, str]]:
  try:
    text = Path("/proc/cpuinfo").read_text()
  except OSError:
    return []
  blocks = []
  for chunk in text.strip().split("\n\n"):
    entry = {}
    for line in chunk.splitlines():
      k, _, v = line.partition(":")
      entry[k.strip()] = v.strip()
    blocks.append(entry)
  return blocks


def _caches() -> str:
  out = []
  for idx in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
    try:
      level = (idx / "level").read_text().strip()
      kind = (idx / "type").read_text().strip()
      size = (idx / "size").read_text().strip()
    except OSError:
      continue
    out.append(f"L{level} {kind.lower()} {size}")
  return ", ".join(out)


def _memory_bytes() -> int:
  try:
    for line in Path("/proc/meminfo").read_text().splitlines():
      if line.startswith("MemTotal:"):
        return int(line.split()[1]) * 1024
  except OSError:
    pass
  return 0


def _os_name() -> str:
  try:
    for line in Path("/etc/os-release").read_text().splitlines():
      if line.startswith("PRETTY_NAME="):
        return f"{line.split('=', 1)[1].strip(chr(34))}, Linux {platform.release()}"
  except OSError:
    pass
  return platform.platform()


def probe(devices: list[Any], process_count: int) -> Machine:
  """Describes this host; `devices` are the process's local JAX devices."""
  info = _cpuinfo()
  first = info[0] if info else {}
  vcpus = os.cpu_count() or 1
  sockets = len({b.get("physical id", "0") for b in info}) or 1
  cores = int(first.get("cpu cores", vcpus)) if first else vcpus
  mhz = first.get("cpu MHz")
  accel = [d for d in devices if d.platform != "cpu"]
  accel_mem = 0
  if accel:
    stats = accel[0].memory_stats() or {}
    accel_mem = int(stats.get("bytes_limit", 0))
  return Machine(
      processor=first.get("model name", platform.processor() or platform.machine()),
      sockets=sockets, cores=cores, vcpus=vcpus,
      frequency=f"{float(mhz):.0f} MHz" if mhz else "",
      caches=_caches(), memory_bytes=_memory_bytes(), os=_os_name(),
      accelerator=accel[0].device_kind if accel else "", accelerators=len(accel),
      accelerator_memory_bytes=accel_mem, nodes=process_count)


def default_system_name(machine: Machine) -> str:
  """`cpu-2core`, `1xnvidia-h100-80gb-hbm3`, `4x8xtpu-v4`: what and how many."""
  if machine.accelerators:
    kind = re.sub(r"[^a-z0-9]+", "-", machine.accelerator.lower()).strip("-")
    nodes = f"{machine.nodes}x" if machine.nodes > 1 else ""
    return f"{nodes}{machine.accelerators}x{kind}"
  nodes = f"{machine.nodes}x" if machine.nodes > 1 else ""
  return f"{nodes}cpu-{machine.vcpus}core"


def _version(dist: str) -> str:
  try:
    return metadata.version(dist)
  except metadata.PackageNotFoundError:
    return "not installed"


def describe(machine: Machine, *, system: str, submitter: str, division: str,
             notes: str) -> dict[str, Any]:
  """A system description with every field system_desc_checker requires."""
  gib = 1024 ** 3
  tf = _version("tensorflow-cpu") if _version("tensorflow") == "not installed" else _version(
      "tensorflow")
  return {
      "submitter": submitter,
      "division": division,
      "status": DEFAULT_STATUS,
      "system_name": system,
      "number_of_nodes": str(machine.nodes),
      "host_processors_per_node": str(machine.sockets),
      "host_processor_model_name": machine.processor,
      "host_processor_core_count": str(machine.cores),
      "host_processor_vcpu_count": str(machine.vcpus),
      "host_processor_frequency": machine.frequency,
      "host_processor_caches": machine.caches,
      "host_processor_interconnect": "",
      "host_memory_capacity": f"{machine.memory_bytes / gib:.0f} GB" if machine.memory_bytes else "",
      "host_storage_type": "",
      "host_storage_capacity": "",
      "host_networking": "",
      "host_networking_topology": "",
      "host_memory_configuration": "",
      "accelerators_per_node": str(machine.accelerators),
      "accelerator_model_name": machine.accelerator or "N/A",
      "accelerator_host_interconnect": "",
      "accelerator_frequency": "",
      "accelerator_on-chip_memories": "",
      "accelerator_memory_configuration": "",
      "accelerator_memory_capacity": (f"{machine.accelerator_memory_bytes / gib:.0f} GB"
                                      if machine.accelerator_memory_bytes else ""),
      "accelerator_interconnect": "",
      "accelerator_interconnect_topology": "",
      "cooling": "",
      "hw_notes": notes,
      "framework": f"JAX {_version('jax')}, Flax {_version('flax')}, Optax {_version('optax')}",
      "other_software_stack": (f"jaxlib {_version('jaxlib')}, TensorFlow {tf} (tf.data only), "
                               f"mlperf-logging {_version('mlperf-logging')}, "
                               f"Python {platform.python_version()}"),
      "operating_system": machine.os,
      "sw_notes": f"mlbench {_version('mlbench')}",
  }


def ensure_system(results_dir: paths.PathLike, description: dict[str, Any]) -> dict[str, Any]:
  """Writes `systems/<system>.json` unless it exists; returns what is on disk.

  Raises:
    UserError: the existing description is unreadable, or names another
      division than this run.
  """
  path = results.system_file(results_dir, description["system_name"])
  path.parent.mkdir(parents=True, exist_ok=True)
  writes.write_new(path, json.dumps(description, indent=2) + "\n")
  try:
    on_disk = json.loads(path.read_text())
  except (OSError, json.JSONDecodeError) as e:
    raise UserError(f"{path} is not valid JSON ({e}); fix it or choose another --system") from None
  if on_disk.get("division") != description["division"]:
    raise UserError(f"{path} is for the {on_disk.get('division')} division but this run is "
                    f"{description['division']}; choose another --system name")
  if on_disk.get("status") not in STATUS_TO_LOG:
    raise UserError(f"{path} has status {on_disk.get('status')!r}; use one of: "
                    + "; ".join(STATUS_TO_LOG))
  return on_disk
