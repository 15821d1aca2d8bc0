"""What `mlbench validate` makes of log shapes the MLPerf review accepted, on excerpts of
published logs (tests/data/excerpts/README.md names each source line), and that a log
breaking a written rule still fails; the reader against each round's official parser; time
to train and convergence against result_summarizer's and the RCP checker's own code."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from mlperf_logging.compliance_checker import mlp_parser
from mlperf_logging.rcp_checker import rcp_checker
from mlperf_logging.result_summarizer import result_summarizer

from mlbench.resultlog import ResultLog
from mlbench.verify import checks, timing
from mlbench.verify.checks import Severity
from mlbench.verify.report import FileReport

DATA = Path(__file__).parents[1] / "data"
EXCERPTS = DATA / "excerpts"
PARSERS = Path(mlp_parser.__file__).parent


def _read(name: str) -> ResultLog:
  return ResultLog.read(EXCERPTS / name)


def _found(findings):
  return [(f.check, f.severity, f.lineno) for f in findings]


def test_a_placeholder_org_and_a_status_word_warn_and_fail_under_strict():
  dell = json.loads((EXCERPTS / "v5.0-dell-2xXE9680Lx8H200-SXM-141GB.json").read_text())
  found = checks.submission(_read("v5.0-dell-bert-placeholders.txt"), dell,
                            "2xXE9680Lx8H200-SXM-141GB")
  assert _found(found) == [("submission", Severity.WARN, 2), ("submission", Severity.WARN, 5)]
  assert "'SUBMISSION_ORG_PLACEHOLDER' but the system description's submitter is 'Dell'" \
      in found[0].message
  google = json.loads((EXCERPTS / "v4.1-google-cloud-tpu-trillium-512-maxtext.json").read_text())
  status = checks.submission(_read("v4.1-google-trillium-gpt3-status.txt"), google,
                             "cloud-tpu-trillium-512-maxtext")
  assert ("submission", Severity.WARN, 3) in _found(status)
  assert any("submission_status 'cloud' does not match the system description's status "
             "'Preview'" in f.message for f in status)
  report = FileReport(Path("result_0.txt"), "bert", "5.0.0", "PASS", [], found)
  assert not report.fails() and report.fails(strict=True)


def test_stable_diffusion_evaluations_around_run_stop_are_no_finding():
  log = _read("v5.0-qct-stable_diffusion-offline-eval.txt")
  assert timing.timestamps(log) == [] and timing.repeats(log) == []
  evals = log.all("eval_accuracy")
  stop = log.first("run_stop")
  assert stop.lineno == 20 and all(e.time_ms > stop.time_ms for e in evals)
  assert log.time_to_train_ms == stop.time_ms - log.first("run_start").time_ms
  # Converged at the first checkpoint evaluated at FID <= 90 and CLIP >= 0.15, as the RCP
  # checker reads it.
  got = log.convergence("5.0.0")
  assert (got.converged, got.epochs) == (True, 2048000)
  official = rcp_checker.read_submission_file(str(EXCERPTS / log.path.name), "5.0.0", False)
  assert (not official[0], official[1]) == (got.converged, got.epochs)


def test_wrapped_repeats_after_run_stop_are_a_repeat_not_a_failure():
  log = _read("v3.1-google-gpt3-repeats.txt")
  assert timing.timestamps(log) == []
  [repeat] = timing.repeats(log)
  assert (repeat.severity, repeat.lineno) == (Severity.WARN, 11)
  assert "repeat an earlier event verbatim, the first line 11 (block_start, as line 5)" \
      in repeat.message
  assert [ln.lineno for ln in log.lines if ln.repeat_of is not None] == [11]


def test_a_skew_in_untimed_setup_warns():
  [skew] = timing.timestamps(_read("v5.0-dell-bert-setup-skew.txt"))
  assert (skew.severity, skew.lineno) == (Severity.WARN, 2)
  assert "2005 ms from line 1 (cache_clear) to cache_clear" in skew.message


@pytest.mark.parametrize("line, by_ms, found", [
    # Google's last evaluation (line 8, the one that reached the target) 2 h back, before
    # run_start (line 2): the clock started after the run had begun.
    (8, -7_200_000, [("timestamps", Severity.FAIL, 8, checks.RUN_RESULTS),
                     ("timestamps", Severity.WARN, 8, None)]),  # and the step back to it
    # 60 s back, after run_start: out of order, the time to train unchanged; a warning.
    (8, -60_000, [("timestamps", Severity.WARN, 8, None)]),
    # run_stop (line 9) 600 s before that evaluation, still after run_start: the clock
    # stopped before the run knew it had reached the target.
    # (Warnings too: line 7's block_stop also timed after run_stop, and the step back.)
    (9, -600_000, [("timestamps", Severity.FAIL, 8, timing.CLOCK_STOPPED_EARLY),
                   ("timestamps", Severity.WARN, 7, None), ("timestamps", Severity.WARN, 9, None)]),
], ids=["evaluation before run_start", "evaluation back after run_start",
        "run_stop before the evaluation"])
def test_a_published_log_with_a_moved_event(tmp_path, line, by_ms, found):
  lines = (EXCERPTS / "v3.1-google-gpt3-repeats.txt").read_text().splitlines(keepends=True)
  stamp = re.search(r'"time_ms": (\d+)', lines[line - 1])[1]
  lines[line - 1] = lines[line - 1].replace(stamp, str(int(stamp) + by_ms))
  (tmp_path / "log.txt").write_text("".join(lines))
  got = timing.timestamps(ResultLog.read(tmp_path / "log.txt"))
  assert [(f.check, f.severity, f.lineno, f.rule) for f in got] == found


SAMPLE = "\n".join([
    "program output, no token",
    ':::MLLOG {"time_ms": 1000, "key": "a", "value": 1, "metadata": {}}',
    '[1,0]<stdout>: :::MLLOG {"time_ms": 1001, "key": "b", "value": null, "metadata": {"x": 1}}',
    'junk :::MLLOG {"time_ms": 3, "key": "first"} then :::MLLOG {"time_ms": 1002, "key": "c", '
    '"value": 2, "metadata": {}}',  # two tokens: the official parser keeps the last
    'Processing :::MLLOG {"time_ms": 1000, "key": "a", "value": 1, "metadata": {}}',
    '  \t:::MLLOG {"time_ms": 1003, "key": "d", "value": [1, 2], "metadata": {}}  \t',
    ':::MLLOG {"time_ms": 1004, "key": "e", "value": 3, "metadata": {}}\r',
    'x\r:::MLLOG {"time_ms": "1005", "key": "f", "value": 4, "metadata": [1]}',
    ":::MLLOG {not json",
    ':::MLLOG {"time_ms": "soon", "key": "g", "value": 5, "metadata": {}}',
    ":::MLLOG ",
]) + "\n"
OLD_SAMPLE = "\n".join([
    ':::MLL 1558515660.674 run_start: {"value": null, "metadata": {"lineno": 1}}',
    'I0522 worker0 :::MLL 1558515661.5 eval_accuracy: {"value": 0.5, "metadata": {"epoch": 1}}',
    "no token here",
]) + "\n"
RULESETS = sorted(re.sub(r"ruleset_(\d)(\d)(\d)\.py", r"\1.\2.\3", p.name)
                  for p in PARSERS.glob("ruleset_*.py"))


@pytest.mark.parametrize("ruleset", RULESETS)
def test_lines_are_found_and_read_as_the_official_parser_of_each_round(tmp_path, ruleset):
  path = tmp_path / "log.txt"
  path.write_text(OLD_SAMPLE if ruleset == "0.6.0" else SAMPLE, newline="")
  loglines, errors = mlp_parser.parse_file(str(path), ruleset=ruleset)
  log = ResultLog.read(path)
  scale = 1e3 if ruleset == "0.6.0" else 1  # v0.6 logs time in seconds
  official = [(ln.timestamp * scale, ln.key, ln.value["value"]) for ln in loglines]
  if ruleset == "0.6.0":
    assert [(ln.time_ms, ln.key, ln.value) for ln in log.old_lines] == official
    return
  assert [(ln.time_ms, ln.key, ln.value) for ln in log.lines] == official
  assert len(log.errors) == len(errors) == 3
  assert [ln.repeat_of for ln in log.lines if ln.key == "a"] == [None, 2]


def _summarizer_minutes(path: Path, ruleset: str) -> float | None:
  loglines, _ = mlp_parser.parse_file(str(path), ruleset=ruleset)
  try:
    start, stop = result_summarizer._query_run_start_stop(loglines)
  except ValueError:
    return None
  return stop - start


@pytest.mark.parametrize("version, ruleset", [("v0.7", "0.7.0"), ("v4.0", "4.0.0")])
def test_time_to_train_and_convergence_are_the_official_tools(version, ruleset):
  # Every benchmark folder's first run and its fifth (v4.0's that missed the target).
  logs = sorted((DATA / "mlperf-results" / version).glob("*/results/*/*/result_[04].txt"))
  assert len(logs) >= 12
  for path in logs:
    log = ResultLog.read(path)
    assert log.time_to_train_ms == _summarizer_minutes(path, ruleset), path
    got = log.convergence(ruleset)
    not_converged, epochs, gbs, benchmark = rcp_checker.read_submission_file(
        str(path), ruleset, False)
    assert (got.converged, got.epochs, got.gbs, got.benchmark) == (
        not not_converged, epochs, gbs, benchmark), path
