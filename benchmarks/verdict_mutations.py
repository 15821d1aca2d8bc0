"""Plants one-line bugs in what decides a result and records which fast tests catch each.

`validate_mutations.py` mutates the logs and times validate on them; this script
mutates the code. Each mutant below is a plausible one-line slip in the logic
that decides whether a run succeeded, which runs olympic scoring drops, the
comparison with the quality target, seeds, run order or the RCP verdict. One at
a time, it is applied to a copy of the checkout's files (never to the checkout
itself), and the fast tests that judge logs and results run on that copy
(`-m "not slow and not multiprocess"`, as `--python` with PYTHONPATH set to the
copy, so the official tools' worker processes import the mutated code too). A
mutant that no test fails on survived: the suite would not notice that bug.

    python benchmarks/verdict_mutations.py [--only ID ...] [--tests PATH ...] [--list]

Prints one line per mutant as it finishes, then a Markdown table: mutant, file,
the tests that failed. Exit status 1 when a mutant survived (or the unmutated
copy fails a test).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = ("tests/unit/test_verdicts.py", "tests/unit/test_checks.py", "tests/unit/test_official.py",
         "tests/unit/test_rules.py", "tests/unit/test_compliance.py", "tests/unit/test_mllog.py",
         "tests/cli/test_validate.py", "tests/cli/test_compare.py")


@dataclasses.dataclass(frozen=True)
class Mutant:
  id: str
  file: str
  old: str  # must occur exactly once in `file`
  new: str
  what: str


MUTANTS = (
    Mutant("checker-error-passes", "mlbench/verify/report.py",
           'return self.checker != "PASS" or', 'return self.checker == "FAIL" or',
           "a log the official checker crashed, hung or was not run on counts as passing"),
    Mutant("olympic-one-too-few", "mlbench/verify/report.py",
           "return (failing <= MAX_DROPPED", "return (failing < MAX_DROPPED",
           "validate: one failing run already fails the benchmark"),
    Mutant("unet3d-drops-three", "mlbench/verify/report.py",
           'MAX_DROPPED = {"unet3d": 4}', 'MAX_DROPPED = {"unet3d": 3}',
           "unet3d may drop three failing runs, not four"),
    Mutant("invalid-log-converged", "mlbench/verify/compare.py",
           'converged = outcome.error is None and bool(outcome.value and outcome.value["valid"])',
           "converged = outcome.error is None",
           "compare: a log the checker judged (even FAIL) counts as converged"),
    Mutant("untimed-run-counts", "mlbench/verify/compare.py",
           "return sum(not r.converged or r.minutes is None for r in self.runs)",
           "return sum(not r.converged for r in self.runs)",
           "a converged run without run_start/run_stop is not dropped"),
    Mutant("olympic-forgets-dropped", "mlbench/verify/compare.py",
           "kept = ordered[max_dropped:len(ordered) - (max_dropped - dropped)]",
           "kept = ordered[max_dropped:len(ordered) - max_dropped]",
           "a non-converged run is not taken as the dropped slowest one"),
    Mutant("score-counts-failed-times", "mlbench/verify/compare.py",
           "times = [r.minutes for r in self.runs if r.converged and r.minutes is not None]",
           "times = [r.minutes for r in self.runs if r.minutes is not None]",
           "the times of non-converged runs enter the olympic mean"),
    Mutant("epochs-keep-slowest", "mlbench/verify/compare.py",
           "middle = epochs[1:-1]", "middle = epochs[1:]",
           "samples_to_converge keeps the slowest run"),
    Mutant("target-strict", "mlbench/rules.py",
           "return value >= self.target if", "return value > self.target if",
           "a run that reaches exactly the target does not count (higher is better)"),
    Mutant("target-strict-lower", "mlbench/rules.py",
           "else value <= self.target", "else value < self.target",
           "a run that reaches exactly the target does not count (lower is better)"),
    Mutant("mini-keeps-official-target", "mlbench/compliance.py",
           "check[:m.start(2)] + repr(rule.quality.target)",
           "check[:m.start(2)] + repr(official_target)",
           "the checker rules derived for mini runs keep the official target"),
    Mutant("run-order-strict", "mlbench/verify/timing.py",
           "if lb.time_ms < la.time_ms:", "if lb.time_ms <= la.time_ms:",
           "two run events at the same millisecond fail the run order"),
    Mutant("skew-tolerance-exclusive", "mlbench/verify/timing.py",
           "if back > tolerance_ms:", "if back >= tolerance_ms:",
           "a step back of exactly the tolerance fails"),
    Mutant("late-evaluation-warns", "mlbench/verify/timing.py",
           'out.append(at("timestamps", Severity.FAIL, f"run_stop (line',
           'out.append(at("timestamps", Severity.WARN, f"run_stop (line',
           "an evaluation timed after run_stop (the clock stopped early) only warns"),
    Mutant("open-log-escapes-closed-rules", "mlbench/verify/checks.py",
           'return desc is not None and closed(desc.get("division")) and not closed(log.division)',
           "return False", "a log saying open on a closed system is held to the open rules only"),
    Mutant("seed-never-required", "mlbench/verify/checks.py",
           "Severity.FAIL if required else Severity.WARN", "Severity.WARN",
           "a closed-division log without a seed only warns"),
    Mutant("seed-required-open", "mlbench/verify/validate.py",
           'required = division == "closed" and', 'required = division != "closed" and',
           "seeds required of the open division instead of the closed one"),
    Mutant("seed-bypass-inverted", "mlbench/verify/package.py",
           'if "seed-checker-bypass" not in params and', 'if "seed-checker-bypass" in params and',
           "the official seed checker runs only when bypassed"),
    Mutant("rcp-fail-warns", "mlbench/verify/package.py",
           'severity = Severity.INFO if r["passed"] else Severity.FAIL',
           'severity = Severity.INFO if r["passed"] else Severity.WARN',
           "validate: a failed RCP check is a warning"),
    Mutant("rcp-bypass-typo", "mlbench/verify/package.py",
           '"rcp-bypass" in params', '"rcp_bypass" in params',
           "package_checker_params' rcp-bypass is not recognised (the rules text spells it so)"),
    Mutant("rcp-found-passes", "mlbench/verify/compare.py",
           'if r["passed"]:\n    return "Pass"', 'if r["message"].startswith("RCP"):\n    return "Pass"',
           "compare: 'RCP found' and 'RCP Interpolation' read as passes whatever the verdict"),
    Mutant("runs-sorted-by-name", "mlbench/verify/submission.py",
           "return tuple(sorted(found, key=_run_number))",
           "return tuple(sorted(found))",
           "result_10.txt comes before result_2.txt"),
    Mutant("run-stop-always-success", "mlbench/mllog.py",
           '"success" if success else "aborted"', '"success" if success is not None else "aborted"',
           "mlbench run logs every run_stop, a run that missed its target too, as a success"),
    Mutant("aborted-is-success", "mlbench/resultlog.py",
           'return stop is not None and stop.metadata.get("status") == "success"',
           'return stop is not None and stop.metadata.get("status") != "aborted"',
           "a run_stop without a status counts as a success"),
)


def copy_checkout(repo: Path, dest: Path) -> None:
  """The checkout's tracked and untracked-but-not-ignored files, as they are now."""
  names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=repo, capture_output=True, check=True).stdout.split(b"\0")
  for name in filter(None, names):
    src = repo / os.fsdecode(name)
    if src.is_file():
      (dest / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(src, dest / os.fsdecode(name))


def run_tests(copy: Path, python: str, tests: list[str], limit_s: float) -> tuple[int, list[str]]:
  """(pytest's exit status, the ids of failed tests) on `copy`."""
  env = dict(os.environ, PYTHONPATH=str(copy))
  try:
    out = subprocess.run([python, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "-m",
                          "not slow and not multiprocess", *tests], cwd=copy, env=env,
                         capture_output=True, text=True, timeout=limit_s, check=False)
  except subprocess.TimeoutExpired:
    return -1, [f"(no result in {limit_s:.0f} s)"]
  failed = re.findall(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", out.stdout, re.M)
  if out.returncode not in (0, 1) and not failed:
    failed = [f"(pytest exit {out.returncode}: {out.stdout.strip().splitlines()[-1:]})"]
  return out.returncode, failed


def _apply(copy: Path, m: Mutant) -> str:
  path = copy / m.file
  text = path.read_text()
  if text.count(m.old) != 1:
    raise SystemExit(f"{m.id}: {m.old!r} occurs {text.count(m.old)} times in {m.file}; "
                     "update the mutant")
  path.write_text(text.replace(m.old, m.new))
  return text


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--repo", type=Path, default=HERE.parent, help="checkout to mutate a copy of")
  ap.add_argument("--python", default=sys.executable, help="interpreter with the test extra")
  ap.add_argument("--only", nargs="*", metavar="ID", help="these mutants only")
  ap.add_argument("--tests", nargs="*", default=list(TESTS), metavar="PATH")
  ap.add_argument("--limit", type=float, default=1800, help="seconds for one test run")
  ap.add_argument("--list", action="store_true", help="list the mutants and exit")
  args = ap.parse_args()
  chosen = [m for m in MUTANTS if not args.only or m.id in args.only]
  if args.list:
    for m in chosen:
      print(f"{m.id:28s} {m.file:28s} {m.what}")
    return 0
  rows, code = [], 0
  with tempfile.TemporaryDirectory(prefix="verdict-mutations-") as tmp:
    copy = Path(tmp)
    copy_checkout(args.repo.resolve(), copy)
    for m in chosen:  # Every `old` is found before any time is spent on tests.
      (copy / m.file).write_text(_apply(copy, m))
    t0 = time.perf_counter()
    status, failed = run_tests(copy, args.python, args.tests, args.limit)
    print(f"unmutated: exit {status}, {time.perf_counter() - t0:.0f} s", flush=True)
    if status != 0:
      print("the unmutated copy fails: " + ", ".join(failed))
      return 1
    for m in chosen:
      original = _apply(copy, m)
      try:
        t0 = time.perf_counter()
        _, failed = run_tests(copy, args.python, args.tests, args.limit)
      finally:
        (copy / m.file).write_text(original)
      code |= not failed
      rows.append((m, failed))
      print(f"{m.id}: {len(failed)} failed in {time.perf_counter() - t0:.0f} s "
            f"{'SURVIVED' if not failed else ''}", flush=True)
  print("\n| mutant | file | what it breaks | failing tests |\n|---|---|---|---|")
  for m, failed in rows:
    print(f"| {m.id} | {m.file} | {m.what} | "
          f"{'<br>'.join(failed) if failed else '**none: survived**'} |")
  return code


if __name__ == "__main__":
  sys.exit(main())
