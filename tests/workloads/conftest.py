"""The compiled programs of every registered workload's mini config, shared by the modules
that drive them (the contract tests and the golden losses): one compile per workload."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from mlbench import registry
from mlbench.train import mesh as mesh_lib, steps
from mlbench.workload import Schedule, StepContext, Workload


@dataclasses.dataclass(frozen=True)
class Compiled:
  """One workload's mini config compiled for the 8 test devices."""

  workload: Workload
  cfg: Any
  schedule: Schedule
  ctx: StepContext
  programs: steps.Programs

  def fresh_state(self, seed: int = 0) -> Any:
    """A new train state (the train step donates its state: every test starts anew)."""
    return self.programs.init_state(seed)

  def train(self, state: Any, batch: dict) -> tuple[Any, dict]:
    """One train step on a host batch; (state, the step's metric sums)."""
    device_batch = mesh_lib.to_global(batch, self.programs.batch_sharding,
                                      self.schedule.rows())
    return self.programs.train(state, self.programs.fresh_sums(), device_batch)


def compile_mini(w: Workload, devices: Any = None, sets: tuple[str, ...] = ()) -> Compiled:
  """The workload's mini config (with `--set` overrides `sets`) compiled for `devices`
  (default: all 8) on one data axis."""
  from mlbench import config as config_lib

  cfg = config_lib.override(w.configs["mini"](), list(sets)) if sets else w.configs["mini"]()
  sched = w.schedule(cfg)
  mesh = mesh_lib.make_mesh(devices=devices)
  ctx = StepContext(mesh=mesh)
  programs = steps.compile_programs(w, cfg, sched, mesh, ctx, w.optimizer(cfg, sched))
  return Compiled(w, cfg, sched, ctx, programs)


# Session-scoped and parametrized: pytest runs every module's tests of one workload
# together, so each workload compiles once however many modules use it.
@pytest.fixture(scope="session", params=registry.names())
def compiled(request) -> Compiled:
  return compile_mini(registry.get(request.param))


@pytest.fixture(scope="session")
def compile_workload():
  """compile_workload(w, devices) -> Compiled, for a test that needs other devices too."""
  return compile_mini
