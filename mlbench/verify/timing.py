"""Checks of a log's clock: the timed region holds the run, its events are in the order
they happened, the run's four bracketing events are there, and lines repeated verbatim.

A FAIL cites the written rule it breaks (`mlbench.verify.checks`); the rest warns. Three
failures: an event of the run timed before its run_start (the clock started late), an
evaluation of the run timed after its run_stop (the clock stopped before the run knew it had
reached the target), and run_stop before run_start (a negative time to train).
"""

from __future__ import annotations

from mlbench.resultlog import OFFLINE_EVAL, Line, ResultLog, year
from mlbench.verify.checks import (QUALITY_MEASURE, REQUIRED_KEYS, RUN_RESULTS, Finding,
                                   Severity, at)

# The evaluations of a run: what a benchmark in OFFLINE_EVAL logs after training, later than
# run_stop, and what no other may time after it.
EVAL_KEYS = frozenset({"eval_start", "eval_stop", "eval_accuracy", "eval_error"})
RESULT_KEYS = frozenset({"eval_accuracy", "eval_error"})  # an evaluation's result
MIN_MS = 1e12  # before 2001: no ms time of a run (v0.7 Intel minigo's evaluator logs seconds)
CLOCK_STOPPED_EARLY = f"{RUN_RESULTS} (the clock stops once the target is reached); " \
    f"{QUALITY_MEASURE} (evaluation is on the clock)"


def timestamps(log: ResultLog, tolerance_ms: float = 1000.0) -> list[Finding]:
  """The timed region holds the run's events, and time_ms does not go back.

  The timed region runs from the run_start to the run_stop result_summarizer times the
  run by (file order). Beyond `tolerance_ms` (the clock skew between the ranks of a
  multi-process job), two orders fail, as no published log outside the cases below has them:
  an event there timed before run_start (training_rules.adoc, Run Results: "The clock must
  start before any part of the system touches the dataset"), and an evaluation there timed
  after run_stop (Run Results: "The clock may be stopped as soon as any part of the system
  determines target accuracy has been reached"; Quality measure: evaluation is timed). The
  rest warns: another event timed after run_stop (HugeCTR's tracked_stats, Habana's v1.0 BERT
  blocks), a step back anywhere else, run_start included (the time to train is run_stop -
  run_start, which that does not change). Set aside: lines without a time (0, or seconds),
  verbatim repeats (`repeats`), and for a benchmark whose reference evaluates timestamped
  checkpoints after training (`OFFLINE_EVAL`) its evaluations and run_stop, which carries
  the passing checkpoint's time (training_rules.adoc, Quality measure).
  """
  out = []
  if (odd := log.not_ms()) is not None:
    out.append(at("timestamps", Severity.WARN, f"time_ms {odd.time_ms:,.0f} is in the year "
                  f"{year(odd.time_ms)}: MLPerf logs time in milliseconds since 1970 (these "
                  "look like microseconds; result_summarizer would count 1,000 times the "
                  "time to train)", odd))
  untimed = [ln for ln in log.lines if ln.time_ms < MIN_MS]
  if untimed:
    out.append(at("timestamps", Severity.WARN, f"{len(untimed)} line(s) have no timestamp "
                  "(time_ms 0, or seconds: a time before 2001); they are left out of the order "
                  "checks", untimed[0]))
  offline = log.benchmark in OFFLINE_EVAL
  timed = [ln for ln in log.lines if ln.time_ms >= MIN_MS and ln.repeat_of is None and not (
      offline and (ln.key in EVAL_KEYS or ln.key == "run_stop"))]
  out += _outside_the_clock(log, timed, tolerance_ms, offline)
  steps = [(prev.time_ms - cur.time_ms, prev, cur) for prev, cur in zip(timed, timed[1:])]
  if skipped := [s for s in steps if s[0] > tolerance_ms]:
    back, prev, cur = max(skipped, key=lambda x: x[0])
    out.append(at("timestamps", Severity.WARN, f"time goes back {len(skipped)} time(s), most "
                  f"by {back:.0f} ms from line {prev.lineno} ({prev.key}) to {cur.key}: the "
                  "events are not in the order they happened (the time to train is run_stop "
                  "- run_start, which this does not change)", cur))
  if small := [s for s in steps if 0 < s[0] <= tolerance_ms]:
    back, _, cur = max(small, key=lambda x: x[0])
    out.append(at("timestamps", Severity.WARN, f"time goes back {len(small)} time(s), by at "
                  f"most {back:.0f} ms (within {tolerance_ms:.0f} ms: clock skew)", cur))
  return out


def _outside_the_clock(log: ResultLog, timed: list[Line], tolerance_ms: float,
                       offline: bool) -> list[Finding]:
  """Events of the timed region timed before its run_start (a FAIL) or after its run_stop
  (a FAIL for an evaluation, a WARN for anything else)."""
  start, stop = log.timed_region()
  if start is None:
    return []
  inside = [ln for ln in timed if start.lineno < ln.lineno < stop.lineno]
  out = []
  back, ln = max(((start.time_ms - ln.time_ms, ln) for ln in inside), default=(0.0, None),
                 key=lambda x: x[0])
  if back > tolerance_ms:
    out.append(at("timestamps", Severity.FAIL, f"line {ln.lineno} ({ln.key}), between "
                  f"run_start (line {start.lineno}) and run_stop, is timed {back:.0f} ms "
                  "before run_start: the clock started after the run had begun", ln,
                  RUN_RESULTS))
  late = [(ln.time_ms - stop.time_ms, ln) for ln in inside if not offline]
  after = [x for x in late if x[0] > tolerance_ms]
  if evals := [x for x in after if x[1].key in EVAL_KEYS]:
    # The latest result (eval_accuracy), the one that decided the run, where one is late.
    ahead, ln = max([x for x in evals if x[1].key in RESULT_KEYS] or evals, key=lambda x: x[0])
    out.append(at("timestamps", Severity.FAIL, f"run_stop (line {stop.lineno}) is timed "
                  f"{ahead / 1000:,.1f} s before the evaluation on line {ln.lineno} ({ln.key}"
                  f"{'' if ln.value is None else f' {ln.value}'}; {len(evals)} evaluation "
                  "event(s) logged before run_stop are timed after it): the clock stopped "
                  "before the run knew it had reached the target, and its time to train is too "
                  "short", ln, CLOCK_STOPPED_EARLY))
  if others := [x for x in after if x[1].key not in EVAL_KEYS]:
    ahead, ln = max(others, key=lambda x: x[0])
    out.append(at("timestamps", Severity.WARN, f"{len(others)} event(s) between run_start and "
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
  return [at("repeats", Severity.WARN, f"{len(again)} line(s) repeat an earlier event "
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
  out = [at("run order", Severity.FAIL, f"no {k} line", rule=REQUIRED_KEYS)
         for k, ln in found.items() if ln is None]
  present = [(k, found[k]) for k in keys if found[k] is not None]
  for (a, la), (b, lb) in zip(present, present[1:]):
    if lb.time_ms < la.time_ms:
      fails = (a, b) == ("run_start", "run_stop")
      out.append(at("run order", Severity.FAIL if fails else Severity.WARN,
                    f"{b} ({lb.time_ms:.0f}) comes before {a} ({la.time_ms:.0f}, line "
                    f"{la.lineno})" + ("" if fails else ": initialisation overlaps the "
                                        "timed run (it is timed)"), lb, RUN_RESULTS))
  return out
