"""Our rule files against the official mlperf-logging checker and benchmark_meta.

For every official ruleset and benchmark we ship, the required hyperparameter
keys, their value constraints, the quality target, the run count and the
untimed-init limit must be what the installed checker enforces.
"""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import yaml
from mlperf_logging.benchmark_meta import get_result_file_counts
from mlperf_logging.compliance_checker import mlp_compliance

from mlbench import compliance, rules
from mlbench.errors import UserError

# Keys every log carries for the harness's structure, not as hyperparameters.
STRUCTURAL = {"submission_benchmark", "eval_accuracy"}


def _official(ruleset: str, name: str) -> list[dict]:
  path = compliance.checker_package_dir() / f"training_{ruleset}" / name
  return [r["KEY"] for r in yaml.load(path.read_text(), Loader=yaml.BaseLoader) if "KEY" in r]


def _enqueued(records: list[dict], key: str, value: str) -> list[tuple[str, str]]:
  """(ruleset, file) that a key's POST enqueues for `value`."""
  out = []
  for r in records:
    if r["NAME"] == key and "POST" in r:
      for target in re.findall(r"enqueue_config\('([^']+)'", r["POST"]):
        folder, _, name = target.format(value).partition("/")
        out.append((folder.removeprefix("training_"), name))
  return out


def official_requirements(rule: rules.Rule, variant: dict) -> dict[str, object]:
  """{key: CHECK expression(s) or None} the closed checker requires for one variant
  (values of the keys that select further rule files, like resnet's opt_name)."""
  files = [(rule.ruleset, "closed_common.yaml"), (rule.ruleset, f"closed_{rule.benchmark}.yaml")]
  for key, value in variant.items():
    files += _enqueued(_official(*files[1]), key, value)
  required = {}
  for ruleset, name in files:
    for r in _official(ruleset, name):
      if r.get("REQ", "").startswith(("EXACTLY_ONE", "AT_LEAST")):
        required[r["NAME"]] = r.get("CHECK")
  return {k: v for k, v in required.items() if k not in STRUCTURAL}


def variants(rule: rules.Rule) -> list[dict]:
  """Every combination of the values our `when` conditions select on."""
  keys = sorted({k for h in rule.hyperparameters for k in h.when})
  if not keys:
    return [{}]
  assert len(keys) == 1, "extend variants() for rules that select on several keys"
  choices = next(h.check["in"] for h in rule.hyperparameters if h.key == keys[0])
  return [{keys[0]: c} for c in choices]


def official_rules():
  """Every MLPerf round's rules we ship (not mini, not mlbench's own unofficial ones)."""
  return [(b, r) for b in sorted({p.stem for p in rules.rules_dir().glob("*/*.yaml")})
          for r in rules.rulesets(b) if r != rules.MINI and rules.load(b, r).official]


def _samples(check: dict) -> list:
  out = []
  for op, arg in check.items():
    if op == "in":
      out += list(arg) + ["adam", "other"]
    elif op == "elements":
      columns = [_samples(c) if c else [43] for c in arg]
      width = max(len(c) for c in columns)
      out += [[c[i % len(c)] for c in columns] for i in range(width)] + [[], [1]]
    elif op == "total_with":  # the partner key is logged as PARTNER (see _partners)
      out += [arg["eq"] - PARTNER + d for d in (0, 1, -1, PARTNER)] + [arg["eq"], "other"]
    elif isinstance(arg, (int, float)):
      out += [arg * f for f in (1, 2, 0.5, 3, 1.5, 1.000001, -1)] + [0, arg + 1, arg - 1]
    else:
      out += [arg, "other"]
  return out


PARTNER = 128


def _partners(h: rules.Hyperparameter) -> dict:
  """The logged values of the keys a cross-key check compares with (the checker's `s`)."""
  return {arg["key"]: PARTNER for op, arg in h.check.items() if op == "total_with"}


def _metadata_samples(h: rules.Hyperparameter) -> list[dict]:
  out = [{}]
  for field, check in h.metadata.items():
    out += [{field: m} for m in _samples(check)]
  return out


def _official_check(expr, value, metadata, state=None) -> bool:
  scope = {"math": math, "is_integer": mlp_compliance.is_integer}
  exprs = expr if isinstance(expr, list) else [expr]
  try:
    return all(eval(e.strip(), scope, {"v": {"value": value, "metadata": metadata},
                                       "s": state or {}})
               for e in exprs)
  except (TypeError, ValueError, ZeroDivisionError, KeyError, IndexError):
    return False


@pytest.mark.parametrize("benchmark, ruleset", official_rules())
def test_required_keys_and_constraints_match_the_official_checker(benchmark, ruleset):
  rule = rules.load(benchmark, ruleset)
  for variant in variants(rule):
    official = official_requirements(rule, variant)
    ours = {h.key: h for h in rule.hyperparameters if h.applies(variant)}
    assert set(ours) == set(official), (variant, set(ours) ^ set(official))
    for key, expr in official.items():
      h = ours[key]
      if expr is None:
        assert not h.check and not h.metadata, f"{key}: we constrain what the checker does not"
        continue
      assert h.check or h.metadata, f"{key}: the checker requires {expr!r}, we check nothing"
      for value in _samples(h.check):
        for metadata in _metadata_samples(h):
          state = _partners(h)
          ours_ok = h.violation(value, metadata if h.metadata else None, logged=state) is None
          assert ours_ok == _official_check(expr, value, metadata, state), (key, value, metadata)


