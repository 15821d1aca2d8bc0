"""Fitting the time model's constants on the calibration set, and judging them.

Least squares on log(predicted / measured) time to train, over the runs of the
set (one row per system and benchmark), with the constants held in physical
bounds. Leave-one-out: each run predicted by constants fitted on all the
others; the spread of those ratios is the uncertainty `check` states.

    python -m benchmarks.calibration.fit [--results DIR] [--held-out DIR] [--write]

--write stores the constants where the package reads them: mlbench/accelerators.yaml
(`time_model`; `--accelerators` names another copy).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

from mlbench import accelerators
from mlbench.pod import costtable, timemodel
from mlbench.pod.timemodel import Constants

from . import cases

# (lower, upper) and starting points of the fitted constants, in Constants.FITTED order:
# eta, hbm, fixed_flops, eval_overhead_s, kappa, fixed_bytes_per_param.
BOUNDS = ((0.05, 1.0), (0.3, 4.0), (0.0, 5e12), (0.0, 20.0), (0.0, 1.0), (0.0, 80.0))
STARTS = ((0.5, 1.0, 2e11, 0.2, 1.0, 42.9), (0.3, 2.0, 1e12, 1.0, 0.5, 20.0),
          (0.8, 0.5, 0.0, 0.0, 0.8, 60.0))
# The constants the fit finds; the others keep `base_constants()`'s values. A model
# choice, made on leave-one-out alone (benchmarks/model_choices.py, 2026-11-28): fitting
# the batch-independent bytes, the per-evaluation overhead and the all-reduce's exposed
# fraction as well gave 19 of 24 runs within 1.25x, typical x/÷ 1.210; holding them at the
# compiles' measure (42.9 bytes per f32 parameter byte), 0 and 1 gives 21, 1.172 (kappa
# fits to 1 either way).
FITTED = ("eta", "hbm", "fixed_flops")


@dataclasses.dataclass(frozen=True)
class Row:
  case: cases.Case
  measured: cases.Measured
  inputs: timemodel.Inputs
  not_fitted: str = ""  # why it is shown but not fitted on (a stand-in program costs it)


def rows(which: tuple[cases.Case, ...], results: Path, held_out: Path | None = None
         ) -> tuple[list[Row], list[str]]:
  """The rows of the cases whose logs are under `results` (or `held_out`, see
  `cases.log_folder`); the reasons the others are left out."""
  records = costtable.load()
  out, skipped = [], []
  for case in which:
    try:
      m = cases.measured(case, results, held_out)
      out.append(Row(case, m, cases.inputs(case, m, records),
                     case.not_fitted or cases.stand_in(case, records)))
    except (FileNotFoundError, KeyError) as e:
      skipped.append(f"{case.name}: {e}")
  return out, skipped


# The value of a fittable constant the fit holds instead (not in FITTED): no evaluation
# overhead, the all-reduce not overlapped; fixed_bytes_per_param: the compiles' measure.
HELD = {"eval_overhead_s": 0.0, "kappa": 1.0}


def base_constants() -> Constants:
  """The constants the fit starts from: the first starting point (`HELD`'s values for the
  constants not fitted), the batch-independent bytes per parameter byte as the cached
  compiles measure them, no warm-up."""
  start = dict(zip(Constants.FITTED, STARTS[0]))
  start.update({k: v for k, v in HELD.items() if k not in FITTED})
  start["fixed_bytes_per_param"] = round(cases.fixed_bytes_per_param(costtable.load()),
                                         2)
  return Constants(**start, warmup_s=0.0)


def warmups(rs: list[Row]) -> tuple[float, tuple[tuple[str, float], ...]]:
  """The warm-up the logs show (`runlog.RunLog.warmup_s`): the median per workload over
  the rows whose block times are sound, and over all of them for the other workloads."""
  got: dict[str, list[float]] = {}
  for r in rs:
    if r.measured.warmup_s is not None:
      got.setdefault(r.inputs.workload, []).append(r.measured.warmup_s)
  every = [w for ws in got.values() for w in ws]
  return (round(statistics.median(every), 3) if every else 0.0,
          tuple(sorted((k, round(statistics.median(v), 3)) for k, v in got.items())))


# The GPU efficiency is fitted per accelerator and workload ("h100/bert"): a choice made
# on leave-one-out (benchmarks/README.md, "Pod prediction": the four H100 runs, typical
# x/÷ 1.227 against 1.428 with one efficiency for ResNet-50's and BERT's runs).
ETA_BY_WORKLOAD = True


def _accelerators(rs: list[Row]) -> list[str]:
  """The efficiencies an `only_eta` fit finds: per accelerator, or per accelerator and
  workload (`ETA_BY_WORKLOAD`)."""
  return sorted({_eta_key(r) for r in rs})


def _eta_key(r: Row) -> str:
  x = r.inputs
  return f"{x.accelerator}/{x.workload}" if ETA_BY_WORKLOAD else x.accelerator


def _constants(values: Any, base: Constants, accs: list[str] | None) -> Constants:
  """Constants from a parameter vector: the efficiencies of `accs` (only those), or the
  fitted constants; the rest are `base`'s."""
  if accs is not None:
    by = {**dict(base.eta_by), **{a: float(v) for a, v in zip(accs, values)}}
    return dataclasses.replace(base, eta_by=tuple(sorted(by.items())))
  return dataclasses.replace(base, **{k: float(v) for k, v in zip(FITTED, values)})


