"""What a run leaves for TensorBoard in its run folder: scalars, and a profile on request.

    <results>/runs/<system>/<benchmark>/<run id>/tensorboard/
      events.out.tfevents.*                      scalars (process 0)
      plugins/profile/<session>/<host>.xplane.pb  `--profile START:COUNT` (every process)

`tensorboard --logdir <results>/runs` shows both (the trace with TensorBoard's
profile plugin, `pip install tensorboard-plugin-profile`, or xprof). Scalars,
after every block of training and every evaluation, at the step they stand at:
the train metrics (`train/loss`, ...), the quality metric (`eval/<key>`),
`perf/samples_per_s`, `perf/mfu` (analytic model FLOPs over the devices' peak)
and `perf/input_wait_fraction` of the block.

The event files are written with flax's metric writer (`flax.metrics.tensorboard`):
flax and TensorFlow are already what the harness runs on, so nothing is added to
install, and TensorFlow's file systems reach the same places the run folder can be
(local disks and gs:// buckets).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlbench.storage import faults
from mlbench.errors import UserError

if TYPE_CHECKING:
  from mlbench.train.plan import Plan


@dataclasses.dataclass(frozen=True)
class ProfileWindow:
  """Steps [start, start + count) of a run are traced by jax.profiler."""

  start: int
  count: int

  @classmethod
  def parse(cls, text: str) -> ProfileWindow:
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text or "")
    if m is None or int(m.group(2)) < 1:
      raise UserError(f"--profile {text!r}: give START:COUNT, the first step to trace and how "
                      "many steps (e.g. --profile 10:5)")
    return cls(int(m.group(1)), int(m.group(2)))


class Telemetry:
  """Scalars (when `scalars`) and a trace of the profile window (when `profile`)."""

  def __init__(self, logdir: Path, *, scalars: bool, profile: ProfileWindow | None,
               flops_per_example: float = 0.0, peak_flops_per_s: float = 0.0):
    self.logdir = Path(logdir)
    self._profile, self._tracing, self._traced = profile, False, False
    self._step: Any = None
    self._flops, self._peak = flops_per_example, peak_flops_per_s
    self._writer = None
    if scalars:
      from flax.metrics import tensorboard

      self.logdir.mkdir(parents=True, exist_ok=True)
      self._writer = tensorboard.SummaryWriter(str(self.logdir))

  @property
  def writes(self) -> bool:
    return self._writer is not None or self._profile is not None

  def before_step(self, step: int) -> None:
    """Starts the trace at the window's first step."""
    if self._profile is not None and not self._traced and step >= self._profile.start:
      import jax

      self.logdir.mkdir(parents=True, exist_ok=True)
      jax.profiler.start_trace(str(self.logdir))
      self._tracing = self._traced = True
    if self._tracing:  # each traced step is named, for the profile's step view
      import jax

      self._step = jax.profiler.StepTraceAnnotation("train", step_num=step)
      self._step.__enter__()

  def after_step(self, step: int, state: Any) -> None:
    """Stops the trace after the window's last step, once the devices are done with it."""
    if self._step is not None:
      self._step.__exit__(None, None, None)
      self._step = None
    if self._tracing and step + 1 >= self._profile.start + self._profile.count:
      self._stop(state)

  def _stop(self, state: Any = None) -> None:
    import jax

    if state is not None:
      jax.block_until_ready(state)
    jax.profiler.stop_trace()
    self._tracing = False

  def block(self, step: int, metrics: dict[str, float], samples: int, seconds: float,
            input_wait_s: float) -> None:
    """Scalars of a finished block of training (`samples` in `seconds` of wall time)."""
    rate = samples / seconds if seconds > 0 else 0.0
    scalars = {f"train/{name}": value for name, value in metrics.items()}
    scalars["perf/samples_per_s"] = rate
    if self._flops and self._peak:
      scalars["perf/mfu"] = rate * self._flops / self._peak
    scalars["perf/input_wait_fraction"] = input_wait_s / seconds if seconds > 0 else 0.0
    self._write(lambda w: [w.scalar(k, v, step) for k, v in scalars.items()])

  def evaluated(self, step: int, key: str, value: float) -> None:
    self._write(lambda w: (w.scalar(f"eval/{key}", value, step), w.flush()))

  def _write(self, write: Callable[[Any], Any]) -> None:
    """Scalars are a view of the run, not part of it: storage that fails under them (a
    full disk) turns them off, with one warning, and the run goes on."""
    if self._writer is None:
      return
    try:
      write(self._writer)
    except Exception as e:  # TensorFlow's own errors
      fault = faults.diagnose(e, self.logdir)
      if fault is None:
        raise
      self._writer = None
      print(f"warning: TensorBoard scalars are off from here on ({fault.cause})",
            file=sys.stderr)

  def close(self) -> None:
    """Ends a trace the run stopped inside of; flushes and closes the event file."""
    if self._step is not None:
      self._step.__exit__(None, None, None)
      self._step = None
    if self._tracing:
      self._stop()
    self._write(lambda w: w.close())
    self._writer = None


def for_run(plan: Plan, folder: Path) -> Telemetry:
  """TensorBoard scalars from process 0 and a trace of `--profile START:COUNT` from every
  process, into the run folder's `tensorboard/`."""
  from mlbench.train import mfu, steps

  window = ProfileWindow(*plan.rc.profile) if plan.rc.profile else None
  leader = plan.runtime.is_leader
  flops = peak = 0.0
  if leader:
    try:
      flops = steps.flops_per_example(plan.workload, plan.cfg, plan.ctx)
      peak = mfu.peak(plan.runtime.local_devices).flops_per_s * plan.runtime.process_count
    except Exception:  # Reporting only: mfu.prepare says why MFU is missing.
      flops = 0.0
  return Telemetry(Path(folder) / "tensorboard", scalars=leader, profile=window,
                   flops_per_example=flops, peak_flops_per_s=peak)


def disabled() -> Telemetry:
  """Telemetry that writes nothing (tests and tools that call the loop directly)."""
  return Telemetry(Path("."), scalars=False, profile=None)