@pytest.mark.parametrize("benchmark, ruleset", official_rules())
def test_target_runs_and_init_limit_match_the_official_tools(benchmark, ruleset):
  rule = rules.load(benchmark, ruleset)
  quality = next(r for r in _official(ruleset, f"closed_{benchmark}.yaml")
                 if r["NAME"] == rule.quality.key and "ATLEAST_ONE_CHECK" in r)
  target = float(re.search(r"[<>]=\s*([0-9.]+)", quality["ATLEAST_ONE_CHECK"]).group(1))
  assert rule.quality.target == pytest.approx(target)
  assert rule.runs == get_result_file_counts("training")[benchmark]
  common = {r["NAME"]: r for r in _official(ruleset, "common.yaml")}
  post = common["submission_division"].get("POST", "")
  m = re.search(r"compile_time_mins'\] = (\d+) if v\['value'\] == 'open' else (\d+)", post)
  if m:
    limits = {"open": float(m.group(1)), "closed": float(m.group(2))}
  else:
    minutes = float(re.search(r"\((\d+)\*60\*1e3\)", " ".join(common["init_stop"]["CHECK"])).group(1))
    limits = {"open": minutes, "closed": minutes}
  assert dict(rule.init_limit_minutes) == limits


def test_mini_rules_are_the_4_0_0_rules_with_another_target():
  mini, official = rules.load("resnet", "mini"), rules.load("resnet", "4.0.0")
  assert mini.quality.target != official.quality.target
  same = dataclasses.replace(mini, ruleset=official.ruleset, source=official.source,
                             quality=official.quality)
  assert same == official


def test_defaults_and_errors():
  assert rules.default_ruleset("resnet", "mini") == "mini"
  assert rules.default_ruleset("resnet", "full") == "4.0.0"
  assert rules.rulesets("resnet") == ["4.0.0", "0.7.0", "mini"]
  with pytest.raises(UserError, match="no 9.9.9 rules for benchmark 'resnet'; choose --ruleset "
                                      "from: 0.7.0, 4.0.0, mini"):
    rules.load("resnet", "9.9.9")


def test_a_rule_file_that_breaks_the_schema_is_refused(tmp_path, monkeypatch):
  (tmp_path / "mini").mkdir()
  (tmp_path / "schema.json").write_text((rules.rules_dir() / "schema.json").read_text())
  (tmp_path / "mini" / "resnet.yaml").write_text(
      "ruleset: mini\nbenchmark: resnet\ncheckr: {usage: training, ruleset: '4.0.0'}\n")
  monkeypatch.setenv("MLBENCH_RULES_DIR", str(tmp_path))
  rules._schema.cache_clear()
  try:
    with pytest.raises(UserError, match="is invalid at"):
      rules.load("resnet", "mini")
  finally:
    rules._schema.cache_clear()


def test_quality_direction():
  q = rules.Quality("eval_accuracy", 0.75, rules.Direction.HIGHER)
  assert q.reached(0.75) and not q.reached(0.7499) and not q.reached(float("nan"))
  q = rules.Quality("eval_accuracy", 3.34, rules.Direction.LOWER)
  assert q.reached(3.3) and not q.reached(3.35)


def test_cadence_shapes_of_the_rule_families():
  bert = rules.load("bert", "4.0.0").evaluation
  # FLOOR(0.05*(230.23*GBS+3e6), 25000): the v4.0 Dell (768) and NVIDIA (4608) batches.
  assert (bert.interval(768), bert.interval(4608), bert.interval(8192)) == (150000, 200000, 225000)
  assert bert.points(4608, 650000) == [200000, 400000, 600000]
  ssd = rules.load("ssd", "0.7.0").evaluation
  assert ssd.points(256, 90) == [40, 50, 55, 60, 65, 70, 75, 80, 85, 90]
  assert ssd.policy is rules.Policy.AT_LEAST
  assert rules.load("resnet", "4.0.0").evaluation.policy is rules.Policy.EXACTLY


def test_hyperparameter_metadata_is_checked_as_the_checker_does():
  from mlbench.workload import WithMetadata

  rule = rules.load("transformer", "0.7.0")
  base = {"global_batch_size": 4096, "opt_name": "adam", "opt_base_learning_rate": 2.0,
          "opt_learning_rate_warmup_steps": 1000, "opt_adam_beta_1": 0.9,
          "opt_adam_beta_2": 0.98, "opt_adam_epsilon": 1e-9}
  ok = {**base, "max_sequence_length": WithMetadata(256, {"method": "discard"})}
  assert rule.problems(ok, closed=True) == []
  plain = rule.problems({**base, "max_sequence_length": 256}, closed=True)
  assert plain == ["max_sequence_length must carry metadata 'method'"]
  bad = rule.problems({**base, "max_sequence_length": WithMetadata(256, {"method": "pad"})},
                      closed=True)
  assert len(bad) == 1 and "metadata method" in bad[0]


def test_bert_logs_train_samples_as_samples_to_converge():
  # NVIDIA's reference-derived BERT logs train_samples = samples trained to the target,
  # just before run_stop (tests/data/mlperf-results/v4.0/Dell/.../bert/result_0.txt);
  # the RCP checker reads it so with --rcp-bert-train-samples.
  from mlbench import rules as rules_lib

  assert rules_lib.load("bert", "4.0.0").train_samples == "converged"
  assert rules_lib.load("bert", "mini").train_samples == "converged"
  assert rules_lib.load("resnet", "4.0.0").train_samples == "dataset"
  # And llama31_8b, as the reference's MLPerfCallback (small_llm_pretraining/nemo
  # callbacks.py L198-202): global_step * global_batch_size at the end of training.
  assert rules_lib.load("llama31_8b", "6.0.0").train_samples == "converged"
  assert rules_lib.load("llama31_8b", "mini").train_samples == "converged"
