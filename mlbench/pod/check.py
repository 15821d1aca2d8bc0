"""`mlbench check`: compile a workload for a mesh from shapes alone, run nothing.

What a pod run would hit first, found on a laptop: sharding errors, memory per
device (parameters, optimizer state, temporaries, from the compiled
executable's memory analysis) against the chip's HBM, FLOPs per step and the
collectives XLA put in the program. With `--topology` the programs are compiled
by the TPU compiler for a real slice (see `topology`), and the report adds a
predicted step time, MFU and time to train (see `predict`). In the spirit of
maxtext's train_compile.py.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from mlbench import accelerators
from mlbench.pod import (estimate, hbm, hlo, hloops, hloproto, oom, predict as predict_lib,
                        quiet, timemodel, uncertainty, xlacost)
from mlbench.pod.hlo import COLLECTIVES

if TYPE_CHECKING:
  from mlbench.config import RunConfig
  from mlbench.train.plan import Plan

__all__ = ["COLLECTIVES", "CheckReport", "ProgramReport", "dry_run"]


@dataclasses.dataclass(frozen=True)
class ProgramReport:
  """One compiled program on one device (the SPMD program every device runs)."""

  name: str
  flops: float | None          # per step, all devices together
  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  code_bytes: int
  collectives: dict[str, int]
  collective_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
  collective_wire_bytes: dict[str, float] = dataclasses.field(default_factory=dict)
  bytes_accessed: float | None = None  # HBM traffic per device, XLA's count
  xla_seconds: float | None = None     # the TPU compiler's own run-time estimate (`xlacost`)
  xla_raw_seconds: float | None = None  # as libtpu gave it
  xla_concat_bitcasts: int = 0          # its -1 s custom calls, added back
  xla_note: str = ""                    # why there is no estimate
  matmul_input_dtypes: dict[str, int] = dataclasses.field(default_factory=dict)
  hlo_readable: bool = True  # False: collectives unknown (neither text nor module proto)
  collective_source: str = "HLO text"  # or "HLO module proto", "unknown"
  collective_group_bytes: dict[int, int] = dataclasses.field(default_factory=dict)
  xla_error: str = ""        # what XLA said when it could not print the program
  hbm: hbm.Breakdown | None = None  # bytes_accessed by kind (None: the program was unread)

  @property
  def peak_bytes(self) -> int:
    """Arguments, outputs not aliased to them, and temporaries: live at once at worst."""
    return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes


@dataclasses.dataclass(frozen=True)
class CheckReport:
  workload: str
  config: str
  mesh: dict[str, int]
  platform: str
  params: int
  param_bytes_per_device: int
  opt_state_bytes_per_device: int
  opt_state_bytes_total: int
  programs: tuple[ProgramReport, ...]
  global_batch_size: int = 0
  device_kind: str = ""
  topology: str | None = None
  accelerator: str | None = None
  hbm_bytes_per_device: int | None = None
  prediction: predict_lib.Prediction | None = None
  param_dtypes: dict[str, int] = dataclasses.field(default_factory=dict)
  opt_state_dtypes: dict[str, int] = dataclasses.field(default_factory=dict)
  attention: tuple[str, ...] = ()  # one line per program and kind of attention call
  rows_per_step: int = 0  # rows of the train step (fewer than the batch where it packs)
  flops_per_example: float = 0.0  # the analytic model FLOPs of one example (packed step's)

  @property
  def peak_bytes(self) -> int:
    return max(p.peak_bytes for p in self.programs)

  @property
  def fits(self) -> bool | None:
    return None if self.hbm_bytes_per_device is None else \
        self.peak_bytes <= self.hbm_bytes_per_device

  def to_json(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    for p, prog in zip(out["programs"], self.programs):
      p["peak_bytes"] = prog.peak_bytes
    out["peak_bytes"], out["fits"] = self.peak_bytes, self.fits
    if self.prediction is not None:
      out["prediction"]["roofline"]["bound_s"] = self.prediction.roofline.bound_s
      out["prediction"]["roofline"]["limit"] = self.prediction.roofline.limit
      terms = self.prediction.terms
      if terms is not None:
        out["prediction"]["terms"].update(train_s=terms.train_s, eval_s=terms.eval_s,
                                          total_s=terms.total_s, input_bound=terms.input_bound)
    return out


def collectives(hlo_text: str) -> dict[str, int]:
  """How many of each collective op the optimized HLO holds (async pairs count once)."""
  return hlo.collectives(hlo_text).count


@dataclasses.dataclass(frozen=True)
class _Read:
  """What check reads from a compiled program: its text (empty where XLA cannot print
  it), collectives, custom calls and ops (None: unread), where they were read from, and
  what XLA said when it could not print the program."""

  text: str
  collectives: hlo.Collectives | None
  calls: xlacost.CustomCalls | None
  ops: list[hloops.Op] | None
  source: str
  error: str = ""


def _read_program(compiled: Any, devices: int) -> _Read:
  """The program's text if XLA can print it, else its module proto read with protobuf;
  XLA's C++ messages kept off the terminal either way."""
  with quiet.captured() as noise:
    try:
      text = compiled.as_text()
      return _Read(text, hlo.collectives(text, devices), xlacost.custom_calls(text),
                   hloops.from_text(text), "HLO text")
    except Exception:  # jaxlib fails to re-read some libtpu programs (async ops)
      pass
    try:
      proto = compiled.runtime_executable().hlo_modules()[0].as_serialized_hlo_module_proto()
      read = _Read("", hlo.collectives_from_proto(proto, devices),
                   xlacost.custom_calls_from_proto(proto), _ops(proto), "HLO module proto")
    except Exception:
      read = _Read("", None, None, None, "unknown")
  return dataclasses.replace(read, error=noise.first_error() or "XLA could not print the program")


