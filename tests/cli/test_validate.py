"""`mlbench validate` on published MLPerf packages, on our own logs, and on broken input."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlbench import system
from mlbench.storage import results
from mlbench.cli import main
from mlbench.verify import checks, timing

DATA = Path(__file__).parents[1] / "data" / "mlperf-results"
ROUNDS = {"v0.7": "0.7.0", "v4.0": "4.0.0"}  # the rounds these packages were published in

# Judges each file with the official compliance checker in one fresh process:
# an independent computation of what validate's checker column must say.
OFFICIAL = """
import json, logging, sys
logging.disable(logging.CRITICAL)
from mlperf_logging.compliance_checker import mlp_compliance
out = {}
for path, ruleset in json.loads(sys.argv[1]):
    mlp_compliance.enqueued_configs.clear()
    checker = mlp_compliance.make_checker("training", ruleset, True, False)
    out[path] = mlp_compliance.main(path, f"training_{ruleset}/common.yaml", checker)[0]
print(json.dumps(out))
"""


def validate(capsys, *args):
  code = main(["validate", "--json", *map(str, args)])
  captured = capsys.readouterr()
  assert "Traceback" not in captured.err
  return code, (json.loads(captured.out) if captured.out else None), captured.err


def _files(report):
  return {f["path"]: f for b in report["benchmarks"] for f in b["files"]} or {
      f["path"]: f for f in report["files"]}


@pytest.mark.parametrize("package, exit_code", [("v0.7/Google", 0), ("v4.0/NVIDIA", 1),
                                                ("v4.0/Dell", 0)])
def test_published_packages_get_the_official_verdict_per_file(capsys, package, exit_code):
  code, report, err = validate(capsys, DATA / package)
  assert code == exit_code == report["exit_code"]
  files = _files(report)
  ruleset = ROUNDS[package.split("/")[0]]
  assert {f["ruleset"] for f in files.values()} == {ruleset}
  judged = subprocess.run([sys.executable, "-c", OFFICIAL,
                           json.dumps([[p, ruleset] for p in files])],
                          capture_output=True, text=True, check=True)
  official = json.loads(judged.stdout)
  assert {p: f["checker"] == "PASS" for p, f in files.items()} == official
  assert "result logs" in err and "benchmarks (olympic scoring)" in err


def test_what_the_published_packages_are_known_for(capsys):
  _, nvidia, _ = validate(capsys, DATA / "v4.0/NVIDIA")
  assert all(any("Field status contains a non valid value" in f["message"] for f in s["findings"])
             for s in nvidia["systems"])  # "onprem" is no 4.0.0 status any more
  bad = _files(nvidia)[str(DATA / "v4.0/NVIDIA/results/eos_n8_ngc24.04_mxnet/resnet/result_4.txt")]
  finding = bad["checker_findings"][0]
  assert finding["message"].startswith("Failed checks for eval_accuracy")
  text = Path(bad["path"]).read_text().splitlines()
  assert '"eval_accuracy"' in text[finding["lineno"] - 1]  # points at the last evaluation
  _, google, _ = validate(capsys, DATA / "v0.7/Google")
  edited = _files(google)[str(DATA / "v0.7/Google/results/tpu-v3-8192-TF/ssd/result_0.txt")]
  # run_start < init_stop: initialisation overlaps the timed run, which breaks no written
  # rule (it is then timed); a warning, which --strict fails.
  assert edited["checker"] == "PASS" and edited["verdict"] == "PASS"
  assert edited["strict_verdict"] == "FAIL"
  assert any(f["check"] == "run order" and f["severity"] == "WARN" for f in edited["findings"])
  verdicts = {(b["system"], b["benchmark"]): b["verdict"] for b in google["benchmarks"]}
  assert set(verdicts.values()) == {"PASS"} and len(verdicts) == 9


def test_a_single_log_uses_its_package_for_ruleset_and_system(capsys):
  log = DATA / "v4.0/Dell/results/XE9680x8H100-SXM-80GB/bert/result_0.txt"  # run in 2023
  code, report, _ = validate(capsys, log)
  assert code == 0
  [f] = report["files"]
  assert f["ruleset"] == "4.0.0"
  assert any(x["check"] == "submission" and "1xE9680x8H100" in x["message"] for x in f["findings"])


@pytest.fixture
def package(tmp_path):
  """A copy of Dell's v4.0 ssd results: five passing runs, a passing system file."""
  root = tmp_path / "Dell"
  shutil.copytree(DATA / "v4.0/Dell/systems", root / "systems")
  shutil.copytree(DATA / "v4.0/Dell/results/XE9680x8H100-SXM-80GB/ssd",
                  root / "results/XE9680x8H100-SXM-80GB/ssd")
  return root


