"""What decides a result: fast tests that fail when any of it changes.

Which runs count as successful, which olympic scoring drops, the comparison with
the quality target, seeds, run order and the RCP verdict, on validate's and
compare's side, pinned against the official tools (result_summarizer's olympic
average, the seed and RCP checkers on real published logs) where they decide.
`benchmarks/verdict_mutations.py` plants one-line bugs in this logic and
records which test catches each.
"""

from __future__ import annotations

import itertools
import re
import shutil
from pathlib import Path

import pytest
from mlperf_logging.result_summarizer import result_summarizer

from mlbench import rules
from mlbench.mllog import MLLog
from mlbench.verify import (checks, compare, official, package, rcp, submission, timing,
                            validate)
from mlbench.verify.checks import Finding, Severity
from mlbench.verify.report import BenchmarkReport, FileReport, Report
from mlbench.resultlog import ResultLog
from mlbench.verify.submission import BenchmarkDir, Target

DELL = Path(__file__).parents[1] / "data/mlperf-results/v4.0/Dell/results/XE9680x8H100-SXM-80GB"
CHECKERS = ("PASS", "FAIL", "ERROR", "NOT RUN")


def _finding(severity: Severity, check: str = "x") -> Finding:
  return Finding(check, severity, "m")


def _file(checker: str = "PASS", *severities: Severity) -> FileReport:
  return FileReport(Path("result_0.txt"), "ssd", "4.0.0", checker, [],
                    [_finding(s) for s in severities])


def _bench(benchmark: str, files: list[FileReport], *severities: Severity) -> BenchmarkReport:
  folder = BenchmarkDir(Path(benchmark), "sys", benchmark, (), None)
  return BenchmarkReport(folder, "4.0.0", "--ruleset", files, [_finding(s) for s in severities])


def test_a_log_fails_on_the_checkers_verdict_or_a_fail_finding_and_nothing_else():
  for checker, severity in itertools.product(CHECKERS, [None, *Severity]):
    f = _file(checker, *([severity] if severity else []))
    assert f.failed == (checker != "PASS" or severity is Severity.FAIL), (checker, severity)
    assert (f.to_json()["verdict"] == "FAIL") == f.failed


@pytest.mark.parametrize("benchmark, allowed", [("ssd", 1), ("bert", 1), ("unet3d", 4)])
def test_olympic_scoring_drops_at_most_one_failing_run_four_for_unet3d(benchmark, allowed):
  runs = 10 if benchmark != "ssd" else 5
  for failing in range(runs + 1):
    files = [_file("FAIL" if i < failing else "PASS") for i in range(runs)]
    assert _bench(benchmark, files).passed == (failing <= allowed), failing
  files = [_file() for _ in range(runs)]
  assert _bench(benchmark, files, Severity.INFO, Severity.WARN).passed
  assert not _bench(benchmark, files, Severity.INFO, Severity.FAIL).passed


def test_the_exit_code_of_a_log_and_of_a_package():
  one = Target(Path("x"), "log")
  for failed, system in itertools.product([False, True], [None, Severity.WARN, Severity.FAIL]):
    systems = [(Path("s.json"), [_finding(system)] if system else [])]
    log = _file("FAIL" if failed else "PASS")
    assert Report(one, [log], [], systems).exit_code == int(failed or system is Severity.FAIL)
  pkg = Target(Path("x"), "package")
  good, bad = _bench("ssd", [_file()] * 5), _bench("ssd", [_file("FAIL")] * 2 + [_file()] * 3)
  assert Report(pkg, [], [good, good], []).exit_code == 0
  assert Report(pkg, [], [good, bad], []).exit_code == 1
  assert Report(pkg, [], [good], [(Path("s.json"), [_finding(Severity.FAIL)])]).exit_code == 1


def _run(minutes, converged=True, epochs=None, problem=None) -> compare.Run:
  return compare.Run(Path("r"), minutes, converged, epochs, [], problem)


def _entry(runs, benchmark="ssd", scaling=1.0, division="closed") -> compare.Entry:
  folder = BenchmarkDir(Path(benchmark), "sys", benchmark, (), None)
  return compare.Entry(Path("p"), folder, "4.0.0", {}, runs, scaling, None, None, None, None,
                       division=division)


def test_olympic_scores_equal_result_summarizers_for_every_pattern_of_failed_runs():
  times = [10.0, 14.0, 11.0, 13.0, 12.0]  # not in run order: the order must not matter
  for failed in itertools.product([False, True], repeat=5):
    runs = [_run(t, not f) for t, f in zip(times, failed)]
    e = _entry(runs, scaling=1.25)
    kept = [t for t, f in zip(times, failed) if not f]
    theirs = (None if sum(failed) > 1 else
              1.25 * result_summarizer._compute_olympic_average(kept, sum(failed), 1))
    assert e.dropped == sum(failed) and e.score == theirs, failed
  ten = [_run(float(t), t not in (3, 7)) for t in range(10)]  # unet3d drops up to four
  assert _entry(ten, "unet3d").score == result_summarizer._compute_olympic_average(
      [0, 1, 2, 4, 5, 6, 8, 9], 2, 4)