def _ops(proto: bytes) -> list[hloops.Op] | None:
  """The program's ops read from its proto; None where they cannot be (the collectives and
  custom calls read from it stand without them)."""
  try:
    return hloproto.ops(hlo.module_proto(proto))
  except Exception:
    return None


def _program(name: str, compiled: Any, devices: int) -> ProgramReport:
  mem = compiled.memory_analysis()
  cost = xlacost.cost_analysis(compiled)
  read = _read_program(compiled, devices)
  empty = hlo.Collectives(count=dict.fromkeys(COLLECTIVES, 0), result_bytes={}, wire_bytes={})
  coll = read.collectives or empty
  flops, accessed = cost.get("flops"), cost.get("bytes accessed")
  # libtpu books -1 s for each ConcatBitcast and nothing for a Pallas kernel: see xlacost.
  xla = xlacost.estimate(cost.get("optimal_seconds"), read.calls)
  return ProgramReport(
      name=name, flops=None if flops is None else float(flops) * devices,
      argument_bytes=int(mem.argument_size_in_bytes), output_bytes=int(mem.output_size_in_bytes),
      alias_bytes=int(mem.alias_size_in_bytes), temp_bytes=int(mem.temp_size_in_bytes),
      code_bytes=int(mem.generated_code_size_in_bytes), collectives=coll.count,
      collective_bytes=coll.result_bytes, collective_wire_bytes=coll.wire_bytes,
      bytes_accessed=accessed, xla_seconds=xla.seconds,
      xla_raw_seconds=xla.raw_seconds, xla_concat_bitcasts=xla.concat_bitcasts, xla_note=xla.note,
      matmul_input_dtypes=hlo.matmul_input_dtypes(read.text),
      hlo_readable=read.source != "unknown", collective_source=read.source,
      collective_group_bytes=dict(coll.by_group), xla_error=read.error,
      hbm=None if read.ops is None or accessed is None else hbm.breakdown(read.ops, accessed))


