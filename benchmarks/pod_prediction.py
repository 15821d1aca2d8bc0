"""Pod prediction vs measurement: the whole calibration table, with leave-one-out ratios.

Every published TPU run of a workload mlbench has (benchmarks/calibration/cases.py CASES:
Google's v0.7 and v2.0 runs in ../shared/mlperf-results, 8 to 4,096 chips) is
predicted by `mlbench check`'s time model (mlbench/pod/timemodel.py) from mlbench's
own full config compiled for the run's per-device batch (cached in
mlbench/pod/calibration_costs.json; `python -m benchmarks.calibration.costs` recompiles), the
run's slice, and the steps and evaluations its logs record. Per run: measured and
predicted time to train (median over its successful logs), their ratio under the
constants fitted on all runs, and under the constants fitted without that run
(leave-one-out); measured and predicted step time where the logs' block times are
sound. Then the held-out runs (Google's v0.6 TPU-v3 runs, `:::MLL` logs, never
fitted) and the v4.0 H100 runs (NVIDIA, Dell), predicted with the same constants.
Goal: every ratio within 1.25x both ways.

    python benchmarks/pod_prediction.py [--results DIR] [--held-out DIR]

The constants it prints are the ones `python -m benchmarks.calibration.fit --write` stores
in mlbench/accelerators.yaml (time_model).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from calibration import cases, fit
from mlbench.pod import timemodel


def _ratio(x: float | None) -> str:
  return "-" if x is None else f"{x:.2f}"


def _constants(c: timemodel.Constants, names: tuple[str, ...]) -> str:
  return ", ".join(f"{k} = {0.0 if abs(getattr(c, k)) < 1e-9 else getattr(c, k):.4g}"
                   for k in names)


def _ms(s: float | None) -> str:
  return "-" if s is None else f"{s * 1e3:,.1f}"


def _row(r: fit.Row, c: timemodel.Constants, loo: float | None) -> str:
  t = timemodel.predict(r.inputs, c)
  m = r.measured
  step = m.step_s
  return (f"| {r.case.name} | {r.inputs.devices:,} | {m.global_batch:,} | {m.steps:,.0f} | "
          f"{m.evals:g} | {m.run_s:,.1f} | {t.total_s:,.1f} | {_ratio(t.total_s / m.run_s)} | "
          f"{_ratio(loo)} | {_ms(step)} | {_ms(t.step_s)} | "
          f"{_ratio(None if step is None else t.step_s / step)} | "
          f"{t.warmup_s:.1f} / {t.train_s:,.1f} / {t.eval_s:,.1f} | "
          f"{'-' if m.warmup_s is None else f'{m.warmup_s:.2f}'} | {100 * t.mfu:.0f}% |")


HEADER = ("| run | devices | batch | steps | evals | measured s | predicted s | pred/meas | "
          "leave-one-out | measured step ms | predicted step ms | step pred/meas | "
          "warm-up / train / eval s | logged warm-up s | MFU |\n|---|" + "---|" * 14)


def _table(title: str, rows: list[fit.Row], c: timemodel.Constants,
           loo: list[float] | None) -> list[float]:
  print(f"\n{title}\n\n{HEADER}")
  ratios = []
  for i, r in enumerate(rows):
    print(_row(r, c, None if loo is None else loo[i]), flush=True)
    ratios.append(timemodel.predict(r.inputs, c).total_s / r.measured.run_s)
  return ratios


def _summary(name: str, ratios: list[float]) -> None:
  if not ratios:
    return
  inside = sum(1 for x in ratios if 1 / 1.25 <= x <= 1.25)
  s = fit.spread(ratios)
  print(f"\n{name}: {inside} of {len(ratios)} within 1.25x; typical x/÷ {s['factor_1sigma']}, "
        f"worst {s['worst']}x (min {min(ratios):.2f}, max {max(ratios):.2f})")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--results", type=Path, default=cases.default_results())
  ap.add_argument("--held-out", type=Path, default=cases.default_held_out())
  args = ap.parse_args()
  cal = fit.calibrate(args.results, args.held_out)
  for why in cal.left_out:
    print(f"left out: {why}")
  c = cal.tpu_constants
  print("fitted TPU constants: " + _constants(c, fit.FITTED) + "; set: "
        + _constants(c, tuple(k for k in timemodel.Constants.NAMES if k not in fit.FITTED)))
  s = fit.spread(cal.tpu_loo)
  print(f"uncertainty (what check states): x/÷ {s['factor_1sigma']} typical, "
        f"{s['worst']}x worst, leave-one-out over {s['runs']} runs")
  fitted = _table(f"Calibration set ({len(cal.tpu)} runs; fitted on all of them)", cal.tpu, c,
                  cal.tpu_loo)
  _summary("calibration, constants fitted on all", fitted)
  _summary("calibration, leave-one-out", cal.tpu_loo)
  _summary("held out (v0.6, :::MLL logs)",
           _table("Held out: v0.6 TPU-v3 runs (never fitted)", cal.held_out, c, None))
  g = cal.gpu_constants
  etas = ", ".join(f"{k} {v:.3g}" for k, v in g.eta_by if k.startswith("h100"))
  title = (f"H100 runs (v4.0): eta fitted on them per workload ({etas}; leave-one-out "
           "column: fitted on the others), the other constants the TPU fit's")
  _summary("H100 (v4.0)", _table(title, cal.gpu, g, cal.gpu_loo))
  _summary("H100 (v4.0), leave-one-out", cal.gpu_loo)
  if cal.not_fitted:
    why = "; ".join(sorted({r.not_fitted for r in cal.not_fitted}))
    _summary("H100, not fitted", _table(f"H100 runs predicted, not fitted on ({why})",
                                        cal.not_fitted, g, None))


if __name__ == "__main__":
  main()
