"""What `mlbench check` says of the spatial and stage mesh axes.

Spatial partitioning (`--mesh data=N,spatial=M`) splits every image by height: its
price is the halo exchanges at convolution borders (the train step's
collective-permutes), its gain the activation memory (the step's temporaries) per
device, which falls about as 1/M. Pipeline stages (`--mesh data=N,stage=S`) split the
layers: each device holds 1/S of the layer stack's parameters and optimizer state,
and idles the bubble, (S - 1) / (M + S - 1) of the stack's time, whatever the
compiler does. The bubble bounds the step from below: the model FLOPs at the devices'
peak, stretched by 1 / (1 - bubble), so the MFU cannot exceed 1 - bubble (a run's MFU
counts it as it is: model FLOPs over the measured step, bubble included).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from mlbench import accelerators

if TYPE_CHECKING:
  from mlbench.pod.check import CheckReport
  from mlbench.train.plan import Plan


@dataclasses.dataclass(frozen=True)
class ParallelReport:
  """The spatial and pipeline side of a dry run (per device)."""

  spatial: int
  stages: int
  microbatches: int
  bubble_fraction: float
  layers_per_stage: int | None
  activation_bytes: int       # the train step's temporaries on one device
  halo_permutes: int          # collective-permutes in the train step
  halo_bytes: int
  step_floor_s: float | None  # model FLOPs at peak, stretched by the bubble
  mfu_ceiling: float          # 1 - bubble
  state_bytes: int = 0        # parameters and optimizer state on one device (one stage's)
  peak_bytes: int = 0         # the train step's peak on one device


def report(plan: Plan, check: CheckReport) -> ParallelReport | None:
  """The report for a plan with a spatial or stage axis (None without either)."""
  from mlbench.train import mesh as mesh_lib, pipeline, steps

  spatial = mesh_lib.axis_size(plan.mesh, mesh_lib.SPATIAL)
  stages = pipeline.stage_count(plan.mesh)
  if spatial == 1 and stages == 1:
    return None
  micro = plan.ctx.microbatches if stages > 1 else 1
  bubble = pipeline.bubble_fraction(stages, micro)
  stack = plan.workload.layer_stack(plan.cfg) if stages > 1 else None
  train = check.programs[0]
  floor = None
  acc = accelerators.for_device_kind(check.device_kind)
  if acc is not None:
    model_flops = steps.flops_per_example(plan.workload, plan.cfg, plan.ctx) * plan.gbs
    ideal = model_flops / (plan.mesh.devices.size * acc.device_peak_flops_per_s)
    floor = ideal / (1 - bubble)
  return ParallelReport(
      spatial=spatial, stages=stages, microbatches=micro, bubble_fraction=bubble,
      layers_per_stage=None if stack is None else stack.layers // stages,
      activation_bytes=train.temp_bytes,
      halo_permutes=train.collectives.get("collective-permute", 0),
      halo_bytes=train.collective_bytes.get("collective-permute", 0),
      step_floor_s=floor, mfu_ceiling=1 - bubble,
      state_bytes=check.param_bytes_per_device + check.opt_state_bytes_per_device,
      peak_bytes=train.peak_bytes)


def lines(r: ParallelReport, *, readable: bool = True) -> list[str]:
  """The report as lines of text for the console."""
  mib = lambda n: f"{n / 2**20:,.1f} MiB"  # noqa: E731
  permutes = (f"{r.halo_permutes} collective-permutes ({mib(r.halo_bytes)})" if readable
              else "collective-permutes unknown (XLA could not print the program)")
  out = []
  if r.spatial > 1:
    out.append(f"spatial={r.spatial}: every image split by height over {r.spatial} devices; "
               f"train step: {permutes} for the halo exchanges, activations (temporaries) "
               f"{mib(r.activation_bytes)} per device")
  if r.stages > 1:
    floor = ("" if r.step_floor_s is None else
             f"; no step under {r.step_floor_s * 1e3:,.2f} ms (model FLOPs at peak / "
             f"(1 - bubble))")
    out.append(f"pipeline: {r.stages} stages of {r.layers_per_stage} layers, per stage "
               f"(device) {mib(r.state_bytes)} of parameters and optimizer state and a "
               f"train-step peak of {mib(r.peak_bytes)}; {r.microbatches} microbatches, "
               f"bubble (S-1)/(M+S-1) = "
               f"{100 * r.bubble_fraction:.1f}% of the stack's time, so MFU <= "
               f"{100 * r.mfu_ceiling:.1f}%{floor}; stage hand-offs: {permutes}")
  return out
