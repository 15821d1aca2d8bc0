"""End to end through the real CLI: the MoE mini run to its target, checked officially.

Slow (a few minutes): trains for real on 8 simulated CPU devices, data parallel
and expert parallel. CI runs it.
"""

from __future__ import annotations

import json

import pytest
import yaml

from mlbench import compliance, rules

pytestmark = pytest.mark.slow

ROUTING = ("moe_dropped_tokens", "moe_dropped_assignments", "moe_load_max_over_mean",
           "moe_aux_loss", "moe_z_loss")


@pytest.fixture(scope="session")
def moe_data_dir(_cache_dir):
  """The MoE mini dataset (pydoc sequences), generated once per session."""
  from workloads.moe import WORKLOAD, config

  path = _cache_dir / "data"
  WORKLOAD.input.prepare(config.mini(), path)
  return path


def _official_required_keys():
  """Every key the 6.1.0 checker requires exactly once of a gpt_oss_20b log."""
  folder = compliance.checker_package_dir() / "training_6.1.0"
  out = set()
  for name in ("common.yaml", "closed_common.yaml", "closed_gpt_oss_20b.yaml"):
    records = yaml.safe_load((folder / name).read_text())
    out |= {r["KEY"]["NAME"] for r in records if "KEY" in r and r["KEY"].get("REQ") == "EXACTLY_ONE"}
  return out


@pytest.mark.parametrize("mesh", [None, "data=2,expert=4"], ids=["data8", "data2-expert4"])
def test_the_moe_mini_run_reaches_its_target_with_a_compliant_log(
    mlbench, tmp_path, moe_data_dir, mesh, mllog_lines, official_check):
  out = mlbench("run", "moe", "--cpu-devices", "8", "--data-dir", str(moe_data_dir),
                "--seed", "0", *(["--mesh", mesh] if mesh else []), cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  report = json.loads(out.stdout.strip())
  rule = rules.load("moe", "mini")
  assert report["status"] == "success" and report["compliant"] is True
  assert report["eval_accuracy"] <= rule.quality.target
  assert set(ROUTING) <= set(report["train_metrics"])
  assert 0 <= report["train_metrics"]["moe_dropped_assignments"] < 0.2
  assert 1 <= report["train_metrics"]["moe_load_max_over_mean"] < 2
  log = tmp_path / report["log"]

  # The official checker, run here by the test itself, on the derived rules.
  official_check(log, rule)

  lines = mllog_lines(log)
  logged = {d["key"]: d["value"] for d in lines}
  assert _official_required_keys() - {"submission_benchmark"} <= set(logged)
  assert logged["submission_benchmark"] == "moe" and logged["moe_aux_loss_coeff"] == 0.01
  assert logged["expert_parallelism"] == (4 if mesh else 1)
  # Log perplexity at the samples cadence of the rules, lower is better.
  evals = [d for d in lines if d["key"] == "eval_accuracy"]
  every = rule.evaluation.interval(logged["global_batch_size"])
  assert [d["metadata"]["samples_count"] for d in evals] == [every * (i + 1)
                                                              for i in range(len(evals))]
  assert evals[-1]["value"] <= rule.quality.target < min(d["value"] for d in evals[:-1])
