"""What a published MLPerf training log says about its run: its time, the samples it
trained, its blocks and evaluations. Both log formats, read by `mlbench.resultlog`.

Timing caveats of real logs (see shared/mlperf-results/README.md): TensorFlow
logs written asynchronously at thousands of chips can carry impossible block
timestamps, and some carry a `run_start` stamped before `init_stop` (the
v0.7 TPU-v3 TF SSD log: 15 hours before); the run's time is therefore taken
from the later of the two to `run_stop`, not as MLPerf scores it
(`ResultLog.time_to_train_ms`, run_start to run_stop). Block times count as sound only where
the blocks cover nearly the whole run and the later ones agree.

Runs whose evaluation is asynchronous (SSD's COCO metric on the host, BERT's and
the Transformer's at thousands of chips) go on training while an evaluation is
scored, and log evaluations of that speculative training after `run_stop`. What
the timed run trained is therefore the more of: the samples of the last
evaluation logged by `run_stop`, and the blocks completed by then; evaluations
logged after it are not the run's.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any

from mlbench.errors import UserError
from mlbench.resultlog import Line, ResultLog

# Benchmarks whose log counts training in epochs of the training set.
_EPOCH_BENCHMARKS = ("resnet", "ssd", "transformer", "gnmt", "maskrcnn", "unet3d", "retinanet")


@dataclasses.dataclass(frozen=True)
class Block:
  """A block of training between evaluations: wall time and training samples."""

  start_s: float
  stop_s: float
  samples: float


@dataclasses.dataclass(frozen=True)
class RunLog:
  """One run, as its log tells it; times in seconds."""

  path: Path
  benchmark: str
  platform: str
  global_batch_size: int
  success: bool
  run_s: float               # the start of the run (see module doc) to run_stop
  samples: float             # training samples the timed run trained (see module doc)
  evals: int                 # evaluations logged by run_stop
  eval_samples: int          # examples of one evaluation
  train_examples: int        # the training set, as logged (0: not logged)
  blocks: tuple[Block, ...]
  eval_s: tuple[float, ...]  # eval_start..eval_stop of each evaluation that logs both
  old_format: bool = False
  start_s: float = 0.0       # the run's start (see module doc), as the log stamps it

  @property
  def steps(self) -> float:
    return self.samples / self.global_batch_size

  def sound_step_s(self) -> float | None:
    """Median step time over the blocks after the first, where block times are sound:
    the blocks cover at least 90 % of the run and the first is within 1.5x of the rest
    per sample (a first block with warm-up in it is fine; one 10x slower is not)."""
    if len(self.blocks) < 3 or self.run_s <= 0:
      return None
    cover = sum(b.stop_s - b.start_s for b in self.blocks) / self.run_s
    rates = [(b.stop_s - b.start_s) / b.samples for b in self.blocks if b.samples > 0]
    if cover < 0.9 or len(rates) < 3 or min(rates) <= 0:
      return None
    later = statistics.median(rates[1:])
    if not later / 1.5 <= rates[0] <= later * 3 or max(rates[1:]) > 1.5 * later:
      return None
    return later * self.global_batch_size

  def warmup_s(self) -> float | None:
    """The first block's time beyond the later blocks' steady rate, plus the wait from the
    run's start to it: compile, program load, the input pipeline's fill and the first
    steps' warm-up as the log shows them; None where block times are not sound."""
    step = self.sound_step_s()
    if step is None:
      return None
    first = self.blocks[0]
    steady = first.samples / self.global_batch_size * step
    extra = max(0.0, first.start_s - self.start_s) + (first.stop_s - first.start_s - steady)
    # A first block shorter than its samples allow is no warm-up: its stamps are not the
    # training's (blocks that overlap evaluations, as in the v0.6 SSD logs).
    return extra if extra >= 0 else None


def _first(evs: list[Line], key: str) -> Line | None:
  return next((e for e in evs if e.key == key), None)


def _value(evs: list[Line], *keys: str) -> Any:
  for key in keys:
    e = _first(evs, key)
    if e is not None and e.value is not None:
      return e.value
  return None


