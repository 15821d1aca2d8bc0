"""`mlbench validate`: the official checks, the missing ones, and clear verdicts.

For every log: the official compliance checker under the log's ruleset (in
isolated workers, all logs of a package in parallel; not run, and a failure, on
a log that would stall or crash it), then mlbench's own checks
(`mlbench.verify.checks`). For every benchmark folder of a package: the
package checks the official package_checker makes (number of result files,
unique seeds, reference convergence points; `mlbench.verify.package`), then a
verdict under olympic scoring (`mlbench.verify.report`). For every system: the
official system-description check.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlbench import compliance, rules as rules_lib
from mlbench.verify import (cadence, checks, official, package as package_lib, rcp as rcp_lib,
                            screen, timing)
from mlbench.verify.checks import Finding, Severity
from mlbench.verify.report import BenchmarkReport, FileReport, Report
from mlbench.resultlog import ResultLog
from mlbench.verify.rounds import detect_ruleset
from mlbench.verify.submission import Target, find, groups

Progress = Callable[[int, int], None]  # (logs the official checker is done with, all logs)
LOGS_PER_WORKER = 20
RCP_MODULES = ("mlperf_logging.rcp_checker.rcp_checker",
               "mlperf_logging.system_desc_checker.system_desc_checker")


_CHECK_FAILED = re.compile(r"CHECK for '([^']+)' failed in line (\d+):\n(.*)\nfailed test: (.*)")
_CODE_FAILED = re.compile(r"Failed executing CHECK code:\n(.*)\ntriggered by line:\n(.*)")


def _checker_findings(outcome: official.Outcome, log: ResultLog) -> tuple[str, list[Finding]]:
  """The checker's verdict, and its messages as findings pointing at file lines."""
  if outcome.error is not None:
    near = re.search(r"near line (\d+)", outcome.error)
    return "ERROR", [Finding("compliance", Severity.FAIL, f"the official checker failed: "
                             f"{outcome.error}", int(near.group(1)) if near else None)]
  result = outcome.value
  # The lines the official parser could not read are the reader's errors: it finds and
  # reads lines as that parser does (mlbench.resultlog).
  parse = "Log lines had parsing errors." in result["errors"]
  out = [Finding("compliance", Severity.FAIL, f"parse error: {msg}", n, text)
         for n, text, msg in (log.errors if parse else [])]
  for message in result["errors"]:
    if message == "Log lines had parsing errors.":
      continue
    out.append(_one_finding(message, log))
  if not result["valid"] and not out:
    out.append(Finding("compliance", Severity.FAIL, "the official checker failed the log"))
  return ("PASS" if result["valid"] else "FAIL"), out


def _official(items: list[tuple[Path, ResultLog, str]], usage: str, tools: official.Isolated,
              progress: Progress | None) -> list[tuple[str, list[Finding]]]:
  """The official checker's verdict on each (log, parsed, ruleset), in parallel.

  A log with what would stall or crash the checker (`mlbench.verify.screen`) is not
  handed to it: its verdict is NOT RUN, a failure, with the reason and line.
  """
  calls = [compliance.checker_args(p, log.benchmark, rs, usage) for p, log, rs in items]
  skipped = [screen.check(log, call[2]) for (_, log, _), call in zip(items, calls)]
  run = [i for i, s in enumerate(skipped) if s is None]
  total, done = len(items), len(items) - len(run)
  if progress:
    progress(done, total)

  def tick(_: int) -> None:
    nonlocal done
    done += 1
    if progress:
      progress(done, total)

  outcomes = dict(zip(run, tools.map(official._tool_compliance, [calls[i] for i in run], tick)))
  out = []
  for i, (_, log, _) in enumerate(items):
    if (why := skipped[i]) is not None:
      out.append(("NOT RUN", [Finding("compliance", Severity.FAIL, f"the official checker was "
                                      f"not run: {why.reason}", why.lineno)]))
    else:
      out.append(_checker_findings(outcomes[i], log))
  return out


