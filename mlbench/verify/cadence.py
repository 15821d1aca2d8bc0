"""The evaluation cadence: a log's evaluations where its rules put them.

The closed division evaluates "at the same frequency (in terms of number of training items
between test sets)" as the reference (training_rules.adoc, Quality measure): off the cadence
fails there and warns in the open division, which "may use an arbitrary stopping criteria".
"""

from __future__ import annotations

import dataclasses

from mlbench import rules as rules_lib
from mlbench.resultlog import Line, ResultLog
from mlbench.verify.checks import QUALITY_MEASURE, Finding, Severity, at


def _num(x: float) -> str:
  return f"{x:,.0f}" if abs(x) >= 1e4 else f"{x:g}"


def schedule(log: ResultLog, rule: rules_lib.Rule | None, *,
             closed: bool = True) -> list[Finding]:
  """Evaluations where the rules' cadence puts them.

  Within two global batches of a point is on time (the rules allow rounding
  up to a batch; packed sequences make BERT's counts vary). Off by less than
  5% of the interval is a warning (still that point, placed imprecisely);
  more, or a point skipped, fails the closed division (training_rules.adoc, Quality
  measure: "CLOSED: ... evaluated at the same frequency") and warns the open one.
  """
  found = _schedule(log, rule)
  if closed:
    return [dataclasses.replace(f, rule=QUALITY_MEASURE) if f.severity is Severity.FAIL else f
            for f in found]
  return [dataclasses.replace(f, severity=Severity.WARN, message=f"{f.message} (the open "
                              "division may evaluate as it likes)")
          if f.severity is Severity.FAIL else f for f in found]


def _schedule(log: ResultLog, rule: rules_lib.Rule | None) -> list[Finding]:
  if rule is None:
    return [at("eval schedule", Severity.INFO, f"not checked: mlbench has no rules for "
               f"{log.benchmark}")]
  evals = [ln for ln in log.all(rule.quality.key) if "epoch_num" in ln.metadata]
  gbs = log.value("global_batch_size")
  if not evals or not isinstance(gbs, (int, float)) or gbs <= 0:
    return []
  per_unit = 1.0
  if rule.convergence_unit is rules_lib.Unit.EPOCHS:
    per_unit = float(log.value("train_samples", 0) or 0) or float("inf")
  ev = rule.evaluation
  interval = ev.interval(int(gbs))
  tol = (2 * gbs / per_unit, max(2 * gbs / per_unit, 0.05 * interval))  # (on time, warn)
  checked = evals if log.success else evals[:-1]  # an aborted run may stop off-cadence
  last = float(evals[-1].metadata["epoch_num"])
  points = ev.points(int(gbs), last + tol[1] + ev.max_offset)
  cadence = (f"at {', '.join(f'{a:g}' for a in ev.at)}, then " if ev.at else "") + (
      f"every {_num(interval)} {ev.unit.value}")
  if ev.policy is rules_lib.Policy.AT_LEAST:
    # Epochs are numbered from 1 (training_rules.adoc, Epoch numbering), and a log may name
    # the epoch an evaluation ended or the next one: v0.7 Fujitsu's and Inspur's SSD
    # evaluations at 40 and 50 epochs say 41 and 51, NVIDIA's 40 and 50.
    numbering = 1.0 if ev.unit is rules_lib.Unit.EPOCHS else 0.0
    return _at_least(checked, points, tol[1] + numbering, ev, cadence)
  return _exactly(checked, points, tol, ev, cadence)


def _exactly(evals: list[Line], points: list[float], tol: tuple[float, float],
             ev: rules_lib.Evaluation, cadence: str) -> list[Finding]:
  if not evals or not points:
    return []
  first = float(evals[0].metadata["epoch_num"])
  offset = points[0] - first
  if not -tol[1] <= offset <= ev.max_offset + tol[1]:
    return [at("eval schedule", Severity.FAIL, f"first evaluation at {_num(first)} "
               f"{ev.unit.value}; the rules put it at {_num(points[0])} ({cadence}"
               + (f", up to {ev.max_offset:g} earlier)" if ev.max_offset else ")"), evals[0])]
  offset = min(max(0.0, round(offset)), ev.max_offset) if ev.max_offset else 0.0
  out = []
  for i, ln in enumerate(evals):
    got = float(ln.metadata["epoch_num"])
    if i >= len(points):
      return out + [at("eval schedule", Severity.FAIL, f"evaluation {i + 1} at {_num(got)} "
                       f"{ev.unit.value} is one more than the cadence has ({cadence})", ln)]
    want = points[i] - offset
    off = got - want
    if abs(off) > tol[1]:
      return out + [at("eval schedule", Severity.FAIL, f"evaluation {i + 1} at {_num(got)} "
                       f"{ev.unit.value}, the rules put it at {_num(want)} ({cadence})", ln)]
    if abs(off) > tol[0]:
      out.append((abs(off), i, ln, want, got))
  if not out:
    return []
  worst = max(out, key=lambda x: x[0])
  _, i, ln, want, got = worst
  return [at("eval schedule", Severity.WARN, f"{len(out)} evaluation(s) off their point by more "
             f"than two batches; the worst, evaluation {i + 1} at {_num(got)}, should be at "
             f"{_num(want)} {ev.unit.value}", ln)]


def _at_least(evals: list[Line], points: list[float], tol: float, ev: rules_lib.Evaluation,
              cadence: str) -> list[Finding]:
  got = [float(ln.metadata["epoch_num"]) for ln in evals]
  if not got:
    return []
  prev = 0.0
  for p in points:
    if p > got[-1] + tol:
      break
    if not any(prev < e <= p + tol for e in got):
      line = next((ln for ln, e in zip(evals, got) if e > p), evals[-1])
      return [at("eval schedule", Severity.FAIL, f"no evaluation between {_num(prev)} and "
                 f"{_num(p)} {ev.unit.value} (at least {cadence})", line)]
    prev = p
  return []
