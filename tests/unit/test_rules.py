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


def official_requirements(rule: rules.Rule, opt_name: str) -> dict[str, str | None]:
  """{key: CHECK expression or None} the closed checker requires for `opt_name`."""
  files = [(rule.ruleset, "closed_common.yaml"), (rule.ruleset, f"closed_{rule.benchmark}.yaml")]
  files += _enqueued(_official(*files[1]), "opt_name", opt_name)
  required = {}
  for ruleset, name in files:
    for r in _official(ruleset, name):
      if r.get("REQ", "").startswith(("EXACTLY_ONE", "AT_LEAST")):
        required[r["NAME"]] = r.get("CHECK")
  return {k: v for k, v in required.items() if k not in STRUCTURAL}


def official_rules():
  return [(b, r) for b in ("resnet",) for r in rules.rulesets(b) if r != rules.MINI]


def _samples(check: dict) -> list:
  out = []
  for op, arg in check.items():
    if op == "in":
      out += list(arg) + ["adam", "other"]
    else:
      out += [arg * f for f in (1, 2, 0.5, 3, 1.5, 1.000001, -1)] + [0]
  return out


def _official_check(expr: str, value) -> bool:
  scope = {"math": math, "is_integer": mlp_compliance.is_integer}
  try:
    return bool(eval(expr.strip(), scope, {"v": {"value": value, "metadata": {}}}))
  except (TypeError, ValueError, ZeroDivisionError):
    return False


@pytest.mark.parametrize("benchmark, ruleset", official_rules())
def test_required_keys_and_constraints_match_the_official_checker(benchmark, ruleset):
  rule = rules.load(benchmark, ruleset)
  opt = next(h for h in rule.hyperparameters if h.key == "opt_name")
  for opt_name in opt.check["in"]:
    official = official_requirements(rule, opt_name)
    ours = {h.key: h for h in rule.hyperparameters if h.applies({"opt_name": opt_name})}
    assert set(ours) == set(official), (opt_name, set(ours) ^ set(official))
    for key, expr in official.items():
      if expr is None:
        assert not ours[key].check, f"{key}: we constrain what the checker does not"
        continue
      assert ours[key].check, f"{key}: the checker requires {expr!r}, we check nothing"
      for value in _samples(ours[key].check):
        assert (ours[key].violation(value) is None) == _official_check(expr, value), (key, value)


@pytest.mark.parametrize("benchmark, ruleset", official_rules())
def test_target_runs_and_init_limit_match_the_official_tools(benchmark, ruleset):
  rule = rules.load(benchmark, ruleset)
  quality = next(r for r in _official(ruleset, f"closed_{benchmark}.yaml")
                 if r["NAME"] == rule.quality.key and "ATLEAST_ONE_CHECK" in r)
  target = float(re.search(r">=\s*([0-9.]+)", quality["ATLEAST_ONE_CHECK"]).group(1))
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
