"""Helpers of the end-to-end tests: reading MLLOG lines, running the official checker, and a
mini run through the real CLI to its target."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml


def _lines(path):
  return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in path.read_text().splitlines()
          if ":::MLLOG " in line]


@pytest.fixture
def mllog_lines():
  """mllog_lines(path) -> the log's :::MLLOG records as dicts, in order."""
  return _lines


@pytest.fixture
def official_check(tmp_path):
  """official_check(log, rule): the official compliance checker, run here by the test
  itself as a user would, passes `log` under `rule` (derived checker rules for mlbench's
  own rulesets)."""
  from mlbench import compliance
  from mlbench.storage import paths

  def check(log, rule):
    config = compliance.checker_config(rule, paths.default_cache_dir())
    args = [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage",
            rule.checker_usage, "--ruleset", rule.checker_ruleset]
    args += ["--config", str(config)] if config else []
    out = subprocess.run([*args, str(log)], capture_output=True, text=True, cwd=tmp_path,
                         timeout=120)
    assert out.returncode == 0 and "SUCCESS" in out.stdout + out.stderr, out.stdout + out.stderr

  return check


@pytest.fixture
def budget_rule():
  """The ResNet-50 mini rules with the target at 0: a run ended by its budget, below the
  mini's target, is held by the official checker to every other rule."""
  from mlbench import rules

  rule = rules.load("resnet", "mini")
  return dataclasses.replace(rule, quality=dataclasses.replace(rule.quality, target=0.0))


def _required_keys(ruleset: str, *files: str) -> set[str]:
  from mlbench import compliance

  folder = compliance.checker_package_dir() / f"training_{ruleset}"
  out = set()
  for name in files:
    records = yaml.safe_load((folder / name).read_text())
    out |= {r["KEY"]["NAME"] for r in records
            if "KEY" in r and r["KEY"].get("REQ") == "EXACTLY_ONE"}
  return out


@pytest.fixture
def required_keys():
  """required_keys(ruleset, *files): every key the official checker of `ruleset` requires
  exactly once, in its rule files `files` (closed_bert.yaml, ...)."""
  return _required_keys


@dataclasses.dataclass(frozen=True)
class MiniRun:
  """A mini run that reached its target, and its checked log."""

  report: dict[str, Any]  # the run's JSON line
  rule: Any               # its mini rules
  lines: list[dict]       # the log's :::MLLOG records, in order
  stderr: str

  @property
  def logged(self) -> dict[str, Any]:
    """key -> value of the logged records (the last of a repeated key)."""
    return {d["key"]: d["value"] for d in self.lines}

  @property
  def evals(self) -> list[dict]:
    return [d for d in self.lines if d["key"] == "eval_accuracy"]

  def reached_only_at_the_end(self) -> bool:
    """The last evaluation reaches the target, no earlier one does."""
    q = self.rule.quality
    return q.reached(self.evals[-1]["value"]) and not any(q.reached(d["value"])
                                                          for d in self.evals[:-1])


@pytest.fixture
def mini_run(mlbench, tmp_path, official_check):
  """mini_run(workload, benchmark, *args, data_dir=None, timeout=900) -> MiniRun: `mlbench run`
  of the mini config on 8 simulated devices with seed 0, which must reach its target with a
  compliant log that the official checker, run here, passes under the mini rules."""
  from mlbench import rules

  def run(workload: str, benchmark: str, *args: str, data_dir: Path | None = None,
          timeout: float = 900) -> MiniRun:
    where = ["--data-dir", str(data_dir)] if data_dir else []
    out = mlbench("run", workload, "--cpu-devices", "8", *where, "--seed", "0", *args,
                  cwd=tmp_path, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip())
    rule = rules.load(benchmark, "mini")
    assert report["status"] == "success" and report["compliant"] is True
    assert rule.quality.reached(report["eval_accuracy"])
    log = tmp_path / report["log"]
    official_check(log, rule)
    return MiniRun(report, rule, _lines(log), out.stderr)

  return run