def _residuals(values: Any, rs: list[Row], base: Constants, accs: list[str] | None
               ) -> list[float]:
  c = _constants(values, base, accs)
  return [math.log(timemodel.predict(r.inputs, c).total_s / r.measured.run_s) for r in rs]


def fit(rs: list[Row], start: Constants | None = None, only_eta: bool = False,
        starts: int = len(STARTS)) -> Constants:
  """The constants that minimise the squared log ratios over `rs`: the fitted ones
  (the best of `starts` starting points, `start`'s first), or with `only_eta` the
  efficiency of each accelerator among `rs`, the others kept from `start`."""
  from scipy.optimize import least_squares

  base = start or base_constants()
  accs = _accelerators(rs) if only_eta else None
  if not only_eta:  # measured on the rows fitted on (a left-out run's logs are not used)
    default, by = warmups(rs)
    base = dataclasses.replace(base, warmup_s=default, warmup_by=by)
  if accs is not None:
    x0s, bounds = [[base.eta_for(*a.split("/")) for a in accs]], [BOUNDS[0]] * len(accs)
  else:
    pick = [Constants.FITTED.index(k) for k in FITTED]
    mine = [getattr(base, k) for k in FITTED]
    others = [[x[i] for i in pick] for x in STARTS if [x[i] for i in pick] != mine]
    x0s, bounds = [mine, *others][:max(1, starts)], [BOUNDS[i] for i in pick]
  lo, hi = zip(*bounds)
  best = None
  for x0 in x0s:
    x0 = [min(max(v, lo_), hi_) for v, lo_, hi_ in zip(x0, lo, hi)]
    got = least_squares(_residuals, x0, bounds=(lo, hi), args=(rs, base, accs), x_scale="jac")
    if best is None or got.cost < best.cost:
      best = got
  return _constants(best.x, base, accs)


def leave_one_out(rs: list[Row], full: Constants, only_eta: bool = False) -> list[float]:
  """Predicted / measured of each row under constants fitted without it (all of them, or
  only the accelerators' efficiencies, the others kept from `full`), each fit started
  from `full` and from the other starting points."""
  out = []
  for i, r in enumerate(rs):
    c = fit(rs[:i] + rs[i + 1:], start=full, only_eta=only_eta)
    out.append(timemodel.predict(r.inputs, c).total_s / r.measured.run_s)
  return out


def spread(ratios: list[float]) -> dict[str, float]:
  """The uncertainty: the RMS of log ratios as a factor, and the worst ratio either way."""
  logs = [math.log(x) for x in ratios]
  return {"factor_1sigma": round(math.exp(math.sqrt(statistics.fmean(v * v for v in logs))), 3),
          "worst": round(math.exp(max(abs(v) for v in logs)), 3), "runs": len(ratios)}


def biased_spread(ratios: list[float], what: str) -> dict[str, Any]:
  """`spread` and the sign of the bias: the geometric mean of predicted / measured and how
  many runs were slower than predicted (a ratio below 1)."""
  bias = math.exp(statistics.fmean(math.log(x) for x in ratios))
  return {**spread(ratios), "bias": round(bias, 3), "slower": sum(1 for x in ratios if x < 1),
          "what": what}


HELD_OUT = "Google's v0.6 TPU-v3 runs of 2019, never fitted"