def test_a_run_counts_only_if_it_converged_has_a_time_and_was_judged():
  assert _entry([_run(None)] + [_run(10.0)] * 4).dropped == 1  # no run_start/run_stop
  assert _entry([_run(None), _run(None)] + [_run(10.0)] * 3).score is None
  unjudged = _entry([_run(11.0, False, problem="timed out after 5 s")] + [_run(10.0)] * 4)
  assert unjudged.score is None and unjudged.unjudged == unjudged.runs[:1]
  log = ResultLog.read(DELL / "ssd/result_0.txt")
  files = [(Path("a"), log)] * 3
  outcomes = [official.Outcome({"valid": True}), official.Outcome({"valid": False}),
              official.Outcome(error="timed out after 5 s")]
  runs = compare._runs(files, outcomes, {})
  assert [(r.converged, r.problem) for r in runs] == [
      (True, None), (False, None), (False, "timed out after 5 s")]
  assert runs[0].minutes == pytest.approx(
      (log.first("run_stop").time_ms - log.first("run_start").time_ms) / 60000)


def test_samples_to_converge_is_the_olympic_mean_with_failures_slowest():
  epochs = [41.0, 40.0, 44.0, 42.0, 43.0]
  assert _entry([_run(1.0, True, e) for e in epochs]).samples_to_converge == 42.0
  runs = [_run(1.0, True, e) for e in epochs[:4]] + [_run(1.0, False, None)]
  assert _entry(runs).samples_to_converge == pytest.approx((41 + 42 + 44) / 3)
  assert _entry(runs[:3] + [_run(1.0, False)] * 2).samples_to_converge is None
  assert _entry([_run(1.0, True, e) for e in epochs], division="open").samples_to_converge is None


def test_the_target_is_reached_at_the_target_in_either_direction():
  up = rules.Quality("eval_accuracy", 0.759, rules.Direction.HIGHER)
  down = rules.Quality("log_perplexity", 3.3, rules.Direction.LOWER)
  assert up.reached(0.759) and up.reached(0.76) and not up.reached(0.7589)
  assert down.reached(3.3) and down.reached(3.29) and not down.reached(3.3001)
  assert not up.reached(float("nan")) and not down.reached(float("nan"))
  assert compare.quality_target("resnet", "4.0.0") == 0.759  # rules/training_4.0.0
  assert compare.quality_target("unet3d", "4.0.0") == 0.908  # the official checker's file
  assert compare.quality_target("resnet", "mini") == rules.load("resnet", "mini").quality.target


def test_seeds_must_be_logged_integers_and_differ_between_runs(tmp_path):
  log = ResultLog.read(DELL / "ssd/result_0.txt")
  assert checks.seed(log, required=True) == []
  logs = [DELL / f"ssd/result_{i}.txt" for i in range(3)]
  text = logs[0].read_text()
  broken = {"none": re.sub(r'.*"key": "seed".*\n', "", text),
            "text": re.sub(r'("key": "seed", "value": )\d+', r'\1"abc"', text),
            "unparsed": text.replace('"key": "seed"', '"key": "seed" oops', 1)}
  for name, body in broken.items():
    (tmp_path / f"{name}.txt").write_text(body)
  cases = [logs, logs[:1] * 2] + [[logs[1], tmp_path / f"{name}.txt"] for name in broken]
  with official.Isolated(2, 60) as tools:
    verdicts = tools.map(official._tool_seeds, [([str(f) for f in c], "4.0.0") for c in cases])
  # mlbench's seed check on the logs it read says what the official seed checker says.
  mine = [rcp.seed_errors([ResultLog.read(f) for f in c]) for c in cases]
  assert [v.value for v in verdicts] == [not m for m in mine] == [True] + [False] * 4
  assert "already logs the same seed on the same line" in mine[1][0]
  assert mine[2] == [f"Result file {tmp_path / 'none.txt'} logs no seed."]


def test_run_order_allows_equal_times_and_the_skew_tolerance_is_inclusive(tmp_path):
  t = 1_700_000_000_000
  events = [(t + 5, "init_start"), (t + 5, "init_stop"), (t + 5, "run_start"),
            (t + 4, "block_start"), (t + 5, "run_stop")]  # 1 ms back in the timed region
  text = "".join(f':::MLLOG {{"time_ms": {t}, "key": "{k}", "value": null, "metadata": '
                 f'{{"status": "success"}}}}\n' for t, k in events)
  (tmp_path / "log.txt").write_text(text)
  log = ResultLog.read(tmp_path / "log.txt")
  assert timing.run_order(log) == []
  [f] = timing.timestamps(log, tolerance_ms=1)
  assert f.severity is Severity.WARN
  assert [f.severity for f in timing.timestamps(log, tolerance_ms=0.5)] == [Severity.FAIL,
                                                                             Severity.WARN]


