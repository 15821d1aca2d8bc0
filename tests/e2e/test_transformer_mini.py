"""End to end through the real CLI: the Transformer mini run to its target, checked
officially.

Slow (a few minutes): trains for real on 8 simulated CPU devices. CI runs it.
"""

from __future__ import annotations

import json

import pytest

from mlbench import rules

pytestmark = pytest.mark.slow


def test_the_transformer_mini_run_reaches_its_target_with_a_compliant_log(
    mlbench, tmp_path, mllog_lines, official_check):
  out = mlbench("run", "transformer", "--cpu-devices", "8", "--seed", "0", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  report = json.loads(out.stdout.strip())
  rule = rules.load("transformer", "mini")
  assert report["status"] == "success" and report["compliant"] is True
  assert report["eval_accuracy"] >= rule.quality.target
  log = tmp_path / report["log"]

  # The official checker, run here by the test itself, on the derived mini rules.
  official_check(log, rule)

  lines = mllog_lines(log)
  logged = {d["key"]: d for d in lines}
  assert logged["submission_benchmark"]["value"] == "transformer"
  assert logged["max_sequence_length"]["metadata"]["method"] == "discard"
  assert logged["opt_adam_epsilon"]["value"] == 1e-9
  evals = [d for d in lines if d["key"] == "eval_accuracy"]
  assert [d["metadata"]["epoch_num"] for d in evals] == list(range(1, len(evals) + 1))
  assert evals[-1]["value"] >= rule.quality.target > max(d["value"] for d in evals[:-1])
