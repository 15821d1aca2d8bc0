"""Runs the official MLPerf compliance checker on our logs, under our rules.

For an official ruleset the checker's own rules apply unchanged. For the mini
ruleset we derive checker rules from the official ones of the ruleset it
extends: the same files with the quality threshold replaced, written to a cache
folder with absolute `enqueue_config` paths (the checker resolves a relative
`--config` against its own package folder). The derived rules therefore require
exactly the keys and constraints of the official ones and differ only in the
target; `python -m mlperf_logging.compliance_checker --config <derived>` checks
a mini log with the unmodified official tool.
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
from mlbench.errors import UserError

_ENQUEUE = "enqueue_config('"
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
  base = rules_lib.load(rule.benchmark, rule.checker_ruleset)
  key = "|".join([rule.benchmark, rule.checker_ruleset, repr(rule.quality),
                  metadata.version("mlperf-logging")])
  root = cache_dir / "checker" / f"{rule.ruleset}-{rule.benchmark}-{_digest(key)}"
  if not root.is_dir():
    _derive(rule, base, root)
  return root / f"{rule.checker_usage}_{rule.checker_ruleset}" / "common.yaml"


def _digest(text: str) -> str:
  return hashlib.sha256(text.encode()).hexdigest()[:12]


def _derive(rule: rules_lib.Rule, base: rules_lib.Rule, root: Path) -> None:
  """Writes the derived rule files under `root`, atomically."""
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
    for f in folder.glob("*.yaml"):
      text = f.read_text().replace(_ENQUEUE, f"{_ENQUEUE}{absolute}/")
      if (folder.name.endswith(f"_{rule.checker_ruleset}")
          and f.stem in (f"closed_{rule.benchmark}", f"open_{rule.benchmark}")):
        records = yaml.load(text, Loader=yaml.BaseLoader) or []
        replaced += _retarget(records, rule, base)
        text = yaml.safe_dump(records, sort_keys=False, width=1000)
      (tmp / folder.name / f.name).write_text(text)
  if replaced == 0:
    shutil.rmtree(tmp)
    raise UserError(f"could not find the {rule.benchmark} quality target {base.quality.target} in "
                    f"the {rule.checker_ruleset} checker rules; is mlperf-logging too new?")
  try:
    os.rename(tmp, root)
  except OSError:  # Another process derived the same rules first.
    shutil.rmtree(tmp)


def _retarget(records: list, rule: rules_lib.Rule, base: rules_lib.Rule) -> int:
  """Replaces the official threshold in the quality key's ATLEAST_ONE_CHECK."""
  pattern = _THRESHOLD[rule.quality.direction]
  count = 0
  for record in records:
    body = record.get("KEY") if isinstance(record, dict) else None
    if not body or body.get("NAME") != rule.quality.key or "ATLEAST_ONE_CHECK" not in body:
      continue
    check = body["ATLEAST_ONE_CHECK"]
    found = [m for m in re.finditer(pattern, check)
             if abs(float(m.group(2)) - base.quality.target) < 1e-9]
    if len(found) != 1:
      continue
    m = found[0]
    body["ATLEAST_ONE_CHECK"] = (check[:m.start(2)] + repr(rule.quality.target)
                                 + check[m.end(2):])
    count += 1
  return count


def checker_args(path: Path, benchmark: str | None, ruleset: str,
                 usage: str = "training") -> tuple[str, str, str, str | None]:
  """(log, usage, ruleset, config) for the checker; mini logs get the derived config."""
  rule = rules_lib.find(benchmark, ruleset)
  if rule is not None and not rule.official:
    config = checker_config(rule, _cache_dir())
    return (str(path), rule.checker_usage, rule.checker_ruleset, str(config))
  return (str(path), usage, ruleset, None)


def _cache_dir() -> Path:
  from mlbench.config import default_cache_dir

  return default_cache_dir()


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
