"""`mlbench plan` against Google's MLPerf v2.0 TPU v4 submissions (ResNet-50 and BERT).

A plan over TPU v4 slices from 512 to 4,096 chips (v4-1024 ... v4-8192, and v4-6912, the
3,456-chip slice of the v2.0 submission) at the global batches Google published in v2.0
(../shared/mlperf-results/v2.0/Google), with steps to converge from MLPerf's 4.0.0
reference convergence points and the per-device costs from the time model's calibration
compiles (`mlbench plan --costs calibration`: a full BERT-large compile takes hours
here). For each published submission: the plan's expected score (olympic mean of the
rules' runs, RCP normalisation included), the measured one (olympic mean of the
published logs' run_start..run_stop; and times the RCP normalisation the checker would
apply), their ratio, and whether the plan ranks the submissions' slices as measured.

The published v2.0 runs are also in the time model's calibration set (its constants
were fitted on them): the leave-one-out column of benchmarks/pod_prediction.py is the
prediction that never saw them. What this adds is the plan's own path: steps from the
RCPs rather than from the logs, and the eval cadence and budget of mlbench's configs.

    python benchmarks/plan_v2.py [--results DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from calibration import cases, runlog
from mlbench import config as config_lib, registry, rules
from mlbench.pod import estimate, odds, plan, plancost, rcp

# (workload, benchmark folder, slice, global batch) of each v2.0 submission.
SUBMISSIONS = (("resnet50", "resnet", "v4-6912", 55296), ("resnet50", "resnet", "v4-8192", 32768),
               ("bert", "bert", "v4-6912", 6912), ("bert", "bert", "v4-8192", 14336))


def measured(root: Path, bench: str, slice_: str, runs: int) -> tuple[float, float, float]:
  """(olympic mean of run times, mean samples to converge, logs) of a submission."""
  folder = root / "v2.0" / "Google" / "results" / f"cloud-tpu-{slice_}-TF" / bench
  logs = runlog.runs(folder, cases.TRAIN_EXAMPLES.get(bench))
  times = sorted(r.run_s for r in logs)[:runs]
  drop = odds.olympic_drop(len(times))
  kept = times[drop:len(times) - drop]
  samples = sorted(r.samples for r in logs)[drop:len(logs) - drop]
  return sum(kept) / len(kept), sum(samples) / len(samples), len(logs)


def predicted(workload: str, slice_: str, batch: int, grad_bytes_per_param: float = 4.0
              ) -> tuple[plan.Candidate, str]:
  """The plan's candidate at a published slice and batch; a batch that does not split
  over the slice's chips is predicted at its fractional per-chip batch (the calibration's
  lines allow it; a compile would not), and said. mlbench sums gradients in float32 (4
  bytes a parameter); Google's TPU code in bfloat16 (2: `cases.GRAD_BYTES_PER_PARAM`)."""
  wl = registry.get(workload)
  _, cfg, _ = config_lib.configured(wl, "full", ())
  rule = rules.load(wl.benchmark, rules.default_ruleset(wl.benchmark, "full", wl.rulesets))
  table = rcp.load(rule)
  t = plan.target(slice_)
  per = batch / t.devices
  note = "" if per.is_integer() else (f"{batch:,} does not split over {t.devices:,} chips "
                                     f"({per:g} a chip): mlbench's data-parallel plan leaves "
                                     "it out; predicted here at the fractional batch")
  costs = plancost.calibration_costs(workload, "full", ())(t.proxy, per)
  costs = dataclasses.replace(costs, grad_bytes=costs.param_bytes * grad_bytes_per_param / 4)
  points = plancost.points_fn(workload, "full", (), rule, table)(batch)
  c = plan.predict_candidate(t, batch, costs, rcp.at(table, batch), workload=workload,
                             eval_examples=wl.schedule(cfg).eval_examples, points=points,
                             runs=rule.runs, constants=lambda p: estimate.constants(p)[0])
  return c, note


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--results", type=Path, default=cases.default_results())
  args = ap.parse_args()
  print("| submission | chips | batch | measured score s (scaled) | plan score s | plan/measured "
        "| bf16 gradients: score s, ratio | plan median s (10-90%) | plan steps | logged steps "
        "| RCP |\n|---|" + "---|" * 10)
  by_workload: dict[str, list[tuple[str, float, float]]] = {}
  notes = []
  for workload, bench, slice_, batch in SUBMISSIONS:
    c, note = predicted(workload, slice_, batch)
    bf16, _ = predicted(workload, slice_, batch, cases.GRAD_BYTES_PER_PARAM)
    rule = rules.load(registry.get(workload).benchmark, "4.0.0")
    score, samples, n = measured(args.results, bench, slice_, rule.runs)
    conv = c.convergence
    per = 1.0 if conv.unit is rules.Unit.SAMPLES else cases.TRAIN_EXAMPLES[bench]
    scale = max(1.0, conv.mean * per / samples)
    look = c.outlook
    ratio = look.score_s / (score * scale)
    by_workload.setdefault(workload, []).append((slice_, score * scale, look.score_s))
    print(f"| v2.0 {slice_} {bench} ({n} logs) | {c.target.chips:,} | {batch:,} | "
          f"{score:.2f} ({score * scale:.2f}) | {look.score_s:.2f} | {ratio:.2f} | "
          f"{bf16.outlook.score_s:.2f}, {bf16.outlook.score_s / (score * scale):.2f} | "
          f"{look.median_s:.2f} ({look.p10_s:.2f}-{look.p90_s:.2f}) | {c.terms.steps:,.0f} | "
          f"{samples / batch:,.0f} | {conv.how} |")
    if note:
      notes.append(f"{slice_} {bench}: {note}")
    ratio16 = bf16.outlook.score_s / (score * scale)
    for what, r in (("mlbench's float32 gradient sum", ratio), ("bf16 as Google's", ratio16)):
      if not 1 / 1.25 <= r <= 1.25:
        notes.append(f"{slice_} {bench}: outside 1.25x with {what} ({r:.2f})")
  for workload, rows in by_workload.items():
    measured_order = [s for s, _, _ in sorted(rows, key=lambda r: r[1])]
    plan_order = [s for s, _, _ in sorted(rows, key=lambda r: r[2])]
    same = "the same" if measured_order == plan_order else "NOT the same"
    print(f"\n{workload}: measured fastest first {measured_order}, plan {plan_order}: {same}")
  for line in notes:
    print(f"note: {line}")
  if not any("outside" in n for n in notes):
    print("\nevery submission within 1.25x")


if __name__ == "__main__":
  main()
