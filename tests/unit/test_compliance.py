"""The official compliance checker, run on logs written by MLLog, under our rules."""

from __future__ import annotations

import json

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


def test_derived_rules_differ_from_the_official_files_only_in_the_target(tmp_path):
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
  assert ours.replace(repr(mini.quality.target), "0.7590") == theirs


def test_derived_rules_are_reused(tmp_path):
  mini = rules.load("resnet", "mini")
  first = compliance.checker_config(mini, tmp_path)
  stamp = first.stat().st_mtime_ns
  assert compliance.checker_config(mini, tmp_path) == first
  assert first.stat().st_mtime_ns == stamp
  assert compliance.checker_config(rules.load("resnet", "4.0.0"), tmp_path) is None
