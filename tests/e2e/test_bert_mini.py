"""End to end through the real CLI: the BERT mini run to its target, checked officially.

Slow (a few minutes): trains for real on 8 simulated CPU devices. CI runs it.
"""

from __future__ import annotations

import json

import pytest
import yaml

from mlbench import compliance, rules

pytestmark = pytest.mark.slow


def _official_required_keys():
  folder = compliance.checker_package_dir() / "training_4.0.0"
  records = yaml.safe_load((folder / "closed_bert.yaml").read_text())
  return {r["KEY"]["NAME"] for r in records if r["KEY"].get("REQ") == "EXACTLY_ONE"}


def test_the_bert_mini_run_reaches_its_target_with_a_compliant_log(
    mlbench, tmp_path, bert_data_dir, mllog_lines, official_check):
  out = mlbench("run", "bert", "--cpu-devices", "8", "--data-dir", str(bert_data_dir),
                "--seed", "0", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  report = json.loads(out.stdout.strip())
  rule = rules.load("bert", "mini")
  assert report["status"] == "success" and report["compliant"] is True
  assert report["eval_accuracy"] >= rule.quality.target
  log = tmp_path / report["log"]

  # The official checker, run here by the test itself, on the derived mini rules.
  official_check(log, rule)

  lines = mllog_lines(log)
  logged = {d["key"]: d["value"] for d in lines}
  assert _official_required_keys() <= set(logged)
  assert logged["submission_benchmark"] == "bert" and logged["opt_lamb_beta_1"] == 0.9
  # Samples-based epoch_num at the mini rules' cadence, as the checker expects for BERT.
  evals = [d for d in lines if d["key"] == "eval_accuracy"]
  every = rule.evaluation.interval(logged["global_batch_size"])
  assert [d["metadata"]["epoch_num"] for d in evals] == [every * (i + 1) for i in range(len(evals))]
  assert evals[-1]["value"] >= rule.quality.target > max(d["value"] for d in evals[:-1])
  # train_samples: the samples trained to the target, logged once before run_stop, as the
  # reference implementations log it (tests/data/mlperf-results/v4.0/Dell/.../bert/
  # result_0.txt: train_samples 2548645 = the last eval_accuracy's epoch_num).
  samples = [i for i, d in enumerate(lines) if d["key"] == "train_samples"]
  stop = next(i for i, d in enumerate(lines) if d["key"] == "run_stop")
  assert len(samples) == 1 and samples[0] < stop
  assert lines[samples[0]]["value"] == evals[-1]["metadata"]["epoch_num"] == report["samples"]