def _bench(root):
  return root / "results/XE9680x8H100-SXM-80GB/ssd"


def _edit(path, fn):
  path.write_text(fn(path.read_text()))


def test_the_clean_copy_passes(capsys, package):
  assert validate(capsys, package)[0] == 0


def _stamp(line: str) -> int:
  return json.loads(line.split(":::MLLOG ", 1)[1])["time_ms"]


def _restamp(lines: list[str], i: int, time_ms: int) -> None:
  lines[i] = lines[i].replace(f'"time_ms": {_stamp(lines[i])}', f'"time_ms": {time_ms}')


@pytest.mark.parametrize("breakage, check, message, rule", [
    ("truncate", "compliance", "parse error", None),
    ("malformed", "compliance", "parse error", None),
    ("no_run_stop", "compliance", "run_stop", None),
    # An evaluation of the run timed 2 h back, before run_start: the clock started late.
    ("before_run_start", "timestamps", "before run_start", timing.RUN_RESULTS),
    # run_stop stamped 600 s before the evaluation that reached the target (still after
    # run_start): the clock stopped early.
    ("run_stop_early", "timestamps", "s before the evaluation on line", timing.CLOCK_STOPPED_EARLY),
])
def test_a_broken_log_fails_with_the_rule_and_line(capsys, package, breakage, check, message, rule):
  log = _bench(package) / "result_2.txt"
  lines = log.read_text().splitlines(keepends=True)
  at = None  # the 1-based line the finding must point at
  if breakage == "truncate":  # Cut in the middle of the last log line, as a full disk would.
    last = max(n for n, ln in enumerate(lines) if ":::MLLOG" in ln)
    log.write_text("".join(lines[:last]) + lines[last][: len(lines[last]) // 2])
  elif breakage == "malformed":
    log.write_text("".join(lines[:40]) + ':::MLLOG {"key": "eval_accuracy", oops\n'
                   + "".join(lines[40:]))
  elif breakage == "no_run_stop":
    log.write_text("".join(ln for ln in lines if '"run_stop"' not in ln))
  elif breakage == "before_run_start":
    i = next(n for n, ln in enumerate(lines) if '"eval_start"' in ln)
    _restamp(lines, i, _stamp(lines[i]) - 7_200_000)
    log.write_text("".join(lines))
    at = i + 1
  else:
    stop = next(n for n, ln in enumerate(lines) if '"run_stop"' in ln)
    reached = max(n for n, ln in enumerate(lines[:stop]) if '"eval_accuracy"' in ln)
    _restamp(lines, stop, _stamp(lines[reached]) - 600_000)
    log.write_text("".join(lines))
    at = reached + 1
    message = f"run_stop (line {stop + 1}) is timed 600.0 s before the evaluation on line {at}"
  code, report, _ = validate(capsys, package)
  bad = _files(report)[str(log)]
  assert bad["verdict"] == "FAIL"
  found = [f for f in bad["checker_findings"] + bad["findings"]
           if f["check"] == check and message in f["message"] and f["severity"] == "FAIL"]
  assert found, bad
  if rule is not None:
    assert (found[0]["rule"], found[0]["lineno"]) == (rule, at)
  if message == "parse error":
    # The official seed checker cannot read an unparseable log, and fails the package.
    assert code == 1 and "Log lines had parsing errors" in json.dumps(report["benchmarks"])
    return
  assert code == 0  # One failing run of five: olympic scoring may drop it.
  _edit(_bench(package) / "result_3.txt", lambda t: t.replace('"run_stop"', '"run_stopp"'))
  assert validate(capsys, package)[0] == 1  # A second one: not any more.


def test_a_step_back_after_run_start_warns_and_fails_under_strict(capsys, package):
  """An event of the run 60 s back, still after run_start: the events are out of order, but
  the time to train (run_stop - run_start) is what it was, and no written rule forbids it
  (Habana's v1.0 BERT logs and v3.1 xFusion's step back inside the run)."""
  log = _bench(package) / "result_2.txt"
  lines = log.read_text().splitlines(keepends=True)
  i = next(n for n, ln in enumerate(lines) if '"eval_start"' in ln)
  start = _stamp(next(ln for ln in lines if '"run_start"' in ln))
  _restamp(lines, i, _stamp(lines[i]) - 60_000)
  assert _stamp(lines[i]) > start
  log.write_text("".join(lines))
  code, report, _ = validate(capsys, package)
  bad = _files(report)[str(log)]
  assert code == 0 and (bad["verdict"], bad["strict_verdict"]) == ("PASS", "FAIL")
  assert not [f for f in bad["findings"] if f["severity"] == "FAIL"]
  [back] = [f for f in bad["findings"] if f["message"].startswith("time goes back 1 time(s), "
                                                                  "most by 60000 ms")]
  assert (back["check"], back["severity"], back["lineno"]) == ("timestamps", "WARN", i + 1)
  assert validate(capsys, "--strict", package)[0] == 1


@pytest.mark.parametrize("where", ["closed system", "open system", "lone log saying open"])
def test_off_the_evaluation_cadence_fails_the_closed_division_and_warns_the_open(
    capsys, tmp_path, package, where):
  """validate judges the cadence by the system description's division, or the log's where
  there is none: off it fails closed (Quality measure), warns open."""
  log = _bench(package) / "result_2.txt"
  _edit(log, lambda t: re.sub(r'("key": "eval_accuracy".*"epoch_num": )2}', r"\g<1>3}", t))
  system = package / "systems/XE9680x8H100-SXM-80GB.json"
  desc = json.loads(system.read_text())
  system.write_text(json.dumps({**desc, "division": "open" if where == "open system" else
                                "closed"}))
  if where == "lone log saying open":
    log = shutil.copy(log, tmp_path / "result_2.txt")
    _edit(log, _say_open)
  code, report, _ = validate(capsys, "--ruleset", "4.0.0", log)
  [found] = [f for f in _files(report)[str(log)]["findings"] if f["check"] == "eval schedule"]
  assert found["message"].startswith("evaluation 2 at 3 epochs, the rules put it at 2")
  if where == "closed system":
    assert (found["severity"], found["rule"], code) == ("FAIL", checks.QUALITY_MEASURE, 1)
  else:
    assert (found["severity"], found["rule"], code) == ("WARN", None, 0)
    assert found["message"].endswith("(the open division may evaluate as it likes)")


def _say_open(text: str, scale: float = 1.0) -> str:
  """A log's submission_division made 'open', each eval_accuracy multiplied by `scale`."""
  text = text.replace('"key": "submission_division", "value": "closed"',
                      '"key": "submission_division", "value": "open"')
  return re.sub(r'("key": "eval_accuracy", "value": )([0-9.]+)',
                lambda m: f"{m.group(1)}{float(m.group(2)) * scale!r}", text)


def test_logs_saying_open_on_a_closed_system_are_held_to_the_closed_rules(capsys, package):
  """Dell's closed ssd runs, each log saying open (the official checker then checks no
  target) and every evaluation at 0.9 of its value: none reaches the closed target, a closed
  result that never converged. Said open but reaching it, they only warn."""
  for log in _bench(package).glob("result_*.txt"):
    _edit(log, _say_open)
  code, report, _ = validate(capsys, package)
  assert code == 0 and report["strict_verdict"] == "FAIL"
  assert {f["check"] for x in _files(report).values() for f in x["findings"]
          if f["severity"] != "INFO"} <= {"submission", "repeats", "timestamps"}
  for log in _bench(package).glob("result_*.txt"):
    _edit(log, lambda t: _say_open(t, 0.9))
  code, report, _ = validate(capsys, package)
  assert code == 1 and report["benchmarks"][0]["failing_runs"] == 5
  for path, f in _files(report).items():
    assert f["checker"] == "PASS" and f["verdict"] == "FAIL", path  # open: no target checked
    [closed] = [x for x in f["findings"] if x["check"] == "division"]
    assert closed["severity"] == "FAIL" and closed["rule"] == \
        f"{checks.DIVISIONS}; {checks.QUALITY_MEASURE}"
    assert closed["message"].startswith(
        "submission_division 'open' on a closed system, so held to the closed rules, which the "
        "official checker fails: Failed checks for eval_accuracy : v['value'] >= 0.340")
    assert '"eval_accuracy"' in Path(path).read_text().splitlines()[closed["lineno"] - 1]


def test_package_level_breakage(capsys, package):
  (_bench(package) / "result_4.txt").unlink()
  code, report, _ = validate(capsys, package)
  assert code == 1 and "4 result_*.txt files, the rules want exactly 5" in json.dumps(report)
  shutil.copy(_bench(package) / "result_0.txt", _bench(package) / "result_4.txt")
  code, report, _ = validate(capsys, package)
  assert code == 1 and "seed checker failed" in json.dumps(report)


def test_an_unknown_benchmark_is_skipped_as_the_package_checker_skips_it(capsys, package):
  moe = package / "results/XE9680x8H100-SXM-80GB/moe"
  _bench(package).rename(moe)
  for f in moe.glob("result_*.txt"):
    _edit(f, lambda t: t.replace('"value": "ssd"', '"value": "moe"'))
  code, report, _ = validate(capsys, package, "--ruleset", "4.0.0")
  assert code == 0 and report["verdict"] == "PASS" and report["strict_verdict"] == "FAIL"
  [bench] = report["benchmarks"]
  [why] = bench["findings"]
  assert why["severity"] == "WARN" and "'moe' is not a 4.0.0 benchmark" in why["message"]
  assert bench["files"] == []  # like the official package checker, judged none of its logs
  code, report, _ = validate(capsys, package, "--ruleset", "4.0.0", "--strict")
  assert code == 1 and report["strict"] is True


def _loop(p):
  p.symlink_to(p.with_name("other"))
  p.with_name("other").symlink_to(p)


@pytest.mark.parametrize("make, message", [
    (lambda p: p.mkdir(), "holds no MLPerf result logs"),
    (lambda p: p.write_text("hello\n"), "is not an MLPerf result log"),
    (lambda p: p.symlink_to("/dev/null"), "is a character device, not a result log or a folder"),
    (lambda p: os.mkfifo(p), "is a named pipe (FIFO), not a result log or a folder"),
    (_loop, "is a loop of symbolic links"),
    (lambda p: p.symlink_to(p.with_name("gone")), "is a symbolic link to "),
], ids=["empty folder", "text", "/dev/null", "fifo", "symlink loop", "dangling symlink"])
@pytest.mark.parametrize("command", ["validate", "compare"])
def test_not_a_log_or_package_is_a_one_line_error(capsys, tmp_path, make, message, command):
  target = tmp_path / "thing"
  make(target)
  code = main([command, str(target)])
  out, err = capsys.readouterr()
  assert code == 2 and out == ""
  assert err.startswith("error: ") and message in err and err.count("\n") == 1, err


def test_unreadable_system_description_and_params_are_one_line_findings(capsys, package):
  (package / "systems/XE9680x8H100-SXM-80GB.json").write_bytes(b"\xff\xfe{}")
  (_bench(package) / "package_checker_params").write_bytes(b"rcp-bypass\x00\xff")
  code, report, err = validate(capsys, package)
  assert code == 1
  [(path, system)] = [(s["path"], s["findings"]) for s in report["systems"]]
  assert [f["message"] for f in system] == [f"{path} is not UTF-8 text (byte 0xff at offset 0)"]
  [params] = [f for f in report["benchmarks"][0]["findings"] if f["check"] == "params"]
  assert params["message"].startswith(f"{_bench(package)}/package_checker_params is not UTF-8 "
                                      "text (byte 0xff at offset 11)")
  (package / "systems/XE9680x8H100-SXM-80GB.json").write_text("[1, 2]")
  assert "holds a JSON list, not an object" in validate(capsys, package)[2]


@pytest.mark.parametrize("command", ["validate", "compare"])
def test_microsecond_timestamps_are_a_one_line_error(capsys, package, command):
  for log in _bench(package).glob("result_*.txt"):
    _edit(log, lambda t: re.sub(r'"time_ms": (\d+)', lambda m: f'"time_ms": {m.group(1)}000', t))
  assert main([command, str(package)]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: cannot tell which ruleset 5 logs follow(s) (benchmarks ssd): "
                        "their time_ms values are not milliseconds since 1970 (result_0.txt line ")
  assert "is in the year 55,6" in err and err.count("\n") == 1


def test_mlbench_logs_validate_under_the_mini_rules(capsys, tmp_path, write_log):
  """Five runs as `mlbench run --runs 5` writes them, with a system description."""
  machine = system.probe(__import__("jax").local_devices(), 1)
  system.ensure_system(tmp_path, system.describe(machine, system="cpu-test", submitter="mlbench",
                                                   division="closed", notes=""))
  folder = results.benchmark_dir(tmp_path, "cpu-test", "resnet")
  folder.mkdir(parents=True)
  for i in range(5):
    write_log(folder / f"result_{i}.txt", [0.5, 0.9, 0.985], seed=100 + i)
  code, report, _ = validate(capsys, tmp_path)
  assert code == 0, json.dumps(report, indent=1)[:3000]
  [bench] = report["benchmarks"]
  assert bench["ruleset"] == "mini" and bench["ruleset_from"].startswith("named in the logs")
  assert "mini rules have no reference convergence points" in json.dumps(bench["findings"])
  write_log(folder / "result_4.txt.tmp", [0.5, 0.97], seed=104)  # below the mini target
  (folder / "result_4.txt.tmp").replace(folder / "result_4.txt")
  code, report, _ = validate(capsys, folder / "result_4.txt")
  assert code == 1 and report["files"][0]["checker"] == "FAIL"


def _note(value):
  return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME",
                                   "key": "note", "value": value, "metadata": {}}) + "\n"


