"""The calibration set: every published MLPerf run of a workload mlbench has.

Google's TPU runs (shared/mlperf-results): v0.7 TPU-v3 (2,048 and 4,096 chips, JAX
and TF) and TPU-v4 (8, 64 and 256 chips, TF), v2.0 TPU-v4 (3,456 and 4,096 chips).
Each run's time to train (median over its successful result logs) is predicted from
mlbench's own full config compiled for the run's per-device batch (the package's cost
table, `mlbench.pod.costtable`, which `costs` writes), the run's slice
(`mlbench.pod.collectives`), and the steps and evaluations its logs record (`runlog`),
by the model of `mlbench.pod.timemodel`, whose constants `fit` fits on them (least
squares on log time) and judges leave-one-out.

Held out: Google's v0.6 TPU-v3 runs (16 to 1,024 chips, the older `:::MLL` log
format; tests/data/mlperf-v0.6) are predicted, never fitted. GPU runs (v4.0 NVIDIA,
Dell) are predicted with the GPU constants.

Where the logs are is given, never looked for: `measured(case, results, held_out)`;
`default_results()` and `default_held_out()` are the command lines' defaults.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from pathlib import Path
from typing import Any

from mlbench import accelerators
from mlbench.pod import collectives, costtable, estimate, timemodel
from mlbench.pod.timemodel import StepCost

from . import implementation, programs, runlog

# Logs that do not name their training set size.
TRAIN_EXAMPLES = {"resnet": 1_281_167, "ssd": 117_266, "transformer": 566_340}
WORKLOAD = {"resnet": "resnet50", "bert": "bert", "ssd": "ssd", "transformer": "transformer"}
# Google's TPU runs sum gradients in bfloat16 (their BERT and UNet3D code:
# `reduce_gradients_in_bf16`, default True), half the bytes of mlbench's float32 sum.
GRAD_BYTES_PER_PARAM = 2.0


@dataclasses.dataclass(frozen=True)
class Case:
  """One published system/benchmark: where its logs are and the slice it ran on."""

  folder: str                 # <round>/<org>/results/<system>/<benchmark>
  accelerator: str            # accelerators.yaml key
  grid: tuple[int, ...]       # chips per dimension (GPUs: GPUs per node, nodes as slices)
  slices: int = 1
  model: int = 1              # model-parallel ways
  held_out: bool = False
  host_decode: bool = True    # False: images decoded off the host CPUs (NVIDIA DALI)
  not_fitted: str = ""        # why the run is shown but not fitted on (a different program)

  @property
  def name(self) -> str:
    parts = self.folder.split("/")
    return f"{parts[0]} {parts[3]} {parts[4]}"

  @property
  def benchmark(self) -> str:
    return self.folder.split("/")[4]


def _v07(system: str, bench: str, acc: str, grid: tuple[int, ...], **kw: Any) -> Case:
  return Case(f"v0.7/Google/results/{system}/{bench}", acc, grid, **kw)


CASES = (
    _v07("tpu-v3-8192-JAX", "resnet", "tpu_v3", (32, 128)),
    _v07("tpu-v3-8192-JAX", "bert", "tpu_v3", (32, 128)),
    _v07("tpu-v3-8192-JAX", "transformer", "tpu_v3", (32, 128), model=4),
    _v07("tpu-v3-4096-JAX", "ssd", "tpu_v3", (32, 64)),
    _v07("tpu-v3-8192-TF", "resnet", "tpu_v3", (32, 128)),
    _v07("tpu-v3-8192-TF", "bert", "tpu_v3", (32, 128)),
    _v07("tpu-v3-8192-TF", "transformer", "tpu_v3", (32, 128), model=4),
    _v07("tpu-v3-8192-TF", "ssd", "tpu_v3", (32, 128)),
    *(_v07(f"tpu-v4-{cores}-TF", bench, "tpu_v4", grid)
      for cores, grid in ((16, (2, 2, 2)), (128, (4, 4, 4)), (512, (4, 8, 8)))
      for bench in ("resnet", "bert", "ssd", "transformer")),
    *(Case(f"v2.0/Google/results/cloud-tpu-v4-{cores}-TF/{bench}", "tpu_v4", grid)
      for cores, grid in ((6912, (12, 12, 24)), (8192, (16, 16, 16)))
      for bench in ("resnet", "bert")),
    *(Case(f"v0.6/Google/results/tpu-v3-{cores}/{bench}", "tpu_v3", grid, held_out=True)
      for cores, grid in ((32, (4, 4)), (128, (8, 8)), (256, (8, 16)), (512, (16, 16)),
                          (1024, (16, 32)), (2048, (32, 32)))
      for bench in ("resnet", "ssd", "transformer")),
)
# NVIDIA's and Dell's ResNet-50 decode JPEGs on the GPUs (DALI with nvJPEG): the host
# CPU decode rate does not bound them, so their input check is off. Their BERT runs unpad
# (NVIDIA) or pack (Dell) their sequences (implementations.json): costed by the packed
# program where the cost table has it (`programs.py`), not fitted on while a stand-in costs
# them.
GPU_CASES = (
    Case("v4.0/NVIDIA/results/eos_n8_ngc24.04_mxnet/resnet", "h100", (8,), slices=8,
         host_decode=False),
    Case("v4.0/NVIDIA/results/eos_n8_ngc23.04_pytorch/bert", "h100", (8,), slices=8),
    Case("v4.0/Dell/results/XE9680x8H100-SXM-80GB/resnet", "h100", (8,), host_decode=False),
    Case("v4.0/Dell/results/XE9680x8H100-SXM-80GB/bert", "h100", (8,)),
)
# Not in either set: v0.7 TPU-v3-1024 GNMT (no GNMT workload in mlbench); the v4.0 GPU
# "ssd" logs (that round's ssd is RetinaNet, not mlbench's SSD-ResNet34).


def default_results() -> Path:
  """The published logs: $MLBENCH_MLPERF_RESULTS, else shared/mlperf-results beside this
  checkout (or beside the folder of worktrees)."""
  env = os.environ.get("MLBENCH_MLPERF_RESULTS")
  if env:
    return Path(env)
  return next((p / "shared" / "mlperf-results" for p in Path(__file__).resolve().parents
               if (p / "shared" / "mlperf-results").is_dir()), Path("mlperf-results"))


def default_held_out() -> Path:
  """The held-out v0.6 logs this checkout carries (<org>/results/<system>/<benchmark>)."""
  return Path(__file__).resolve().parents[2] / "tests" / "data" / "mlperf-v0.6"


def fixed_bytes_per_param(records: dict[str, dict[str, Any]]) -> float:
  """XLA's batch-independent HBM bytes of a train step (its bytes at batch 0, on the line
  through two compiled batches) over the f32 parameter bytes: the median over the
  workloads compiled at two batches (36 to 47: the weight update and the weights' reads
  and writes, about 43 passes over the parameters)."""
  ratios = []
  for workload in sorted({r["workload"] for r in records.values()}):
    try:
      cost = costtable.device_cost(records, workload, 0.0, 1, "train")
    except KeyError:
      continue  # one compiled batch: no line to read the intercept from
    ratios.append(cost["bytes"] / (4.0 * cost["params"]))
  return statistics.median(ratios) if ratios else 0.0


def _megatron_all_reduces(cfg: Any, examples: float) -> tuple[int, float]:
  """(all-reduces, bytes) of a step of the Transformer with its matmuls split over a
  model axis as Megatron-LM does: one all-reduce of the activations after each
  attention and MLP sublayer forward, one of their input gradients backward
  (encoder layers have 2 sublayers, decoder layers 3), in bfloat16."""
  m = cfg.model
  ops = 2 * (2 * m.encoder_layers + 3 * m.decoder_layers)
  return ops, ops * examples * cfg.data.max_length * m.width * 2.0


@dataclasses.dataclass(frozen=True)
class Measured:
  """A case's runs as their logs say (medians over the successful result logs)."""

  run_s: float
  steps: float
  evals: float
  global_batch: int
  eval_examples: int
  step_s: float | None  # where block times are sound
  logs: int
  warmup_s: float | None = None  # the first block's extra time, where block times are sound


