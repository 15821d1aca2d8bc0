"""The official compliance checker, run on logs written by MLLog, under our rules."""

from __future__ import annotations

import json

import pytest
import yaml

from mlbench import compliance, rules


def test_the_mini_threshold_is_the_only_difference(tmp_path, write_log):
  mini, official = rules.load("resnet", "mini"), rules.load("resnet", "4.0.0")
  log = write_log(tmp_path / "a.txt", [0.5, 0.9])  # above 0.759, below the mini target
  assert compliance.check_log(log, official, tmp_path).passed
  verdict = compliance.check_log(log, mini, tmp_path)
  assert not verdict.passed
  assert "--config" in verdict.command and "Failed checks for eval_accuracy" in verdict.output
  log = write_log(tmp_path / "b.txt", [0.5, 0.9, mini.quality.target + 0.005])
  assert compliance.check_log(log, mini, tmp_path).passed


def test_a_missing_required_key_fails_the_check(tmp_path, write_log):
  mini = rules.load("resnet", "mini")
  log = write_log(tmp_path / "a.txt", [0.99], drop=("lars_opt_weight_decay",))
  verdict = compliance.check_log(log, mini, tmp_path)
  assert not verdict.passed
  assert "lars_opt_weight_decay" in verdict.output


def test_derived_rules_differ_from_the_official_files_only_in_the_quality_check(tmp_path):
  """The target, and the sanity bound that rejects a perfect score, made inclusive."""
  mini = rules.load("resnet", "mini")
  derived = compliance.checker_config(mini, tmp_path).parent.parent
  official = compliance.checker_package_dir()
  differences = []
  for folder in sorted(derived.iterdir()):
    for f in sorted(folder.glob("*.yaml")):
      ours = f.read_text().replace(f"{derived.resolve()}/", "")
      theirs = (official / folder.name / f.name).read_text()
      a = yaml.load(ours, Loader=yaml.BaseLoader)
      b = yaml.load(theirs, Loader=yaml.BaseLoader)
      if a != b:
        differences.append((folder.name, f.name, json.dumps(a) , json.dumps(b)))
  assert [(d[0], d[1]) for d in differences] == [("training_4.0.0", "closed_resnet.yaml")]
  ours, theirs = differences[0][2], differences[0][3]
  assert ours.replace(repr(mini.quality.target), "0.7590").replace("<=", "<") == theirs


def test_derived_rules_are_reused(tmp_path):
  mini = rules.load("resnet", "mini")
  first = compliance.checker_config(mini, tmp_path)
  stamp = first.stat().st_mtime_ns
  assert compliance.checker_config(mini, tmp_path) == first
  assert first.stat().st_mtime_ns == stamp
  assert compliance.checker_config(rules.load("resnet", "4.0.0"), tmp_path) is None


MINIS = ("resnet50", "efficientnet", "vit", "bert", "ssd", "transformer", "llama31_8b", "moe",
         "gpt_oss_20b")


def _perfect_log(path, workload: str, *, ruleset: str = "mini"):
  """A mini run's log as the loop writes it (its plan on 8 devices, the loop's setup
  records) that reaches a perfect score at its first evaluation: accuracy, mAP or BLEU
  1.0, a log perplexity of 0. Returns (path, the plan's rule)."""
  import jax

  from mlbench.config import RunConfig
  from mlbench.mllog import MLLog
  from mlbench.train import loop
  from mlbench.train.plan import make_plan
  from mlbench.train.runtime import Runtime

  devices = jax.devices()[:8]
  plan = make_plan(RunConfig(workload=workload, ruleset=ruleset, results_dir=path.parent),
                   Runtime(0, 1, devices, devices))
  perfect = 1.0 if plan.rule.quality.direction is rules.Direction.HIGHER else 0.0
  point = plan.points[0]
  log = MLLog(path)
  log.cache_clear(False)
  log.init_start()
  loop._log_setup(plan, 3, log)
  log.init_stop()
  log.run_start()
  log.block_start(1, point.epoch, 0)
  log.eval_start(point.epoch, point.samples)
  log.eval_result(plan.rule.quality.key, perfect, point.epoch, point.samples)
  log.eval_stop(point.epoch, point.samples)
  log.block_stop(1, point.samples)
  if plan.rule.train_samples == "converged":
    log.event("train_samples", point.samples)
  log.run_stop(True)
  log.close()
  return path, plan.rule


@pytest.mark.parametrize("workload", MINIS)
def test_every_mini_accepts_a_perfect_score(tmp_path, workload):
  """A perfect score is a value a mini's small held-out set allows (a run reached 1.0 on
  the digits): the derived checker rules accept it, where the official bounds reject it
  as a broken evaluation of the full dataset."""
  log, rule = _perfect_log(tmp_path / "perfect.txt", workload)
  verdict = compliance.check_log(log, rule, tmp_path)
  assert verdict.passed, verdict.failures()
  if workload == "resnet50":
    official, _ = _perfect_log(tmp_path / "official.txt", workload, ruleset="4.0.0")
    verdict = compliance.check_log(official, rules.load("resnet", "4.0.0"), tmp_path)
    assert not verdict.passed and "v['value'] < 1.0" in "".join(verdict.failures())
