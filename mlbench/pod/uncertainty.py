"""How sure a prediction is: the calibration's two spreads, and where a prediction extrapolates.

The time model's error is measured twice, and both are stored with its constants
(accelerators.yaml `time_model`, written by benchmarks/calibration/fit.py):

- `leave_one_out`: each fitted run predicted by constants fitted without it;
- `never_fitted`: runs the fit never saw and no model choice was made on (Google's v0.6
  TPU-v3 runs): their spread, and the sign of their bias (how many ran slower than
  predicted, the geometric mean of predicted / measured).

A prediction states both; its band uses the wider (`Uncertainty.sigma`), a log-normal
factor with that spread. A candidate on an accelerator, or of a workload, that the
calibration has no run of is extrapolated (`Uncertainty.extrapolation` says why), and
its spread widens by a stated rule: each thing without a calibration run adds, in
quadrature, the largest miss the model made on a run it did not fit (the worst of both
measurements): sigma^2 = sigma_wider^2 + n x ln(worst)^2.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from mlbench import accelerators

RULE = ("each thing without a calibration run adds, in quadrature, the largest miss on a run "
        "the fit did not see")


@dataclasses.dataclass(frozen=True)
class Spread:
  """A set of predicted / measured ratios: the RMS of their logs as a factor (x/÷), the
  worst either way, how many, and (never-fitted runs) the bias: the geometric mean
  ratio and how many ran slower than predicted."""

  factor: float
  worst: float
  runs: int
  bias: float | None = None
  slower: int | None = None
  what: str = ""

  @classmethod
  def from_dict(cls, raw: dict[str, Any] | None) -> Spread | None:
    if not raw or not raw.get("runs"):
      return None
    return cls(factor=float(raw["factor_1sigma"]), worst=float(raw["worst"]),
               runs=int(raw["runs"]), bias=raw.get("bias"), slower=raw.get("slower"),
               what=str(raw.get("what", "")))

  def direction(self) -> str:
    """Which way the runs missed: 'mostly slower than predicted' and the like."""
    if self.slower is None:
      return ""
    faster = self.runs - self.slower
    if self.slower > faster:
      return f"{self.slower} of {self.runs} slower than predicted"
    if faster > self.slower:
      return f"{faster} of {self.runs} faster than predicted"
    return "as many faster as slower than predicted"

  def to_json(self) -> dict[str, Any]:
    return {"factor": self.factor, "worst": self.worst, "runs": self.runs, "bias": self.bias,
            "slower_than_predicted": self.slower, "what": self.what or None}


@dataclasses.dataclass(frozen=True)
class Uncertainty:
  """A platform's two spreads and what its calibration has runs of."""

  platform: str
  loo: Spread | None
  never_fitted: Spread | None
  accelerators: tuple[str, ...] = ()
  workloads: tuple[str, ...] = ()

  @property
  def wider(self) -> Spread | None:
    spreads = [s for s in (self.loo, self.never_fitted) if s is not None]
    return max(spreads, key=lambda s: s.factor) if spreads else None

  def extrapolation(self, accelerator: str, workload: str) -> tuple[str, ...]:
    """Why a prediction for `workload` on `accelerator` extrapolates (none: it does not)."""
    if self.wider is None:
      return (f"no time model fitted for {self.platform}: unfitted constants",)
    out = []
    if accelerator not in self.accelerators:
      out.append(f"no calibration run on {accelerator} (the {self.platform} runs were on "
                 f"{', '.join(self.accelerators)})")
    if workload not in self.workloads:
      out.append(f"no calibration run of {workload} on {self.platform} (runs of "
                 f"{', '.join(self.workloads)})")
    return tuple(out)

  def sigma(self, reasons: tuple[str, ...] = ()) -> float:
    """The log-spread of a prediction's band: the wider spread's, widened per reason."""
    wide = self.wider
    if wide is None:
      return math.log(2.0) * math.sqrt(1 + len(reasons))  # nothing measured: x/÷ 2 a reason
    worst = max(s.worst for s in (self.loo, self.never_fitted) if s is not None)
    return math.sqrt(math.log(wide.factor) ** 2 + len(reasons) * math.log(worst) ** 2)

  def summary(self) -> str:
    """Both spreads in words, as check and plan print them."""
    parts = []
    if self.loo is not None:
      parts.append(f"fitted runs x/÷ {self.loo.factor:.2f} (leave-one-out over {self.loo.runs},"
                   f" worst {self.loo.worst:.2f}x)")
    if self.never_fitted is not None:
      n = self.never_fitted
      what = f" ({n.what})" if n.what else ""
      parts.append(f"never-fitted runs x/÷ {n.factor:.2f}{what}, worst {n.worst:.2f}x, "
                   f"{n.direction()}")
    else:
      parts.append("no never-fitted runs measured")
    return "; ".join(parts)

  def describe(self, accelerator: str, workload: str) -> dict[str, Any]:
    """A prediction's uncertainty as data: both spreads, why it extrapolates (if it does)
    and the factor of its band (x/÷)."""
    reasons = self.extrapolation(accelerator, workload)
    return {**self.to_json(), "summary": self.summary(), "extrapolated": list(reasons),
            "band_factor": round(math.exp(self.sigma(reasons)), 4),
            "rule": RULE if reasons else None}

  def to_json(self) -> dict[str, Any]:
    return {"leave_one_out": None if self.loo is None else self.loo.to_json(),
            "never_fitted": None if self.never_fitted is None else self.never_fitted.to_json(),
            "wider_factor": round(math.exp(self.sigma()), 4),
            "calibrated": {"accelerators": list(self.accelerators),
                           "workloads": list(self.workloads)}}


def of(platform: str) -> Uncertainty:
  """The stored spreads and calibrated sets of a platform's time model. A platform without
  never-fitted runs of its own (the GPUs: their model is the TPU fit's but for one
  efficiency) takes the TPU's never-fitted spread, said so."""
  raw = accelerators.time_model(platform)
  cal = raw.get("calibrated") or {}
  never = Spread.from_dict(raw.get("never_fitted"))
  if never is None and platform != "tpu":
    tpu = Spread.from_dict(accelerators.time_model("tpu").get("never_fitted"))
    if tpu is not None:
      never = dataclasses.replace(tpu, what=f"{tpu.what}: the {platform} model shares the "
                                  "TPU fit's constants but its efficiency")
  return Uncertainty(platform=platform, loo=Spread.from_dict(raw.get("leave_one_out")),
                     never_fitted=never,
                     accelerators=tuple(cal.get("accelerators") or ()),
                     workloads=tuple(cal.get("workloads") or ()))


def describe(platform: str, accelerator: str, workload: str) -> dict[str, Any]:
  """`Uncertainty.describe` of the platform's stored time model (a `plan.SpreadFn`)."""
  return of(platform).describe(accelerator, workload)