def _compile(plan: Plan, where: str) -> Any:
  from mlbench.train import steps

  try:
    return steps.compile_programs(plan.workload, plan.cfg, plan.schedule, plan.mesh, plan.ctx,
                                  plan.tx, weight_update_sharding=plan.rc.weight_update_sharding)
  except Exception as e:  # XLA raises JaxRuntimeError (a RuntimeError) for compile-time OOM.
    if "CompileTimeHbmOom" in str(e) or "RESOURCE_EXHAUSTED" in str(e):
      raise oom.does_not_fit(plan, where, e) from None
    raise


def dry_run(plan: Plan, *, topology: str | None = None,
            convergence: predict_lib.Convergence | None = None) -> CheckReport:
  """Compiles the plan's init, train and eval programs and reports on them; on a known
  accelerator, also against its HBM and with a predicted step time."""
  import jax
  import numpy as np

  from mlbench.train import sharding

  device = plan.mesh.devices.flat[0]
  where = topology or f"{plan.mesh.devices.size} x {device.device_kind}"
  programs = _compile(plan, where)
  params, _ = jax.eval_shape(lambda k: plan.workload.init(plan.cfg, k), jax.random.key(0))
  devices = int(plan.mesh.devices.size)
  # Train first and eval second, as reports before init was added listed them.
  reports = (_program("train step", programs.train, devices),
             _program("eval step", programs.eval, devices),
             _program("init", programs.init, devices))
  acc = accelerators.for_device_kind(device.device_kind)
  prediction = None
  param_bytes = sharding.bytes_per_device(params, programs.state_sharding.params)
  # On GPUs XLA's cost analysis misses the cuBLAS/cuDNN custom calls (most of the FLOPs),
  # so only the TPU compiler's counts make a prediction.
  tpu = acc is not None and acc.platform == "tpu"
  per_example = _flops_per_example(plan) if tpu or plan.workload.flops_per_example else 0.0
  if tpu:
    prediction = _predict(plan, acc, reports, param_bytes, per_example * plan.gbs, convergence)
  return CheckReport(
      workload=plan.workload.name, config=plan.config_name, mesh=dict(plan.mesh.shape),
      platform=device.platform,
      params=int(sum(np.prod(x.shape) for x in jax.tree.leaves(params))),
      param_bytes_per_device=param_bytes,
      opt_state_bytes_per_device=programs.opt_state_bytes,
      opt_state_bytes_total=programs.opt_state_bytes_replicated,
      programs=reports, global_batch_size=plan.gbs, device_kind=device.device_kind,
      topology=topology, accelerator=None if acc is None else acc.name,
      hbm_bytes_per_device=None if acc is None else acc.device_hbm_bytes, prediction=prediction,
      param_dtypes=_dtypes(params), opt_state_dtypes=_dtypes(jax.eval_shape(plan.tx.init, params)),
      attention=tuple(used.line() for used in programs.attention),
      rows_per_step=plan.schedule.rows(), flops_per_example=per_example)


def _flops_per_example(plan: Plan) -> float:
  """The model FLOPs of one example: the workload's analytic count (a packed step's where
  it packs), else XLA's of its lowered gradient."""
  from mlbench.train import steps

  return steps.flops_per_example(plan.workload, plan.cfg, plan.ctx)


def _dtypes(tree: Any) -> dict[str, int]:
  """How many arrays of each dtype a pytree holds."""
  import jax

  out: dict[str, int] = {}
  for leaf in jax.tree.leaves(tree):
    out[str(leaf.dtype)] = out.get(str(leaf.dtype), 0) + 1
  return out


