"""Evaluation points from the rules' cadence, and the hyperparameters every log carries."""

from __future__ import annotations

import dataclasses

from mlbench.train import plan
from mlbench import rules
from mlbench.workload import Schedule


def _schedule(epochs, train=1437, gbs=128):
  return Schedule(global_batch_size=gbs, eval_batch_size=gbs, train_examples=train,
                  eval_examples=360, max_train_samples=int(round(epochs * train)))


def test_every_four_epochs_up_to_the_budget():
  rule = rules.load("resnet", "mini")
  points = plan.eval_points(_schedule(10), rule)
  # 4 epochs = 5748 samples = 44.9 steps of 128: evaluate after step 45 (the rules
  # allow rounding up to whole batches), log nominal epoch 4.
  assert [(p.step, p.epoch) for p in points] == [(45, 4), (90, 8), (113, 10.065)]
  assert points[0].samples == 45 * 128


def test_a_budget_on_a_cadence_point_is_not_evaluated_twice():
  rule = rules.load("resnet", "mini")
  points = plan.eval_points(_schedule(8), rule)
  assert [(p.step, p.epoch) for p in points] == [(45, 4), (90, 8)]


def test_samples_as_the_convergence_unit_logs_samples():
  rule = rules.load("resnet", "mini")
  rule = dataclasses.replace(rule, convergence_unit=rules.Unit.SAMPLES,
                             evaluation=rules.Evaluation(rules.Unit.SAMPLES, 1000))
  points = plan.eval_points(_schedule(1, train=3000, gbs=256), rule)
  assert [(p.step, p.epoch) for p in points] == [(4, 1024), (8, 2048), (12, 3072)]


def test_every_log_carries_the_harness_keys():
  assert plan.harness_hparams(_schedule(1)) == {
      "global_batch_size": 128, "train_samples": 1437, "eval_samples": 360,
      "gradient_accumulation_steps": 1}
