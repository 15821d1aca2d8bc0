"""Reading MLPerf result logs: lines with their real line numbers, and what they say.

The official parser numbers lines among `:::MLLOG` lines only and raises on
some malformed lines; validate reports file line numbers and must survive any
input, so it reads logs with this tolerant reader. The official checkers still
judge every log themselves (`mlbench.verify.official`).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mlbench import rules as rules_lib
from mlbench.errors import UserError

TOKEN = ":::MLLOG "
OLD_TOKEN = ":::MLL "  # v0.6 format
CHUNK = 1 << 16  # characters read at a time
# The official parser would take hours on a :::MLLOG line of this length (see
# mlbench.verify.official.screen), and the longest published one has 2,211
# characters: longer lines are counted, not kept. All lines together are read
# up to MAX_READ characters, 400 times the largest published log.
MAX_LINE_READ = 1 << 20
MAX_READ = 64 << 20
QUOTE = 1000  # characters of an unread line kept to quote it
MAX_TIME_MS = 1e14  # the year 5138: a larger time_ms is no millisecond timestamp


@dataclasses.dataclass(frozen=True)
class Line:
  """One `:::MLLOG` event."""

  lineno: int  # 1-based line number in the file
  time_ms: float
  key: str
  value: Any
  metadata: dict[str, Any]
  text: str


@dataclasses.dataclass
class ResultLog:
  """A parsed result log."""

  path: Path
  lines: list[Line]
  errors: list[tuple[int, str, str]]  # (lineno, text, problem)
  old_format: bool = False
  # What the official parser's cost depends on (its regex is quadratic in a
  # line's length; see mlbench.verify.screen): the file's size, its
  # longest :::MLLOG line (lineno, characters) and the sum of their squares.
  size: int = 0
  longest: tuple[int, int] = (0, 0)
  squares: int = 0

  @classmethod
  def read(cls, path: Path) -> ResultLog:
    """Reads a log in bounded memory: a line is read in chunks, and of a line
    longer than `MAX_LINE_READ` characters only its length and start are kept."""
    lines, errors, old = [], [], False
    longest, squares, read = (0, 0), 0, 0
    with open(path, encoding="latin-1") as f:
      for n, text, chars, old_line in _scan(f):
        old |= old_line
        if text is None:
          continue
        read += len(text)
        if read > MAX_READ:
          errors.append((n, "", f"not read from line {n} on: the file holds more than "
                         f"{MAX_READ // 2**20} MiB of :::MLLOG lines, far more than any real log"))
          break
        squares += chars ** 2
        longest = max(longest, (chars, -n))
        if chars > len(text):
          errors.append((n, text[:QUOTE], f"not read: the line is {chars:,} characters long "
                         f"(mlbench reads :::MLLOG lines of up to {MAX_LINE_READ // 2**20} MiB; "
                         "published ones have a few thousand)"))
          continue
        line, problem = _parse(n, text)
        if line is None:
          errors.append((n, text, problem))
        else:
          lines.append(line)
    size = Path(path).stat().st_size
    return cls(Path(path), lines, errors, old, size, (-longest[1], longest[0]), squares)

  def all(self, key: str) -> list[Line]:
    return [ln for ln in self.lines if ln.key == key]

  def first(self, key: str) -> Line | None:
    return next((ln for ln in self.lines if ln.key == key), None)

  def value(self, key: str, default: Any = None) -> Any:
    line = self.first(key)
    return default if line is None else line.value

  @property
  def benchmark(self) -> str | None:
    return self.value("submission_benchmark")

  @property
  def division(self) -> str | None:
    return self.value("submission_division")

  @property
  def success(self) -> bool:
    stop = self.first("run_stop")
    return stop is not None and stop.metadata.get("status") == "success"

  @property
  def date(self) -> datetime.date | None:
    """The day of the first real timestamp (some published lines carry time_ms 0;
    a time_ms past MAX_TIME_MS is no date in milliseconds: see `not_ms`)."""
    stamps = [ln.time_ms for ln in self.lines if 1e11 < ln.time_ms < MAX_TIME_MS]  # after 1973
    if not stamps:
      return None
    return datetime.datetime.fromtimestamp(min(stamps) / 1000, datetime.timezone.utc).date()

  def not_ms(self) -> Line | None:
    """The first line whose time_ms cannot be milliseconds since 1970 (microseconds,
    say: year 50,000 and more), or None."""
    return next((ln for ln in self.lines if not ln.time_ms < MAX_TIME_MS), None)


def year(time_ms: float) -> str:
  """The year `time_ms` falls in, in words (no datetime: it may be far out of range)."""
  years = time_ms / 1000 / 31_556_952  # seconds in a Gregorian year
  return f"{math.floor(1970 + years):,}" if math.isfinite(years) else str(time_ms)


def _parse(n: int, text: str) -> tuple[Line | None, str]:
  try:
    d = json.loads(text[len(TOKEN):])
    return Line(n, float(d["time_ms"]), str(d["key"]), d["value"], dict(d["metadata"] or {}),
                text), ""
  except (ValueError, KeyError, TypeError, RecursionError) as e:  # RecursionError: deep nesting
    return None, f"not a valid :::MLLOG line ({type(e).__name__}: {str(e)[:200]})"


def is_log(path: Path) -> bool:
  """Whether a file holds at least one MLPerf log line (read in chunks: a file
  without newlines costs no more memory than one with them)."""
  tokens = (TOKEN.encode(), OLD_TOKEN.encode())
  keep = max(map(len, tokens)) - 1  # a token may straddle two chunks
  try:
    with open(path, "rb") as f:
      tail = b""
      while chunk := f.read(CHUNK):
        window = tail + chunk
        if any(t in window for t in tokens):
          return True
        tail = window[-keep:]
  except OSError:
    return False
  return False


def _scan(f: Any) -> Iterator[tuple[int, str | None, int, bool]]:
  """(line number, its :::MLLOG text or None, that text's length, whether the line
  is a v0.6 `:::MLL` line) for each line of a text file, in bounded memory.

  The text runs from the token to the end of the line, stripped; of a line
  longer than MAX_LINE_READ only the first MAX_LINE_READ characters are kept.
  """
  n = 0
  while part := f.readline(CHUNK):
    n += 1
    text, chars, old, tail = None, 0, False, ""
    while True:
      if text is None:
        window = tail + part
        at = window.find(TOKEN)
        if at >= 0:
          text, chars = window[at:at + MAX_LINE_READ + 1], len(window) - at
        else:
          old = old or OLD_TOKEN in window
          tail = window[-(len(TOKEN) - 1):]
      else:
        if len(text) <= MAX_LINE_READ:
          text += part[:MAX_LINE_READ + 1 - len(text)]
        chars += len(part)
      if part.endswith("\n"):
        break
      part = f.readline(CHUNK)
      if not part:
        break
    if text is not None and len(text) <= MAX_LINE_READ:  # kept whole
      text = text.strip()
      chars = len(text)
    elif text is not None:
      chars -= len(part) - len(part.rstrip())  # the line's end, as str.strip() drops it
    yield n, text, chars, old and text is None


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


def ruleset_sort_key(ruleset: str) -> tuple[int, ...]:
  return tuple(int(p) for p in re.findall(r"\d+", ruleset)) or (1_000_000,)
