"""mlbench's own log checks, on small logs written line by line."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from mlbench.verify import cadence, checks, timing
from mlbench import rules
from mlbench.verify.checks import Severity
from mlbench.resultlog import ResultLog, is_log
from mlbench.verify.rounds import detect_ruleset
from mlbench.errors import UserError


def _log(tmp_path, events, name="log.txt"):
  """events: (time_ms, key, value, metadata) tuples -> a parsed ResultLog."""
  lines = []
  for t, key, value, meta in events:
    lines.append(":::MLLOG " + json.dumps({"namespace": "", "time_ms": t, "event_type":
                                           "POINT_IN_TIME", "key": key, "value": value,
                                           "metadata": {"file": "x.py", "lineno": 1, **meta}}))
  path = tmp_path / name
  path.write_text("some preamble\n" + "\n".join(lines) + "\n")
  return ResultLog.read(path)


def _run(tmp_path, evals, *, gbs=3200, train=1281167, success=True, start=1_700_000_000_000):
  ev = [(start + 10 + i, "eval_accuracy", v, {"epoch_num": e}) for i, (e, v) in enumerate(evals)]
  return _log(tmp_path, [(start - 5, "init_start", None, {}), (start - 2, "init_stop", None, {}),
                         (start - 1, "global_batch_size", gbs, {}),
                         (start - 1, "train_samples", train, {}),
                         (start, "run_start", None, {}), *ev,
                         (start + 100, "run_stop", None,
                          {"status": "success" if success else "aborted"})])


def _fails(findings):
  return [f for f in findings if f.severity is Severity.FAIL]


def test_reader_keeps_file_line_numbers_and_reports_bad_lines(tmp_path):
  path = tmp_path / "x.txt"
  path.write_text("junk\n:::MLLOG {\"time_ms\": 5, \"key\": \"a\", \"value\": 1, \"metadata\": {}}\n"
                  "[1,0]<stdout>: :::MLLOG {\"time_ms\": 6, \"key\": \"b\"}\n"
                  ":::MLLOG {not json\n")
  log = ResultLog.read(path)
  assert [(ln.lineno, ln.key) for ln in log.lines] == [(2, "a")]
  assert [e[0] for e in log.errors] == [3, 4]
  assert [f.lineno for f in checks.parse_errors(log)] == [3, 4]


def _peak_bytes(fn):
  tracemalloc.start()
  try:
    out = fn()
    return out, tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()


def test_a_file_without_newlines_is_read_in_bounded_memory(tmp_path):
  """32 MiB without a newline: not a log (a whole-line read held it twice over), and
  as one :::MLLOG line between two good ones: counted, quoted, never held whole."""
  chunk = b"x" * (1 << 20)
  plain, log = tmp_path / "plain.txt", tmp_path / "log.txt"
  plain.write_bytes(chunk * 32)
  good = b':::MLLOG {"time_ms": 5, "key": "a", "value": 1, "metadata": {}}\n'
  log.write_bytes(good + b":::MLLOG " + chunk * 32 + b"\n" + good)
  found, peak = _peak_bytes(lambda: is_log(plain))
  assert found is False and peak < 2**21
  (read, peak) = _peak_bytes(lambda: ResultLog.read(log))
  assert peak < 2**23  # the 1 MiB kept of the long line, and what reads it
  assert [ln.lineno for ln in read.lines] == [1, 3] and read.longest == (2, 9 + 32 * 2**20)
  [(lineno, quoted, problem)] = read.errors
  assert lineno == 2 and len(quoted) == 1000
  assert problem.startswith("not read: the line is 33,554,441 characters long")
  assert is_log(log) and read.squares == 2 * 63**2 + (9 + 32 * 2**20) ** 2


def test_timestamps_an_event_of_the_run_before_run_start_fails_other_steps_back_warn(tmp_path):
  t = 1_746_133_159_000  # 2025; 0 and a time in seconds are no timestamps
  log = _log(tmp_path, [(t + 1000, "a", 1, {}), (0, "submission_org", "x", {}),
                        (t + 998, "b", 1, {}), (1_746_133_159, "cache_clear", 1, {}),
                        (t + 200, "c", 1, {}),  # set-up: 798 ms back
                        (t + 2000, "run_start", None, {}), (t + 500, "d", 1, {}),
                        (t + 3000, "run_stop", None, {"status": "success"}), (t + 900, "e", 1, {})])
  found = timing.timestamps(log, tolerance_ms=100)
  assert [f.severity for f in found] == [Severity.WARN, Severity.FAIL, Severity.WARN,
                                         Severity.WARN]
  assert "2 line(s) have no timestamp" in found[0].message
  # d is logged inside the run but timed before its run_start: the clock started late.
  assert found[1].message.startswith("line 8 (d), between run_start (line 7) and run_stop, is "
                                     "timed 1500 ms before run_start") and found[1].lineno == 8
  assert found[1].rule == checks.RUN_RESULTS
  assert found[2].message.startswith("time goes back 3 time(s), most by 2100 ms from line 9 "
                                     "(run_stop) to e")
  assert "by at most 2 ms" in found[3].message
  late = _log(tmp_path, [(t, "run_start", None, {}), (t + 5000, "tracked_stats", 1, {}),
                         (t + 3000, "run_stop", None, {"status": "success"})], name="late.txt")
  [after, back] = timing.timestamps(late, tolerance_ms=100)
  assert after.severity is back.severity is Severity.WARN  # HugeCTR's tracked_stats do this
  assert after.message.startswith("1 event(s) between run_start and run_stop (line 4) are "
                                  "timed after it, most by 2000 ms (line 3, tracked_stats)")


@pytest.mark.parametrize("benchmark, key, severity", [
    ("bert", "eval_accuracy", Severity.FAIL), ("bert", "eval_stop", Severity.FAIL),
    ("bert", "tracked_stats", Severity.WARN),  # work logged late, not the decision
    ("stable_diffusion", "eval_accuracy", None)])  # evaluates checkpoints after training
def test_timestamps_an_evaluation_after_run_stop_fails_beyond_the_tolerance(tmp_path, benchmark,
                                                                            key, severity):
  t = 1_746_133_159_000
  for late_ms, name in ((900, "skew.txt"), (1500, "late.txt")):  # tolerance 1,000 ms
    log = _log(tmp_path, [(t - 10, "submission_benchmark", benchmark, {}),
                          (t, "run_start", None, {}), (t + 5000, "eval_start", None, {}),
                          (t + 5000 + late_ms, key, 0.72, {}),
                          (t + 5000, "run_stop", None, {"status": "success"})], name=name)
    found = [f for f in timing.timestamps(log) if f.severity is not Severity.WARN
             or "after it" in f.message]
    if severity is None or late_ms < 1000:
      assert found == [], (late_ms, found)
      continue
    [f] = found
    assert (f.severity, f.lineno) == (severity, 5)
    if severity is Severity.FAIL:
      assert f.rule == timing.CLOCK_STOPPED_EARLY
      assert f.message.startswith(f"run_stop (line 6) is timed 1.5 s before the evaluation on "
                                  f"line 5 ({key}")


def test_run_order(tmp_path):
  log = _log(tmp_path, [(1, "init_start", None, {}), (5, "init_stop", None, {}),
                        (3, "run_start", None, {}), (9, "run_stop", None, {"status": "success"})])
  [f] = timing.run_order(log)
  assert f.message.startswith("run_start (3) comes before init_stop (5")
  log = _log(tmp_path, [(1, "init_start", None, {}), (2, "init_stop", None, {}),
                        (3, "run_start", None, {})], name="b.txt")
  assert [f.message for f in timing.run_order(log)] == ["no run_stop line"]


def test_exact_cadence_with_an_offset(tmp_path):
  rule = rules.load("resnet", "4.0.0")
  good = _run(tmp_path, [(3, 0.3), (7, 0.5), (11, 0.76)])  # offset 1, as NVIDIA v4.0 logs
  assert cadence.schedule(good, rule) == []
  skipped = _run(tmp_path, [(4, 0.3), (12, 0.76)])
  [f] = cadence.schedule(skipped, rule)
  assert f.severity is Severity.FAIL and "evaluation 2 at 12 epochs" in f.message
  late_start = _run(tmp_path, [(5, 0.3), (9, 0.76)])
  assert "first evaluation at 5 epochs" in _fails(cadence.schedule(late_start, rule))[0].message


def test_samples_cadence_tolerates_batches_and_warns_on_drift(tmp_path):
  rule = rules.load("bert", "4.0.0")  # every 150,000 samples at batch 768
  on_time = _run(tmp_path, [(150528, 0.4), (300288, 0.5), (450048, 0.72)], gbs=768)
  assert cadence.schedule(on_time, rule) == []
  drift = _run(tmp_path, [(150000, 0.4), (298000, 0.5), (450000, 0.72)], gbs=768)
  [f] = cadence.schedule(drift, rule)
  assert f.severity is Severity.WARN and "evaluation 2 at 298,000" in f.message
  wrong = _run(tmp_path, [(150000, 0.4), (330000, 0.72)], gbs=768)
  assert _fails(cadence.schedule(wrong, rule))


def test_at_least_cadence_allows_extra_evaluations_but_no_gaps(tmp_path):
  rule = rules.load("ssd", "0.7.0")  # epochs 40, 50, 55, ... at least
  extra = _run(tmp_path, [(e, 0.1) for e in (5, 10, 20, 30, 40, 45, 50, 55)] + [(60, 0.231)],
               gbs=1024, train=117266)
  assert cadence.schedule(extra, rule) == []
  gap = _run(tmp_path, [(40, 0.1), (50, 0.2), (60, 0.231)], gbs=1024, train=117266)
  [f] = cadence.schedule(gap, rule)
  assert "no evaluation between 50 and 55 epochs" in f.message


def test_schedule_of_a_benchmark_without_rules_is_only_noted(tmp_path):
  log = _log(tmp_path, [(1, "submission_benchmark", "dlrm", {})])
  [f] = cadence.schedule(log, None)
  assert f.severity is Severity.INFO and "no rules for dlrm" in f.message


def test_submission_values_against_the_system_description(tmp_path):
  desc = {"submitter": "Dell", "division": "closed", "status": "Available on-premise",
          "system_name": "XE9680x8H100-SXM-80GB"}
  ok = _log(tmp_path, [(1, "submission_org", "Dell", {}), (1, "submission_division", "closed", {}),
                       (1, "submission_status", "onprem", {}),
                       (1, "submission_platform", "1xXE9680x8H100-SXM-80GB", {})])
  assert checks.submission(ok, desc, "XE9680x8H100-SXM-80GB") == []
  bad = _log(tmp_path, [(1, "submission_org", "NVIDIA", {}), (1, "submission_division", "open", {}),
                        (1, "submission_status", "cloud", {}),
                        (1, "submission_platform", "1xE9680x8H100-SXM-80GB", {})], name="b.txt")
  found = checks.submission(bad, desc, "XE9680x8H100-SXM-80GB")
  assert [f.severity for f in found] == [Severity.WARN] * 4  # no written rule compares them


def test_seed_required_or_not(tmp_path):
  none = _log(tmp_path, [(1, "run_start", None, {})])
  assert checks.seed(none, required=True)[0].severity is Severity.FAIL
  assert checks.seed(none, required=False)[0].severity is Severity.WARN
  bad = _log(tmp_path, [(1, "seed", "abc", {})], name="b.txt")
  assert "is not an integer" in checks.seed(bad, required=True)[0].message


def test_ruleset_from_the_latest_run_or_the_log_itself(tmp_path):
  day = 1_714_000_000_000  # 2024-04-24
  old = _log(tmp_path, [(day - 365 * 86_400_000, "submission_benchmark", "bert", {})], "a.txt")
  new = _log(tmp_path, [(day, "submission_benchmark", "resnet", {})], "b.txt")
  assert detect_ruleset([old])[0] == "3.0.0"  # 2023-04-25: before the 3.0 results
  assert detect_ruleset([old, new])[0] == "4.0.0"  # carried-over runs do not decide
  named = _log(tmp_path, [(1, "submission_benchmark", "resnet", {}),
                          (1, "mlbench_ruleset", "mini", {})], "c.txt")
  assert detect_ruleset([named]) == ("mini", "named in the logs (mlbench_ruleset)")
  with pytest.raises(UserError, match="pass --ruleset"):
    detect_ruleset([_log(tmp_path, [(day, "submission_benchmark", "pong", {})], "d.txt")])


def test_microsecond_timestamps_warn_and_date_nothing(tmp_path):
  day_us = 1_714_000_000_000_000  # 2024-04-24 in microseconds: the year 56,284 in ms
  log = _log(tmp_path, [(day_us, "submission_benchmark", "resnet", {}),
                        (day_us + 5, "init_start", None, {})])
  assert log.date is None and log.not_ms().lineno == 2
  [f] = timing.timestamps(log)
  assert f.severity is Severity.WARN and f.lineno == 2
  assert "time_ms 1,714,000,000,000,000 is in the year 56,284" in f.message
  with pytest.raises(UserError, match=r"not milliseconds since 1970 \(log.txt line 2: "
                     r"1,714,000,000,000,000 is in the year 56,284\); pass --ruleset"):
    detect_ruleset([log])
