"""What would stall or crash the official mlperf-logging parser, found without running it.

Every official tool that reads a log (the compliance checker, the seed and RCP
checkers, result_summarizer) parses it with the same `mlp_parser`, so a log
that fails this screen is handed to none of them.
"""

from __future__ import annotations

import dataclasses
import importlib

from mlbench.resultlog import ResultLog

# What stalls the official parser (mlp_parser of every training ruleset in
# mlperf-logging 4.1.68): it runs `re.sub(".*:::MLLOG ", ...)` on each :::MLLOG
# line, which takes time quadratic in the line's length. Measured on a 2-core
# CPU: 0.09 s for 16 KiB, 1.6 s for 64 KiB, 6.4 s for 128 KiB, so about half an
# hour for one 2 MB line; and the compliance tool parses each file twice. The
# longest line of any published log here is 2,211 characters (a 156 KB file).
MAX_LINE_CHARS = 64 * 1024
MAX_SQUARES = 4 * MAX_LINE_CHARS**2  # all lines together: seconds of regex, not minutes
MAX_FILE_BYTES = 64 * 1024 * 1024  # 400 times the largest published log here


@dataclasses.dataclass(frozen=True)
class NotRun:
  """Why the official checker is not run on a log, and the line that decides it."""

  reason: str
  lineno: int | None = None


def check(log: ResultLog, ruleset: str) -> NotRun | None:
  """What in `log` would stall or crash the official compliance checker, found
  without running it; None when nothing known would."""
  lineno, chars = log.longest
  if chars > MAX_LINE_CHARS:
    return NotRun(f"line {lineno} is {chars:,} characters long; the official parser's time "
                  f"grows with the square of a line's length (over {MAX_LINE_CHARS // 1024} KiB "
                  "it takes minutes to hours), so it would stall", lineno)
  if log.squares > MAX_SQUARES:
    return NotRun(f"its :::MLLOG lines are too long together (the longest, line {lineno}, has "
                  f"{chars:,} characters); the official parser's time grows with the square of "
                  "each line's length, so it would take minutes", lineno)
  if log.size > MAX_FILE_BYTES:
    return NotRun(f"the file is {log.size / 2**20:,.0f} MiB, far larger than any real result log "
                  f"(limit {MAX_FILE_BYTES // 2**20} MiB)")
  return _unreadable(log, ruleset)


def _unreadable(log: ResultLog, ruleset: str) -> NotRun | None:
  """The first line on which the official parser raises instead of reporting a parse
  error (it catches ValueError only: a missing key or a line that is not a JSON
  object ends the whole check with a KeyError or TypeError)."""
  if not log.errors:
    return None
  try:
    parser = importlib.import_module("mlperf_logging.compliance_checker.mlp_parser.ruleset_"
                                     + ruleset.replace(".", ""))
  except ImportError:  # a ruleset (mini) or a release we do not know; the worker will tell
    return None
  for lineno, text, _ in log.errors:
    try:  # Safe here: these lines are short (above), and this is json.loads and lookups.
      parser.string_to_logline(lineno, text)
    except ValueError:
      continue
    except Exception as e:  # noqa: BLE001 - what the official parser would raise
      return NotRun(f"line {lineno} would crash the official parser ({type(e).__name__}: "
                    f"{str(e)[:100]}): a :::MLLOG line must be a JSON object with time_ms, key, "
                    "value and metadata", lineno)
  return None