def _insert(path, text, at=30):
  lines = path.read_text().splitlines(keepends=True)
  path.write_text("".join(lines[:at]) + text + "".join(lines[at:]))


def test_a_log_with_a_2mb_line_gets_its_verdict_at_once(capsys, package):
  log = _bench(package) / "result_1.txt"
  _insert(log, _note("x" * 2_000_000))  # the official parser would spin on it for hours
  start = time.monotonic()
  code, report, err = validate(capsys, log)
  assert time.monotonic() - start < 10
  assert code == 1
  [f] = report["files"]
  assert f["checker"] == "NOT RUN" and f["verdict"] == "FAIL"
  [why] = f["checker_findings"]
  assert why["lineno"] == 31 and "line 31 is 2,000,1" in why["message"]
  assert "characters long" in why["message"] and "NOT RUN" in err
  assert len(json.dumps(report)) < 20_000  # the line is quoted, not copied
  code, report, _ = validate(capsys, package)
  assert code == 1 and _files(report)[str(log)]["checker"] == "NOT RUN"
  # The official seed checker parses every log the same way: it is not run either.
  [seeds] = report["benchmarks"][0]["findings"]
  assert seeds["message"] == ("seed and RCP checkers not run: the official checker was not run on "
                              "result_1.txt (line 31), and these tools parse it the same way")


