"""End to end through the real CLI: the gpt_oss_20b mini run to its target, expert parallel
(2 x 4 on 8 simulated CPU devices: the dropless MoE's all-to-alls), checked by the official
compliance checker under the mini rules.

Slow (a minute or two on a 2-core CPU): trains for real. CI runs it. Expert parallelism
equal to one device is the dropless layer's own test (tests/workloads/test_dropless_moe.py).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_the_gpt_oss_mini_run_reaches_its_target_with_a_compliant_log(mini_run, gpt_oss_data_dir,
                                                                      required_keys):
  run = mini_run("gpt_oss_20b", "gpt_oss_20b", "--mesh", "data=2,expert=4",
                 data_dir=gpt_oss_data_dir)
  logged = run.logged
  assert required_keys("6.1.0", "common.yaml", "closed_common.yaml",
                       "closed_gpt_oss_20b.yaml") - {"submission_benchmark"} <= set(logged)
  assert logged["submission_benchmark"] == "gpt_oss_20b"
  assert (logged["expert_parallelism"], logged["tensor_parallelism"],
          logged["micro_batch_size"]) == (4, 1, 1)
  assert (logged["opt_adamw_beta_2"], logged["opt_gradient_clip_norm"]) == (0.95, 1.0)
  # train_samples: the samples the dataset is built for, before run_start (primus_mllog).
  assert logged["train_samples"] == logged["max_steps"] * logged["global_batch_size"]
  every = run.rule.evaluation.interval(logged["global_batch_size"])
  assert [d["metadata"]["samples_count"] for d in run.evals] == [every * (i + 1)
                                                                  for i in range(len(run.evals))]
  assert run.reached_only_at_the_end()
  # Layer 0 slides (32 keys back), layer 1 sees everything, in both programs.
  sites = {(d["metadata"]["program"], d["metadata"]["site"]) for d in run.lines
           if d["key"] == "mlbench_attention"}
  for program in ("train step", "eval step"):
    assert sum("sliding window 32" in s for p, s in sites if p == program) == 1
    assert sum("sliding" not in s for p, s in sites if p == program) == 1
