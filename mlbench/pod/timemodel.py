"""Time to train on a pod, term by term: what `check` prints and the calibration fits.

    time to train = first-block warm-up
                  + steps x (device step + exposed collectives + host/dispatch overhead)
                  + evaluations x (eval program x eval batches + per-evaluation overhead)

- device step: the roofline of the compiled train step per device, the larger of
  its FLOPs at the chip's peak over the fitted efficiency `eta` (no real step
  reaches the peak) and its HBM bytes at the HBM bandwidth over the fitted
  factor `hbm` (XLA's `bytes accessed` counts every fusion's operands, some of
  which stay in on-chip memory: the fit finds real steps about this much faster
  than the count at the published bandwidth);
- collectives: the data-parallel gradient all-reduce and the model/expert-axis
  collectives, timed on the slice's torus (`collectives`), of which the fitted
  fraction `kappa` is not hidden behind compute;
- per step, the fitted host/dispatch overhead `h` (the host loop, infeed);
- an input-bound check: a host's cores decode `cores / cpu_s_per_example`
  examples per second; a step can be no faster than its share of that;
- evaluations: as many as the rules' cadence (or the run's log) says, each the
  compiled eval step over the eval set split over the devices (padded to whole
  batches), over `eta`, plus the fitted per-evaluation overhead `e0`
  (host-side metrics, the switch between programs);
- warm-up `w0`: the first block's extra time (program load, input start-up).

The six constants live in accelerators.yaml (`time_model`), fitted by
`mlbench.pod.calibration` on the published TPU runs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

# CPU seconds one host core spends to decode and augment one training example, by
# workload: ResNet-50's 2.6-2.8 ms per ImageNet JPEG is measured by
# benchmarks/input_pipeline.py (see /work/shared/notes/jax-scaling.md, section 4); SSD
# decodes larger COCO images (about twice the pixels) plus box handling; the text
# workloads parse pre-tokenised records (tens of microseconds).
INPUT_CPU_S = {"resnet50": 2.7e-3, "ssd": 5.0e-3, "bert": 5e-5, "transformer": 5e-5,
               "moe": 5e-5, "llama31_8b": 2e-4}


@dataclasses.dataclass(frozen=True)
class Constants:
  """The fitted efficiency constants of the time model."""

  eta: float             # achieved fraction of the peak FLOP/s (train and eval programs)
  hbm: float             # XLA's HBM bytes over this factor of the bandwidth
  kappa: float           # fraction of collective time not overlapped with compute
  step_overhead_s: float  # h: host and dispatch overhead per step
  warmup_s: float        # w0: the first block's extra time
  eval_overhead_s: float  # e0: per evaluation, beyond its programs
  # `eta` of each accelerator the fit saw (chips differ: TPU v4's megacore reaches a
  # smaller share of its peak than v3's cores); `eta` itself, their geometric mean,
  # stands for the others.
  eta_by: tuple[tuple[str, float], ...] = ()

  NAMES = ("eta", "hbm", "kappa", "step_overhead_s", "warmup_s", "eval_overhead_s")

  @classmethod
  def from_dict(cls, raw: dict[str, Any]) -> Constants:
    by = tuple(sorted((str(k), float(v)) for k, v in (raw.get("eta_by") or {}).items()))
    return cls(**{k: float(raw[k]) for k in cls.NAMES}, eta_by=by)

  def to_list(self) -> list[float]:
    return [getattr(self, k) for k in self.NAMES]

  def eta_for(self, accelerator: str) -> float:
    return dict(self.eta_by).get(accelerator, self.eta)


@dataclasses.dataclass(frozen=True)
class StepCost:
  """One program's per-device cost: FLOPs and HBM bytes (XLA's counts)."""

  flops: float
  hbm_bytes: float

  def roofline_s(self, peak_flops_per_s: float, hbm_bytes_per_s: float, eta: float = 1.0,
                 hbm: float = 1.0) -> float:
    """The larger of compute and HBM time, at `eta` of the peak and `hbm` x the bandwidth."""
    return max(self.flops / (peak_flops_per_s * eta), self.hbm_bytes / (hbm_bytes_per_s * hbm))


@dataclasses.dataclass(frozen=True)
class Inputs:
  """What the model needs about one run (per device, one step, one evaluation)."""

  devices: int
  global_batch: int
  peak_flops_per_s: float        # per device
  hbm_bytes_per_s: float         # per device
  train: StepCost
  collective_s: float            # all collectives of one step on the topology, unhidden
  steps: float
  evals: float
  eval_batch_cost: StepCost      # one eval batch per device
  eval_batches: int              # per evaluation
  model_flops_per_step: float    # analytic (for MFU)
  input_cpu_s_per_example: float = 0.0
  host_cores_per_device: float = 0.0
  accelerator: str = ""          # accelerators.yaml key (its own fitted efficiency)


@dataclasses.dataclass(frozen=True)
class Terms:
  """The predicted time to train, term by term (seconds)."""

  device_step_s: float
  collective_s: float
  overhead_s: float
  input_step_s: float
  step_s: float
  steps: float
  warmup_s: float
  eval_each_s: float
  evals: float
  mfu: float

  @property
  def train_s(self) -> float:
    return self.steps * self.step_s

  @property
  def eval_s(self) -> float:
    return self.evals * self.eval_each_s

  @property
  def total_s(self) -> float:
    return self.warmup_s + self.train_s + self.eval_s

  @property
  def input_bound(self) -> bool:
    return self.input_step_s > self.device_step_s + self.collective_s + self.overhead_s



def predict(x: Inputs, c: Constants) -> Terms:
  """Every term of the time to train of one run under constants `c`."""
  eta = c.eta_for(x.accelerator)
  device = x.train.roofline_s(x.peak_flops_per_s, x.hbm_bytes_per_s, eta, c.hbm)
  collective = c.kappa * x.collective_s
  per_device_batch = x.global_batch / x.devices
  cores = x.host_cores_per_device
  input_s = per_device_batch * x.input_cpu_s_per_example / cores if cores > 0 else 0.0
  # No step is faster than its collectives alone or than its hosts can feed it.
  step = max(device + collective + c.step_overhead_s, x.collective_s, input_s)
  eval_each = (x.eval_batches * x.eval_batch_cost.roofline_s(
      x.peak_flops_per_s, x.hbm_bytes_per_s, eta, c.hbm) + c.eval_overhead_s)
  mfu = x.model_flops_per_step / (step * x.devices * x.peak_flops_per_s)
  return Terms(device_step_s=device, collective_s=collective, overhead_s=c.step_overhead_s,
               input_step_s=input_s, step_s=step, steps=x.steps, warmup_s=c.warmup_s,
               eval_each_s=eval_each, evals=x.evals, mfu=mfu)


def eval_split(eval_examples: int, data_devices: int, per_device_batch: int) -> tuple[int, int]:
  """(batches per evaluation, per-device batch) for an eval set spread over the devices:
  the last batch is padded, as the harness's evaluation does."""
  per_device_batch = max(1, min(per_device_batch, math.ceil(eval_examples / data_devices)))
  return math.ceil(eval_examples / (per_device_batch * data_devices)), per_device_batch