def test_serial_and_parallel_give_the_same_verdicts(capsys):
  _, serial, _ = validate(capsys, "--jobs", "1", DATA / "v4.0/NVIDIA")
  _, parallel, _ = validate(capsys, "--jobs", "3", DATA / "v4.0/NVIDIA")
  assert serial == parallel
  files = _files(serial)
  assert len(files) == 20 and {f["checker"] for f in files.values()} == {"PASS", "FAIL"}


def test_the_official_timeout_option(capsys, package, monkeypatch):
  slow = _bench(package) / "result_2.txt"
  # Short enough to be run, long enough that the official parser needs many seconds.
  _insert(slow, "".join(_note("y" * 60_000) for _ in range(4)))
  for how in ("option", "envvar"):
    args = ["--official-timeout", "2"] if how == "option" else []
    if how == "envvar":
      monkeypatch.setenv("MLBENCH_OFFICIAL_TIMEOUT", "2")
    start = time.monotonic()
    code, report, _ = validate(capsys, *args, slow)
    assert time.monotonic() - start < 15, how
    [f] = report["files"]
    [why] = f["checker_findings"]
    assert code == 1 and f["checker"] == "ERROR", how
    assert why["message"].startswith("the official checker failed: timed out after 2 s reading "
                                     "result_2.txt, near line 3")
    assert why["lineno"] in (31, 32, 33, 34)


