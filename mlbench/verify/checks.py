"""Checks of a result log that the official tools do not make: what a finding is, and
the checks of what a log says about itself (seed, resumption, its `submission_*` values
against its system description, the division it is judged by). The clock's checks are in
`mlbench.verify.timing`, the evaluation cadence's in `mlbench.verify.cadence`.

Each check is a pure function of a parsed log (and the rules or system
description it should agree with) returning findings. A FAIL is what the official
tools fail or what breaks a written MLPerf rule, and cites it (`Finding.rule`);
everything else these checks notice is a WARN that names the line and why it may
matter (`validate --strict` fails on those too); INFO, what could not be checked.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from mlbench.resultlog import Line, ResultLog

MAX_QUOTE = 500
# The written rules a FAIL cites: mlcommons/training_policies training_rules.adoc (read at
# d73e20f, 2026-05-14) by section, or the official tool that fails the same.
RUN_RESULTS = "training_rules.adoc, Run Results"
QUALITY_MEASURE = "training_rules.adoc, Quality measure"
RANDOM_NUMBERS = ("training_rules.adoc, Random numbers (enforced by the package checker's "
                  "seed checker for closed >= 1.0.0)")
DIVISIONS = ("training_rules.adoc, Divisions (Closed: the reference's preprocessing, model, "
             "training method and quality target)")
REQUIRED_KEYS = "mlperf_logging compliance_checker training_<ruleset>/common.yaml"


class Severity(enum.Enum):
  FAIL = "FAIL"
  WARN = "WARN"
  INFO = "INFO"


@dataclasses.dataclass(frozen=True)
class Finding:
  """One thing a check found, pointing at a log line when there is one."""

  check: str
  severity: Severity
  message: str
  lineno: int | None = None
  line: str | None = None
  rule: str | None = None  # the written rule (file, section) or official check a FAIL breaks

  def to_json(self) -> dict[str, Any]:
    line = self.line  # A broken log's line may be megabytes long; the report quotes its start.
    if line is not None and len(line) > MAX_QUOTE:
      line = f"{line[:MAX_QUOTE]}... ({len(line):,} characters)"
    return {"check": self.check, "severity": self.severity.value, "message": self.message,
            "lineno": self.lineno, "line": line, "rule": self.rule}


def at(check: str, severity: Severity, message: str, line: Line | None = None,
       rule: str | None = None) -> Finding:
  """A finding at `line` (the rule only where it fails)."""
  return Finding(check, severity, message, line.lineno if line else None,
                 line.text if line else None, rule if severity is Severity.FAIL else None)


def parse_errors(log: ResultLog) -> list[Finding]:
  return [Finding("parse", Severity.FAIL, problem, lineno, text)
          for lineno, text, problem in log.errors]


def resumed(log: ResultLog) -> list[Finding]:
  """Says where a run continued from a checkpoint (`mlbench run --resume`).

  Not a failure: the run's time still counts from its first run_start, with the
  time lost to the interruption in it.
  """
  out = []
  for ln in log.all("mlbench_resumed"):
    meta = ln.metadata or {}
    out.append(at("resumed", Severity.INFO,
                  f"the run was interrupted and resumed from its checkpoint of step {ln.value}"
                  f" on {meta.get('devices', '?')} devices; {meta.get('lost_s', '?')} s were "
                  "lost and are in its time", ln))
  return out


def seed(log: ResultLog, *, required: bool) -> list[Finding]:
  """A seed is logged, as an integer: required of closed logs of the rulesets the
  package checker's seed checker runs for (it fails a run without one, or with one
  int() cannot read), a warning elsewhere."""
  level = Severity.FAIL if required else Severity.WARN
  seeds = log.all("seed")
  if not seeds:
    return [at("seed", level, "no seed is logged" + (
        "" if required else " (this ruleset and division do not require it)"),
        rule=RANDOM_NUMBERS)]
  out = []
  for ln in seeds:
    try:
      int(ln.value)
    except (TypeError, ValueError):
      out.append(at("seed", level, f"seed {ln.value!r} is not an integer", ln, RANDOM_NUMBERS))
  return out


_STATUS = {"onprem": {"available on-premise", "onprem", "available"},
           "cloud": {"available cloud", "cloud", "available"},
           "preview": {"preview"},
           "research": {"research, development, or internal (rdi)", "research", "rdi"}}


def _norm(text: str) -> str:
  return "".join(c for c in str(text).lower() if c.isalnum())


def submission(log: ResultLog, desc: Mapping[str, Any], system_id: str) -> list[Finding]:
  """submission_* values agree with systems/<system>.json. No written rule or official
  check compares them (the review accepted NeMo's `SUBMISSION_ORG_PLACEHOLDER` and
  `cloud` for a 'Preview' system), so a difference is a warning: the results table
  takes the submitter and status from the system description, not from the log."""
  out = []
  pairs = (("submission_org", "submitter"), ("submission_division", "division"))
  for key, field in pairs:
    ln = log.first(key)
    if ln is not None and _norm(ln.value) != _norm(desc.get(field, "")):
      out.append(at("submission", Severity.WARN, f"{key} {ln.value!r} but the system "
                    f"description's {field} is {desc.get(field)!r}" + (
                        "; the official checker judged the log by its own division, the seed "
                        "and RCP checks follow the system's" + (
                            ", and validate holds it to the closed rules too"
                            if needs_closed_checks(log, desc) else "")
                        if field == "division" else ""), ln))
  ln = log.first("submission_status")
  if ln is not None and str(desc.get("status", "")).lower() not in _STATUS.get(
      str(ln.value).lower(), {str(ln.value).lower()}):
    out.append(at("submission", Severity.WARN, f"submission_status {ln.value!r} does not match "
                  f"the system description's status {desc.get('status')!r}", ln))
  ln = log.first("submission_platform")
  if ln is not None:
    platform = _norm(str(ln.value).split("x", 1)[1]) if _node_prefixed(ln.value) else ""
    names = {_norm(desc.get("system_name", "")), _norm(system_id)}
    if _norm(ln.value) not in names and platform not in names:
      out.append(at("submission", Severity.WARN, f"submission_platform {ln.value!r} names "
                    f"neither system_name {desc.get('system_name')!r} nor the system "
                    f"{system_id!r}", ln))
  return out


def closed(division: Any) -> bool:
  """Whether a system description's or log's division is the closed one."""
  return str(division).strip().lower() == "closed"


def needs_closed_checks(log: ResultLog, desc: Mapping[str, Any] | None) -> bool:
  """A log the official checker did not hold to the closed rules on a closed system.

  The system description's division is the result's (the results table publishes it; the
  package checker's seed and RCP checks follow it), but the official checker judges each
  log by its own `submission_division`: one saying open on a closed system escapes the
  closed checks (the quality target, the hyperparameters). validate runs them on it too,
  and what they fail fails (Divisions). A log saying closed on an open system was held to
  the stricter rules already (v1.0-v3.1 have 40 such logs; none the other way)."""
  return desc is not None and closed(desc.get("division")) and not closed(log.division)


def _node_prefixed(value: Any) -> bool:
  head = str(value).split("x", 1)[0]
  return "x" in str(value) and head.isdigit()