def _closed_checks(items: list[tuple[Path, ResultLog, str]], usage: str,
                   tools: official.Isolated) -> dict[Path, list[Finding]]:
  """The official checker's closed rules (its `closed_common.yaml`, which adds the
  benchmark's) on the logs that said open on a closed system (`checks.needs_closed_checks`):
  what they fail, as FAIL findings citing Divisions (and Quality measure for the target).
  Not on a log the official checker was not run on (it fails already)."""
  calls, todo = [], []
  for path, log, rs in items:
    p, u, r, config = compliance.checker_args(path, log.benchmark, rs, usage)
    rules = Path(config).parent if config else compliance.checker_package_dir() / f"{u}_{r}"
    if (rules / "closed_common.yaml").is_file() and screen.check(log, r) is None:
      calls.append((p, u, r, str(rules / "closed_common.yaml")))
      todo.append((path, log, rs))
  out = {}
  for (path, log, rs), outcome in zip(todo, tools.map(official._tool_compliance, calls)):
    rule = rules_lib.find(log.benchmark, rs)
    quality = rule.quality.key if rule is not None else "eval_accuracy"
    found = [f for f in _checker_findings(outcome, log)[1] if not f.message.startswith("parse")]
    out[path] = [dataclasses.replace(
        f, check="division", message=f"submission_division {log.division!r} on a closed system, "
        f"so held to the closed rules, which the official checker fails: {f.message}",
        rule=checks.DIVISIONS + (f"; {checks.QUALITY_MEASURE}" if quality in f.message else ""))
        for f in found]
  return out


def _one_finding(message: str, log: ResultLog) -> Finding:
  if m := _CHECK_FAILED.match(message):
    return Finding("compliance", Severity.FAIL, f"{m.group(1)}: failed test {m.group(4).strip()}",
                   _lineno(log, m.group(3)), m.group(3))
  if m := _CODE_FAILED.match(message):
    return Finding("compliance", Severity.FAIL, f"could not evaluate {m.group(1).strip()}",
                   _lineno(log, m.group(2)), m.group(2))
  if message.startswith("Failed checks for "):
    key = message[len("Failed checks for "):].split(" ", 1)[0]
    last = log.all(key)[-1] if log.all(key) else None
    return Finding("compliance", Severity.FAIL, message, last.lineno if last else None,
                   last.text if last else None)
  return Finding("compliance", Severity.FAIL, message.splitlines()[0])


def _lineno(log: ResultLog, text: str) -> int | None:
  text = text.strip()
  for ln in log.lines:
    if ln.text == text:
      return ln.lineno
  return next((n for n, t, _ in log.errors if t == text), None)


def _file_findings(log: ResultLog, ruleset: str, division: str | None,
                   desc: dict[str, Any] | None, system: str | None,
                   tolerance_ms: float) -> list[Finding]:
  out = checks.parse_errors(log) + timing.timestamps(log, tolerance_ms) + timing.run_order(log)
  out += timing.repeats(log) + checks.resumed(log)
  out += cadence.schedule(log, rules_lib.find(log.benchmark, ruleset), closed=division != "open")
  required = division == "closed" and ruleset in official.RULESETS_WITH_PACKAGE_CHECKS
  out += checks.seed(log, required=required)
  if desc is not None and system is not None:
    out += checks.submission(log, desc, system)
  return out


def _file_reports(files: list[tuple[Path, ResultLog]], verdicts: list[tuple[str, list[Finding]]],
                  ruleset: str, division: str | None, desc: dict[str, Any] | None,
                  system: str | None, tolerance_ms: float,
                  closed: dict[Path, list[Finding]]) -> list[FileReport]:
  out = []
  for (path, log), (verdict, official_findings) in zip(files, verdicts):
    div = division or log.division
    out.append(FileReport(path, log.benchmark, ruleset, verdict, official_findings,
                          _file_findings(log, ruleset, div, desc, system, tolerance_ms)
                          + closed.get(path, [])))
  return out


