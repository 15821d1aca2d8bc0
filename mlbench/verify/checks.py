"""Checks of a result log that the official tools do not make.

Each check is a pure function of a parsed log (and the rules or system
description it should agree with) returning findings. FAIL findings make a
file fail; WARN findings are reported; INFO says what could not be checked.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from mlbench import rules as rules_lib
from mlbench.resultlog import Line, ResultLog, year


MAX_QUOTE = 500


class Severity(enum.Enum):
  FAIL = "FAIL"
  WARN = "WARN"
  INFO = "INFO"


@dataclasses.dataclass(frozen=True)
class Finding:
  """One thing a check found, pointing at a log line when there is one."""

  check: str
  severity: Severity
  message: str
  lineno: int | None = None
  line: str | None = None

  def to_json(self) -> dict[str, Any]:
    line = self.line  # A broken log's line may be megabytes long; the report quotes its start.
    if line is not None and len(line) > MAX_QUOTE:
      line = f"{line[:MAX_QUOTE]}... ({len(line):,} characters)"
    return {"check": self.check, "severity": self.severity.value, "message": self.message,
            "lineno": self.lineno, "line": line}


def _at(check: str, severity: Severity, message: str, line: Line | None = None) -> Finding:
  return Finding(check, severity, message, line.lineno if line else None,
                 line.text if line else None)


def parse_errors(log: ResultLog) -> list[Finding]:
  return [Finding("parse", Severity.FAIL, problem, lineno, text)
          for lineno, text, problem in log.errors]


def timestamps(log: ResultLog, tolerance_ms: float = 1000.0) -> list[Finding]:
  """time_ms never goes back. Steps back within `tolerance_ms` (clock skew
  between the ranks of a multi-process job) are warnings; lines without a
  time (0, as in lines added to published logs after the run) are set aside."""
  out = []
  if (odd := log.not_ms()) is not None:
    out.append(_at("timestamps", Severity.FAIL, f"time_ms {odd.time_ms:,.0f} is in the year "
                   f"{year(odd.time_ms)}: MLPerf logs time in milliseconds since 1970 (these "
                   "look like microseconds)", odd))
  untimed = [ln for ln in log.lines if ln.time_ms <= 0]
  if untimed:
    out.append(_at("timestamps", Severity.WARN, f"{len(untimed)} line(s) have no timestamp "
                   "(time_ms 0); they are left out of the order checks", untimed[0]))
  timed = [ln for ln in log.lines if ln.time_ms > 0]
  small = []
  for prev, cur in zip(timed, timed[1:]):
    back = prev.time_ms - cur.time_ms
    if back > tolerance_ms:
      out.append(_at("timestamps", Severity.FAIL, f"time goes back {back:.0f} ms from line "
                     f"{prev.lineno} ({prev.key}) to {cur.key}", cur))
    elif back > 0:
      small.append((back, cur))
  if small:
    worst = max(small, key=lambda x: x[0])
    out.append(_at("timestamps", Severity.WARN, f"time goes back {len(small)} time(s), by at "
                   f"most {worst[0]:.0f} ms (within {tolerance_ms:.0f} ms: clock skew)", worst[1]))
  return out


def run_order(log: ResultLog) -> list[Finding]:
  """init_start <= init_stop <= run_start <= run_stop, each present."""
  keys = ("init_start", "init_stop", "run_start", "run_stop")
  found = {k: next((ln for ln in log.all(k) if ln.time_ms > 0), log.first(k)) for k in keys}
  out = [_at("run order", Severity.FAIL, f"no {k} line") for k, ln in found.items() if ln is None]
  present = [(k, found[k]) for k in keys if found[k] is not None]
  for (a, la), (b, lb) in zip(present, present[1:]):
    if lb.time_ms < la.time_ms:
      out.append(_at("run order", Severity.FAIL, f"{b} ({lb.time_ms:.0f}) comes before {a} "
                     f"({la.time_ms:.0f}, line {la.lineno})", lb))
  return out


def resumed(log: ResultLog) -> list[Finding]:
  """Says where a run continued from a checkpoint (`mlbench run --resume`).

  Not a failure: the run's time still counts from its first run_start, with the
  time lost to the interruption in it.
  """
  out = []
  for ln in log.all("mlbench_resumed"):
    meta = ln.metadata or {}
    out.append(_at("resumed", Severity.INFO,
                   f"the run was interrupted and resumed from its checkpoint of step {ln.value}"
                   f" on {meta.get('devices', '?')} devices; {meta.get('lost_s', '?')} s were "
                   "lost and are in its time", ln))
  return out


def seed(log: ResultLog, *, required: bool) -> list[Finding]:
  seeds = log.all("seed")
  if not seeds:
    return [_at("seed", Severity.FAIL if required else Severity.WARN,
                "no seed is logged" + ("" if required else " (this ruleset does not require it)"))]
  out = []
  for ln in seeds:
    try:
      int(ln.value)
    except (TypeError, ValueError):
      out.append(_at("seed", Severity.FAIL, f"seed {ln.value!r} is not an integer", ln))
  return out


_STATUS = {"onprem": {"available on-premise", "onprem", "available"},
           "cloud": {"available cloud", "cloud", "available"},
           "preview": {"preview"},
           "research": {"research, development, or internal (rdi)", "research", "rdi"}}


def _norm(text: str) -> str:
  return "".join(c for c in str(text).lower() if c.isalnum())


def submission(log: ResultLog, desc: Mapping[str, Any], system_id: str) -> list[Finding]:
  """submission_* values agree with systems/<system>.json."""
  out = []
  pairs = (("submission_org", "submitter"), ("submission_division", "division"))
  for key, field in pairs:
    ln = log.first(key)
    if ln is not None and _norm(ln.value) != _norm(desc.get(field, "")):
      out.append(_at("submission", Severity.FAIL, f"{key} {ln.value!r} but the system "
                     f"description's {field} is {desc.get(field)!r}", ln))
  ln = log.first("submission_status")
  if ln is not None and str(desc.get("status", "")).lower() not in _STATUS.get(
      str(ln.value).lower(), {str(ln.value).lower()}):
    out.append(_at("submission", Severity.FAIL, f"submission_status {ln.value!r} does not match "
                   f"the system description's status {desc.get('status')!r}", ln))
  ln = log.first("submission_platform")
  if ln is not None:
    platform = _norm(str(ln.value).split("x", 1)[1]) if _node_prefixed(ln.value) else ""
    names = {_norm(desc.get("system_name", "")), _norm(system_id)}
    if _norm(ln.value) not in names and platform not in names:
      out.append(_at("submission", Severity.WARN, f"submission_platform {ln.value!r} names "
                     f"neither system_name {desc.get('system_name')!r} nor the system "
                     f"{system_id!r}", ln))
  return out


def _node_prefixed(value: Any) -> bool:
  head = str(value).split("x", 1)[0]
  return "x" in str(value) and head.isdigit()


def _num(x: float) -> str:
  return f"{x:,.0f}" if abs(x) >= 1e4 else f"{x:g}"


def schedule(log: ResultLog, rule: rules_lib.Rule | None) -> list[Finding]:
  """Evaluations where the rules' cadence puts them.

  Within two global batches of a point is on time (the rules allow rounding
  up to a batch; packed sequences make BERT's counts vary). Off by less than
  5% of the interval is a warning (still that point, placed imprecisely);
  more, or a point skipped, fails.
  """
  if rule is None:
    return [_at("eval schedule", Severity.INFO, f"not checked: mlbench has no rules for "
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
    return _at_least(checked, points, tol[1], ev, cadence)
  return _exactly(checked, points, tol, ev, cadence)


def _exactly(evals: list[Line], points: list[float], tol: tuple[float, float],
             ev: rules_lib.Evaluation, cadence: str) -> list[Finding]:
  if not evals or not points:
    return []
  first = float(evals[0].metadata["epoch_num"])
  offset = points[0] - first
  if not -tol[1] <= offset <= ev.max_offset + tol[1]:
    return [_at("eval schedule", Severity.FAIL, f"first evaluation at {_num(first)} "
                f"{ev.unit.value}; the rules put it at {_num(points[0])} ({cadence}"
                + (f", up to {ev.max_offset:g} earlier)" if ev.max_offset else ")"), evals[0])]
  offset = min(max(0.0, round(offset)), ev.max_offset) if ev.max_offset else 0.0
  out = []
  for i, ln in enumerate(evals):
    got = float(ln.metadata["epoch_num"])
    if i >= len(points):
      return out + [_at("eval schedule", Severity.FAIL, f"evaluation {i + 1} at {_num(got)} "
                        f"{ev.unit.value} is one more than the cadence has ({cadence})", ln)]
    want = points[i] - offset
    off = got - want
    if abs(off) > tol[1]:
      return out + [_at("eval schedule", Severity.FAIL, f"evaluation {i + 1} at {_num(got)} "
                        f"{ev.unit.value}, the rules put it at {_num(want)} ({cadence})", ln)]
    if abs(off) > tol[0]:
      out.append((abs(off), i, ln, want, got))
  if not out:
    return []
  worst = max(out, key=lambda x: x[0])
  _, i, ln, want, got = worst
  return [_at("eval schedule", Severity.WARN, f"{len(out)} evaluation(s) off their point by more "
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
      return [_at("eval schedule", Severity.FAIL, f"no evaluation between {_num(prev)} and "
                  f"{_num(p)} {ev.unit.value} (at least {cadence})", line)]
    prev = p
  return []
