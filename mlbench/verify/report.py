"""What validate finds: a report per log, per benchmark folder and per system.

A log fails on the official checker's verdict or one of mlbench's FAIL
findings; a benchmark passes under olympic scoring with at most one failing
run (four for unet3d) and no failing package check; validate exits 1 when a
benchmark, the single log or a system description fails.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from mlbench.verify.checks import Finding, Severity
from mlbench.verify.submission import BenchmarkDir, Target

MAX_DROPPED = {"unet3d": 4}  # failing runs olympic scoring may drop (otherwise 1)


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
    return self.checker != "PASS" or any(f.severity is Severity.FAIL for f in self.findings)

  def first_problem(self) -> Finding | None:
    fails = [f for f in self.checker_findings + self.findings if f.severity is Severity.FAIL]
    return fails[0] if fails else None

  def to_json(self) -> dict[str, Any]:
    return {"path": str(self.path), "benchmark": self.benchmark, "ruleset": self.ruleset,
            "checker": self.checker, "verdict": "FAIL" if self.failed else "PASS",
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
    failing = sum(f.failed for f in self.files)
    return (failing <= MAX_DROPPED.get(self.bench.benchmark, 1)
            and not any(f.severity is Severity.FAIL for f in self.findings))

  def to_json(self) -> dict[str, Any]:
    return {"folder": str(self.bench.folder), "system": self.bench.system,
            "benchmark": self.bench.benchmark, "ruleset": self.ruleset, "ruleset_from": self.how,
            "verdict": "PASS" if self.passed else "FAIL",
            "failing_runs": sum(f.failed for f in self.files),
            "findings": [f.to_json() for f in self.findings],
            "files": [f.to_json() for f in self.files]}


@dataclasses.dataclass
class Report:
  target: Target
  files: list[FileReport]          # a single log's report
  benchmarks: list[BenchmarkReport]
  systems: list[tuple[Path, list[Finding]]]

  @property
  def exit_code(self) -> int:
    bad_systems = any(f.severity is Severity.FAIL for _, fs in self.systems for f in fs)
    if self.target.kind == "log":
      return int(self.files[0].failed or bad_systems)
    return int(bad_systems or not all(b.passed for b in self.benchmarks))

  def to_json(self) -> dict[str, Any]:
    return {"path": str(self.target.path), "kind": self.target.kind,
            "exit_code": self.exit_code, "files": [f.to_json() for f in self.files],
            "benchmarks": [b.to_json() for b in self.benchmarks],
            "systems": [{"path": str(p), "findings": [f.to_json() for f in fs]}
                        for p, fs in self.systems]}
