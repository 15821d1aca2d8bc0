"""Which round's rules a set of result logs (one submission) follows, and how we know."""

from __future__ import annotations

import datetime
import functools

from mlbench import rules as rules_lib
from mlbench.errors import UserError
from mlbench.resultlog import ResultLog, year


@functools.cache
def _rounds() -> list[tuple[str, datetime.date]]:
  import yaml

  with open(rules_lib.rules_dir() / "rounds.yaml") as f:
    doc = yaml.safe_load(f)
  return sorted(((str(r["ruleset"]), r["published"]) for r in doc["rounds"]), key=lambda x: x[1])


def detect_ruleset(logs: list[ResultLog]) -> tuple[str, str]:
  """The ruleset a set of logs (one submission) was written for, and how we know.

  mlbench logs name it (`mlbench_ruleset`); v0.6 logs have their own format.
  Otherwise the latest run decides: a submission belongs to the first round
  published on or after its last run in which all its benchmarks exist
  (rules/rounds.yaml). Earlier runs may be results carried over from a past
  round, so the latest date is the one that counts.

  Raises:
    UserError: the dates and benchmarks match no round; pass --ruleset.
  """
  named = {str(log.value("mlbench_ruleset")) for log in logs if log.value("mlbench_ruleset")}
  if len(named) == 1:
    return named.pop(), "named in the logs (mlbench_ruleset)"
  if named:
    raise UserError(f"these logs name different rulesets ({', '.join(sorted(named))}); "
                    "validate them separately or pass --ruleset")
  if logs and all(log.old_format for log in logs):
    return "0.6.0", "v0.6 log format"
  from mlperf_logging.benchmark_meta import get_allowed_benchmarks

  days = [d for d in (log.date for log in logs) if d is not None]
  # A log that names no benchmark is broken and fails on its own; the others decide.
  benchmarks = {log.benchmark for log in logs if log.benchmark is not None} or {None}
  if days:
    day = max(days)
    for ruleset, published in _rounds():
      try:
        allowed = set(get_allowed_benchmarks("training", ruleset))
      except ValueError:
        continue
      if published >= day and benchmarks <= allowed:
        return ruleset, f"last run on {day}, before the {ruleset} results of {published}"
  where = logs[0].path if len(logs) == 1 else f"{len(logs)} logs"
  odd = next(((log, ln) for log in logs if (ln := log.not_ms()) is not None), None)
  why = "" if days or odd is None else (
      f": their time_ms values are not milliseconds since 1970 ({odd[0].path.name} line "
      f"{odd[1].lineno}: {odd[1].time_ms:,.0f} is in the year {year(odd[1].time_ms)})")
  raise UserError(f"cannot tell which ruleset {where} follow(s) (benchmarks "
                  f"{', '.join(sorted(map(str, benchmarks)))}){why}; pass --ruleset")