def _samples_of(e: Line, benchmark: str, gbs: int, train_examples: int, zero_based: bool
                ) -> float:
  """Training samples an evaluation event stands at."""
  meta = e.metadata
  if meta.get("samples_count"):
    return float(meta["samples_count"])
  n = float(meta.get("epoch_num") or 0)
  if benchmark == "bert":  # v0.7 counts steps, v1.0 on samples
    return n * gbs if n < 1e5 else n
  if benchmark in _EPOCH_BENCHMARKS and train_examples:
    return (n + (1 if zero_based else 0)) * train_examples
  return n


def read(path: Path, train_examples: int | None = None) -> RunLog:
  """The run a result log describes; `train_examples` where the log does not say."""
  log = ResultLog.read(path)
  evs = log.events
  if not evs:
    raise UserError(f"{path}: no :::MLLOG or :::MLL lines; give an MLPerf result log")
  benchmark = str(_value(evs, "submission_benchmark") or "")
  gbs = int(_value(evs, "global_batch_size") or 0)
  n_train = int(_value(evs, "train_samples", "num_train_examples") or train_examples or 0)
  if benchmark == "bert":
    n_train = 0  # BERT's train_samples is the samples trained, not a dataset size
  run_start, run_stop = _first(evs, "run_start"), _first(evs, "run_stop")
  init_stop = _first(evs, "init_stop")
  if run_start is None or run_stop is None or not gbs:
    raise UserError(f"{path}: no run_start, run_stop or global_batch_size; not a complete run")
  start = max(_s(run_start), _s(init_stop) if init_stop else 0.0)
  first_epochs = [e.metadata.get("first_epoch_num") for e in evs if e.key == "block_start"]
  zero_based = bool(first_epochs) and first_epochs[0] == 0
  evals = [e for e in evs if e.key in ("eval_accuracy", "eval_bleu", "eval_mlm_accuracy")
           and e.value is not None and _s(e) <= _s(run_stop)]
  blocks = _blocks(evs, benchmark, gbs, n_train, zero_based)
  samples = max(max((_samples_of(e, benchmark, gbs, n_train, zero_based) for e in evals),
                    default=0.0),
                sum(b.samples for b in blocks if b.stop_s <= _s(run_stop)))
  return RunLog(
      path=Path(path), benchmark=benchmark, platform=str(_value(evs, "submission_platform") or ""),
      global_batch_size=gbs, success=(run_stop.metadata.get("status") == "success"),
      run_s=_s(run_stop) - start, samples=samples, evals=len(evals),
      eval_samples=int(_value(evs, "eval_samples", "num_eval_examples") or 0),
      train_examples=n_train, blocks=blocks,
      eval_s=_eval_times(evs), old_format=log.old_format,
      start_s=start)


def _s(e: Line) -> float:
  """An event's time in seconds."""
  return e.time_ms / 1e3


def _blocks(evs: list[Line], benchmark: str, gbs: int, n_train: int, zero_based: bool
            ) -> tuple[Block, ...]:
  """Block start/stop pairs (matched by first_epoch_num) and the samples each trained."""
  starts = {e.metadata.get("first_epoch_num"): e for e in evs if e.key == "block_start"}
  out = []
  for stop in (e for e in evs if e.key == "block_stop"):
    start = starts.get(stop.metadata.get("first_epoch_num"))
    if start is None:
      continue
    count = float(start.metadata.get("epoch_count") or 1)
    if benchmark == "bert":
      samples = count * gbs
    elif n_train:
      samples = count * n_train
    else:
      samples = count
    out.append(Block(_s(start), _s(stop), samples))
  return tuple(out)


def _eval_times(evs: list[Line]) -> tuple[float, ...]:
  starts = {e.metadata.get("epoch_num"): _s(e) for e in evs if e.key == "eval_start"}
  return tuple(_s(e) - starts[e.metadata.get("epoch_num")] for e in evs
               if e.key == "eval_stop" and e.metadata.get("epoch_num") in starts)


def runs(folder: Path, train_examples: int | None = None) -> list[RunLog]:
  """Every successful run's log in a `results/<system>/<benchmark>` folder."""
  logs = [read(p, train_examples) for p in sorted(Path(folder).glob("result_*.txt"))]
  return [r for r in logs if r.success]