def test_a_warning_passes_and_fails_under_strict_with_its_line(capsys, package):
  """NVIDIA's NeMo code logs a placeholder for the org (published v5.0 logs, see
  tests/data/excerpts): the review accepted it, so validate warns and `--strict` fails."""
  for log in _bench(package).glob("result_*.txt"):
    _edit(log, lambda t: t.replace('"submission_org", "value": "Dell"',
                                   '"submission_org", "value": "SUBMISSION_ORG_PLACEHOLDER"'))
  code, report, err = validate(capsys, package)
  assert code == 0 and report["exit_code"] == 0 and report["strict"] is False
  assert (report["verdict"], report["strict_verdict"]) == ("PASS", "FAIL")
  warned = [f for f in _files(report).values() for f in f["findings"]
            if f["check"] == "submission" and "PLACEHOLDER" in f["message"]]
  assert len(warned) == 5 and all(f["severity"] == "WARN" and f["lineno"] for f in warned)
  assert re.search(r"WARN submission \(\d+\): .* \[results/XE9680x8H100-SXM-80GB/ssd/result_0.txt "
                   r"line \d+\]", err)
  code, report, err = validate(capsys, "--strict", package)
  assert code == 1 and report["exit_code"] == 1 and report["strict"] is True
  assert "(--strict: warnings fail)" in err


