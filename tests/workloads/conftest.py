"""The compiled programs of every registered workload's mini config, shared by the modules
that drive them (the contract tests and the golden losses): one compile per workload; and a
real photograph as an ImageNet record (the ResNet-50 preprocessing and stem tests)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
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
                                      self.schedule.global_batch_size)
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


@pytest.fixture(scope="session")
def china_jpeg() -> bytes:
  """A real photograph: scikit-learn's china.jpg, a 427x640 JPEG."""
  from importlib import resources

  return (resources.files("sklearn.datasets") / "images" / "china.jpg").read_bytes()


@pytest.fixture(scope="session")
def photo_record(tmp_path_factory, china_jpeg):
  """`china_jpeg` as a serialized ImageNet record (label 608, one box)."""
  from mlbench.datasets import records
  from mlbench.train import data

  tf = data.tf()
  path = str(tmp_path_factory.mktemp("imagenet") / "train-{index:05d}-of-{count:05d}")
  records.write_shards(path, [{
      "image/encoded": china_jpeg, "image/class/label": 608,
      "image/object/bbox/ymin": np.array([0.1], np.float32),
      "image/object/bbox/xmin": np.array([0.2], np.float32),
      "image/object/bbox/ymax": np.array([0.9], np.float32),
      "image/object/bbox/xmax": np.array([0.7], np.float32)}], 1)
  return next(iter(tf.data.TFRecordDataset(path.format(index=0, count=1))))
