"""Time to train on a pod, term by term: what `check` and `plan` print and the calibration fits.

    time to train = first-block warm-up
                  + steps x (device step + exposed collectives + host overhead)
                  + evaluations x (eval batches x (eval program + its sums' all-reduce)
                                   + per-evaluation overhead)

- device step: a soft roofline of the compiled train step per device, its FLOPs at
  the chip's peak over the fitted efficiency `eta` against its per-example HBM
  bytes at the bandwidth times the fitted factor `hbm` (`ROOFLINE_P`-norm of the
  two: near the ridge neither hides the other completely), plus the fitted
  `fixed_flops`: per-step device work that does not shrink with the batch
  (the weight update, normalisation statistics, small ops' latencies), as FLOPs
  at the chip's peak, so it takes a v3 core 4.5x longer than a v4 chip. The
  per-example bytes are XLA's `bytes accessed` less the batch-independent ones,
  `fixed_bytes_per_param` x the f32 parameter bytes per device (held at the
  cached compiles' intercept, 42.9: fitting it as well scored worse under
  leave-one-out and swung from 46 to 27 with one run left out);
- replicas running different programs (a run that buckets sequences by length runs
  one program per bucket, a replica's step drawing one): each program's roofline at its
  share of a replica's steps, and the step the expected slowest of the replicas
  (`slowest_of`: they wait for each other at the gradient all-reduce; on one replica
  the weighted mean, on thousands the slowest program);
- collectives: the data-parallel gradient all-reduce and the model/expert-axis
  collectives, timed on the slice's torus (`collectives`: over all its axes at
  once), a fraction `kappa` of them exposed (held at 1, not overlapped with the
  backward pass: it fits to 1 when fitted);
- per step, the host overhead `step_overhead_s` (0 for TPUs: the published runs
  ran device loops of whole epochs, and a per-step constant in host seconds fits
  them worse than the device's own fixed work);
- input stalls: a host's cores decode `cores / cpu_s_per_example` examples per
  second (`INPUT_CPU_S`, measured); a step can be no faster than its share of
  that, and the terms say `input_bound` where it is that share that sets it;
- evaluations: as many as the rules' cadence (or the run's log) says, each the
  compiled eval step (roofline and fixed work) over the eval set split over the
  devices (padded to whole batches), each batch's sums all-reduced over the
  slice (latency-bound at thousands of chips), plus a per-evaluation overhead
  `e0` (host work: reading the sums, logging; held at 0, the better choice under
  leave-one-out);
- warm-up: the first block's time beyond the steady rate, as the published logs
  show it (`RunLog.warmup_s` of benchmarks/calibration/runlog.py: compile and
  program load, the input pipeline's fill, the first steps), measured per workload
  where their block times are sound (`warmup_by`), not fitted;
- the last partial block: steps are whole, and a run trains to the end of the
  evaluation block in which it converges (`plan` stops a run at the first
  evaluation at or past its convergence; the calibration takes the steps its
  logs record).

The constants live in accelerators.yaml (`time_model`), fitted on the published TPU
runs by the calibration tooling outside the package (benchmarks/calibration/fit.py;
which are fitted and which held is a choice made on leave-one-out alone,
benchmarks/model_choices.py), beside both measured spreads (`uncertainty`).
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
               "moe": 5e-5, "llama31_8b": 2e-4, "gpt_oss_20b": 2e-4}


# The p of the soft roofline (c^p + m^p)^(1/p), chosen on leave-one-out alone
# (benchmarks/model_choices.py, 2026-11-28, the runs costed by what they ran): typical
# factor 1.175 at p = 2, 1.172 at 3 (worst 1.51x), 1.172 at 4 (worst 1.52x), 1.173 at 8
# and for a hard max. (It was first chosen in part on the v0.6 runs, which now only
# measure: benchmarks/README.md, "Pod prediction".)
ROOFLINE_P = 3.0


@dataclasses.dataclass(frozen=True)
class Constants:
  """The time model's constants: `FITTED` the ones the calibration may fit (it fits
  eta, hbm and fixed_flops, holding the others), the rest fixed by physics or by
  measurement (see the module doc)."""

  eta: float              # achieved fraction of the peak FLOP/s (train and eval programs)
  hbm: float              # per-example HBM bytes over this factor of the bandwidth
  fixed_flops: float      # per-step device work independent of the batch, FLOPs at peak
  warmup_s: float         # w0: the first block's extra time
  eval_overhead_s: float  # e0: per evaluation, beyond its programs
  kappa: float = 1.0      # fraction of collective time not overlapped with compute
  step_overhead_s: float = 0.0  # host overhead per step
  fixed_bytes_per_param: float = 0.0  # batch-independent HBM bytes per f32 parameter byte
  # The efficiency of accelerators fitted on their own (the H100 on GPU runs), by
  # accelerator ("h100") or by accelerator and workload ("h100/bert"); `eta` stands for
  # the others.
  eta_by: tuple[tuple[str, float], ...] = ()
  # The warm-up of each workload as the published logs show it (measured, not fitted:
  # benchmarks/calibration's `RunLog.warmup_s`); `warmup_s` stands for the others.
  warmup_by: tuple[tuple[str, float], ...] = ()

  FITTED = ("eta", "hbm", "fixed_flops", "eval_overhead_s", "kappa", "fixed_bytes_per_param")
  NAMES = FITTED + ("warmup_s", "step_overhead_s")

  @classmethod
  def from_dict(cls, raw: dict[str, Any]) -> Constants:
    def pairs(key: str) -> tuple[tuple[str, float], ...]:
      return tuple(sorted((str(k), float(v)) for k, v in (raw.get(key) or {}).items()))

    return cls(**{k: float(raw[k]) for k in cls.NAMES if k in raw}, eta_by=pairs("eta_by"),
               warmup_by=pairs("warmup_by"))

  def to_list(self) -> list[float]:
    return [getattr(self, k) for k in self.NAMES]

  def fitted(self) -> list[float]:
    return [getattr(self, k) for k in self.FITTED]

  def eta_for(self, accelerator: str, workload: str = "") -> float:
    by = dict(self.eta_by)
    return by.get(f"{accelerator}/{workload}", by.get(accelerator, self.eta))

  def warmup_for(self, workload: str) -> float:
    return dict(self.warmup_by).get(workload, self.warmup_s)


@dataclasses.dataclass(frozen=True)
class StepCost:
  """One program's per-device cost: FLOPs and HBM bytes (XLA's counts)."""

  flops: float
  hbm_bytes: float

  def roofline_s(self, peak_flops_per_s: float, hbm_bytes_per_s: float, eta: float = 1.0,
                 hbm: float = 1.0, fixed_bytes: float = 0.0) -> float:
    """Compute time at `eta` of the peak against the time of the bytes beyond
    `fixed_bytes` at `hbm` x the bandwidth: their `ROOFLINE_P`-norm."""
    compute, memory = self.terms_s(peak_flops_per_s, hbm_bytes_per_s, eta, hbm, fixed_bytes)
    return (compute ** ROOFLINE_P + memory ** ROOFLINE_P) ** (1 / ROOFLINE_P)

  def terms_s(self, peak_flops_per_s: float, hbm_bytes_per_s: float, eta: float = 1.0,
              hbm: float = 1.0, fixed_bytes: float = 0.0) -> tuple[float, float]:
    """(compute, memory) seconds as the roofline weighs them: the FLOPs at `eta` of the
    peak, the bytes beyond `fixed_bytes` at `hbm` x the bandwidth. Near the ridge both
    count; well below it (BERT-large: compute 2.7x the memory term) a cut in bytes moves
    the step by about (memory / compute)^2 of the cut."""
    compute = self.flops / (peak_flops_per_s * eta)
    memory = max(self.hbm_bytes - fixed_bytes, 0.0) / (hbm_bytes_per_s * hbm)
    return compute, memory


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
  param_bytes_per_device: float = 0.0  # f32 parameters (the batch-independent bytes)
  workload: str = ""             # its measured warm-up
  eval_collective_s: float = 0.0  # an eval batch's sums reduced over the slice
  # Where replicas run different programs step by step (a length-bucketed run: one per
  # bucket), each program's share of a replica's steps and its cost; `train` is then their
  # weighted mean. `replicas` run in step (0: `devices`).
  train_mix: tuple[tuple[float, StepCost], ...] = ()
  replicas: int = 0


@dataclasses.dataclass(frozen=True)
class Terms:
  """The predicted time to train, term by term (seconds)."""

  device_step_s: float          # roofline and fixed work
  collective_s: float
  overhead_s: float
  input_step_s: float
  step_s: float
  steps: float
  warmup_s: float
  eval_each_s: float
  evals: float
  mfu: float
  fixed_s: float = 0.0          # the fixed work's share of device_step_s
  # The train step's two roofline terms as weighed (`StepCost.terms_s`; of the mean
  # program where replicas run several): device_step_s - fixed_s is their soft maximum.
  compute_s: float = 0.0
  memory_s: float = 0.0

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
  eta = c.eta_for(x.accelerator, x.workload)
  fixed = c.fixed_flops / x.peak_flops_per_s
  fixed_bytes = c.fixed_bytes_per_param * x.param_bytes_per_device
  programs = x.train_mix or ((1.0, x.train),)
  device = fixed + slowest_of(
      [(share, cost.roofline_s(x.peak_flops_per_s, x.hbm_bytes_per_s, eta, c.hbm, fixed_bytes))
       for share, cost in programs], x.replicas or x.devices)
  collective = c.kappa * x.collective_s
  per_device_batch = x.global_batch / x.devices
  cores = x.host_cores_per_device
  input_s = per_device_batch * x.input_cpu_s_per_example / cores if cores > 0 else 0.0
  # No step is faster than its collectives alone or than its hosts can feed it.
  step = max(device + collective + c.step_overhead_s, x.collective_s, input_s)
  eval_each = (x.eval_batches * (fixed + x.eval_collective_s + x.eval_batch_cost.roofline_s(
      x.peak_flops_per_s, x.hbm_bytes_per_s, eta, c.hbm)) + c.eval_overhead_s)
  mfu = x.model_flops_per_step / (step * x.devices * x.peak_flops_per_s)
  compute_s, memory_s = x.train.terms_s(x.peak_flops_per_s, x.hbm_bytes_per_s, eta, c.hbm,
                                        fixed_bytes)
  return Terms(device_step_s=device, collective_s=collective, overhead_s=c.step_overhead_s,
               input_step_s=input_s, step_s=step, steps=x.steps,
               warmup_s=c.warmup_for(x.workload),
               eval_each_s=eval_each, evals=x.evals, mfu=mfu, fixed_s=fixed,
               compute_s=compute_s, memory_s=memory_s)


def slowest_of(times: list[tuple[float, float]], replicas: int) -> float:
  """The expected time of a step whose `replicas` each run one program drawn at its share
  (share, seconds) and then wait for each other (the gradient all-reduce): the expected
  maximum of `replicas` draws. One replica: the weighted mean; thousands: the slowest
  program any replica is likely to draw."""
  total = sum(share for share, _ in times)
  out, below = 0.0, 0.0
  for share, seconds in sorted(times, key=lambda t: t[1]):
    upto = below + share / total
    out += seconds * (min(upto, 1.0) ** replicas - below ** replicas)
    below = upto
  return out


def eval_split(eval_examples: int, data_devices: int, per_device_batch: int) -> tuple[int, int]:
  """(batches per evaluation, per-device batch) for an eval set spread over the devices:
  the last batch is padded, as the harness's evaluation does."""
  per_device_batch = max(1, min(per_device_batch, math.ceil(eval_examples / data_devices)))
  return math.ceil(eval_examples / (per_device_batch * data_devices)), per_device_batch