def test_a_package_without_its_system_description_fails_in_one_line(capsys, package):
  shutil.rmtree(package / "systems")  # as v4.1 Clemson's results were once published alone
  code, report, _ = validate(capsys, package)
  assert code == 1
  [(path, findings)] = [(s["path"], s["findings"]) for s in report["systems"]]
  [missing] = findings
  assert missing["severity"] == "FAIL" and missing["rule"].startswith("submission_rules.adoc")
  assert missing["message"].startswith(f"{path} is missing; a package describes every system")


def test_a_system_folder_judges_its_own_system_description_only(capsys, package):
  """`validate results/<system>` judges that system's description, as a benchmark folder
  does; another system's broken description is the package's business."""
  (package / "systems/Other-System.json").write_text("[1, 2]")
  code, report, _ = validate(capsys, package / "results/XE9680x8H100-SXM-80GB")
  assert code == 0, report
  assert [Path(s["path"]).name for s in report["systems"]] == ["XE9680x8H100-SXM-80GB.json"]
  assert validate(capsys, package)[0] == 1  # The package's validation still reads it.


COMMAND = (sys.executable, "-c", "import sys; from mlbench.cli import main; sys.exit(main())")


def _stale_pending_log(folder: Path) -> Path:
  """A killed run's leftover log (its process gone): validate and compare note it on stderr."""
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True).stdout.strip()
  log = folder / f"pending_{dead}_0123abcd.log"
  log.write_text("a killed run's log\n")
  return log


def test_the_report_goes_to_stdout_the_notes_to_stderr(tmp_path, package):
  """`mlbench validate PKG > report.txt` keeps the report (verdicts, tables, exit code line);
  progress and notes go to stderr; with --json the JSON alone is on stdout and the report
  joins the notes; the exit code is the verdict's either way."""
  _stale_pending_log(_bench(package))
  (_bench(package) / "result_4.txt").unlink()  # a failing package: exit 1
  for as_json in (False, True):
    report = tmp_path / f"report{int(as_json)}.txt"
    with open(report, "w") as stdout:
      done = subprocess.run([*COMMAND, "validate", *(["--json"] * as_json), str(package)],
                            stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=300)
    out, err = report.read_text(), done.stderr
    assert done.returncode == 1, err
    assert "note: ignoring 1 log(s) of killed runs" in err and "note:" not in out
    human, other = (err, out) if as_json else (out, err)
    for part in ("result logs", "benchmarks (olympic scoring)", "exit code 1"):
      assert part in human and part not in other, part
    assert "4 result_*.txt files, the rules want exactly 5" in human
    if as_json:
      assert json.loads(out)["exit_code"] == 1
