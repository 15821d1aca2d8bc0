"""From a compiled train step to a predicted step time, MFU and time to train.

Three lower bounds on a step, per device (the roofline): its FLOPs at the
chip's peak, its HBM traffic at the HBM bandwidth, and the bytes its
collectives send at the interconnect bandwidth; and XLA's own estimate
(`optimal_seconds` of the TPU compiler's cost analysis, corrected by `xlacost`). Without
the time model's terms the prediction is the largest of them: the step can be no faster
than any (with them, as `check` predicts, XLA's estimate is only shown). Time to train is the
predicted step time times the steps to converge, taken from MLPerf's reference
convergence points (RCPs, shipped with mlperf-logging; read as the RCP checker
reads them, `rcp`) for the batch size, or from a real run's result log.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from mlbench import accelerators, rules
from mlbench.errors import UserError
from mlbench.pod import rcp, timemodel
from mlbench.resultlog import ResultLog


@dataclasses.dataclass(frozen=True)
class Roofline:
  """Seconds per step if only one resource limited it."""

  compute_s: float
  hbm_s: float
  collective_s: float

  @property
  def bound_s(self) -> float:
    return max(self.compute_s, self.hbm_s, self.collective_s)

  @property
  def limit(self) -> str:
    """Which resource bounds the step."""
    terms = {"compute": self.compute_s, "HBM": self.hbm_s, "interconnect": self.collective_s}
    return max(terms, key=terms.get)


@dataclasses.dataclass(frozen=True)
class Convergence:
  """Training samples until the quality target, and where that figure comes from."""

  samples: float
  source: str


@dataclasses.dataclass(frozen=True)
class Prediction:
  accelerator: str
  devices: int
  xla_step_s: float | None
  roofline: Roofline
  step_s: float
  samples_per_s: float
  model_flops_per_step: float
  model_flops_per_s: float
  mfu: float
  steps_to_converge: float | None
  convergence_source: str
  time_to_train_s: float | None
  terms: timemodel.Terms | None = None   # the time to train, term by term
  provenance: dict[str, Any] = dataclasses.field(default_factory=dict)  # of the constants
  collectives_known: bool = True  # False: model-axis collectives unknown (not in the terms)


def roofline(acc: accelerators.Accelerator, flops_per_device: float, bytes_per_device: float,
             wire_bytes_per_device: float) -> Roofline:
  return Roofline(compute_s=flops_per_device / acc.device_peak_flops_per_s,
                  hbm_s=bytes_per_device / acc.device_hbm_bytes_per_s,
                  collective_s=wire_bytes_per_device / acc.device_interconnect_bytes_per_s)


def predict(acc: accelerators.Accelerator, devices: int, global_batch: int, roof: Roofline,
            xla_step_s: float | None, model_flops_per_step: float,
            convergence: Convergence | None, *, terms: timemodel.Terms | None = None,
            provenance: dict[str, Any] | None = None,
            collectives_known: bool = True) -> Prediction:
  """Step time, throughput, MFU and time to train of one compiled train step: with the
  time model's `terms`, their step and total; else the largest lower bound."""
  step_s = terms.step_s if terms is not None else max(roof.bound_s, xla_step_s or 0.0)
  model_rate = model_flops_per_step / step_s
  steps = None if convergence is None else convergence.samples / global_batch
  total = None if steps is None else (terms.total_s if terms is not None else steps * step_s)
  return Prediction(
      accelerator=acc.name, devices=devices, xla_step_s=xla_step_s, roofline=roof, step_s=step_s,
      samples_per_s=global_batch / step_s, model_flops_per_step=model_flops_per_step,
      model_flops_per_s=model_rate, mfu=model_rate / (devices * acc.device_peak_flops_per_s),
      steps_to_converge=steps,
      convergence_source="none" if convergence is None else convergence.source,
      time_to_train_s=total, terms=terms, provenance=dict(provenance or {}),
      collectives_known=collectives_known)


def from_rcps(rule: rules.Rule, global_batch: int, train_examples: int) -> Convergence | None:
  """Samples to converge from the RCPs of the rule's round (or the first later round with
  RCPs for this benchmark): their mean at the batch as the RCP checker reads it (`rcp`)."""
  if not rule.official:  # The mini rules have targets of their own; no RCP applies.
    return None
  try:
    table = rcp.load(rule)
  except UserError:
    return None
  c = rcp.at(table, global_batch)
  samples = c.mean if rule.convergence_unit is rules.Unit.SAMPLES else c.mean * train_examples
  return Convergence(samples=samples, source=f"{table.source} reference convergence points "
                     f"({c.mean:,.4g} {c.unit.value} at batch {global_batch}, {c.how})")


def from_log(path: Path, rule: rules.Rule, train_examples: int) -> Convergence:
  """Samples a real run trained before reaching its target, from its result log
  (`:::MLLOG` or the older `:::MLL` format)."""
  evs = ResultLog.read(path).events
  stops = [e for e in evs if e.key == "run_stop"]
  # An asynchronous evaluation logged after run_stop scored training the run did not need.
  evals = [e for e in evs if e.key == rule.quality.key and e.value is not None
           and (not stops or e.time_ms <= stops[-1].time_ms)]
  if not evals or not stops or stops[-1].metadata.get("status") != "success":
    raise UserError(f"--from-log {path}: not a successful run (no {rule.quality.key} or no "
                    "run_stop with status success); give the log of a run that converged")
  meta = evals[-1].metadata
  if meta.get("samples_count"):
    samples = float(meta["samples_count"])
  elif rule.convergence_unit is rules.Unit.SAMPLES:
    samples = float(meta["epoch_num"])
  else:
    samples = float(meta["epoch_num"]) * train_examples
  return Convergence(samples=samples, source=f"{path} ({samples:,.0f} samples)")