def _predict(plan: Plan, acc: accelerators.Accelerator, reports: tuple[ProgramReport, ...],
             grad_bytes: float, model_flops: float,
             convergence: predict_lib.Convergence | None) -> predict_lib.Prediction:
  """The time model on the compiled programs. Where XLA counts fewer FLOPs than the
  analytic model FLOPs (none, or a scanned stack's body once) those stand in; where the
  program's collectives are unknown, the gradient all-reduce still comes from the topology
  (only model-axis ones are missing)."""
  train, evaluation = reports[0], reports[1]
  devices = int(plan.mesh.devices.size)
  other = math.prod(v for k, v in plan.mesh.shape.items() if k != "data")
  steps = convergence.samples / plan.gbs if convergence is not None else 0.0
  model_bytes = (float(train.collective_group_bytes.get(other, 0))
                 if train.hlo_readable and other > 1 else None)
  compiled = estimate.CompiledRun(
      workload=plan.workload.name, devices=devices, mesh=dict(plan.mesh.shape),
      global_batch=plan.gbs,
      train=_cost_of(train, devices, model_flops),
      eval_batch=_cost_of(evaluation, devices, 0.0),
      eval_batches=math.ceil(plan.schedule.eval_examples / plan.schedule.eval_batch_size),
      grad_bytes_per_device=float(grad_bytes), model_collective_bytes=model_bytes,
      model_flops_per_step=model_flops, steps=steps,
      evals=float(sum(1 for p in plan.points if p.step <= math.ceil(steps)) or 1))
  consts, provenance = estimate.constants(acc.platform)
  provenance["uncertainty"] = uncertainty.describe(acc.platform, acc.name, plan.workload.name)
  x = estimate.inputs(acc, compiled)
  terms = timemodel.predict(x, consts)
  roof = predict_lib.roofline(acc, x.train.flops, x.train.hbm_bytes, 0.0)
  roof = dataclasses.replace(roof, collective_s=x.collective_s)
  return predict_lib.predict(acc, devices, plan.gbs, roof, train.xla_seconds, model_flops,
                             convergence, terms=terms, provenance=provenance,
                             collectives_known=train.hlo_readable or other == 1)


def _cost_of(p: ProgramReport, devices: int, least_flops: float) -> timemodel.StepCost:
  """A program's per-device cost. XLA counts a while loop's body once, so a scanned layer
  stack (llama31_8b, gpt_oss_20b) reads as one layer's work: its FLOPs are at least
  `least_flops` (the model's; `estimate.run_step` takes the same floor), its bytes those
  of every trip (the body's repeats read from the program: `hbm.Breakdown.loop_repeats`)."""
  flops = max(float(p.flops or 0.0), least_flops)
  repeats = p.hbm.loop_repeats if p.hbm is not None and p.bytes_accessed else 0.0
  return timemodel.StepCost(flops=flops / devices,
                            hbm_bytes=float(p.bytes_accessed or 0.0) + repeats)


def fit_eval_batch(rc: RunConfig, devices: int) -> tuple[RunConfig, str | None]:
  """The run config with an eval batch that splits over the data-parallel devices, and
  a line saying so; unchanged (None) where the config's does or the user set one.

  The eval batch is no rule-bound hyperparameter: a pod's data axis may be larger
  than a config's eval batch (BERT's 1,024 on a 4,096-chip v4 slice)."""
  from mlbench import config as config_lib, registry

  if any(o.split("=", 1)[0].strip() == "eval_batch_size" for o in rc.overrides):
    return rc, None
  other = math.prod(v for k, v in (rc.mesh or ()) if k != "data") or 1
  data = max(1, devices // other)
  workload = registry.get(rc.workload)
  _, cfg, _ = config_lib.configured(workload, rc.config, rc.overrides)
  size = int(workload.schedule(cfg).eval_batch_size)
  if size % data == 0:
    return rc, None
  fitted = -(-size // data) * data
  note = (f"eval batch {fitted:,}: the config's {size:,} does not split over {data:,} "
          f"data-parallel devices (the eval batch is not rule-bound; --set eval_batch_size=N "
          "to choose)")
  return dataclasses.replace(rc, overrides=(*rc.overrides, f"eval_batch_size={fitted}")), note
