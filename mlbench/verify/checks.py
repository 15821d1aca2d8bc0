"""Checks of a result log that the official tools do not make.

Each check is a pure function of a parsed log (and the rules or system
description it should agree with) returning findings. A FAIL is what the official
tools fail or what breaks a written MLPerf rule, and cites it (`Finding.rule`);
everything else these checks notice is a WARN that names the line and why it may
matter (`validate --strict` fails on those too); INFO, what could not be checked.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from mlbench import rules as rules_lib
from mlbench.resultlog import OFFLINE_EVAL, Line, ResultLog, year

MAX_QUOTE = 500
# The written rules a FAIL cites: mlcommons/training_policies training_rules.adoc (read at
# d73e20f, 2026-05-14) by section, or the official tool that fails the same.
RUN_RESULTS = "training_rules.adoc, Run Results"
QUALITY_MEASURE = "training_rules.adoc, Quality measure"
RANDOM_NUMBERS = ("training_rules.adoc, Random numbers (enforced by the package checker's "
                  "seed checker for closed >= 1.0.0)")
REQUIRED_KEYS = "mlperf_logging compliance_checker training_<ruleset>/common.yaml"
# What a benchmark in OFFLINE_EVAL logs after training, later than run_stop.
_EVAL_KEYS = frozenset({"eval_start", "eval_stop", "eval_accuracy", "eval_error"})
MIN_MS = 1e12  # before 2001: no ms time of a run (v0.7 Intel minigo's evaluator logs seconds)


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
  rule: str | None = None  # the written rule (file, section) or official check a FAIL breaks

  def to_json(self) -> dict[str, Any]:
    line = self.line  # A broken log's line may be megabytes long; the report quotes its start.
    if line is not None and len(line) > MAX_QUOTE:
      line = f"{line[:MAX_QUOTE]}... ({len(line):,} characters)"
    return {"check": self.check, "severity": self.severity.value, "message": self.message,
            "lineno": self.lineno, "line": line, "rule": self.rule}


def _at(check: str, severity: Severity, message: str, line: Line | None = None,
        rule: str | None = None) -> Finding:
  return Finding(check, severity, message, line.lineno if line else None,
                 line.text if line else None, rule if severity is Severity.FAIL else None)


def parse_errors(log: ResultLog) -> list[Finding]:
  return [Finding("parse", Severity.FAIL, problem, lineno, text)
          for lineno, text, problem in log.errors]


def timestamps(log: ResultLog, tolerance_ms: float = 1000.0) -> list[Finding]:
  """The timed region holds the run's events, and time_ms does not go back.

  The timed region runs from the run_start to the run_stop result_summarizer times the
  run by (file order). An event there timed before run_start by more than `tolerance_ms`
  (the clock skew between the ranks of a multi-process job) fails: the clock started after
  the run had begun (training_rules.adoc, Run Results: "The clock must start before any
  part of the system touches the dataset"); no published log has one. Warnings: one timed
  after run_stop (published logs have them: HugeCTR's tracked_stats, Habana's v1.0 BERT
  blocks), a step back anywhere (no score depends on it). Set aside: lines without a time
  (0, or seconds), verbatim repeats (`repeats`), and for a benchmark whose reference
  evaluates timestamped checkpoints after training (`OFFLINE_EVAL`) its evaluations and
  run_stop, which carries the passing checkpoint's time (training_rules.adoc, Quality
  measure).
  """
  out = []
  if (odd := log.not_ms()) is not None:
    out.append(_at("timestamps", Severity.WARN, f"time_ms {odd.time_ms:,.0f} is in the year "
                   f"{year(odd.time_ms)}: MLPerf logs time in milliseconds since 1970 (these "
                   "look like microseconds; result_summarizer would count 1,000 times the "
                   "time to train)", odd))
  untimed = [ln for ln in log.lines if ln.time_ms < MIN_MS]
  if untimed:
    out.append(_at("timestamps", Severity.WARN, f"{len(untimed)} line(s) have no timestamp "
                   "(time_ms 0, or seconds: a time before 2001); they are left out of the order "
                   "checks", untimed[0]))
  offline = log.benchmark in OFFLINE_EVAL
  timed = [ln for ln in log.lines if ln.time_ms >= MIN_MS and ln.repeat_of is None and not (
      offline and (ln.key in _EVAL_KEYS or ln.key == "run_stop"))]
  out += _outside_the_clock(log, timed, tolerance_ms, offline)
  steps = [(prev.time_ms - cur.time_ms, prev, cur) for prev, cur in zip(timed, timed[1:])]
  if skipped := [s for s in steps if s[0] > tolerance_ms]:
    back, prev, cur = max(skipped, key=lambda x: x[0])
    out.append(_at("timestamps", Severity.WARN, f"time goes back {len(skipped)} time(s), most "
                   f"by {back:.0f} ms from line {prev.lineno} ({prev.key}) to {cur.key}: the "
                   "events are not in the order they happened (the time to train is run_stop "
                   "- run_start, which this does not change)", cur))
  if small := [s for s in steps if 0 < s[0] <= tolerance_ms]:
    back, _, cur = max(small, key=lambda x: x[0])
    out.append(_at("timestamps", Severity.WARN, f"time goes back {len(small)} time(s), by at "
                   f"most {back:.0f} ms (within {tolerance_ms:.0f} ms: clock skew)", cur))
  return out


def _outside_the_clock(log: ResultLog, timed: list[Line], tolerance_ms: float,
                       offline: bool) -> list[Finding]:
  """Events of the timed region timed before its run_start (a FAIL) or after its run_stop."""
  start, stop = log.timed_region()
  if start is None:
    return []
  inside = [ln for ln in timed if start.lineno < ln.lineno < stop.lineno]
  out = []
  back, ln = max(((start.time_ms - ln.time_ms, ln) for ln in inside), default=(0.0, None),
                 key=lambda x: x[0])
  if back > tolerance_ms:
    out.append(_at("timestamps", Severity.FAIL, f"line {ln.lineno} ({ln.key}), between "
                   f"run_start (line {start.lineno}) and run_stop, is timed {back:.0f} ms "
                   "before run_start: the clock started after the run had begun", ln,
                   RUN_RESULTS))
  late = [(ln.time_ms - stop.time_ms, ln) for ln in inside if not offline]
  if after := [x for x in late if x[0] > tolerance_ms]:
    ahead, ln = max(after, key=lambda x: x[0])
    out.append(_at("timestamps", Severity.WARN, f"{len(after)} event(s) between run_start and "
                   f"run_stop (line {stop.lineno}) are timed after it, most by {ahead:.0f} ms "
                   f"(line {ln.lineno}, {ln.key}): the clock stopped before work the log shows; "
                   "if that work led to the target, the time to train is too short", ln))
  return out


def repeats(log: ResultLog) -> list[Finding]:
  """Lines that repeat an earlier event verbatim (Google's v3.1 gpt3 logs end with their
  block_start lines again, wrapped as `Processing :::MLLOG {...}`). The official tools
  read them as events; they are set aside from the order checks here."""
  again = [ln for ln in log.lines if ln.repeat_of is not None]
  if not again:
    return []
  return [_at("repeats", Severity.WARN, f"{len(again)} line(s) repeat an earlier event "
              f"verbatim, the first line {again[0].lineno} ({again[0].key}, as line "
              f"{again[0].repeat_of}): several processes logging one event, or output copied "
              "into the log; a tool that counts events counts them twice", again[0])]


def run_order(log: ResultLog) -> list[Finding]:
  """init_start, init_stop, run_start and run_stop, each present (the official
  checker requires them), run_stop no earlier than run_start (a time to train is no
  negative span: Run Results). Initialisation ending after the clock started is a
  warning: it is then timed, which costs only the run itself."""
  keys = ("init_start", "init_stop", "run_start", "run_stop")
  found = {k: next((ln for ln in log.all(k) if ln.time_ms > 0), log.first(k)) for k in keys}
  out = [_at("run order", Severity.FAIL, f"no {k} line", rule=REQUIRED_KEYS)
         for k, ln in found.items() if ln is None]
  present = [(k, found[k]) for k in keys if found[k] is not None]
  for (a, la), (b, lb) in zip(present, present[1:]):
    if lb.time_ms < la.time_ms:
      fails = (a, b) == ("run_start", "run_stop")
      out.append(_at("run order", Severity.FAIL if fails else Severity.WARN,
                     f"{b} ({lb.time_ms:.0f}) comes before {a} ({la.time_ms:.0f}, line "
                     f"{la.lineno})" + ("" if fails else ": initialisation overlaps the "
                                        "timed run (it is timed)"), lb, RUN_RESULTS))
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
  """A seed is logged, as an integer: required of closed logs of the rulesets the
  package checker's seed checker runs for (it fails a run without one, or with one
  int() cannot read), a warning elsewhere."""
  level = Severity.FAIL if required else Severity.WARN
  seeds = log.all("seed")
  if not seeds:
    return [_at("seed", level, "no seed is logged" + (
        "" if required else " (this ruleset and division do not require it)"),
        rule=RANDOM_NUMBERS)]
  out = []
  for ln in seeds:
    try:
      int(ln.value)
    except (TypeError, ValueError):
      out.append(_at("seed", level, f"seed {ln.value!r} is not an integer", ln, RANDOM_NUMBERS))
  return out


_STATUS = {"onprem": {"available on-premise", "onprem", "available"},
           "cloud": {"available cloud", "cloud", "available"},
           "preview": {"preview"},
           "research": {"research, development, or internal (rdi)", "research", "rdi"}}


def _norm(text: str) -> str:
  return "".join(c for c in str(text).lower() if c.isalnum())


def submission(log: ResultLog, desc: Mapping[str, Any], system_id: str) -> list[Finding]:
  """submission_* values agree with systems/<system>.json. No written rule or official
  check compares them (the review accepted NeMo's `SUBMISSION_ORG_PLACEHOLDER` and
  `cloud` for a 'Preview' system), so a difference is a warning: the results table
  takes the submitter and status from the system description, not from the log."""
  out = []
  pairs = (("submission_org", "submitter"), ("submission_division", "division"))
  for key, field in pairs:
    ln = log.first(key)
    if ln is not None and _norm(ln.value) != _norm(desc.get(field, "")):
      out.append(_at("submission", Severity.WARN, f"{key} {ln.value!r} but the system "
                     f"description's {field} is {desc.get(field)!r}" + (
                         "; the official checker judges the log by its own division, the "
                         "seed and RCP checks follow the system's" if field == "division"
                         else ""), ln))
  ln = log.first("submission_status")
  if ln is not None and str(desc.get("status", "")).lower() not in _STATUS.get(
      str(ln.value).lower(), {str(ln.value).lower()}):
    out.append(_at("submission", Severity.WARN, f"submission_status {ln.value!r} does not match "
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