def write(platform: str, c: Constants, loo: dict[str, float], n: int,
          path: Path | None = None, note: str = "", case_set: str = "CASES",
          fitted: str = "", never: dict[str, Any] | None = None,
          calibrated: dict[str, list[str]] | None = None) -> None:
  """Stores the constants and their provenance in accelerators.yaml (`time_model`): the
  package's (what `mlbench check` and `mlbench plan` read), or the copy at `path`."""
  path = path or Path(accelerators.__file__).with_name("accelerators.yaml")
  text = path.read_text()
  head = text.split("\ntime_model:\n", 1)[0].split("\n# The pod time model's", 1)[0]
  head = head.rstrip("\n") + "\n"
  doc = yaml.safe_load(text).get("time_model") or {}
  doc = {k: v for k, v in doc.items() if k != platform}
  doc[platform] = {**{k: _num(v) for k, v in zip(Constants.NAMES, c.to_list())},
                   "eta_by": {k: float(f"{v:.4g}") for k, v in c.eta_by},
                   "warmup_by": {k: float(f"{v:.4g}") for k, v in c.warmup_by},
                   "fitted_constants": fitted or ", ".join(FITTED),
                   "fitted_on": f"{n} published runs (benchmarks/calibration/cases.py {case_set})",
                   "fitted": datetime.date.today().isoformat(),
                   "command": "python -m benchmarks.calibration.fit --write",
                   "leave_one_out": loo,
                   "never_fitted": never or {"runs": 0},
                   "calibrated": calibrated or {"accelerators": [], "workloads": []},
                   **({"note": note} if note else {})}
  accelerators._document.cache_clear()
  accelerators.table.cache_clear()
  lines = ["", "# The pod time model's constants (mlbench/pod/timemodel.py), fitted on published",
           "# runs by the command each names; leave_one_out: the spread check states.",
           "time_model:"]
  for name in sorted(doc):
    lines.append(f"  {name}:")
    for k, v in doc[name].items():
      lines.append(f"    {k}: {_yaml(v)}")
  tmp = path.with_suffix(".tmp")
  tmp.write_text(head + "\n".join(lines) + "\n")
  tmp.replace(path)


def _num(v: float) -> float:
  """Four significant digits; a constant the fit ran to its bound of 0 is written as 0."""
  return 0.0 if abs(v) < 1e-9 else float(f"{v:.4g}")


def _yaml(v: Any) -> str:
  if isinstance(v, dict):
    return "{" + ", ".join(f"{k}: {_yaml(x)}" for k, x in v.items()) + "}"
  if isinstance(v, list):
    return "[" + ", ".join(_yaml(x) for x in v) + "]"
  if isinstance(v, str):
    return '"' + re.sub(r'"', "'", v) + '"'
  return repr(v)


@dataclasses.dataclass(frozen=True)
class Calibration:
  """The fit of each platform, its leave-one-out ratios, and the held-out runs."""

  tpu: list[Row]
  tpu_constants: Constants
  tpu_loo: list[float]
  held_out: list[Row]
  gpu: list[Row]
  gpu_constants: Constants
  gpu_loo: list[float]
  left_out: list[str]
  not_fitted: list[Row]

  def held_out_ratios(self) -> list[float]:
    """Predicted / measured of the never-fitted runs under the TPU constants."""
    return [timemodel.predict(r.inputs, self.tpu_constants).total_s / r.measured.run_s
            for r in self.held_out]


def calibrated(rs: list[Row]) -> dict[str, list[str]]:
  """What the fitted runs cover: their accelerators (as accelerators.yaml names them) and
  workloads; a prediction outside them extrapolates (`mlbench.pod.uncertainty`)."""
  return {"accelerators": sorted({r.case.accelerator for r in rs}),
          "workloads": sorted({r.inputs.workload for r in rs})}


def calibrate(results: Path, held_out: Path | None = None) -> Calibration:
  """Fits the TPU constants on the calibration set, and the GPU efficiency (one constant,
  the rest the TPU's: four runs cannot fit seven) on the H100 runs; leave-one-out for
  both. The logs are under `results`, the held-out v0.6 ones under `held_out`."""
  tpu, left = rows(tuple(c for c in cases.CASES if not c.held_out), results)
  held, left_h = rows(tuple(c for c in cases.CASES if c.held_out), results, held_out)
  gpu, left_g = rows(cases.GPU_CASES, results)
  c = fit(tpu, base_constants())
  fitted = [r for r in gpu if not r.not_fitted]
  g = fit_gpu(fitted, c)
  return Calibration(tpu=tpu, tpu_constants=c, tpu_loo=leave_one_out(tpu, c), held_out=held,
                     gpu=fitted, gpu_constants=g,
                     gpu_loo=leave_one_out(fitted, g, only_eta=True) if fitted else [],
                     left_out=left + left_h + left_g,
                     not_fitted=[r for r in gpu if r.not_fitted])


