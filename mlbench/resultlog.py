"""Reading MLPerf result logs, both formats: every event with its real line number.

`:::MLLOG {json}` (MLPerf v0.7 on, mlperf-logging) and the older
`:::MLL <unix seconds> <key>: {"value": ..., "metadata": {...}}` (v0.5 and v0.6, and
the TPU-pod papers' own runs). The one reader of logs: `validate` judges the
`:::MLLOG` lines (`ResultLog.lines`, what the official tools read), `compare` scores
each run's time to train and convergence as result_summarizer and the RCP checker read
them (`ResultLog.time_to_train_ms`, `ResultLog.convergence`), `check --from-log` takes
the samples a run trained from its events in either format (`ResultLog.events`), and the
time model's calibration (benchmarks/calibration) the published runs' steps and times.

Lines are found as the official parser of every training ruleset finds them
(compliance_checker/mlp_parser/ruleset_*.py, alike in this): a line holding the token
anywhere is an event, stripped to the token's last occurrence (its greedy
`re.sub(".*" + TOKEN, TOKEN, line)`) and of whitespace; its JSON must have time_ms, key,
value and metadata. A verbatim repeat of an earlier event (Google's v3.1 gpt3 logs end
with `Processing :::MLLOG {...}` copies) is read, as the official parser reads it, and
marked (`Line.repeat_of`). Unlike that parser, this reader numbers file lines, survives
any input and reads in bounded memory: a malformed `:::MLLOG` line is kept as an error.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mlbench.errors import UserError
from mlbench.storage import paths

TOKEN = ":::MLLOG "
OLD_TOKEN = ":::MLL "  # v0.6 format
_STEM = ":::MLL"  # in both
_OLD = re.compile(r":::MLL\s+([\d.]+)\s+([\w.]+):\s*(\{.*\})\s*$")
CHUNK = 1 << 16  # characters read at a time
# The official parser would take hours on a :::MLLOG line of this length (see
# mlbench.verify.official.screen), and the longest published one has 2,211
# characters: longer lines are counted, not kept. All lines together are read
# up to MAX_READ characters, 400 times the largest published log.
MAX_LINE_READ = 1 << 20
MAX_READ = 64 << 20
QUOTE = 1000  # characters of an unread line kept to quote it
MAX_TIME_MS = 1e14  # the year 5138: a larger time_ms is no millisecond timestamp

# Each benchmark's logging shape, where it is not "evaluate on the clock, in epochs".
# stable_diffusion's and minigo's references evaluate timestamped checkpoints after training,
# logged before a run_stop carrying the passing checkpoint's earlier time (training_rules.adoc
# "Quality measure"; rcp_checker.py read_submission_file L91; minigo's ml_perf/eval_models.py).
OFFLINE_EVAL = frozenset({"stable_diffusion", "minigo"})
# Counted in samples_count of the last evaluation (read_submission_file L114, 4.1.68).
SAMPLES_COUNT = frozenset({"llama2_70b_lora", "flux1", "llama31_405b", "llama31_8b",
                           "gpt_oss_20b", "deepseekv3_671b", "qwen35_397b_grpo", "dlrmv4"})


@dataclasses.dataclass(frozen=True)
class Line:
  """One event: a `:::MLLOG` line, or a v0.6 `:::MLL` line (its seconds in milliseconds)."""

  lineno: int  # 1-based line number in the file
  time_ms: float
  key: str
  value: Any
  metadata: dict[str, Any]  # {} where the log's metadata is no JSON object
  text: str  # from the token on, stripped: what the official parser reads
  repeat_of: int | None = None  # the line an identical earlier event is on


@dataclasses.dataclass(frozen=True)
class Convergence:
  """A run's convergence as the RCP checker reads it (`ResultLog.convergence`)."""

  converged: bool
  epochs: float  # epochs or samples to converge; 1e9 when not converged
  gbs: Any  # the last global_batch_size logged; -1 when none is
  benchmark: Any


