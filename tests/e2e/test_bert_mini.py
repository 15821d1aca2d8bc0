"""End to end through the real CLI: the BERT mini run to its target, checked officially,
its sequences packed (the full config's default; the mini's own default trains padded,
which the golden losses and the contract tests cover).

Slow (a few minutes): trains for real on 8 simulated CPU devices. CI runs it.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_the_bert_mini_run_reaches_its_target_with_a_compliant_log(mini_run, bert_data_dir,
                                                                   required_keys):
  # 64 sequences a step in ceil(64 / 1.02) rows, rounded up to split over the 8 devices:
  # 64 rows, the short sequences sharing some and leaving others empty.
  run = mini_run("bert", "bert", "--set", "data.max_sequences_per_row=3", "--set",
                 "data.packing_factor=1.02", data_dir=bert_data_dir)
  lines, logged, evals = run.lines, run.logged, run.evals
  assert required_keys("4.0.0", "closed_bert.yaml") <= set(logged)
  assert logged["submission_benchmark"] == "bert" and logged["opt_lamb_beta_1"] == 0.9
  # Samples-based epoch_num at the mini rules' cadence, as the checker expects for BERT.
  every = run.rule.evaluation.interval(logged["global_batch_size"])
  assert [d["metadata"]["epoch_num"] for d in evals] == [every * (i + 1) for i in range(len(evals))]
  assert run.reached_only_at_the_end()
  # train_samples: the samples trained to the target, logged once before run_stop, as the
  # reference implementations log it (tests/data/mlperf-results/v4.0/Dell/.../bert/
  # result_0.txt: train_samples 2548645 = the last eval_accuracy's epoch_num).
  samples = [i for i, d in enumerate(lines) if d["key"] == "train_samples"]
  stop = next(i for i, d in enumerate(lines) if d["key"] == "run_stop")
  assert len(samples) == 1 and samples[0] < stop
  assert lines[samples[0]]["value"] == evals[-1]["metadata"]["epoch_num"] == run.report["samples"]
  # Which implementation each attention ran on, and why: XLA on this CPU, for both programs.
  used = [d for d in lines if d["key"] == "mlbench_attention"]
  assert {(d["metadata"]["program"], d["value"]) for d in used} == {("train step", "xla"),
                                                                    ("eval step", "xla")}
  assert all(d["metadata"]["reason"] == "no fused attention kernel on cpu" for d in used)
  # Packed, and said so: the step's sequences (the logged global_batch_size) in its rows.
  packing = [d for d in lines if d["key"] == "mlbench_packing"]
  assert len(packing) == 1 and logged["global_batch_size"] == 64
  assert packing[0]["metadata"]["rows_per_step"] == 64 == packing[0]["metadata"][
      "sequences_per_step"] and packing[0]["metadata"]["max_sequences_per_row"] == 3
