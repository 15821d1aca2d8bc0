"""End to end through the real CLI: the MoE mini run to its target, checked officially.

Slow (a few minutes): trains for real on 8 simulated CPU devices, expert parallel (2 x 4).
The data-parallel mesh trains the same numbers (tests/workloads/test_moe.py,
test_expert_parallel_training_follows_single_device_training), so one run to the target
covers both. CI runs it.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

ROUTING = ("moe_dropped_tokens", "moe_dropped_assignments", "moe_load_max_over_mean",
           "moe_aux_loss", "moe_z_loss")


def test_the_moe_mini_run_reaches_its_target_with_a_compliant_log(mini_run, moe_data_dir,
                                                                  required_keys):
  run = mini_run("moe", "moe", "--mesh", "data=2,expert=4", data_dir=moe_data_dir)
  metrics = run.report["train_metrics"]
  assert set(ROUTING) <= set(metrics)
  assert 0 <= metrics["moe_dropped_assignments"] < 0.2
  assert 1 <= metrics["moe_load_max_over_mean"] < 2
  logged = run.logged
  assert required_keys("6.1.0", "common.yaml", "closed_common.yaml",
                       "closed_gpt_oss_20b.yaml") - {"submission_benchmark"} <= set(logged)
  assert logged["submission_benchmark"] == "moe" and logged["moe_aux_loss_coeff"] == 0.01
  assert logged["expert_parallelism"] == 4
  # Log perplexity at the samples cadence of the rules, lower is better.
  every = run.rule.evaluation.interval(logged["global_batch_size"])
  assert [d["metadata"]["samples_count"] for d in run.evals] == [every * (i + 1)
                                                                  for i in range(len(run.evals))]
  assert run.reached_only_at_the_end()
