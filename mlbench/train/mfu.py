"""Model FLOPs utilisation: a run's model FLOP/s against what its devices can do.

The model FLOPs of a step are the workload's analytic count (or XLA's count of
the lowered, unoptimised gradient: on GPUs the compiled program's count misses
the cuBLAS/cuDNN calls). The peak is the accelerator table's dense bf16 FLOP/s
per device times the devices; on a CPU, which has no table entry, it is the
measured rate of a large float32 matmul on this machine (what
benchmarks/accelerator_step.py compares against on a CPU).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import TYPE_CHECKING, Any

from mlbench import accelerators

if TYPE_CHECKING:
  from mlbench.train.plan import Plan
  from mlbench.train.progress import RunProgress


@dataclasses.dataclass(frozen=True)
class Peak:
  """What the devices of a run can do, and where the figure comes from."""

  flops_per_s: float
  source: str


@functools.cache
def measured_matmul_flops_per_s(n: int = 2048, repeats: int = 5,
                                dtype: str = "float32") -> float:
  """FLOP/s of an n x n matmul in `dtype` on the first local device (best of `repeats`)."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  dev = jax.local_devices()[0]
  with jax.transfer_guard("allow"):
    a = jax.device_put(jnp.asarray(np.random.default_rng(0).standard_normal((n, n)),
                                   jnp.dtype(dtype)), dev)
    dot = jax.jit(lambda x: x @ x).lower(a).compile()
    jax.block_until_ready(dot(a))
    best = float("inf")
    for _ in range(repeats):
      t0 = time.perf_counter()
      jax.block_until_ready(dot(a))
      best = min(best, time.perf_counter() - t0)
  return 2 * n**3 / best


def peak(devices: list[Any]) -> Peak:
  """The peak FLOP/s of `devices` together: from the accelerator table, or measured."""
  acc = accelerators.for_device_kind(devices[0].device_kind)
  if acc is not None:
    return Peak(len(devices) * acc.device_peak_flops_per_s,
                f"{len(devices)} x {acc.name} dense bf16 peak")
  # Simulated CPU devices share the host's cores: one matmul measures the whole machine.
  return Peak(measured_matmul_flops_per_s(), "measured 2048x2048 float32 matmul on this host")


def utilization(model_flops_per_s: float, p: Peak) -> float:
  return model_flops_per_s / p.flops_per_s if p.flops_per_s else 0.0


def prepare(plan: Plan, progress: RunProgress) -> tuple[float, Peak]:
  """(model FLOPs of one example, the peak of all the run's devices), told to the progress
  line too.

  A plugin that gives no analytic count and whose one-example gradient cannot be
  lowered on its own (it needs the mesh) gets no MFU: never the compiled program's
  count, which on GPUs misses the cuBLAS/cuDNN calls.
  """
  from mlbench.train import steps

  try:
    flops = steps.flops_per_example(plan.workload, plan.cfg, plan.ctx)
  except Exception as e:  # Reporting only: never fail a run over its FLOP count.
    progress.note(f"model FLOPs not counted ({type(e).__name__}: give the workload an analytic "
                  "flops_per_example); no MFU reported")
    flops = 0.0
  p = peak(plan.runtime.local_devices)
  # All devices of the run: the local ones' peak times the processes (hosts are alike).
  hosts = plan.runtime.process_count
  run = Peak(p.flops_per_s * hosts, p.source if hosts == 1 else f"{hosts} hosts x {p.source}")
  progress.utilization(flops, run.flops_per_s)
  return flops, run
