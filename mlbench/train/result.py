"""What one run did: its outcome, its times and rates, and where its log and traces are.

The loop fills it in as the run goes (`mlbench.train.loop`); checkpoints keep the parts a
resumed run carries on from (`mlbench.train.lifecycle`); the runner reports it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mlbench.train import goodput, mfu


@dataclasses.dataclass
class RunResult:
  """What one run did; `log` is set on process 0."""

  seed: int
  success: bool = False
  init_s: float = 0.0
  time_to_train_s: float = 0.0
  train_s: float = 0.0
  eval_s: float = 0.0
  input_wait_s: float = 0.0
  samples: int = 0
  epoch: float = 0.0
  evals: list[tuple[float, float]] = dataclasses.field(default_factory=list)
  train_metrics: dict[str, float] = dataclasses.field(default_factory=dict)
  diverged: str | None = None
  flops_per_example: float = 0.0  # model FLOPs (see mfu), forward and backward
  peak_flops_per_s: float = 0.0   # what the run's devices can do (see mfu.peak)
  peak_source: str = ""
  opt_state_bytes: int = 0
  goodput: goodput.Goodput | None = None
  checkpoint_saves: list[tuple[int, float]] = dataclasses.field(default_factory=list)
  log: Path | None = None
  train_cost: dict[str, float] = dataclasses.field(default_factory=dict)  # XLA's, per device
  tensorboard_dir: Path | None = None  # scalars and traces (process 0)

  @property
  def samples_per_s(self) -> float:
    return self.samples / self.train_s if self.train_s else 0.0

  @property
  def flops_per_s(self) -> float:
    """Achieved model FLOP/s while training."""
    return self.samples_per_s * self.flops_per_example

  @property
  def mfu(self) -> float:
    """Model FLOPs utilisation against the devices' peak."""
    return mfu.utilization(self.flops_per_s, mfu.Peak(self.peak_flops_per_s, self.peak_source))
