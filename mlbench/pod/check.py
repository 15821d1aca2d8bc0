"""`mlbench check`: compile a workload for a mesh from shapes alone, run nothing.

What a pod run would hit first, found on a laptop: sharding errors, memory per
device (parameters, optimizer state, temporaries, from the compiled
executable's memory analysis), FLOPs per step and the collectives XLA put in
the program. In the spirit of maxtext's train_compile.py.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "collective-permute")


@dataclasses.dataclass(frozen=True)
class ProgramReport:
  """One compiled program on one device (the SPMD program every device runs)."""

  name: str
  flops: float | None          # per step, all devices together
  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  code_bytes: int
  collectives: dict[str, int]

  @property
  def peak_bytes(self) -> int:
    """Arguments, outputs not aliased to them, and temporaries: live at once at worst."""
    return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes


@dataclasses.dataclass(frozen=True)
class CheckReport:
  workload: str
  config: str
  mesh: dict[str, int]
  platform: str
  params: int
  param_bytes_per_device: int
  opt_state_bytes_per_device: int
  opt_state_bytes_total: int
  programs: tuple[ProgramReport, ...]

  def to_json(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    for p, prog in zip(out["programs"], self.programs):
      p["peak_bytes"] = prog.peak_bytes
    return out


def collectives(hlo_text: str) -> dict[str, int]:
  """How many of each collective op the optimized HLO holds (async pairs count once)."""
  counts = {}
  for op in COLLECTIVES:
    counts[op] = len(re.findall(rf"= [^\n]*? {op}(?:-start)?\(", hlo_text))
  return counts


def _program(name: str, compiled: Any, devices: int) -> ProgramReport:
  from mlbench.train.steps import _flops

  mem = compiled.memory_analysis()
  flops = _flops(compiled)
  return ProgramReport(
      name=name, flops=None if flops is None else flops * devices,
      argument_bytes=int(mem.argument_size_in_bytes), output_bytes=int(mem.output_size_in_bytes),
      alias_bytes=int(mem.alias_size_in_bytes), temp_bytes=int(mem.temp_size_in_bytes),
      code_bytes=int(mem.generated_code_size_in_bytes), collectives=collectives(compiled.as_text()))


def dry_run(plan: Any) -> CheckReport:
  """Compiles the plan's init, train and eval programs and reports on them."""
  import jax
  import numpy as np

  from mlbench.train import sharding, steps

  programs = steps.compile_programs(plan.workload, plan.cfg, plan.schedule, plan.mesh, plan.ctx,
                                    plan.tx, weight_update_sharding=plan.rc.weight_update_sharding)
  params, _ = jax.eval_shape(lambda k: plan.workload.init(plan.cfg, k), jax.random.key(0))
  devices = int(plan.mesh.devices.size)
  return CheckReport(
      workload=plan.workload.name, config=plan.config_name, mesh=dict(plan.mesh.shape),
      platform=plan.runtime.devices[0].platform,
      params=int(sum(np.prod(x.shape) for x in jax.tree.leaves(params))),
      param_bytes_per_device=sharding.bytes_per_device(params, programs.state_sharding.params),
      opt_state_bytes_per_device=programs.opt_state_bytes,
      opt_state_bytes_total=programs.opt_state_bytes_replicated,
      programs=(_program("train step", programs.train, devices),
                _program("eval step", programs.eval, devices)))
