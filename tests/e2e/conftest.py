"""Helpers of the end-to-end tests: reading MLLOG lines, running the official checker."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


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
  from mlbench import compliance, config as config_lib

  def check(log, rule):
    config = compliance.checker_config(rule, config_lib.default_cache_dir())
    args = [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage",
            rule.checker_usage, "--ruleset", rule.checker_ruleset]
    args += ["--config", str(config)] if config else []
    out = subprocess.run([*args, str(log)], capture_output=True, text=True, cwd=tmp_path,
                         timeout=120)
    assert out.returncode == 0 and "SUCCESS" in out.stdout + out.stderr, out.stdout + out.stderr

  return check
