"""Benchmark rules as data: `rules/<ruleset>/<benchmark>.yaml` into frozen `Rule`s.

One file per ruleset and benchmark (`rules/training_4.0.0/resnet.yaml`,
`rules/mini/resnet.yaml`), validated against `rules/schema.json`. A file may
`extends:` another and override parts of it (the mini rules change only the
target). A benchmark of mlbench's own (`moe`) names the official benchmark its
rules are modelled on (`checker: {benchmark: gpt_oss_20b}`), whose checker
rules mlbench derives its logs' checker rules from; benchmarks MLPerf never had
(`efficientnet`, `vit`) have their papers' rules in the ruleset `rules/mlbench/`,
marked `official: false`. Nothing here is code in disguise: constraints are named
operators.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlbench.errors import UserError, choices

MINI = "mini"


class Direction(enum.Enum):
  HIGHER = "higher"
  LOWER = "lower"


class Unit(enum.Enum):
  EPOCHS = "epochs"
  SAMPLES = "samples"


@dataclasses.dataclass(frozen=True)
class Quality:
  """The quality target: `key` (an mllog key) must reach `target`."""

  key: str
  target: float
  direction: Direction

  def reached(self, value: float) -> bool:
    if math.isnan(value):
      return False
    return value >= self.target if self.direction is Direction.HIGHER else value <= self.target


class Policy(enum.Enum):
  """How strictly the cadence binds (the rules' wording changed after v0.7)."""

  EXACTLY = "exactly"    # "at the same frequency ... may be rounded up to the batch size"
  AT_LEAST = "at_least"  # "at least as frequently as"


@dataclasses.dataclass(frozen=True)
class Evaluation:
  """Evaluation cadence, in `unit` (epochs or training samples).

  Attributes:
    unit: what `every`, `at` and `max_offset` count.
    every: the interval, or {slope, intercept, floor_to}: an interval that
      depends on the global batch size (BERT since 1.0).
    at: explicit points first (SSD v0.7: epochs 40, 50, 55, ...); the regular
      interval resumes after the last of them.
    max_offset: all evaluations may come up to this much earlier (ResNet).
    policy: exactly, or at least this often.
  """

  unit: Unit
  every: float | Mapping[str, float]
  at: tuple[float, ...] = ()
  max_offset: float = 0.0
  policy: Policy = Policy.EXACTLY

  def interval(self, global_batch_size: int) -> float:
    if isinstance(self.every, Mapping):
      raw = self.every["slope"] * global_batch_size + self.every["intercept"]
      return math.floor(raw / self.every["floor_to"]) * self.every["floor_to"]
    return float(self.every)

  def points(self, global_batch_size: int, limit: float) -> list[float]:
    """Evaluation points up to `limit`, in `unit`, before any offset."""
    out = [p for p in self.at if p <= limit]
    step = self.interval(global_batch_size)
    p = (self.at[-1] if self.at else 0.0) + step
    while p <= limit + 1e-9:
      out.append(p)
      p += step
    return out


_CHECKS = {
    "eq": lambda v, x: v == x, "gt": lambda v, x: v > x, "ge": lambda v, x: v >= x,
    "lt": lambda v, x: v < x, "le": lambda v, x: v <= x, "in": lambda v, x: v in x,
    # Same tolerance as the official checker's is_integer().
    "multiple_of": lambda v, x: abs(round(v / x) - v / x) < 1e-5,
    "power_of_two_times": lambda v, x: v > 0 and abs(round(math.log2(v / x)) - math.log2(v / x)) < 1e-5,
    "elements": lambda v, x: len(v) >= len(x) and all(
        c is None or _violation(c, e, "") is None for c, e in zip(x, v)),
}


def _violation(check: Mapping[str, Any], value: Any, key: str,
               logged: Mapping[str, Any] | None = None) -> str | None:
  for op, arg in check.items():
    try:
      if op == "total_with":  # value + another logged key's value == a total
        ok = logged is None or value + logged[arg["key"]] == arg["eq"]
      else:
        ok = _CHECKS[op](value, arg)
    except (TypeError, ValueError, ZeroDivisionError, KeyError):
      ok = False
    if not ok:
      return f"{key}={value!r} must satisfy {op} {arg!r}"
  return None


@dataclasses.dataclass(frozen=True)
class Hyperparameter:
  """A key the log must carry (if `when` matches), and the values it may take.

  `metadata` holds checks on fields of the logged line's metadata (the
  transformer's max_sequence_length names its `method`).
  """

  key: str
  when: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  check: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  metadata: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)

  def applies(self, hparams: Mapping[str, Any]) -> bool:
    return all(hparams.get(k) == v for k, v in self.when.items())

  def violation(self, value: Any, metadata: Mapping[str, Any] | None = None,
                logged: Mapping[str, Any] | None = None) -> str | None:
    """None if `value` (and its line's metadata) satisfy every check, else the rule.

    `logged` (every logged key's value) is what checks across keys (`total_with`)
    compare with; without it they pass.
    """
    msg = _violation(self.check, value, self.key, logged)
    if msg or metadata is None:
      return msg
    for field, check in self.metadata.items():
      if field not in metadata:
        return f"{self.key} must carry metadata '{field}'"
      if msg := _violation(check, metadata[field], f"{self.key} metadata {field}"):
        return msg
    return None


