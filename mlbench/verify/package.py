"""The package checks of validate: what the official package_checker checks per
benchmark folder (result count, unique seeds, reference convergence points, the
benchmark being one of the round's), and each system description.

The official RCP and system-description checkers run in isolated workers
(`mlbench.verify.official`); the seed checker's rules are applied to the logs validate
read (`mlbench.verify.rcp`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from mlbench import rules as rules_lib
from mlbench.errors import UserError
from mlbench.resultlog import ResultLog
from mlbench.verify import official, rcp as rcp_lib, submission
from mlbench.verify.checks import RANDOM_NUMBERS, Finding, Severity
from mlbench.verify.report import FileReport
from mlbench.verify.submission import BenchmarkDir

# mlcommons/policies submission_rules.adoc, the directory structure of a submission.
SUBMISSION_LAYOUT = "submission_rules.adoc, Directory structure (systems/<system_desc_id>.json)"


def load_system(path: Path | None) -> tuple[dict[str, Any] | None, list[Finding]]:
  """A system description, and a FAIL finding when it is missing or unreadable."""
  desc, problem = submission.read_system(path)
  if problem and path is not None and not path.exists():
    problem += (f"; a package describes every system of its results/ in systems/ (the "
                f"official package checker stops on the missing {path.name})")
  return desc, [Finding("system", Severity.FAIL, problem, rule=SUBMISSION_LAYOUT)] if problem \
      else []


def _params(bench: BenchmarkDir) -> set[str]:
  """package_checker_params lines at the system and benchmark level.

  Raises:
    UserError: such a file is not UTF-8 text (what it allows cannot be known).
  """
  out = set()
  for folder in (bench.folder.parent, bench.folder):
    f = folder / "package_checker_params"
    if f.is_file():
      out |= {line.strip() for line in submission.read_text(f).splitlines() if line.strip()}
  return out


def _expected_runs(bench: BenchmarkDir, ruleset: str) -> int | None:
  rule = rules_lib.find(bench.benchmark, ruleset)
  if rule is not None:
    return rule.runs
  from mlperf_logging.benchmark_meta import get_result_file_counts

  return get_result_file_counts("training").get(bench.benchmark)


def skipped(bench: BenchmarkDir, ruleset: str, usage: str) -> Finding | None:
  """A WARN finding when the official package checker skips this folder ("Skipping
  benchmark": its name is no benchmark of the round) and judges none of its logs."""
  rule = rules_lib.find(bench.benchmark, ruleset)
  if ruleset == rules_lib.MINI or (rule is not None and not rule.official):
    return None  # mlbench's own rules: `_allowed` judges the name
  from mlperf_logging.benchmark_meta import get_allowed_benchmarks

  try:
    names = get_allowed_benchmarks(usage, ruleset)
  except ValueError:
    return None  # `_allowed` fails it
  if bench.benchmark in names:
    return None
  return Finding("benchmark", Severity.WARN, f"'{bench.benchmark}' is not a {ruleset} benchmark "
                 f"(known: {', '.join(sorted(set(names)))}); like the official package checker, "
                 "validate skips this folder and judges none of its logs")


def _allowed(bench: BenchmarkDir, ruleset: str, usage: str) -> list[Finding]:
  rule = rules_lib.find(bench.benchmark, ruleset)
  if ruleset == rules_lib.MINI or (rule is not None and not rule.official):
    ok = rule is not None  # mini, or mlbench's own rules of a benchmark MLPerf never had
    allowed = f"the benchmarks in rules/{ruleset}"
  else:
    from mlperf_logging.benchmark_meta import get_allowed_benchmarks

    try:
      names = get_allowed_benchmarks(usage, ruleset)
    except ValueError as e:
      return [Finding("benchmark", Severity.FAIL, str(e))]
    ok, allowed = bench.benchmark in names, ", ".join(sorted(set(names)))
  return [] if ok else [Finding("benchmark", Severity.FAIL, f"'{bench.benchmark}' is not a "
                                f"{ruleset} benchmark (known: {allowed})")]


def _blocked(files: list[FileReport]) -> str | None:
  """Why the official package tools cannot be run on these logs: they parse every
  log as the compliance checker does, so what stalled or would stall it stalls them."""
  for f in files:
    first = f.checker_findings[0] if f.checker_findings else None
    timed_out = f.checker == "ERROR" and first is not None and "timed out" in first.message
    if f.checker == "NOT RUN" or timed_out:
      line = f" (line {first.lineno})" if first is not None and first.lineno else ""
      return (f"not run: the official checker {'timed out' if timed_out else 'was not run'} on "
              f"{f.path.name}{line}, and these tools parse it the same way")
  return None


@dataclasses.dataclass
class Pending:
  """One benchmark folder's package checks: what is known without the official RCP
  checker, and the call to make of it (None: not made). (Not `Plan`: that is a run's.)"""

  out: list[Finding]
  rcp: tuple | None = None  # (logs, usage, ruleset, bypass) for rcp.rcps
  tools_from: int | None = None  # where the seed and RCP findings start in `out`, if made


def plan(bench: BenchmarkDir, ruleset: str, division: str | None, usage: str,
         logs: list[ResultLog]) -> Pending:
  """The package checks of one benchmark folder, from its logs alone (`finish` adds what
  the official checker's verdicts on them change)."""
  out = _allowed(bench, ruleset, usage)
  expected = _expected_runs(bench, ruleset)
  if expected is not None and len(bench.files) != expected:
    out.append(Finding("runs", Severity.FAIL, f"{len(bench.files)} result_*.txt files, the "
                       f"rules want exactly {expected}"))
  tool_rs = rules_lib.checker_ruleset(bench.benchmark, ruleset)
  if division != "closed" or tool_rs not in official.RULESETS_WITH_PACKAGE_CHECKS or out:
    return Pending(out)
  try:
    params = _params(bench)
  except UserError as e:
    return Pending(out + [Finding("params", Severity.FAIL, f"{e}; it lists the package "
                                  "checker's options, one per line (rcp-bypass, "
                                  "seed-checker-bypass)")])
  todo = Pending(out, tools_from=len(out))
  if "seed-checker-bypass" not in params and (errors := rcp_lib.seed_errors(logs)):
    out.append(Finding("seeds", Severity.FAIL, "seed checker failed: " + "; ".join(errors),
                       rule=RANDOM_NUMBERS))
  rule = rules_lib.find(bench.benchmark, ruleset)
  if rule is not None and not rule.official:
    out.append(Finding("rcp", Severity.INFO, f"not checked: the {ruleset} rules have no "
                       "reference convergence points"))
  elif bench.benchmark != "minigo":
    todo.rcp = (logs, usage, tool_rs, "rcp-bypass" in params)
  return todo


def finish(pending: Pending, files: list[FileReport], rcp: official.Outcome | None
           ) -> list[Finding]:
  """A folder's package findings, given the official checker's verdict on each log
  (`files`) and the RCP checker's outcome (None where not asked for)."""
  if pending.tools_from is not None and (why := _blocked(files)):
    return pending.out[:pending.tools_from] + [
        Finding("seeds", Severity.FAIL, f"seed and RCP checkers {why}")]
  return pending.out + ([rcp_finding(rcp)] if pending.rcp and rcp is not None else [])


def findings(bench: BenchmarkDir, ruleset: str, division: str | None, usage: str,
             tools: official.Isolated, files: list[FileReport],
             logs: list[ResultLog] | None = None) -> list[Finding]:
  """The package checks of one benchmark folder (`plan` and `finish` for one)."""
  logs = logs if logs is not None else [ResultLog.read(f) for f in bench.files]
  todo = plan(bench, ruleset, division, usage, logs)
  rcp = rcp_lib.rcps(tools, [todo.rcp])[0] if todo.rcp else None
  return finish(todo, files, rcp)


def rcp_finding(result: official.Outcome) -> Finding:
  """The RCP checker's outcome as validate reports it: a failure unless it passed."""
  if result.error:
    return Finding("rcp", Severity.FAIL, f"RCP checker failed: {result.error}")
  r = result.value
  severity = Severity.INFO if r["passed"] else Severity.FAIL
  return Finding("rcp", severity, f"{r['message']} (score scaling {r['factor']:.6g})")


def systems(package: Path, ruleset: str, usage: str, systems_used: set[str],
            tools: official.Isolated, *,
            only_used: bool = False) -> list[tuple[Path, list[Finding]]]:
  """Each system description of `package` (only those its results use, with
  `only_used`), read and judged by the official system-description checker."""
  out = []
  folder = package / "systems"
  names = systems_used if only_used else {p.stem for p in folder.glob("*.json")} | systems_used
  for name in sorted(names):
    path = folder / f"{name}.json"
    desc, findings = load_system(path)
    if desc is not None and ruleset in official.RULESETS_WITH_PACKAGE_CHECKS:
      result = tools.call(official._tool_system, str(path), usage, ruleset)
      if result.error or not result.value:
        why = result.error or "; ".join(m.split(" - ", 1)[-1] for m in result.messages
                                        if m.startswith("ERROR"))
        findings.append(Finding("system", Severity.FAIL, f"system description checker: {why}"))
    out.append((path, findings))
  return out


