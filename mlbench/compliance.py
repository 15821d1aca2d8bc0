"""Runs the official MLPerf compliance checker on our logs, under our rules.

For an official ruleset the checker's own rules apply unchanged. For the mini
ruleset we derive checker rules from the official ones of the ruleset it
extends: the same files with the quality threshold replaced, written to a cache
folder with absolute `enqueue_config` paths (the checker resolves a relative
`--config` against its own package folder). The derived rules therefore require
exactly the keys and constraints of the official ones and differ only in the
target and, for the mini rules, in the quality check's sanity bounds, made inclusive
(a perfect score on a mini's small held-out set is a result, not a broken evaluation:
`< 1.0` becomes `<= 1.0`); `python -m mlperf_logging.compliance_checker --config <derived>` checks
a mini log with the unmodified official tool.

A benchmark of mlbench's own (`moe`) is modelled on an official one
(`Rule.checker_benchmark`, e.g. gpt_oss_20b): the derived rules accept its name
as `submission_benchmark`, and its `closed_<benchmark>.yaml` and
`open_<benchmark>.yaml` are the official benchmark's files with our target and
with our constraints on the keys our rule file lists (each official value check
of such a key is replaced by ours, or dropped where ours has none; keys the
official file lacks are added as required). Keys of the ruleset's common files
keep their official checks. A mini ruleset that states its own hyperparameter list
(llama31_8b's, which frees the keys pinning the reference's 8,192-token scale) gets
the same treatment of the official benchmark's files, under their own names.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from mlbench import rules as rules_lib
from mlbench.storage import paths
from mlbench.errors import UserError

_ENQUEUE = "enqueue_config('"
# Part of the derived rules' cache key: a change to how they are derived gets new files
# (2: the mini rules' sanity bounds made inclusive).
_DERIVATION = "2"
_THRESHOLD = {rules_lib.Direction.HIGHER: r"(>=\s*)([0-9.eE+-]+)",
              rules_lib.Direction.LOWER: r"(<=\s*)([0-9.eE+-]+)"}


def checker_package_dir() -> Path:
  """The installed `mlperf_logging/compliance_checker` folder."""
  spec = importlib.util.find_spec("mlperf_logging.compliance_checker")
  if spec is None or not spec.submodule_search_locations:
    raise UserError("mlperf-logging is not installed; `pip install mlperf-logging`")
  return Path(list(spec.submodule_search_locations)[0])


def checker_config(rule: rules_lib.Rule, cache_dir: Path) -> Path | None:
  """The `--config` file the checker needs for `rule`; None for official rules."""
  if rule.official:
    return None
  base = rules_lib.find(rule.checker_benchmark, rule.checker_ruleset)
  parts = [rule.benchmark, rule.checker_ruleset, repr(rule.quality),
           metadata.version("mlperf-logging"), _DERIVATION]
  constrained = rule.modelled or _relaxed(rule, base)
  if constrained:
    parts += [rule.checker_benchmark, repr(rule.hyperparameters)]
  root = cache_dir / "checker" / f"{rule.ruleset}-{rule.benchmark}-{_digest('|'.join(parts))}"
  if not root.is_dir():
    _derive(rule, None if base is None else base.quality.target, root, constrained=constrained)
  return root / f"{rule.checker_usage}_{rule.checker_ruleset}" / "common.yaml"


def _relaxed(rule: rules_lib.Rule, base: rules_lib.Rule | None) -> bool:
  """A mini ruleset that states its own hyperparameter constraints (llama31_8b's frees the
  keys that pin the reference's scale) instead of inheriting the official ones."""
  return base is not None and base.hyperparameters != rule.hyperparameters


def _digest(text: str) -> str:
  return hashlib.sha256(text.encode()).hexdigest()[:12]


def _derive(rule: rules_lib.Rule, official_target: float | None, root: Path, *,
            constrained: bool = False) -> None:
  """Writes the derived rule files under `root`, atomically.

  `official_target` picks the threshold to replace; None (mlbench has no rules
  of the official benchmark) replaces the quality check's only threshold. With
  `constrained`, the benchmark's files carry our rule's hyperparameter checks.
  """
  import yaml

  if "'" in str(root.resolve()):
    raise UserError(f"the cache folder {root} contains a quote; set MLBENCH_CACHE_DIR elsewhere")
  src = checker_package_dir()
  root.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=".tmp-"))
  absolute = str(root.resolve())
  replaced = 0
  for folder in src.iterdir():
    if not re.fullmatch(rf"{rule.checker_usage}_\d+\.\d+\.\d+", folder.name):
      continue
    (tmp / folder.name).mkdir()
    ours = folder.name.endswith(f"_{rule.checker_ruleset}")
    common = _common_keys(folder) if ours and constrained else set()
    for f in folder.glob("*.yaml"):
      text = f.read_text().replace(_ENQUEUE, f"{_ENQUEUE}{absolute}/")
      name = f.name
      if ours and f.stem in (f"closed_{rule.checker_benchmark}", f"open_{rule.checker_benchmark}"):
        records = yaml.load(text, Loader=yaml.BaseLoader) or []
        replaced += _retarget(records, rule, official_target)
        if rule.modelled:  # Ours is a copy under our name; the official file stays as is.
          (tmp / folder.name / name).write_text(text)
          name = name.replace(rule.checker_benchmark, rule.benchmark, 1)
        if constrained:
          _constrain(records, rule, common, closed=f.stem.startswith("closed_"))
        text = yaml.safe_dump(records, sort_keys=False, width=1000)
      elif ours and rule.modelled:
        records = yaml.load(text, Loader=yaml.BaseLoader) or []
        if _accept(records, rule):
          text = yaml.safe_dump(records, sort_keys=False, width=1000)
      (tmp / folder.name / name).write_text(text)
  if replaced == 0:
    shutil.rmtree(tmp)
    raise UserError(f"could not find the {rule.checker_benchmark} quality target "
                    f"{official_target or ''} in the {rule.checker_ruleset} checker rules; "
                    "is mlperf-logging too new?")
  try:
    os.rename(tmp, root)
  except OSError:  # Another process derived the same rules first.
    shutil.rmtree(tmp)


