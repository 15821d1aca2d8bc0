"""The time model's inputs for one compiled run: what `check`, `plan` and a run's closing
summary predict with (the calibration builds the same inputs from published logs).

The collectives come from the topology (`collectives`): the data-parallel
gradient all-reduce of each chip's gradient bytes over the chips of the data
axis, and the model/expert-axis collectives the compiled program holds (read
from its text or its module proto; unknown when XLA could write neither).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from mlbench import accelerators
from mlbench.pod import collectives, timemodel
from mlbench.pod.timemodel import Constants, StepCost

# An eval batch's sums (correct, count, loss: a few float32s), reduced over the slice.
EVAL_SUMS_BYTES = 16.0
# Used where no constants are fitted for a platform (see accelerators.yaml, time_model).
UNFITTED = Constants(eta=0.5, hbm=1.0, fixed_flops=0.0, warmup_s=5.0, eval_overhead_s=1.0,
                     step_overhead_s=1e-3)


def constants(platform: str) -> tuple[Constants, dict[str, Any]]:
  """The fitted constants of a platform and their provenance (leave-one-out spread)."""
  raw = accelerators.time_model(platform)
  if not raw:
    return UNFITTED, {"fitted_on": "nothing: no constants fitted for this platform"}
  return Constants.from_dict(raw), {k: v for k, v in raw.items()
                                    if k not in (*Constants.NAMES, "eta_by", "warmup_by")}


def link(acc: accelerators.Accelerator) -> collectives.Link:
  ici = acc.ici
  return collectives.Link(link_bytes_per_s=float(ici.get("link_bytes_per_s", 0) or
                                                 acc.interconnect_bytes_per_s),
                          hop_latency_s=float(ici.get("hop_latency_s", 1e-6)),
                          dcn_bytes_per_s=float(ici.get("dcn_bytes_per_s", 0)),
                          dcn_latency_s=float(ici.get("dcn_latency_s", 1e-5)))


def torus_of(acc: accelerators.Accelerator, grid: tuple[int, ...], slices: int = 1
             ) -> collectives.Torus:
  ici = acc.ici
  return collectives.torus(grid, ici.get("pod_dims"), int(ici.get("cube", 0)), slices=slices)


def grid_of(acc: accelerators.Accelerator, chips: int) -> tuple[tuple[int, ...], int]:
  """(chip grid of one slice, slices) for `chips` chips: GPUs are NVLink domains (nodes)
  joined by the network; TPUs the Cloud TPU slice shape of that many chips."""
  domain = int(acc.ici.get("nvlink_domain", 0))
  if domain:
    per = min(domain, chips)
    return (per,), max(1, chips // per)
  from mlbench.pod import topology

  for gen in topology.GENERATIONS.values():
    if gen.accelerator == acc.name and chips in gen.grids:
      return gen.grids[chips], 1
  return (chips,), 1


def data_torus(t: collectives.Torus, other_axes: int) -> collectives.Torus:
  """The torus the data axis spans when `other_axes` (model x expert) neighbouring chips
  share each replica: the first dimension that divides by it shrinks."""
  if other_axes <= 1:
    return t
  dims = list(t.dims)
  for i, d in enumerate(dims):
    if d % other_axes == 0:
      dims[i] = d // other_axes
      return dataclasses.replace(t, dims=tuple(dims))
  return dataclasses.replace(t, dims=(max(1, math.prod(dims) // other_axes),), wrap=(False,))


@dataclasses.dataclass(frozen=True)
class CompiledRun:
  """What the model needs about a run's compiled programs, whatever compiled them (check's
  dry run, plan's compiles or cost table, a finished run's train step)."""

  workload: str
  devices: int
  mesh: dict[str, int]
  global_batch: int
  train: StepCost           # per device
  eval_batch: StepCost      # per device, one eval batch
  eval_batches: int         # per evaluation
  grad_bytes_per_device: float  # the f32 parameters' bytes on a device
  model_collective_bytes: float | None  # None: unknown
  model_flops_per_step: float
  steps: float
  evals: float


def inputs(acc: accelerators.Accelerator, p: CompiledRun) -> timemodel.Inputs:
  chips = max(1, p.devices // acc.devices_per_chip)
  grid, slices = grid_of(acc, chips)
  other = math.prod(v for k, v in p.mesh.items() if k != "data") or 1
  lk = link(acc)
  torus = torus_of(acc, grid, slices)
  coll = collectives.all_reduce_s(p.grad_bytes_per_device, data_torus(torus, other), lk)
  if other > 1 and p.model_collective_bytes:
    coll += collectives.group_s("all-reduce", p.model_collective_bytes, other, lk)
  return timemodel.Inputs(
      devices=p.devices, global_batch=p.global_batch,
      peak_flops_per_s=acc.device_peak_flops_per_s, hbm_bytes_per_s=acc.device_hbm_bytes_per_s,
      train=p.train, collective_s=coll, steps=p.steps, evals=p.evals,
      eval_batch_cost=p.eval_batch, eval_batches=p.eval_batches,
      model_flops_per_step=p.model_flops_per_step,
      input_cpu_s_per_example=timemodel.INPUT_CPU_S.get(p.workload, 0.0),
      host_cores_per_device=acc.host_cores_per_chip / acc.devices_per_chip,
      accelerator=acc.name, param_bytes_per_device=p.grad_bytes_per_device,
      workload=p.workload,
      eval_collective_s=collectives.all_reduce_s(EVAL_SUMS_BYTES, torus, lk))


def run_step(acc: accelerators.Accelerator, plan: Any, result: Any
             ) -> tuple[float, timemodel.Terms] | None:
  """(measured step seconds, predicted terms) of a finished run on an accelerator, from
  the compiled train step's counts the run kept; None where there is nothing to compare.
  On GPUs XLA's count misses the cuBLAS/cuDNN calls: the analytic model FLOPs stand in
  where they are larger."""
  from mlbench.train import steps as steps_lib

  cost, gbs = result.train_cost, plan.gbs
  done = result.samples / gbs if gbs else 0
  if not cost or done < 1 or result.goodput is None:
    return None
  devices = len(plan.runtime.devices)
  model_flops = result.flops_per_example * gbs
  other = math.prod(v for k, v in plan.mesh.shape.items() if k != "data") or 1
  grad = 4.0 * steps_lib.count_params(plan.workload, plan.cfg) / other
  p = CompiledRun(workload=plan.workload.name, devices=devices, mesh=dict(plan.mesh.shape),
                  global_batch=gbs,
                  train=StepCost(max(cost.get("flops", 0.0), model_flops / devices),
                                 cost.get("bytes accessed", 0.0)),
                  eval_batch=StepCost(0.0, 0.0), eval_batches=0, grad_bytes_per_device=grad,
                  model_collective_bytes=None, model_flops_per_step=model_flops, steps=0,
                  evals=0)
  consts, _ = constants(acc.platform)
  return result.goodput.productive_s / done, timemodel.predict(inputs(acc, p), consts)