@dataclasses.dataclass(frozen=True)
class Rule:
  """The rules of one benchmark under one ruleset."""

  ruleset: str
  benchmark: str
  checker_usage: str
  checker_ruleset: str
  checker_benchmark: str  # the official benchmark the checker rules come from
  quality: Quality
  evaluation: Evaluation
  convergence_unit: Unit
  runs: int
  init_limit_minutes: Mapping[str, float]
  hyperparameters: tuple[Hyperparameter, ...]
  source: Path
  # "converged": train_samples is the samples trained to the target, logged at the
  # end (BERT); "dataset": the training set's size, logged with the hyperparameters.
  train_samples: str = "dataset"
  marked_official: bool = True  # False: no MLPerf round published these (`official: false`)

  @property
  def official(self) -> bool:
    """An MLPerf round's rules, which the official tools know (not mini, not mlbench's own)."""
    return self.ruleset != MINI and self.marked_official

  @property
  def modelled(self) -> bool:
    """A benchmark of mlbench's own, checked with rules derived from an official one's."""
    return self.checker_benchmark != self.benchmark

  def required_keys(self, hparams: Mapping[str, Any]) -> list[str]:
    return [h.key for h in self.hyperparameters if h.applies(hparams)]

  def problems(self, hparams: Mapping[str, Any], *, closed: bool) -> list[str]:
    """What makes `hparams` (the logged hyperparameters) break these rules.

    Missing required keys are always problems (the log would fail the checker);
    value constraints bind the closed division only.
    """
    from mlbench.workload import unpack

    out = []
    plain = {k: unpack(v)[0] for k, v in hparams.items()}
    for h in self.hyperparameters:
      if not h.applies(plain):
        continue
      if h.key not in hparams:
        out.append(f"{h.key} is required but not logged")
      elif closed and (msg := h.violation(*unpack(hparams[h.key]), logged=plain)):
        out.append(msg)
    return out


def rules_dir() -> Path:
  """The folder holding the rule files.

  `$MLBENCH_RULES_DIR` if set; else the copy packed into a wheel
  (`mlbench/_rules`); else `rules/` of a source checkout.
  """
  env = os.environ.get("MLBENCH_RULES_DIR")
  if env:
    return Path(env)
  here = Path(__file__).resolve().parent
  packed = here / "_rules"
  return packed if packed.is_dir() else here.parent / "rules"


def _is_round(ruleset: str) -> bool:  # '4.0.0', not a name (mini, mlbench)
  return re.fullmatch(r"\d+(\.\d+)*", ruleset) is not None


def _folder(ruleset: str) -> str:
  return f"training_{ruleset}" if _is_round(ruleset) else ruleset


def rulesets(benchmark: str, only: Sequence[str] = ()) -> list[str]:
  """Rulesets that have rules for `benchmark`: MLPerf rounds newest first (only those in
  `only`, a workload's `rulesets`, if given), then named ones (`mlbench`), then mini."""
  found = []
  for d in rules_dir().iterdir():
    if (d / f"{benchmark}.yaml").is_file():
      found.append(d.name.removeprefix("training_"))
  rounds = sorted((r for r in found if _is_round(r) and (not only or r in only)),
                  key=lambda r: tuple(int(p) for p in r.split(".")), reverse=True)
  named = sorted(r for r in found if not _is_round(r) and r != MINI)
  return rounds + named + ([MINI] if MINI in found else [])


