"""Process setup: simulated CPU devices, jax.distributed, and JAX flags.

Called once by the CLI before anything touches a device; importing mlbench
modules never does any of this.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

from mlbench.storage import paths
from mlbench.errors import UserError


@dataclasses.dataclass(frozen=True)
class Runtime:
  """What this process is part of."""

  process_index: int
  process_count: int
  devices: list[Any]
  local_devices: list[Any]
  xla_flags: tuple[str, ...] = ()  # what setup added to XLA_FLAGS (GPU_XLA_FLAGS on GPUs)

  @property
  def is_leader(self) -> bool:
    """Process 0 writes logs, results and the human-readable output."""
    return self.process_index == 0

  @property
  def simulated_pod(self) -> bool:
    """Several XLA:CPU devices sharing this host's cores.

    There, train steps in flight at once were seen to deadlock in XLA:CPU's
    collectives (a model-parallel step: "Termination timeout for all reduce ...
    only 1 of 4 threads arrived", after ~60 steps); the loop then waits for
    each step, which cost nothing measurable (445 vs 449 samples/s).
    """
    return len(self.local_devices) > 1 and self.local_devices[0].platform == "cpu"


@dataclasses.dataclass(frozen=True)
class Distributed:
  """jax.distributed settings given on the command line; None: found by jax.distributed
  on a cluster it knows (a Cloud TPU slice, GKE, SLURM, Open MPI), else one process."""

  coordinator: str | None = None
  num_processes: int | None = None
  process_id: int | None = None

  @property
  def explicit(self) -> bool:
    return any(v is not None for v in (self.coordinator, self.num_processes, self.process_id))


_SLURM = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")


def _count(name: str) -> int:
  value = os.environ.get(name, "1")
  return int(value) if value.isdigit() else 1


def _cluster_detected() -> str | None:
  """A job whose processes jax.distributed sets up from its environment: "slice" (a
  multi-host TPU slice named by GKE's TPU_WORKER_HOSTNAMES), "slurm" (a step of several
  `srun` tasks), "mpi" (`mpirun`), "tpu-vm" (a Cloud TPU VM: GCE's metadata server names
  the slice's hosts, if it has several); None elsewhere."""
  import glob

  tpu_hosts = (os.environ.get("TPU_PROCESS_ADDRESSES")
               or os.environ.get("TPU_WORKER_HOSTNAMES", ""))
  if "," in tpu_hosts:
    return "slice"
  if all(v in os.environ for v in _SLURM) and _count("SLURM_NTASKS") > 1:
    return "slurm"
  if "OMPI_MCA_orte_hnp_uri" in os.environ and _count("OMPI_COMM_WORLD_SIZE") > 1:
    return "mpi"
  tpu = glob.glob("/dev/accel*") or (glob.glob("/dev/vfio/[0-9]*")
                                     and not glob.glob("/dev/nvidia[0-9]*"))
  return "tpu-vm" if tpu else None


def _native_stdout_to_stderr() -> None:
  """Keeps stdout for machine output: Gloo prints status lines ("[Gloo] Rank 0 is
  connected to 1 peer ranks") to file descriptor 1 from C++. Point fd 1 at
  stderr, and sys.stdout at a copy of the original stdout."""
  sys.stdout.flush()
  original = os.dup(1)
  os.dup2(2, 1)
  sys.stdout = os.fdopen(original, "w", buffering=1)


def _start_distributed(dist: Distributed) -> None:
  """jax.distributed on a cluster it detects, each option given overriding what it finds;
  with options on no such cluster, all three are needed."""
  import jax

  detected = _cluster_detected()
  if not (dist.explicit or detected):
    return
  if not detected and None in (dist.coordinator, dist.num_processes, dist.process_id):
    raise UserError("a multi-host run needs --coordinator HOST:PORT, --num-processes N and "
                    "--process-id I together (found on TPU slices, SLURM and Open MPI)")
  if None not in (dist.num_processes, dist.process_id) and not (
      0 <= dist.process_id < dist.num_processes):
    raise UserError(f"--process-id must be in 0..{dist.num_processes - 1}, "
                    f"got {dist.process_id}")
  _native_stdout_to_stderr()
  try:
    # A coordinator given binds to that address only (the default binds every interface).
    jax.distributed.initialize(coordinator_address=dist.coordinator,
                               num_processes=dist.num_processes, process_id=dist.process_id,
                               coordinator_bind_address=dist.coordinator,
                               initialization_timeout=120)
  except ValueError as e:  # Nothing found: on a TPU VM outside a slice, run alone.
    if detected != "tpu-vm" or dist.explicit:
      raise UserError(f"jax.distributed found no {detected or 'cluster'} settings ({e}); give "
                      "--coordinator HOST:PORT, --num-processes N and --process-id I") from None
    print(f"warning: no TPU slice found ({e}); running as one process", file=sys.stderr)


def _accelerator_attached() -> bool:
  """A TPU (/dev/accel*, /dev/vfio/N on v5e and later) or a GPU this host can see."""
  import glob

  return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")
              or glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/kfd"))


def cpu_only_without_accelerator() -> None:
  """Before anything imports JAX: with no accelerator attached, JAX's platforms are the
  CPU's (JAX_PLATFORMS=cpu) for this process and those it starts, whatever a command
  imports. libtpu (installed for `mlbench check --topology`) otherwise brings up a TPU
  client at JAX's first device query and prints "Failed to find host bounds ...
  TPU_ACCELERATOR_TYPE" and an INVALID_ARGUMENT line on stderr. An explicit JAX_PLATFORMS
  is left alone, as is a process where JAX already runs (a test calling `main`).
  """
  if os.environ.get("JAX_PLATFORMS") or "jax" in sys.modules or _accelerator_attached():
    return
  os.environ["JAX_PLATFORMS"] = "cpu"


GPU_XLA_FLAGS = ("--xla_gpu_enable_latency_hiding_scheduler=true",)
"""XLA flags a run on GPUs gets: the latency-hiding scheduler overlaps collectives with
compute (NVIDIA's JAX container sets it, docs.nvidia.com/jax-toolbox/environment-variables;
MaxText's GPU recipes too). Data: add a flag here once a benchmark shows it helps."""


def _gpu_xla_flags() -> tuple[str, ...]:
  """Appends `GPU_XLA_FLAGS` to XLA_FLAGS on a host with an NVIDIA GPU, before XLA starts,
  except those the user's XLA_FLAGS already sets; returns the ones added."""
  import glob

  from jax._src import xla_bridge

  if not glob.glob("/dev/nvidia[0-9]*") or xla_bridge.backends_are_initialized():
    return ()
  os.environ["XLA_FLAGS"], added = with_flags(os.environ.get("XLA_FLAGS", ""), GPU_XLA_FLAGS)
  return added


def with_flags(present: str, flags: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
  """(`present` XLA_FLAGS with those of `flags` it does not set, the flags added): a flag
  the user set, to any value, stays theirs."""
  names = {f.split("=")[0] for f in present.split()}
  added = tuple(f for f in flags if f.split("=")[0] not in names)
  return " ".join([present, *added]).strip(), added


def _pin_cpu_without_accelerator() -> None:
  """With no accelerator attached, run on the CPU platform only.

  libtpu (installed for `mlbench check --topology`) otherwise tries to bring up a
  TPU at JAX's start and prints "could not determine TPU accelerator type" and an
  INVALID_ARGUMENT line on stderr before falling back to the CPU. An explicit
  JAX_PLATFORMS (or jax_platforms) is left alone.
  """
  import jax
  from jax._src import xla_bridge

  if (os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms
      or xla_bridge.backends_are_initialized() or _accelerator_attached()):
    return
  jax.config.update("jax_platforms", "cpu")


def setup(*, cpu_devices: int | None = None, distributed: Distributed = Distributed(),
          compile_cache: paths.Path | None = None) -> Runtime:
  """Configures JAX for this process and returns what it sees.

  Args:
    cpu_devices: simulate this many CPU devices per process (a pod on one
      host). Must be set before JAX initialises its backends, so call this first.
    distributed: multi-host settings; jax.distributed starts before any device
      is touched.
    compile_cache: the folder of JAX's persistent compilation cache (None: off),
      set before anything compiles.
  """
  import jax

  from mlbench.train import compile_cache as compile_cache_lib

  _pin_cpu_without_accelerator()
  xla_flags = _gpu_xla_flags()
  if cpu_devices is not None:
    if cpu_devices < 1:
      raise UserError(f"--cpu-devices must be >= 1, got {cpu_devices}")
    try:
      jax.config.update("jax_num_cpu_devices", int(cpu_devices))
    except RuntimeError as e:  # The backend is already up (e.g. a second run() in-process).
      if len(jax.devices("cpu")) != cpu_devices:
        raise UserError(f"cannot switch to {cpu_devices} CPU devices after JAX started with "
                        f"{len(jax.devices('cpu'))}; run in a fresh process") from e
  compile_cache_lib.configure(compile_cache)
  _start_distributed(distributed)
  return Runtime(process_index=jax.process_index(), process_count=jax.process_count(),
                 devices=jax.devices(), local_devices=jax.local_devices(), xla_flags=xla_flags)


def leave(code: int, *, finished: bool) -> int:
  """The end of this process's command: in a multi-process run, every process posts its exit
  code, waits for the others, and shuts jax.distributed down with them before the
  interpreter exits (`lifecycle.peers.leave`); returns the code every process exits with.
  `finished`: the command returned (not an error). Alone, or before JAX: `code`."""
  if "jax" not in sys.modules:  # No command that never imported JAX started it.
    return code
  from mlbench.train.lifecycle import peers

  return peers.leave(code, finished=finished)


def any_process(flag: bool) -> bool:
  """Whether `flag` is true on any process of the run (itself when alone): one
  process's answer for facts every process observes for its own host."""
  import jax
  import numpy as np

  if jax.process_count() == 1:
    return bool(flag)
  from jax.experimental import multihost_utils as mhu

  return bool(np.asarray(mhu.process_allgather(np.asarray(int(flag), np.int32))).any())


def clear_page_cache() -> bool:
  """Flushes and drops the OS page cache, as MLPerf requires before a run.

  Returns:
    Whether the cache was dropped (it needs root on Linux).
  """
  try:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
      f.write("3\n")
    return True
  except OSError:
    return False
