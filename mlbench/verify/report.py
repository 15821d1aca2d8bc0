"""What validate finds: a report per log, per benchmark folder and per system.

A log fails on the official checker's verdict or one of mlbench's FAIL
findings; a benchmark passes under olympic scoring with at most one failing
run (four for unet3d) and no failing package check; validate exits 1 when a
benchmark, the single log or a system description fails. The strict verdict
(`--strict`) takes every WARN finding for a FAIL; the report carries both, and the
exit code follows the one asked for.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from mlbench.verify.checks import Finding, Severity
from mlbench.verify.submission import BenchmarkDir, Target

MAX_DROPPED = {"unet3d": 4}  # failing runs olympic scoring may drop (otherwise 1)


def _bad(findings: list[Finding], strict: bool) -> bool:
  """Whether these findings fail: a FAIL does; under the strict verdict a WARN does too."""
  return any(f.severity is Severity.FAIL or (strict and f.severity is Severity.WARN)
             for f in findings)


def _warnings(findings: list[Finding]) -> int:
  return sum(f.severity is Severity.WARN for f in findings)


@dataclasses.dataclass
class FileReport:
  """One log: the official checker's verdict and mlbench's findings."""

  path: Path
  benchmark: str | None
  ruleset: str
  checker: str  # PASS, FAIL, ERROR (it crashed or hung) or NOT RUN (it would have)
  checker_findings: list[Finding]
  findings: list[Finding]

  @property
  def failed(self) -> bool:
    return self.fails()

  def fails(self, strict: bool = False) -> bool:
    return self.checker != "PASS" or _bad(self.findings, strict)

  def first_problem(self, strict: bool = False) -> Finding | None:
    fails = [f for f in self.checker_findings + self.findings if _bad([f], strict)]
    return fails[0] if fails else None

  def to_json(self) -> dict[str, Any]:
    return {"path": str(self.path), "benchmark": self.benchmark, "ruleset": self.ruleset,
            "checker": self.checker, "verdict": "FAIL" if self.failed else "PASS",
            "strict_verdict": "FAIL" if self.fails(strict=True) else "PASS",
            "warnings": _warnings(self.findings),
            "checker_findings": [f.to_json() for f in self.checker_findings],
            "findings": [f.to_json() for f in self.findings]}


@dataclasses.dataclass
class BenchmarkReport:
  """The runs of one benchmark on one system, judged as MLPerf would score them."""

  bench: BenchmarkDir
  ruleset: str
  how: str
  files: list[FileReport]
  findings: list[Finding]

  @property
  def passed(self) -> bool:
    return self.passes()

  def passes(self, strict: bool = False) -> bool:
    """Under olympic scoring; under the strict verdict no run may fail (a warning is no
    reason to drop a run) and no package check may warn."""
    failing = sum(f.fails(strict) for f in self.files)
    if strict and failing:
      return False
    return (failing <= MAX_DROPPED.get(self.bench.benchmark, 1)
            and not _bad(self.findings, strict))

  def to_json(self) -> dict[str, Any]:
    return {"folder": str(self.bench.folder), "system": self.bench.system,
            "benchmark": self.bench.benchmark, "ruleset": self.ruleset, "ruleset_from": self.how,
            "verdict": "PASS" if self.passed else "FAIL",
            "strict_verdict": "PASS" if self.passes(strict=True) else "FAIL",
            "failing_runs": sum(f.failed for f in self.files),
            "findings": [f.to_json() for f in self.findings],
            "files": [f.to_json() for f in self.files]}


@dataclasses.dataclass
class Report:
  target: Target
  files: list[FileReport]          # a single log's report
  benchmarks: list[BenchmarkReport]
  systems: list[tuple[Path, list[Finding]]]
  strict: bool = False  # the verdict asked for: the exit code follows it

  def fails(self, strict: bool) -> bool:
    bad_systems = any(_bad(fs, strict) for _, fs in self.systems)
    if self.target.kind == "log":
      return self.files[0].fails(strict) or bad_systems
    return bad_systems or not all(b.passes(strict) for b in self.benchmarks)

  @property
  def exit_code(self) -> int:
    return int(self.fails(self.strict))

  def to_json(self) -> dict[str, Any]:
    every = [f for b in self.benchmarks for f in b.findings + [x for r in b.files
                                                              for x in r.findings]]
    every += [f for r in self.files for f in r.findings] + [f for _, fs in self.systems
                                                            for f in fs]
    return {"path": str(self.target.path), "kind": self.target.kind,
            "exit_code": self.exit_code, "strict": self.strict,
            "verdict": "FAIL" if self.fails(False) else "PASS",
            "strict_verdict": "FAIL" if self.fails(True) else "PASS",
            "warnings": _warnings(every), "files": [f.to_json() for f in self.files],
            "benchmarks": [b.to_json() for b in self.benchmarks],
            "systems": [{"path": str(p), "findings": [f.to_json() for f in fs]}
                        for p, fs in self.systems]}
