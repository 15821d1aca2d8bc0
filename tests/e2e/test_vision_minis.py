"""The efficientnet and vit minis through the real CLI: to their targets on 8 simulated
devices from the digits resnet50's mini writes, logs that the official checker accepts
under the derived mini rules (modelled on ResNet's), and that `mlbench validate` passes.

Slow: each trains for real (about a minute on a quiet 2-core CPU). CI runs them.
"""

from __future__ import annotations

import json

import pytest

from mlbench import registry, rules

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("workload", ["efficientnet", "vit"])
def test_the_mini_reaches_its_target_with_a_log_validate_accepts(workload, mlbench, tmp_path,
                                                                 data_dir, mllog_lines):
  out = mlbench("run", workload, "--cpu-devices", "8", "--data-dir", str(data_dir),
                "--seed", "1", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  report = json.loads(out.stdout.strip())
  rule = rules.load(workload, "mini")
  assert report["status"] == "success" and report["compliant"] is True
  assert report["eval_accuracy"] >= rule.quality.target
  w = registry.get(workload)
  assert report["flops_per_example"] == w.flops_per_example(w.configs["mini"]())
  log = tmp_path / report["log"]
  assert log.parent.name == workload
  lines = mllog_lines(log)
  evals = [d for d in lines if d["key"] == "eval_accuracy"]
  every = rule.evaluation.every
  assert [d["metadata"]["epoch_num"] for d in evals] == [every * (i + 1) for i in range(len(evals))]
  assert [d["value"] for d in lines if d["key"] == "submission_benchmark"] == [workload]

  checked = mlbench("validate", "--json", str(log), cwd=tmp_path)
  assert checked.returncode == 0, checked.stderr[-2000:]
  [verdict] = json.loads(checked.stdout)["files"]
  assert verdict["ruleset"] == "mini" and verdict["checker"] == "PASS"
  assert [f for f in verdict["findings"] if f["severity"] != "INFO"] == []