def default_ruleset(benchmark: str, config_name: str, only: Sequence[str] = ()) -> str:
  """Mini configs follow the mini rules; every other config the newest official ones
  (of `only`, a workload's `rulesets`, if given)."""
  available = rulesets(benchmark, only)
  if not available:
    raise UserError(f"no rules for benchmark '{benchmark}' in {rules_dir()}; add "
                    f"rules/<ruleset>/{benchmark}.yaml")
  if config_name == MINI and MINI in available:
    return MINI
  official = [r for r in available if r != MINI]
  return official[0] if official else available[0]


def load(benchmark: str, ruleset: str) -> Rule:
  """Loads and validates the rules of `benchmark` under `ruleset`."""
  path = rules_dir() / _folder(ruleset) / f"{benchmark}.yaml"
  if not path.is_file():
    raise UserError(f"no {ruleset} rules for benchmark '{benchmark}'; choose --ruleset "
                    f"from: {choices(rulesets(benchmark)) or '(none)'}")
  stat = path.stat()
  return _load(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _load(path: Path, mtime_ns: int, size: int) -> Rule:
  """Built once per version of the file: validate reads every log's (0.2 s a schema check)."""
  doc = _resolve(path)
  _validate(doc, path)
  return _build(doc, path)


def find(benchmark: str | None, ruleset: str) -> Rule | None:
  """The rules of `benchmark` under `ruleset` if mlbench has them, else None."""
  if not benchmark or not (rules_dir() / _folder(ruleset) / f"{benchmark}.yaml").is_file():
    return None
  return load(benchmark, ruleset)


def checker_ruleset(benchmark: str | None, ruleset: str) -> str:
  """The official ruleset the MLPerf tools use for logs of `ruleset` (mini: the one it extends)."""
  rule = find(benchmark, ruleset)
  return rule.checker_ruleset if rule is not None else ruleset


def _resolve(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
  import yaml  # Deferred: keeps `mlbench --help` fast.

  if path in seen:
    raise UserError(f"rule file {path} extends itself through {seen}")
  with open(path) as f:
    doc = yaml.safe_load(f) or {}
  parent = doc.pop("extends", None)
  if parent is None:
    return doc
  return _merge(_resolve(rules_dir() / parent, seen + (path,)), doc)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
  out = dict(base)
  for k, v in over.items():
    out[k] = _merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
  return out


@functools.cache
def _schema() -> dict[str, Any]:
  return json.loads((rules_dir() / "schema.json").read_text())


def _validate(doc: dict[str, Any], path: Path) -> None:
  import jsonschema

  try:
    jsonschema.validate(doc, _schema())
  except jsonschema.ValidationError as e:
    where = "/".join(str(p) for p in e.absolute_path) or "(top level)"
    raise UserError(f"rule file {path} is invalid at {where}: {e.message}") from None


def _build(doc: dict[str, Any], path: Path) -> Rule:
  q, ev = doc["quality"], doc["evaluation"]
  every = ev["every"] if isinstance(ev["every"], dict) else float(ev["every"])
  evaluation = Evaluation(Unit(ev["unit"]), every, tuple(float(a) for a in ev.get("at", ())),
                          float(ev.get("max_offset", 0)), Policy(ev.get("policy", "exactly")))
  return Rule(
      ruleset=str(doc["ruleset"]),
      benchmark=doc["benchmark"],
      checker_usage=doc["checker"]["usage"],
      checker_ruleset=str(doc["checker"]["ruleset"]),
      checker_benchmark=doc["checker"].get("benchmark", doc["benchmark"]),
      quality=Quality(q["key"], float(q["target"]), Direction(q["direction"])),
      evaluation=evaluation,
      convergence_unit=Unit(doc["convergence_unit"]),
      runs=int(doc["runs"]),
      init_limit_minutes={k: float(v) for k, v in doc["init_limit_minutes"].items()},
      hyperparameters=tuple(Hyperparameter(h["key"], h.get("when", {}), h.get("check", {}),
                                           h.get("metadata", {}))
                            for h in doc["hyperparameters"]),
      source=path,
      train_samples=doc.get("train_samples", "dataset"),
      marked_official=bool(doc.get("official", True)),
  )