def test_a_seed_is_required_of_closed_logs_of_rulesets_with_package_checks(tmp_path):
  text = (DELL / "ssd/result_0.txt").read_text()
  (tmp_path / "log.txt").write_text("".join(ln for ln in text.splitlines(keepends=True)
                                            if '"key": "seed"' not in ln))
  log = ResultLog.read(tmp_path / "log.txt")

  def seed(division, ruleset):
    return [f.severity for f in validate._file_findings(log, ruleset, division, None, None, 1e3)
            if f.check == "seed"]

  assert seed("closed", "4.0.0") == [Severity.FAIL]
  assert seed("open", "4.0.0") == seed("closed", "0.7.0") == [Severity.WARN]


def test_runs_are_numbered_and_a_run_stop_without_status_is_no_success(tmp_path):
  for name in [f"result_{i}.txt" for i in (11, 2, 0, 10, 1)] + ["result_x.txt", "result_3.tmp"]:
    (tmp_path / name).write_text("")
  # Every result_*.txt, as the official tools glob them; numbered runs by their numbers.
  assert [p.name for p in submission.result_files(tmp_path)] == [
      "result_0.txt", "result_1.txt", "result_2.txt", "result_10.txt", "result_11.txt",
      "result_x.txt"]
  stop = ':::MLLOG {{"time_ms": 5, "key": "run_stop", "value": null, "metadata": {}}}\n'
  for metadata, success in (('{"status": "success"}', True), ('{"status": "aborted"}', False),
                            ("{}", False)):
    (tmp_path / "log.txt").write_text(stop.format(metadata))
    assert ResultLog.read(tmp_path / "log.txt").success is success, metadata
  (tmp_path / "log.txt").write_text("")
  assert ResultLog.read(tmp_path / "log.txt").success is False
  for success, status in ((True, "success"), (False, "aborted")):  # as mlbench run logs it
    log = MLLog(tmp_path / f"{status}.txt")
    log.run_stop(success)
    log.close()
    assert ResultLog.read(tmp_path / f"{status}.txt").first("run_stop").metadata["status"] == status


@pytest.fixture(scope="module")
def fast_ssd(tmp_path_factory):
  """Dell's v4.0 ssd runs as if they had converged in half the epochs: faster than the
  reference convergence points allow."""
  fast = tmp_path_factory.mktemp("fast") / "ssd"
  shutil.copytree(DELL / "ssd", fast)
  for log in fast.glob("result_*.txt"):
    log.write_text(re.sub(r'"epoch_num": (\d+)', lambda m: f'"epoch_num": {int(m[1]) // 2}',
                          log.read_text()))
  return fast


def test_package_checker_params_bypass_the_seed_and_rcp_checkers(fast_ssd, tmp_path):
  folder = tmp_path / "sys" / "ssd"
  shutil.copytree(fast_ssd, folder)
  seed = re.search(r'"key": "seed", "value": (\d+)', (folder / "result_0.txt").read_text())[1]
  last = folder / "result_4.txt"
  last.write_text(re.sub(r'("key": "seed", "value": )\d+', rf"\g<1>{seed}", last.read_text()))
  bench = BenchmarkDir(folder, "sys", "ssd", submission.result_files(folder), None)
  with official.Isolated(2, 60) as tools:
    plain = package.findings(bench, "4.0.0", "closed", "training", tools, [])
    (folder / "package_checker_params").write_text("seed-checker-bypass\nrcp-bypass\n")
    bypassed = package.findings(bench, "4.0.0", "closed", "training", tools, [])
  assert [(f.check, f.severity) for f in plain] == [("seeds", Severity.FAIL),
                                                    ("rcp", Severity.FAIL)]
  assert [(f.check, f.severity) for f in bypassed] == [("rcp", Severity.INFO)]
  assert "passed using rcp_bypass" in bypassed[0].message


@pytest.fixture(scope="module")
def rcp_outcomes(fast_ssd):
  """The RCP checker on Dell's v4.0 ssd runs, and on the fast copy without and with
  rcp-bypass."""
  fast = fast_ssd
  with official.Isolated(2, 60) as tools:
    return [rcp.rcp(tools, sorted(folder.glob("result_*.txt")), "training", "4.0.0", bypass)
            for folder, bypass in ((DELL / "ssd", False), (fast, False), (fast, True))]


def test_the_rcp_verdict(rcp_outcomes):
  ok, fast, bypassed = rcp_outcomes
  assert [package.rcp_finding(o).severity for o in rcp_outcomes] == [
      Severity.INFO, Severity.FAIL, Severity.INFO]
  assert package.rcp_finding(fast).message == "RCP found (score scaling 2)"
  assert "passed using rcp_bypass" in package.rcp_finding(bypassed).message
  assert compare.rcp_label(ok) == ("Pass", 1.0) and compare.rcp_label(fast) == ("Fail", 2.0)
  assert package.rcp_finding(official.Outcome(error="timed out")).severity is Severity.FAIL
  assert compare.rcp_label(official.Outcome(error="timed out")) == ("Error: timed out", None)