def fit_gpu(rs: list[Row], tpu: Constants) -> Constants:
  """The GPU constants: the TPU fit's, with the GPU runs' own warm-ups (as their logs show
  them) and their efficiencies fitted on them (`_gpu`)."""
  if not rs:
    return tpu
  mine = dict(tpu.warmup_by) | dict(warmups(rs)[1])
  start = dataclasses.replace(tpu, warmup_by=tuple(sorted(mine.items())))
  return _gpu(fit(rs, start=start, only_eta=True))


def _gpu(c: Constants) -> Constants:
  """The GPU constants: the H100's fitted efficiencies (per workload) for the H100 and the
  H200 (the same GH100 tensor cores); for other workloads and GPUs their geometric mean
  (a prediction there is extrapolated: `mlbench.pod.uncertainty`); no TPU entries."""
  mine = {k.split("/", 1)[1]: v for k, v in c.eta_by if k.startswith("h100/")}
  if not mine:
    h100 = c.eta_for("h100")
    return dataclasses.replace(c, eta=h100, eta_by=(("h100", h100), ("h200", h100)))
  mean = math.exp(statistics.fmean(math.log(v) for v in mine.values()))
  by = {f"{gpu}/{wl}": v for wl, v in mine.items() for gpu in ("h100", "h200")}
  return dataclasses.replace(c, eta=mean, eta_by=tuple(sorted(by.items())))


TPU_NOTE = ("eta, hbm and fixed_flops fitted; held (a choice made on leave-one-out, "
            "benchmarks/model_choices.py): fixed_bytes_per_param at the compiles' measure (the "
            "batch-independent HBM bytes per f32 parameter byte), eval_overhead_s 0, kappa 1 "
            "(the all-reduce not overlapped), step_overhead_s 0 (the runs ran device loops); "
            "warm-up measured, not fitted: the first block's time beyond the steady rate in the "
            "logs whose block times are sound (runlog.RunLog.warmup_s), the median per workload "
            "(warmup_by). Each run costed by the programs it ran (programs.py: "
            "implementations.json)")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--results", type=Path, default=cases.default_results(),
                  help="the published logs (<round>/<org>/results/...)")
  ap.add_argument("--held-out", type=Path, default=cases.default_held_out(),
                  help="the held-out v0.6 logs (<org>/results/...)")
  ap.add_argument("--write", action="store_true", help="store the constants")
  ap.add_argument("--accelerators", type=Path, default=None,
                  help="the accelerators.yaml to store them in (default: the package's)")
  args = ap.parse_args()
  cal = calibrate(args.results, args.held_out)
  for s in cal.left_out:
    print(f"left out: {s}", file=sys.stderr)
  print("tpu", cal.tpu_constants, spread(cal.tpu_loo))
  print("gpu", cal.gpu_constants, spread(cal.gpu_loo) if cal.gpu_loo else "-")
  never = biased_spread(cal.held_out_ratios(), HELD_OUT) if cal.held_out else None
  print("never fitted", never)
  if args.write:
    write("tpu", cal.tpu_constants, spread(cal.tpu_loo), len(cal.tpu), args.accelerators,
          note=TPU_NOTE, never=never, calibrated=calibrated(cal.tpu))
    if cal.gpu:
      write("gpu", cal.gpu_constants, spread(cal.gpu_loo), len(cal.gpu), args.accelerators,
            case_set="GPU_CASES", fitted="eta_by: the h100's per workload",
            calibrated=calibrated(cal.gpu),
            note="the h100 efficiency fitted per workload on the H100 runs (GPU_CASES; the "
                 "BERT runs costed by the packed program), eta their geometric mean for other "
                 "workloads; their warm-ups measured on their logs, the others the TPU fit's; "
                 "no never-fitted GPU run: the TPU's never-fitted spread stands for it")


if __name__ == "__main__":
  main()