@dataclasses.dataclass
class ResultLog:
  """A parsed result log."""

  path: Path
  lines: list[Line]  # the :::MLLOG lines: what the official tools read and validate judges
  errors: list[tuple[int, str, str]]  # (lineno, text, problem)
  old_format: bool = False
  # What the official parser's cost depends on (its regex is quadratic in a
  # line's length; see mlbench.verify.screen): the file's size, its
  # longest :::MLLOG line (lineno, characters) and the sum of their squares.
  size: int = 0
  longest: tuple[int, int] = (0, 0)
  squares: int = 0
  old_lines: list[Line] = dataclasses.field(default_factory=list)  # the v0.6 `:::MLL` lines

  @classmethod
  def read(cls, path: paths.PathLike) -> ResultLog:
    """Reads a log, on a disk or in a bucket, in bounded memory: a line is read in chunks,
    and of a line longer than `MAX_LINE_READ` characters only its length and start are kept.

    Raises:
      UserError: the file cannot be read.
    """
    where = paths.path(path)
    log = cls(path if isinstance(path, paths.Path) else Path(path), [], [])
    try:
      with where.open("rb") as raw, io.TextIOWrapper(raw, encoding="latin-1") as f:
        log._take(_scan(f))
      log.size = where.stat().length
    except OSError as e:
      raise UserError(f"cannot read the result log {path} ({e.strerror or e})") from None
    return log

  def _take(self, scanned: Iterator[tuple[int, str | None, int, bool]]) -> None:
    """Keeps each scanned line as an event or an error, and the figures of the longest."""
    longest, read, seen = (0, 0), 0, {}
    for n, text, chars, old in scanned:
      self.old_format |= old
      read += len(text)
      if read > MAX_READ:
        self.errors.append((n, "", f"not read from line {n} on: the file holds more than "
                            f"{MAX_READ // 2**20} MiB of log lines, far more than any real log"))
        break
      if old:  # a v0.6 line: an event or nothing, never an error (validate judges :::MLLOG)
        if (event := _parse_old(n, text)) is not None:
          self.old_lines.append(event)
        continue
      self.squares += chars ** 2
      longest = max(longest, (chars, -n))
      if chars > len(text):
        self.errors.append((n, text[:QUOTE], f"not read: the line is {chars:,} characters long "
                            f"(mlbench reads :::MLLOG lines of up to {MAX_LINE_READ // 2**20} "
                            "MiB; published ones have a few thousand)"))
        continue
      line, problem = _parse(n, text, seen.setdefault(text, n))
      if line is None:
        self.errors.append((n, text, problem))
      else:
        self.lines.append(line)
    self.longest = (-longest[1], longest[0])

  @property
  def events(self) -> list[Line]:
    """Every event of the log in either format (`lines` and `old_lines`), in file order."""
    return sorted(self.lines + self.old_lines, key=lambda ln: ln.lineno)

  def timed_region(self) -> tuple[Line, Line] | tuple[None, None]:
    """The run_start and run_stop result_summarizer times the run by; (None, None) without
    both. Its `_query_run_start_stop` (4.1.68 L141) takes events in order until it has
    both: the run_start counted is the last one before the first run_stop."""
    start = stop = None
    for ln in self.lines:
      if ln.key == "run_start":
        start = ln
      elif ln.key == "run_stop":
        stop = ln
      if start is not None and stop is not None:
        return start, stop
    return None, None

  @property
  def time_to_train_ms(self) -> float | None:
    """run_stop - run_start, as result_summarizer scores a run; None without both."""
    start, stop = self.timed_region()
    return None if start is None or stop is None else stop.time_ms - start.time_ms

  def convergence(self, ruleset: str, *, train_samples: bool = False) -> Convergence:
    """The run's convergence as the RCP checker's `read_submission_file` reads it (and
    result_summarizer's samples_to_converge); `train_samples`: BERT's
    `--rcp-bert-train-samples`.

    Raises:
      ValueError: where the official reader raises, naming the line.
    """
    step_unit = "step_num" if ruleset == "3.1.0" else "samples_count"
    conv: Any = None
    out = Convergence(False, 1e9, -1, None)
    sd: dict[Any, dict[Any, Any]] = {}  # stable_diffusion's FID and CLIP per checkpoint
    every = [(ln.lineno, ln.text, ln) for ln in self.lines]  # with the malformed lines
    for n, text, ln in sorted(every + [(n, t, None) for n, t, _ in self.errors]):
      body = text[len(TOKEN):]
      try:
        is_eval = "eval_error" in body or "eval_accuracy" in body
        counted = out.benchmark in SAMPLES_COUNT or out.benchmark == "stable_diffusion"
        if ln is None and ("global_batch_size" in body or "submission_benchmark" in body
                           or "run_stop" in body or (is_eval and (counted or not train_samples))
                           or (train_samples and "train_samples" in body)):
          raise ValueError("not JSON")  # where the official reader's json.loads raises
        value, meta = (None, {}) if ln is None else (ln.value, ln.metadata)
        if "global_batch_size" in body:
          out = dataclasses.replace(out, gbs=value)
        if "submission_benchmark" in body:
          out = dataclasses.replace(out, benchmark=value)
          train_samples &= value == "bert"
        if out.benchmark == "stable_diffusion" and is_eval:
          sd.setdefault(meta[step_unit], {})[meta["metric"]] = value
        elif out.benchmark in SAMPLES_COUNT and is_eval:
          conv = meta["samples_count"]
        elif not train_samples and is_eval:
          conv = round(meta["epoch_num"], 3)
        elif train_samples and "train_samples" in body:
          conv = value
        if "run_stop" in body and ln.key == "run_stop":
          if meta["status"] != "success":
            out = dataclasses.replace(out, converged=False, epochs=1e9)
            continue
          if out.benchmark == "stable_diffusion":  # the first checkpoint at the target
            conv = min(s for s, r in sd.items() if r["FID"] <= 90.0 and r["CLIP"] >= 0.15)
          if conv is None:
            raise ValueError("no evaluation before it")
          out = dataclasses.replace(out, converged=True, epochs=conv)
      except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"line {n}: {type(e).__name__}: {str(e)[:100]}") from None
    return out

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
    """The day of the first real timestamp (not 0; not past MAX_TIME_MS: `not_ms`)."""
    stamps = [ln.time_ms for ln in self.lines if 1e11 < ln.time_ms < MAX_TIME_MS]  # after 1973
    if not stamps:
      return None
    return datetime.datetime.fromtimestamp(min(stamps) / 1000, datetime.timezone.utc).date()

  def not_ms(self) -> Line | None:
    """The first line whose time_ms cannot be ms since 1970 (microseconds?), or None."""
    return next((ln for ln in self.lines if not ln.time_ms < MAX_TIME_MS), None)