def _keys(records: list) -> list[dict]:
  """The bodies of a checker file's KEY records."""
  return [r["KEY"] for r in records if isinstance(r, dict) and isinstance(r.get("KEY"), dict)]


def _retarget(records: list, rule: rules_lib.Rule, official_target: float | None) -> int:
  """Replaces the official threshold in the quality key's ATLEAST_ONE_CHECK."""
  pattern = _THRESHOLD[rule.quality.direction]
  count = 0
  for body in _keys(records):
    if body.get("NAME") != rule.quality.key or "ATLEAST_ONE_CHECK" not in body:
      continue
    check = body["ATLEAST_ONE_CHECK"]
    found = [m for m in re.finditer(pattern, check)
             if official_target is None or abs(float(m.group(2)) - official_target) < 1e-9]
    if len(found) != 1:
      continue
    m = found[0]
    check = check[:m.start(2)] + repr(rule.quality.target) + check[m.end(2):]
    mini = rule.ruleset == rules_lib.MINI
    body["ATLEAST_ONE_CHECK"] = _closed_bounds(check) if mini else check
    count += 1
  return count


def _closed_bounds(check: str) -> str:
  """The quality check with its strict sanity bounds made inclusive (`< 1.0` -> `<= 1.0`,
  `> 0.0` -> `>= 0.0`). The official ones reject a perfect score (a top-1 accuracy of 1.0
  on ImageNet, a log perplexity of 0 on C4) as a broken evaluation; on a mini's small,
  easy held-out set (540 digits) a perfect score is a legitimate result of the run."""
  return re.sub(r"v\['value'\]\s*([<>])(?!=)\s*", r"v['value'] \1= ", check)


# Our named operators as the checker's Python expressions (same semantics).
_EXPRESSIONS = {"eq": "v['value'] == {!r}", "gt": "v['value'] > {!r}",
                "ge": "v['value'] >= {!r}", "lt": "v['value'] < {!r}",
                "le": "v['value'] <= {!r}", "in": "v['value'] in {!r}",
                "multiple_of": "is_integer(v['value'] / {!r})"}


def _expression(h: rules_lib.Hyperparameter) -> str:
  """A hyperparameter's checks as one checker CHECK expression ('' for none)."""
  unsupported = sorted(set(h.check) - set(_EXPRESSIONS))
  if h.when or h.metadata or unsupported:
    raise UserError(f"cannot write the rule for {h.key} as a checker check (conditions, "
                    f"metadata or {unsupported} are not supported for a modelled benchmark)")
  return " and ".join(_EXPRESSIONS[op].format(arg) for op, arg in h.check.items())


