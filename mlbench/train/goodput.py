"""Goodput of a run: productive training-step time over total wall time.

Computed from the run's own clock (ml-goodput-measurement needs Google Cloud
Logging, not available everywhere). Wall time runs from the original
`init_start` to `run_stop`, restarts included; the badput is split into init
and compile (of every start), evaluation, checkpointing (the time the step
loop waited for saves), input waits, time lost to restarts (work after the
last checkpoint, and the time until the resumed run was back), and the rest.

Every second is counted once: the train segments are the wall time of the
train blocks, the input and checkpoint waits inside them are taken out of the
productive time, and a checkpoint holds the waits of every step up to it (the
block a signal cut short included), so a resumed run neither counts them as
productive nor loses them.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
  from mlbench.train.clock import Clock


@dataclasses.dataclass(frozen=True)
class Goodput:
  """Seconds per category; `goodput` = productive / total."""

  total_s: float
  productive_s: float
  init_s: float
  eval_s: float
  checkpoint_s: float
  input_wait_s: float
  restarts_s: float
  other_s: float

  @property
  def goodput(self) -> float:
    return self.productive_s / self.total_s if self.total_s > 0 else 0.0

  def to_json(self) -> dict[str, float]:
    return {"goodput": round(self.goodput, 4),
            **{k: round(v, 3) for k, v in dataclasses.asdict(self).items()}}

  def summary(self) -> str:
    """One line for the closing summary."""
    parts = [("init+compile", self.init_s), ("eval", self.eval_s),
             ("checkpoint", self.checkpoint_s), ("input", self.input_wait_s),
             ("restarts", self.restarts_s), ("other", self.other_s)]
    total = self.total_s or 1.0
    return (f"goodput {100 * self.goodput:.1f}% of {self.total_s:.1f} s; badput "
            + ", ".join(f"{name} {100 * s / total:.1f}%" for name, s in parts))


def measure(clock: Clock, input_wait_s: float) -> Goodput:
  """The goodput of a finished run from its clock marks and segments, and the time its
  steps waited for input."""
  seg = clock.segments
  total = clock.between("init_start", "run_stop")
  init = clock.between("init_start", "init_stop") + seg["init"]
  # The train segments are wall time of the train blocks: the loop's waits for
  # input and for checkpoint saves happen inside them.
  productive = max(seg["train"] - input_wait_s - seg["checkpoint"], 0.0)
  known = init + seg["eval"] + seg["checkpoint"] + input_wait_s + seg["lost"] + productive
  return Goodput(total_s=total, productive_s=productive, init_s=init, eval_s=seg["eval"],
                 checkpoint_s=seg["checkpoint"], input_wait_s=input_wait_s,
                 restarts_s=seg["lost"], other_s=max(total - known, 0.0))