def log_folder(case: Case, results: Path, held_out: Path | None = None) -> Path:
  """Where a case's logs are: under `results` (<round>/<org>/results/...); a held-out v0.6
  case's under `held_out` (<org>/results/...) where `results` lacks it."""
  where = results / case.folder
  if case.held_out and held_out is not None and not where.is_dir():
    return held_out / case.folder.split("/", 1)[1]
  return where


def measured(case: Case, results: Path, held_out: Path | None = None) -> Measured:
  """A case's runs, from its logs under `results` (`held_out`: see `log_folder`)."""
  folder = log_folder(case, results, held_out)
  logs = runlog.runs(folder, TRAIN_EXAMPLES.get(case.benchmark))
  if not logs:
    raise FileNotFoundError(f"no successful result logs in {folder}")
  sound = [s for s in (r.sound_step_s() for r in logs) if s is not None]
  warm = [w for w in (r.warmup_s() for r in logs) if w is not None]
  return Measured(run_s=statistics.median(r.run_s for r in logs),
                  steps=statistics.median(r.steps for r in logs),
                  evals=statistics.median(r.evals for r in logs),
                  global_batch=logs[0].global_batch_size,
                  eval_examples=max(r.eval_samples for r in logs) or 5000,
                  step_s=statistics.median(sound) if len(sound) * 2 > len(logs) else None,
                  logs=len(logs),
                  warmup_s=statistics.median(warm) if len(warm) * 2 > len(logs) else None)