def _common_keys(folder: Path) -> set[str]:
  """Keys the ruleset's common files check, whatever the benchmark."""
  import yaml

  out = set()
  for f in folder.glob("*common.yaml"):
    out |= {b.get("NAME") for b in _keys(yaml.load(f.read_text(), Loader=yaml.BaseLoader) or [])}
  return out


def _constrain(records: list, rule: rules_lib.Rule, common: set[str], *, closed: bool) -> None:
  """Gives the keys our rule lists our checks (official ones replaced, or dropped where
  ours has none; the open division gets none; a key's official POST that enqueues more
  checker files for its value goes with its check), and adds the keys the official
  benchmark file lacks, unless a common file checks them."""
  ours = {h.key: h for h in rule.hyperparameters}
  check = _expression if closed else (lambda h: "")
  seen = set()
  for body in _keys(records):
    h = ours.get(body.get("NAME"))
    if h is None:
      continue
    seen.add(h.key)
    body.pop("CHECK", None)
    if "enqueue_config" in body.get("POST", ""):  # ResNet's opt_name -> closed_resnet_<opt>
      body.pop("POST")
    if expr := check(h):
      body["CHECK"] = expr
  for h in rule.hyperparameters:
    if h.key not in seen and h.key not in common:
      body = {"NAME": h.key, "REQ": "EXACTLY_ONE"}
      if expr := check(h):
        body["CHECK"] = expr
      records.append({"KEY": body})


def _accept(records: list, rule: rules_lib.Rule) -> int:
  """Adds our benchmark name wherever the official one is an accepted submission_benchmark."""
  official, ours = f"'{rule.checker_benchmark}'", f"'{rule.benchmark}'"
  count = 0
  for body in _keys(records):
    if body.get("NAME") == "submission_benchmark" and official in body.get("CHECK", ""):
      body["CHECK"] = body["CHECK"].replace(official, f"{official}, {ours}")
      count += 1
  return count


def checker_args(path: Path, benchmark: str | None, ruleset: str,
                 usage: str = "training") -> tuple[str, str, str, str | None]:
  """(log, usage, ruleset, config) for the checker; mini logs get the derived config."""
  rule = rules_lib.find(benchmark, ruleset)
  if rule is not None and not rule.official:
    config = checker_config(rule, paths.default_cache_dir())
    return (str(path), rule.checker_usage, rule.checker_ruleset, str(config))
  return (str(path), usage, ruleset, None)


@dataclasses.dataclass(frozen=True)
class CheckResult:
  """The official checker's verdict on one log."""

  passed: bool
  command: str
  output: str

  def failures(self) -> list[str]:
    """The checker's error lines, for a short report."""
    lines = [ln.strip() for ln in self.output.splitlines()]
    return [ln for ln in lines if ln.startswith(("ERROR", "WARNING")) or "failed" in ln.lower()]


def check_log(log: Path, rule: rules_lib.Rule, cache_dir: Path,
              timeout_s: float = 300) -> CheckResult:
  """Runs `python -m mlperf_logging.compliance_checker` on `log` in a subprocess.

  A subprocess keeps the checker's global state, root-logger output and
  `compliance_checker.log` side file out of this process, and a hang or crash
  inside it becomes a failed check instead of a failed run.
  """
  config = checker_config(rule, cache_dir)
  args = ["-m", "mlperf_logging.compliance_checker", "--usage", rule.checker_usage,
          "--ruleset", rule.checker_ruleset]
  if config is not None:
    args += ["--config", str(config)]
  args.append(str(Path(log).resolve()))
  shown = " ".join(["python", *args])
  with tempfile.TemporaryDirectory() as tmp:
    full = [sys.executable, *args[:-1], "--log_output", os.path.join(tmp, "checker.log"), args[-1]]
    try:
      proc = subprocess.run(full, capture_output=True, text=True, timeout=timeout_s, cwd=tmp)
    except subprocess.TimeoutExpired:
      return CheckResult(False, shown, f"the checker did not finish in {timeout_s:.0f} s")
  output = proc.stdout + proc.stderr
  passed = proc.returncode == 0 and "SUCCESS" in output
  return CheckResult(passed, shown, output)