def validate(path: Path, *, ruleset: str | None = None, usage: str = "training",
             timeout_s: float = 120.0, tolerance_ms: float = 1000.0, strict: bool = False,
             processes: int | None = None, progress: Progress | None = None) -> Report:
  """Validates a log, a benchmark folder, a package or a folder of packages.

  Args:
    timeout_s: the time the official checker may take on one log (and each other
      official tool on one input); a log it runs out of fails.
    strict: the exit code follows the strict verdict (warnings fail too).
    processes: worker processes for the official tools; default: one per core, and
      one per LOGS_PER_WORKER logs.
    progress: called with (logs checked, logs in all) as the official checker ends on each.
  """
  target = find(Path(path))
  # A worker costs a process and its imports: one per LOGS_PER_WORKER logs, up to a core each.
  n_logs = sum(len(b.files) for b in target.benchmarks)
  workers = processes or max(1, min(_cores(), n_logs // LOGS_PER_WORKER))
  with official.sigterm_raises(), official.Isolated(workers, timeout_s) as tools, \
      official.Isolated(1, timeout_s) as rcp_tools:
    if target.kind == "log":
      report = _validate_one_log(target, ruleset, usage, tools, tolerance_ms, progress)
      report.strict = strict
      return report
    # The RCP checker's worker starts and imports it (scipy: seconds) while the logs are read;
    # not for a ruleset without package checks (0.6.0, 0.7.0), which needs neither.
    needs = ruleset is None or ruleset == rules_lib.MINI or \
        ruleset in official.RULESETS_WITH_PACKAGE_CHECKS
    warm = _in_background(lambda: needs and rcp_tools.call(official._tool_import, *RCP_MODULES))
    folders = _read_folders(target, ruleset, usage)
    judged = [(f, _describe(target, f)) for f in folders if isinstance(f[2], str)]
    plans = [package_lib.plan(b, rs, div or _division(logs), usage, [log for _, log in logs])
             for (b, rs, _, logs), (_, div) in judged]
    # The RCP checker (its scipy import takes seconds) and the system-description checker
    # run beside the compliance checker.
    rcps = _in_background(lambda: (warm(), rcp_lib.rcps(rcp_tools, [p.rcp for p in plans if p.rcp]),
                                   _systems(target, folders, usage, rcp_tools))[1:])
    verdicts = iter(_official([(p, log, rs) for (_, rs, _, logs), _ in judged for p, log in logs],
                              usage, tools, progress))
    closed = _closed_checks([(p, log, rs) for (_, rs, _, logs), (desc, _) in judged
                             for p, log in logs if checks.needs_closed_checks(log, desc)],
                            usage, tools)
    outcomes, systems = rcps()
    rcp_outcomes = iter(outcomes)
    reports = {b.folder: BenchmarkReport(b, rs, "not judged", [], [how])
               for b, rs, how, _ in folders if not isinstance(how, str)}
    for ((bench, rs, how, logs), (desc, division)), todo in zip(judged, plans):
      files = _file_reports(logs, [next(verdicts) for _ in logs], rs, division, desc,
                            bench.system, tolerance_ms, closed)
      found = package_lib.finish(todo, files, next(rcp_outcomes) if todo.rcp else None)
      if desc is not None and "division" not in desc:  # The package checker reads it first.
        found.insert(0, Finding("system", Severity.FAIL, f"{bench.system}.json has no "
                                "division; the official package checker stops on it",
                                rule=package_lib.SUBMISSION_LAYOUT))
      reports[bench.folder] = BenchmarkReport(bench, rs, how, files, found)
    benchmarks = [reports[f[0].folder] for f in folders]
  return Report(target, [], benchmarks, systems, strict)


def _systems(target: Target, folders: list[_Folder], usage: str,
             tools: official.Isolated) -> list[tuple[Path, list[Finding]]]:
  """Each package's system descriptions, judged."""
  return [found for package, rs, used in _packages(target, folders)
          for found in package_lib.systems(package, rs, usage, used, tools,
                                           only_used=target.kind in ("benchmark", "system"))]


def _describe(target: Target, folder: _Folder) -> tuple[dict[str, Any] | None, str | None]:
  """A benchmark folder's system description and division (None where unknown)."""
  desc, _ = package_lib.load_system(_system_file(target, folder[0]))
  return desc, (desc or {}).get("division")


def _in_background(fn: Callable[[], Any]) -> Callable[[], Any]:
  """Starts `fn` in a thread; the function returned waits for its result (or raises its
  exception). A thread: the workers it waits on do the work."""
  box: dict[str, Any] = {}

  def target() -> None:
    try:
      box["value"] = fn()
    except BaseException as e:  # noqa: BLE001 - handed to the caller
      box["error"] = e

  thread = threading.Thread(target=target, daemon=True)
  thread.start()

  def result() -> Any:
    thread.join()
    if "error" in box:
      raise box["error"]
    return box["value"]
  return result


def _system_file(target: Target, bench: Any) -> Path | None:
  """Where a benchmark folder's system description is: in its package's systems/, also
  where a package (what the user named) has no systems/ at all."""
  if bench.system_file is not None or target.kind not in ("package", "packages"):
    return bench.system_file
  return bench.folder.parent.parent.parent / "systems" / f"{bench.system}.json"


def _cores() -> int:
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


_Folder = tuple[Any, str, Any, list[tuple[Path, ResultLog]]]  # (bench, ruleset, how, logs)


def _read_folders(target: Target, ruleset: str | None, usage: str) -> list[_Folder]:
  """Every benchmark folder with its logs read and the ruleset they are judged by; `how`
  is a Finding instead where a folder is not judged (no logs, or one the official
  package checker skips)."""
  folders: list[_Folder] = []
  for dirs in groups(target).values():
    logs = {b.folder: [(f, ResultLog.read(f)) for f in b.files] for b in dirs}
    every = [log for pairs in logs.values() for _, log in pairs]
    if not every and not ruleset:  # Nothing to read a ruleset from; the count check fails.
      folders += [(b, "-", Finding("runs", Severity.FAIL, "no result_*.txt files"), [])
                  for b in dirs]
      continue
    rs, how = (ruleset, "--ruleset") if ruleset else detect_ruleset(every)
    for b in dirs:
      skip = package_lib.skipped(b, rs, usage)
      folders.append((b, rs, skip or how, [] if skip else logs[b.folder]))
  return folders


def _packages(target: Target, folders: list[_Folder]) -> list[tuple[Path, str, set[str]]]:
  """(package, ruleset of its system descriptions, systems its results use), in order."""
  out: dict[Path, tuple[str, set[str]]] = {}
  for bench, rs, how, _ in folders:
    system_file = _system_file(target, bench)
    # A folder the package checker skips still has its system description read first.
    if system_file is not None and (isinstance(how, str) or how.severity is Severity.WARN):
      first = out.setdefault(system_file.parent.parent,
                             (rules_lib.checker_ruleset(bench.benchmark, rs), set()))
      first[1].add(bench.system)
  return [(p, rs, used) for p, (rs, used) in out.items()]


def _validate_one_log(target: Target, ruleset: str | None, usage: str, tools: official.Isolated,
                      tolerance_ms: float, progress: Progress | None) -> Report:
  """A single log; if it sits in a package, its system description is used too."""
  log = ResultLog.read(target.log)
  results = target.log.parent.parent.parent
  package = results.parent if results.name == "results" else None
  # In a package, the package's latest run tells the round (earlier runs may be
  # results carried over from a past round).
  siblings = ([ResultLog.read(f) for f in (results).glob("*/*/result_*.txt")]
              if package else [log])
  rs = ruleset or detect_ruleset(siblings)[0]
  system = target.log.parent.parent.name if package else None
  desc, _ = package_lib.load_system(package / "systems" / f"{system}.json" if package else None)
  files = [(target.log, log)]
  verdicts = _official([(target.log, log, rs)], usage, tools, progress)
  closed = _closed_checks([(target.log, log, rs)] if checks.needs_closed_checks(log, desc)
                          else [], usage, tools)
  return Report(target, _file_reports(files, verdicts, rs, (desc or {}).get("division"), desc,
                                      system if desc else None, tolerance_ms, closed), [], [])


def _division(pairs: list[tuple[Path, ResultLog]]) -> str | None:
  return next((log.division for _, log in pairs if log.division), None)
