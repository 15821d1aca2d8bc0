"""The time model's choices of form, each judged on leave-one-out alone.

Since issue 49, a choice of the model's form (not a constant the fit finds) is made on the
leave-one-out spread of the fitted runs only; the never-fitted v0.6 runs are printed
beside it, measured, never used to choose (benchmarks/README.md, "Pod prediction", says
which data chose what). For each alternative: the fitted runs within 1.25x
leave-one-out, the typical factor (RMS of log ratios) and the worst; then the never-fitted
runs' typical factor and worst under the constants fitted on all runs.

- `ROOFLINE_P`: the norm of the soft roofline (2, 3, 4, 8, or a hard max);
- which constants the fit finds, and which it holds (the batch-independent bytes at the
  compiles' measure, no per-evaluation overhead, no overlap of the all-reduce);
- the step of a length-bucketed run: the expected slowest of its replicas' programs
  (they wait for each other at the gradient all-reduce) or their weighted mean;
- the H100 runs' efficiency: one for every workload, or one per workload.

    python benchmarks/model_choices.py [--results DIR] [--held-out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from calibration import cases, fit
from mlbench.pod import timemodel


def _judge(name: str, rows: list[fit.Row], held: list[fit.Row]) -> None:
  c = fit.fit(rows, fit.base_constants())
  loo = fit.leave_one_out(rows, c)
  inside = sum(1 for x in loo if 1 / 1.25 <= x <= 1.25)
  s = fit.spread(loo)
  never = fit.spread([timemodel.predict(r.inputs, c).total_s / r.measured.run_s for r in held])
  print(f"| {name} | {inside} of {len(loo)} | {s['factor_1sigma']:.3f} | {s['worst']:.2f} | "
        f"{never['factor_1sigma']:.3f} | {never['worst']:.2f} |", flush=True)


# Which fittable constants the fit holds instead (at `fit.HELD`'s values, the bytes at the
# compiles' measure).
HOLDS = ((), ("kappa",), ("fixed_bytes_per_param",), ("eval_overhead_s",),
         ("fixed_bytes_per_param", "eval_overhead_s"),
         ("fixed_bytes_per_param", "eval_overhead_s", "kappa"))


def _held(names: tuple[str, ...]) -> str:
  base = fit.base_constants()
  return ", ".join(f"{k} = {getattr(base, k):g}" for k in names)


def _mean_buckets(rows: list[fit.Row]) -> list[fit.Row]:
  """The bucketed run's step as the weighted mean of its programs (one replica's view)."""
  return [dataclasses.replace(r, inputs=dataclasses.replace(r.inputs, replicas=1))
          if r.inputs.train_mix else r for r in rows]


def _gpu_choice(results: Path) -> None:
  """The H100 runs' efficiency: one for every workload, or one per workload."""
  cal = fit.calibrate(results)
  chosen = fit.ETA_BY_WORKLOAD
  for per_workload in (False, True):
    fit.ETA_BY_WORKLOAD = per_workload
    c = fit.fit(cal.gpu, start=dataclasses.replace(cal.gpu_constants, eta_by=()),
                only_eta=True)
    loo = fit.leave_one_out(cal.gpu, c, only_eta=True)
    s = fit.spread(loo)
    inside = sum(1 for x in loo if 1 / 1.25 <= x <= 1.25)
    name = "one per workload" if per_workload else "one for all workloads"
    print(f"| H100 efficiency: {name} | {inside} of {len(loo)} | {s['factor_1sigma']:.3f} | "
          f"{s['worst']:.2f} | - | - |", flush=True)
  fit.ETA_BY_WORKLOAD = chosen


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--results", type=Path, default=cases.default_results())
  ap.add_argument("--held-out", type=Path, default=cases.default_held_out())
  args = ap.parse_args()
  rows, _ = fit.rows(tuple(c for c in cases.CASES if not c.held_out), args.results)
  held_rows, _ = fit.rows(tuple(c for c in cases.CASES if c.held_out), args.results,
                          args.held_out)
  print("| choice | leave-one-out within 1.25x | LOO typical | LOO worst | never-fitted typical "
        "(not used) | never-fitted worst (not used) |\n|---|---|---|---|---|---|")
  chosen, fitted = timemodel.ROOFLINE_P, fit.FITTED
  for held in HOLDS:
    fit.FITTED = tuple(k for k in timemodel.Constants.FITTED if k not in held)
    for p in (2.0, 3.0, 4.0, 8.0, 64.0):
      timemodel.ROOFLINE_P = p
      what = f"held: {_held(held)}" if held else "all fitted"
      _judge(f"ROOFLINE_P = {p:g}, {what}", rows, held_rows)
  timemodel.ROOFLINE_P, fit.FITTED = chosen, fitted
  if any(r.inputs.train_mix for r in rows):
    _judge("bucketed step: the slowest replica's (expected)", rows, held_rows)
    _judge("bucketed step: the weighted mean of the buckets", _mean_buckets(rows), held_rows)
  _gpu_choice(args.results)
  print(f"\nthe module's choice: ROOFLINE_P = {chosen:g} (p = 64 stands for a hard max), "
        f"fitted: {', '.join(fitted)}; the bucketed rows under it")


if __name__ == "__main__":
  main()
