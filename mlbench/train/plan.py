"""Turns a `RunConfig` into a `Plan`: everything the runs of one invocation share.

All checks that need neither data nor a device happen here, before any run
starts and before anything is written: the workload and config exist,
overrides are valid, the batch splits over hosts and devices, and the logged
hyperparameters satisfy the rules of the chosen ruleset and division.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from mlbench import config as config_lib, fields, registry, rules, system as system_lib
from mlbench.storage import paths
from mlbench.train import data, mesh as mesh_lib, pipeline
from mlbench.config import Division, InputMode, RunConfig
from mlbench.errors import UserError, choices
from mlbench.train.runtime import Runtime
from mlbench.workload import Schedule, Split, StartPoint, StepContext, WithMetadata, Workload


@dataclasses.dataclass(frozen=True)
class Point:
  """An evaluation point: after `step` steps, logged as `epoch` (epoch_num)."""

  step: int
  epoch: float
  samples: int


@dataclasses.dataclass(frozen=True)
class Plan:
  """What every run of one invocation shares."""

  rc: RunConfig
  runtime: Runtime
  workload: Workload
  config_name: str
  cfg: Any
  rule: rules.Rule
  schedule: Schedule
  mesh: Any
  ctx: StepContext
  tx: Any
  hparams: dict[str, Any]
  system: str
  system_desc: dict[str, Any]  # what systems/<system>.json says (written by the runner)
  data_dir: Path
  points: tuple[Point, ...]
  pipeline: data.PipelineOptions = data.PipelineOptions()

  @property
  def gbs(self) -> int:
    return self.schedule.global_batch_size

  @property
  def log_status(self) -> str:
    """`submission_status` as the logs of rulesets <= 4.0.0 spell it."""
    return system_lib.STATUS_TO_LOG[self.system_desc["status"]]


def eval_points(schedule: Schedule, rule: rules.Rule) -> tuple[Point, ...]:
  """Where the rules' cadence puts evaluations (rounded up to whole steps), up to the
  training budget, which always ends with one."""
  ev = rule.evaluation
  per_unit = schedule.train_examples if ev.unit is rules.Unit.EPOCHS else 1
  # Samples per unit as steps count them: whole epochs of `epoch_steps` where given.
  if ev.unit is rules.Unit.EPOCHS and schedule.epoch_steps:
    per_unit = schedule.epoch_steps * schedule.global_batch_size
  offset = schedule.eval_offset
  if not 0 <= offset <= ev.max_offset:
    raise UserError(f"an evaluation offset of {offset:g} {ev.unit.value} is outside the "
                    f"{rule.ruleset} {rule.benchmark} rules (0 to {ev.max_offset:g}); change it")
  points = []
  for cadence in ev.points(schedule.global_batch_size,
                           schedule.max_train_samples / per_unit + offset):
    nominal = cadence - offset
    step = math.ceil(round(nominal * per_unit, 6) / schedule.global_batch_size)
    if step <= schedule.max_steps and (not points or step > points[-1].step):
      points.append(_point(schedule, rule, step, nominal=nominal))
  if not points or points[-1].step != schedule.max_steps:
    points.append(_point(schedule, rule, schedule.max_steps, nominal=None))
  return tuple(points)


def _point(schedule: Schedule, rule: rules.Rule, step: int, nominal: float | None) -> Point:
  samples = step * schedule.global_batch_size
  if rule.convergence_unit is rules.Unit.SAMPLES:
    epoch = float(samples)
  elif nominal is not None and rule.evaluation.unit is rules.Unit.EPOCHS:
    epoch = float(nominal)
  elif schedule.epoch_steps:
    epoch = round(step / schedule.epoch_steps, 3)
  else:
    epoch = round(samples / schedule.train_examples, 3)
  return Point(step, int(epoch) if epoch.is_integer() else epoch, samples)


def harness_hparams(schedule: Schedule) -> dict[str, Any]:
  """The hyperparameter keys every log carries, whatever the workload."""
  return {"global_batch_size": schedule.global_batch_size,
          "train_samples": schedule.train_examples,
          "eval_samples": schedule.eval_examples,
          "gradient_accumulation_steps": schedule.gradient_accumulation_steps}


def _with_rows(schedule: Schedule, runtime: Runtime, mesh: Any,
               pipe: config_lib.PipelineConfig) -> Schedule:
  """The schedule with its training rows resolved for this mesh: a packed workload's
  global_batch_size / packing.factor, rounded up to split evenly over the data-parallel
  devices (times the accumulation steps and pipeline microbatches) and the processes."""
  if schedule.packing is None:
    return schedule
  stages = pipeline.stage_count(mesh)
  micro = (pipe.microbatches or stages) if stages > 1 else 1
  quantum = math.lcm(mesh_lib.data_size(mesh) * schedule.gradient_accumulation_steps * micro,
                     runtime.process_count)
  rows = math.ceil(schedule.global_batch_size / (schedule.packing.factor * quantum)) * quantum
  return dataclasses.replace(schedule, train_rows=min(rows, schedule.global_batch_size))


def _check_batches(schedule: Schedule, runtime: Runtime, mesh: Any) -> None:
  devices = mesh_lib.data_size(mesh)
  for name, size in (("global_batch_size", schedule.global_batch_size),
                     ("eval_batch_size", schedule.eval_batch_size)):
    if size % devices or size % runtime.process_count:
      raise UserError(f"{name}={size} does not split evenly over {devices} data-parallel devices "
                      f"and {runtime.process_count} processes; --set {name}= a multiple of "
                      f"{math.lcm(devices, runtime.process_count)}")
  k = schedule.gradient_accumulation_steps
  if k > 1 and (schedule.global_batch_size % (k * devices)):
    raise UserError(f"global_batch_size={schedule.global_batch_size} does not split into {k} "
                    f"microbatches that split evenly over {devices} data-parallel devices; "
                    "--set gradient_accumulation_steps= a divisor of "
                    f"{schedule.global_batch_size // devices}")


def _parallelism(workload: Workload, config_name: str, cfg: Any, schedule: Schedule, mesh: Any,
                 pipe: config_lib.PipelineConfig) -> int:
  """Checks the spatial and stage axes against what the workload declares; returns the
  pipeline's microbatches (1 without a stage axis)."""
  what = f"{workload.name} --config {config_name}"
  spatial = mesh_lib.axis_size(mesh, mesh_lib.SPATIAL)
  if spatial > 1 and not workload.spatial_inputs:
    raise UserError(f"--mesh spatial={spatial}: {what} has no images to split by height "
                    "(spatial partitioning is for convolutional workloads: resnet50, ssd); "
                    "drop the spatial axis")
  stages = pipeline.stage_count(mesh)
  if stages == 1:
    if pipe.microbatches:
      raise UserError("pipeline.microbatches needs pipeline stages: add a stage axis, "
                      "e.g. --mesh data=N,stage=S")
    return 1
  stack = workload.layer_stack(cfg)
  if stack is None:
    scan = fields.SCAN_LAYERS.get(cfg)
    hint = f" (--set {fields.SCAN_LAYERS.key}=true)" if scan is False else ""
    raise UserError(f"--mesh stage={stages}: {what} has no layer stack to split into pipeline "
                    f"stages{hint}; pipelines are for transformer workloads, drop the stage axis")
  micro = pipe.microbatches or stages
  replicas = math.prod(mesh.shape[a] for a in pipeline.batch_axes(mesh))
  pipeline.check(stages=stages, microbatches=micro, layers=stack.layers, what=what, per_replica={
      "global_batch_size": schedule.rows() // (replicas * schedule.gradient_accumulation_steps),
      "eval_batch_size": schedule.eval_batch_size // replicas})
  return micro


def make_plan(rc: RunConfig, runtime: Runtime, *,
              machine: system_lib.Machine | None = None) -> Plan:
  """Validates a run request and builds the shared plan (writes the system description)."""
  workload = registry.get(rc.workload)
  name, cfg, harness = config_lib.configured(workload, rc.config, rc.overrides)
  cfg = _with_precision(cfg, name, rc.precision, runtime)
  ruleset = rc.ruleset or rules.default_ruleset(workload.benchmark, name, workload.rulesets)
  rule = rules.load(workload.benchmark, ruleset)
  if ruleset not in rules.rulesets(workload.benchmark, workload.rulesets):
    raise UserError(f"{workload.name} does not implement the {ruleset} {workload.benchmark} "
                    "benchmark; choose --ruleset from: "
                    f"{choices(rules.rulesets(workload.benchmark, workload.rulesets))}")
  schedule = workload.schedule(cfg)
  mesh = mesh_lib.make_mesh(dict(rc.mesh) if rc.mesh else None, devices=runtime.devices)
  schedule = _with_rows(schedule, runtime, mesh, harness.pipeline)
  _check_batches(schedule, runtime, mesh)
  ctx = StepContext(mesh=mesh, bn_groups=_bn_groups(rc.bn_group_size, mesh, schedule, cfg),
                    microbatches=_parallelism(workload, name, cfg, schedule, mesh,
                                              harness.pipeline))
  hparams = {**harness_hparams(schedule), **_random_start(workload.start, cfg),
             **workload.hparams(cfg, schedule, ctx)}
  _closed_architecture(workload, cfg, rule, rc.division)
  problems = rule.problems(hparams, closed=rc.division is Division.CLOSED)
  if problems:
    raise UserError(f"{workload.name} ({name}) breaks the {rule.ruleset} {rule.benchmark} rules: "
                    + "; ".join(problems) + ("; use --division open or change the config"
                                             if rc.division is Division.CLOSED else ""))
  machine = machine or system_lib.probe(runtime.local_devices, runtime.process_count)
  system = paths.check_name("--system", rc.system or system_lib.default_system_name(machine))
  paths.check_name("--submitter", rc.submitter)
  description = system_lib.describe(machine, system=system, submitter=rc.submitter,
                                 division=rc.division.value, notes=_hw_notes(runtime, rc))
  return Plan(rc=rc, runtime=runtime, workload=workload, config_name=name, cfg=cfg, rule=rule,
              schedule=schedule, mesh=mesh, ctx=ctx, tx=workload.optimizer(cfg, schedule),
              hparams=hparams, system=system, system_desc=description, data_dir=rc.data_dir,
              points=eval_points(schedule, rule),
              pipeline=data.PipelineOptions(deterministic=rc.input_mode is InputMode.DETERMINISTIC))


def _closed_architecture(workload: Workload, cfg: Any, rule: rules.Rule,
                         division: Division) -> None:
  """A closed run under an MLPerf round's rules trains the benchmark's model: a config
  switched to another architecture (`mlbench.fields.switch`) is an open-division run, or
  one under unofficial rules."""
  switched = fields.switched(cfg) if rule.official and division is Division.CLOSED else []
  if switched:
    sets = ", ".join(f"{key}={value}" for key, value, _ in switched)
    ours = ", ".join(f"{key}={reference}" for key, _, reference in switched)
    raise UserError(f"{sets} is not the model of the closed {rule.ruleset} {rule.benchmark} "
                    f"benchmark ({workload.name}'s has {ours}): use --division open, or "
                    "--ruleset mini")


def start_path(start: StartPoint | None, cfg: Any) -> str:
  """The path a config gives for the workload's starting point ("" for none)."""
  return (fields.Field(start.key, str).get(cfg) or "") if start else ""


def _random_start(start: StartPoint | None, cfg: Any) -> dict[str, Any]:
  """A run without the reference's starting point says so in its log."""
  if start is None or start_path(start, cfg):
    return {}
  return {"weights_initialization": WithMetadata("random", {"reference_starts_from": start.name})}


def check_inputs(plan: Plan) -> None:
  """Refuses a run that lacks what it reads, before any compile, in one message: its data
  and, for a closed run under official rules, the reference's starting point."""
  missing = []
  for split in (Split.TRAIN, Split.EVAL):
    try:
      plan.workload.input.files(plan.cfg, plan.data_dir, split)
    except UserError as e:
      missing.append(str(e))
      break  # the message names the whole layout
  start = _start_problem(plan)
  if start is None and missing:
    raise UserError(missing[0])
  if start is not None:
    raise UserError(f"{plan.workload.name} ({plan.config_name}) cannot start; missing: "
                    + "; and ".join([*missing, start]))


def _start_problem(plan: Plan) -> str | None:
  start = plan.workload.start
  path = start_path(start, plan.cfg)
  if path and "://" not in path and not (Path(path).exists() or Path(path + ".index").exists()):
    return f"{start.name}: {path} does not exist ({start.source})"
  if start and not path and plan.rule.official and plan.rc.division is Division.CLOSED:
    return (f"{start.name}, which the closed division requires (--init-checkpoint PATH; "
            f"{start.source}; or --division open to start from random weights)")
  return None


def _with_precision(cfg: Any, config_name: str, precision: str | None, runtime: Runtime) -> Any:
  """Sets the config's compute dtype (`model.dtype`) from --precision, or to bfloat16 for
  a full config on TPUs and GPUs, as MLPerf submissions run; CPUs keep the config's own."""
  has_key = fields.PRECISION.get(cfg) is not None
  if precision is None:
    accelerated = runtime.devices[0].platform in ("tpu", "gpu", "cuda", "rocm")
    if not (accelerated and config_name == "full" and has_key):
      return cfg
    precision = "bfloat16"
  if not has_key:
    raise UserError(f"--precision needs a config with a `{fields.PRECISION.key}` field; this "
                    "one has none (use --set on the config's own precision fields)")
  return fields.PRECISION.set(cfg, fields.DType(precision))


def _bn_groups(group_size: int | None, mesh: Any, schedule: Schedule, cfg: Any) -> int:
  """Batch-norm groups: from --bn-group-size (data-parallel devices per group), else from
  the config's examples per group (`model.bn_group_examples`, 0 or absent: one group),
  as EfficientNet's reference groups its replicas: max(1, examples / per-device batch)
  devices a group (tensorflow/tpu efficientnet utils.py, DistributedBatchNormalization),
  here the largest divisor of the data-parallel devices up to that."""
  devices = mesh_lib.data_size(mesh)
  if group_size is None:
    examples = fields.BN_GROUP_EXAMPLES.get(cfg) or 0
    per_device = schedule.global_batch_size // (devices * schedule.gradient_accumulation_steps)
    if not examples or not per_device:
      return 1
    group_size = max(1, min(devices, examples // per_device))
    while devices % group_size:
      group_size -= 1
    return devices // group_size
  if group_size < 1 or devices % group_size:
    raise UserError(f"--bn-group-size {group_size} must divide the {devices} data-parallel "
                    "devices")
  return devices // group_size


def _hw_notes(runtime: Runtime, rc: RunConfig) -> str:
  if rc.cpu_devices:
    return f"{rc.cpu_devices} simulated CPU devices (XLA host platform) on one host"
  return ""
