"""End to end through the real CLI: the Transformer mini run to its target, checked
officially.

Slow (a few minutes): trains for real on 8 simulated CPU devices. CI runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mlbench import compliance, config as config_lib, rules

pytestmark = pytest.mark.slow


def _log(path):
  return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in path.read_text().splitlines()
          if ":::MLLOG " in line]


def test_the_transformer_mini_run_reaches_its_target_with_a_compliant_log(mlbench, tmp_path):
  out = mlbench("run", "transformer", "--cpu-devices", "8", "--seed", "0", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  report = json.loads(out.stdout.strip())
  rule = rules.load("transformer", "mini")
  assert report["status"] == "success" and report["compliant"] is True
  assert report["eval_accuracy"] >= rule.quality.target
  log = tmp_path / report["log"]

  # The official checker, run here by the test itself, on the derived mini rules.
  config = compliance.checker_config(rule, config_lib.default_cache_dir())
  check = subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage",
                          "training", "--ruleset", "0.7.0", "--config", str(config), str(log)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
  assert check.returncode == 0 and "SUCCESS" in check.stdout + check.stderr

  lines = _log(log)
  logged = {d["key"]: d for d in lines}
  assert logged["submission_benchmark"]["value"] == "transformer"
  assert logged["max_sequence_length"]["metadata"]["method"] == "discard"
  assert logged["opt_adam_epsilon"]["value"] == 1e-9
  evals = [d for d in lines if d["key"] == "eval_accuracy"]
  assert [d["metadata"]["epoch_num"] for d in evals] == list(range(1, len(evals) + 1))
  assert evals[-1]["value"] >= rule.quality.target > max(d["value"] for d in evals[:-1])
