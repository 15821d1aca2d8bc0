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
import re
from typing import Any

from mlbench import accelerators
from mlbench.errors import UserError
from mlbench.pod import hlo, predict as predict_lib
from mlbench.pod.hlo import COLLECTIVES

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
  xla_seconds: float | None = None     # the TPU compiler's own run-time estimate
  matmul_input_dtypes: dict[str, int] = dataclasses.field(default_factory=dict)
  hlo_readable: bool = True  # False: XLA could not print the program; no collectives known

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
    return out


def collectives(hlo_text: str) -> dict[str, int]:
  """How many of each collective op the optimized HLO holds (async pairs count once)."""
  return hlo.collectives(hlo_text).count


def _cost(compiled: Any) -> dict[str, float]:
  try:
    cost = compiled.cost_analysis()
  except Exception:  # Not every backend implements cost analysis.
    return {}
  if isinstance(cost, list):
    cost = cost[0] if cost else {}
  return dict(cost or {})


def _program(name: str, compiled: Any, devices: int) -> ProgramReport:
  mem = compiled.memory_analysis()
  cost = _cost(compiled)
  try:
    text, readable = compiled.as_text(), True
  except Exception:  # jaxlib fails to re-read some libtpu programs (async ops); keep the rest
    text, readable = "", False
  coll = hlo.collectives(text, devices)
  flops = cost.get("flops")
  # The TPU compiler's estimate comes out negative for some programs (seen: ResNet-50 on
  # v4); that is no estimate.
  xla_s = cost.get("optimal_seconds")
  xla_s = xla_s if xla_s is not None and xla_s > 0 else None
  return ProgramReport(
      name=name, flops=None if flops is None else float(flops) * devices,
      argument_bytes=int(mem.argument_size_in_bytes), output_bytes=int(mem.output_size_in_bytes),
      alias_bytes=int(mem.alias_size_in_bytes), temp_bytes=int(mem.temp_size_in_bytes),
      code_bytes=int(mem.generated_code_size_in_bytes), collectives=coll.count,
      collective_bytes=coll.result_bytes, collective_wire_bytes=coll.wire_bytes,
      bytes_accessed=cost.get("bytes accessed"), xla_seconds=xla_s,
      matmul_input_dtypes=hlo.matmul_input_dtypes(text), hlo_readable=readable)


_OOM = re.compile(r"required for HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds available HBM "
                  r"\(([\d.]+)([KMGT]?)\)")
_UNIT = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _does_not_fit(plan: Any, where: str, error: Exception) -> UserError:
  """The one-line error for XLA's compile-time out-of-memory, with what to try."""
  data = int(plan.mesh.shape.get("data", 1))
  m = _OOM.search(str(error))
  need, smaller = "", max(data, plan.gbs // 2 // data * data)
  if m:
    need_b = float(m.group(1)) * _UNIT[m.group(2)]
    have_b = float(m.group(3)) * _UNIT[m.group(4)]
    need = f": {need_b / 2**30:,.1f} GiB of temporaries per device, {have_b / 2**30:,.1f} GiB of HBM"
    # Temporaries grow about linearly with the per-device batch.
    smaller = max(data, int(plan.gbs * have_b / need_b * 0.8) // data * data)
  batch = (f", or a smaller per-chip batch (--set global_batch_size={smaller})"
           if smaller < plan.gbs else " (the batch is already one example per data shard)")
  return UserError(
      f"{plan.workload.name} --config {plan.config_name} at global batch {plan.gbs} does not "
      f"fit on {where}{need}; try --weight-update-sharding, a model axis (--mesh data=N,model=M)"
      f"{remat_hint(plan.cfg)}{batch}")


def remat_hint(cfg: Any) -> str:
  """`, remat (--set model.remat=full)` where the config has that key, else nothing: a hint
  to set a key the workload lacks would only be refused as unknown."""
  remat = getattr(getattr(cfg, "model", None), "remat", None)
  if remat is None or getattr(remat, "value", remat) == "full":
    return ""
  return ", remat (--set model.remat=full)"


def _compile(plan: Any, where: str) -> Any:
  from mlbench.train import steps

  try:
    return steps.compile_programs(plan.workload, plan.cfg, plan.schedule, plan.mesh, plan.ctx,
                                  plan.tx, weight_update_sharding=plan.rc.weight_update_sharding)
  except Exception as e:  # XLA raises JaxRuntimeError (a RuntimeError) for compile-time OOM.
    if "CompileTimeHbmOom" in str(e) or "RESOURCE_EXHAUSTED" in str(e):
      raise _does_not_fit(plan, where, e) from None
    raise


def dry_run(plan: Any, *, topology: str | None = None,
            convergence: predict_lib.Convergence | None = None) -> CheckReport:
  """Compiles the plan's init, train and eval programs and reports on them; on a known
  accelerator, also against its HBM and with a predicted step time."""
  import jax
  import numpy as np

  from mlbench.train import sharding, steps

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
  # On GPUs XLA's cost analysis misses the cuBLAS/cuDNN custom calls (most of the FLOPs),
  # so only the TPU compiler's counts make a prediction.
  if acc is not None and acc.platform == "tpu":
    model_flops = steps.flops_per_example(plan.workload, plan.cfg, plan.ctx) * plan.gbs
    prediction = _predict(acc, devices, plan.gbs, reports[0], model_flops, convergence)
  return CheckReport(
      workload=plan.workload.name, config=plan.config_name, mesh=dict(plan.mesh.shape),
      platform=device.platform,
      params=int(sum(np.prod(x.shape) for x in jax.tree.leaves(params))),
      param_bytes_per_device=sharding.bytes_per_device(params, programs.state_sharding.params),
      opt_state_bytes_per_device=programs.opt_state_bytes,
      opt_state_bytes_total=programs.opt_state_bytes_replicated,
      programs=reports, global_batch_size=plan.gbs, device_kind=device.device_kind,
      topology=topology, accelerator=None if acc is None else acc.name,
      hbm_bytes_per_device=None if acc is None else acc.device_hbm_bytes, prediction=prediction,
      param_dtypes=_dtypes(params), opt_state_dtypes=_dtypes(jax.eval_shape(plan.tx.init, params)))


def _dtypes(tree: Any) -> dict[str, int]:
  """How many arrays of each dtype a pytree holds."""
  import jax

  out: dict[str, int] = {}
  for leaf in jax.tree.leaves(tree):
    out[str(leaf.dtype)] = out.get(str(leaf.dtype), 0) + 1
  return out


def _predict(acc: accelerators.Accelerator, devices: int, gbs: int, train: ProgramReport,
             model_flops: float, convergence: predict_lib.Convergence | None
             ) -> predict_lib.Prediction | None:
  if train.flops is None or train.bytes_accessed is None or not train.hlo_readable:
    return None  # without the program's collectives the interconnect term is unknown
  roof = predict_lib.roofline(acc, train.flops / devices, train.bytes_accessed,
                              sum(train.collective_wire_bytes.values()))
  return predict_lib.predict(acc, devices, gbs, roof, train.xla_seconds, model_flops, convergence)