def stand_in(case: Case, records: dict[str, dict[str, Any]]) -> str:
  """Why the case is not costed by its own program ("" where it is)."""
  from mlbench import registry

  wl = registry.get(WORKLOAD[case.benchmark])
  impl = implementation.of(case.folder)
  return programs.train(records, WORKLOAD[case.benchmark], impl, 1.0, case.model, wl,
                        wl.configs["full"]()).stand_in


def inputs(case: Case, m: Measured, records: dict[str, dict[str, Any]]) -> timemodel.Inputs:
  """The time model's inputs for one case, costed by the program it ran (`programs`)."""
  from mlbench import registry

  impl = implementation.of(case.folder)
  chips = math.prod(case.grid) * case.slices
  acc = programs.as_run(accelerators.table()[case.accelerator], impl, chips)
  devices = chips * acc.devices_per_chip
  workload = WORKLOAD[case.benchmark]
  wl = registry.get(workload)
  cfg = wl.configs["full"]()
  if impl.kind not in ("packed", "unpadded"):
    cfg = programs.padded_cfg(cfg)  # the model FLOPs (MFU) of a run that padded
  data_devices = devices // case.model
  per_device = m.global_batch / data_devices
  # With m-way model parallelism a device does 1/m of a data shard's work (compiled
  # data-parallel figures at the shard's batch, split m ways).
  ran = programs.train(records, workload, impl, per_device, case.model, wl, cfg)
  train = ran.cost
  n_eval, eval_b = timemodel.eval_split(m.eval_examples, data_devices,
                                        max(1, math.ceil(per_device)))
  evaluation = programs.split(costtable.device_cost(records, workload, eval_b, 1, "eval"),
                              case.model)
  whole = estimate.torus_of(acc, case.grid, case.slices)
  torus = estimate.data_torus(whole, case.model)
  grad_bytes = GRAD_BYTES_PER_PARAM * train["params"]
  coll = collectives.all_reduce_s(grad_bytes, torus, estimate.link(acc))
  if case.model > 1:  # the model axis: a line of `model` chips along the first dimension
    ops, nbytes = _megatron_all_reduces(cfg, per_device)
    coll += collectives.group_s("all-reduce", nbytes, case.model, estimate.link(acc), ops=ops)
  return timemodel.Inputs(
      devices=devices, global_batch=m.global_batch,
      peak_flops_per_s=acc.device_peak_flops_per_s, hbm_bytes_per_s=acc.device_hbm_bytes_per_s,
      train=StepCost(train["flops"], train["bytes"]), collective_s=coll, steps=m.steps,
      evals=m.evals, eval_batch_cost=StepCost(evaluation["flops"], evaluation["bytes"]),
      eval_batches=n_eval,
      model_flops_per_step=(float(wl.flops_per_example(cfg)) * m.global_batch
                            if ran.model_flops_per_replica is None
                            else ran.model_flops_per_replica * data_devices),
      train_mix=ran.mix, replicas=data_devices,
      input_cpu_s_per_example=timemodel.INPUT_CPU_S.get(workload, 0.0) * case.host_decode,
      host_cores_per_device=acc.host_cores_per_chip / acc.devices_per_chip,
      accelerator=acc.name, param_bytes_per_device=4.0 * train["params"], workload=workload,
      eval_collective_s=collectives.all_reduce_s(estimate.EVAL_SUMS_BYTES, whole,
                                                 estimate.link(acc)))
