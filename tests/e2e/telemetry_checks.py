"""What a real mini run leaves for TensorBoard: scalars beside its log and, with
`--profile 5:3`, a trace of steps 5-7. Checked on the uninterrupted one-epoch run of
test_preemption (a run of its own would cost the suite another ResNet-50 mini start)."""

from __future__ import annotations

from pathlib import Path

import pytest


def check_scalars_and_trace(cwd: Path, report: dict, stderr: str) -> None:
  """`report`: the run's JSON line; one epoch of the ResNet-50 mini, whole steps of 64."""
  import jax
  import tensorflow as tf
  from tensorboard.backend.event_processing import event_accumulator as ea

  board = cwd / report["tensorboard"]
  assert board.parent.parent.parent.parent == cwd / "results" / "runs"
  assert f"TensorBoard: scalars and a trace of steps 5-7 in {report['tensorboard']}" in stderr

  # TensorBoard's own loader reads the scalars back, at the step of the evaluation.
  acc = ea.EventAccumulator(str(board), size_guidance={ea.TENSORS: 0})
  acc.Reload()
  got = {tag: [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]
         for tag in acc.Tags()["tensors"]}
  assert {"train/loss", "eval/eval_accuracy", "perf/samples_per_s", "perf/mfu",
          "perf/input_wait_fraction"} <= set(got)
  steps = report["samples"] // 64  # The evaluation is logged at the last step trained.
  assert steps == 19 and report["samples"] == 1216
  assert got["eval/eval_accuracy"] == [(steps, pytest.approx(report["eval_accuracy"]))]
  assert got["train/loss"][0][1] == pytest.approx(report["train_metrics"]["loss"], rel=1e-5)
  assert got["perf/samples_per_s"][0][1] > 0 and 0 < got["perf/mfu"][0][1] < 1
  assert 0 <= got["perf/input_wait_fraction"][0][1] < 1

  # The trace lies where TensorBoard's profile plugin looks for runs, and parses as an
  # XSpace with the three traced steps named.
  [trace] = board.glob("plugins/profile/*/*.xplane.pb")
  space = jax.profiler.ProfileData.from_file(str(trace))
  steps = {e.name for p in space.planes for line in p.lines for e in line.events
           if e.name == "train"}
  assert steps == {"train"}
  numbers = sorted({int(dict(e.stats).get("step_num", -1)) for p in space.planes
                    for line in p.lines for e in line.events if e.name == "train"})
  assert numbers == [5, 6, 7]