def year(time_ms: float) -> str:
  """The year `time_ms` falls in, in words (no datetime: it may be far out of range)."""
  years = time_ms / 1000 / 31_556_952  # seconds in a Gregorian year
  return f"{math.floor(1970 + years):,}" if math.isfinite(years) else str(time_ms)


def _parse(n: int, text: str, first: int) -> tuple[Line | None, str]:
  """An event as the official `string_to_logline` reads it (`first`: the line this text
  was first seen on); or why it is none."""
  try:
    d = json.loads(text[len(TOKEN):])
    meta = d["metadata"]
    return Line(n, float(d["time_ms"]), str(d["key"]), d["value"],
                dict(meta) if isinstance(meta, dict) else {}, text,
                None if first == n else first), ""
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


def _parse_old(n: int, text: str) -> Line | None:
  """A v0.6 `:::MLL` line as an event (its seconds in milliseconds); None if it is none."""
  m = _OLD.match(text)
  if m is None:
    return None
  try:
    raw = json.loads(m.group(3))
    return Line(n, float(m.group(1)) * 1e3, m.group(2), raw.get("value"),
                dict(raw.get("metadata") or {}), text)
  except (ValueError, TypeError, AttributeError, RecursionError):
    return None


def _scan(f: Any) -> Iterator[tuple[int, str | None, int, bool]]:
  """(line number, its log text or None, that text's length, whether the text is a v0.6
  `:::MLL` line) for the lines of a text file that hold a token, in bounded memory. The
  text runs from the token's last occurrence (`:::MLLOG` where the line holds it, else
  `:::MLL`) to the end of the line, stripped; of a longer line MAX_LINE_READ characters."""
  n = 0
  while part := f.readline(CHUNK):
    n += 1
    if part[-1] == "\n" or len(part) < CHUNK:  # the whole line at once: the common case
      if _STEM not in part:
        continue
      at, old = part.rfind(TOKEN), False
      if at < 0:
        at, old = part.rfind(OLD_TOKEN), True
      if at >= 0:
        text = part[at:].strip()
        yield n, text, len(text), old
      continue
    text, chars, old, tail = None, 0, False, ""
    while True:
      window = tail + part
      if (at := window.rfind(TOKEN)) >= 0:  # a later token starts the text afresh
        text, chars, old = window[at:at + MAX_LINE_READ + 1], len(window) - at, False
      elif (text is None or old) and (at := window.rfind(OLD_TOKEN)) >= 0:
        text, chars, old = window[at:at + MAX_LINE_READ + 1], len(window) - at, True
      elif text is not None:
        text, chars = _more(text, chars, part)
      tail = window[-(len(TOKEN) - 1):]
      if part.endswith("\n"):
        break
      part = f.readline(CHUNK)
      if not part:
        break
    if text is not None:  # kept whole, or its end (as str.strip() drops it) not counted
      chars = len(text := text.strip()) if len(text) <= MAX_LINE_READ else \
          chars - (len(part) - len(part.rstrip()))
      yield n, text, chars, old


def _more(text: str, chars: int, part: str) -> tuple[str, int]:
  """A line's text and length with its next part: the text kept to MAX_LINE_READ + 1."""
  if len(text) <= MAX_LINE_READ:
    text += part[:MAX_LINE_READ + 1 - len(text)]
  return text, chars + len(part)
