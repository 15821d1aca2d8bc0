"""`mlbench compare`: MLPerf scores of submissions, side by side.

A run's time to train is run_stop - run_start (`ResultLog.time_to_train_ms`). A run
converged if the official compliance checker passes its log (as result_summarizer
decides). The score is the olympic mean in minutes: drop the fastest and the slowest
run; a non-converged run counts as the slowest; more than one (four for unet3d) makes
the result invalid. It is multiplied by scaling.json's factor where the folder has one
(the review committee's normalisation), exactly as result_summarizer does, so the
scores agree with it. The RCP check (closed division, rulesets >= 1.0.0) runs on a copy
and reports its own factor alongside.

A log that would stall or crash the official parser (`mlbench.verify.screen`)
is handed to no official tool, and one that an official tool could not judge
(it timed out or crashed) is reported as such: whether that run converged is
unknown, so its entry gets no score (never a score that counts it as not
converged), and no RCP verdict or epochs to converge.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mlbench import compliance, rules as rules_lib
from mlbench.verify import official, rcp as rcp_lib, screen
from mlbench.errors import UserError
from mlbench.resultlog import ResultLog
from mlbench.verify.rounds import detect_ruleset
from mlbench.verify.submission import BenchmarkDir, find, groups, read_system, read_text
from mlbench.verify.report import MAX_DROPPED

NOT_CONVERGED = 1e9  # how the RCP tools count a run that did not converge

SYSTEM_COLUMNS = ("division", "availability", "submitter", "system", "number_of_nodes",
                  "host_processor_model_name", "host_processors_count", "accelerator_model_name",
                  "accelerators_count", "framework", "notes", "private_id")
BENCHMARK_COLUMNS = ("time_to_train", "Energy", "GBS", "samples_to_converge", "RCP",
                     "rcp_scaling_factor")
EXTRA_COLUMNS = ("speedup", "runs", "converged_runs", "run_minutes", "rcp_factor")


@dataclasses.dataclass
class Run:
  path: Path
  minutes: float | None
  converged: bool
  epochs: float | None           # epochs (or samples) to converge, as the RCP tools read them
  evals: list[tuple[float, float]]  # (minutes since run_start, quality value)
  problem: str | None = None     # why the official checker did not judge it: not known to converge


@dataclasses.dataclass
class Entry:
  """One benchmark of one system of one submission."""

  source: Path
  bench: BenchmarkDir
  ruleset: str
  desc: dict[str, Any]
  runs: list[Run]
  scaling: float
  gbs: float | None
  rcp: str | None
  rcp_factor: float | None
  target: float | None
  speedup: float | None = None
  division: str | None = "closed"
  epochs_problem: str | None = None  # why epochs to converge are unknown

  @property
  def dropped(self) -> int:
    return sum(not r.converged or r.minutes is None for r in self.runs)

  @property
  def unjudged(self) -> list[Run]:
    """Runs the official checker could not judge: the score is unknown with them."""
    return [r for r in self.runs if r.problem is not None]

  @property
  def score(self) -> float | None:
    if self.unjudged:
      return None
    times = [r.minutes for r in self.runs if r.converged and r.minutes is not None]
    avg = olympic(times, self.dropped, MAX_DROPPED.get(self.bench.benchmark, 1))
    return None if avg is None else avg * self.scaling

  @property
  def samples_to_converge(self) -> float | None:
    """The olympic mean of epochs (samples for BERT) to converge; closed division
    only, as result_summarizer reports it (result_summarizer.py L518-571 compute it,
    and GBS, under `if division == 'closed'`): open submissions may train any model
    any way, so the count compares nothing."""
    if self.division != "closed" or self.unjudged or self.epochs_problem:
      return None
    epochs = sorted(r.epochs if r.epochs is not None else NOT_CONVERGED for r in self.runs)
    unconverged = sum(r.epochs is None for r in self.runs)  # by run_stop, as the RCP reader
    if unconverged > MAX_DROPPED.get(self.bench.benchmark, 1) or len(epochs) < 3:
      return None
    middle = epochs[1:-1]
    return sum(middle) / len(middle)


def olympic(times: list[float], dropped: int, max_dropped: int = 1) -> float | None:
  """Mean after dropping the `max_dropped` fastest and slowest runs.

  Runs that did not converge (`dropped` of them) are the slowest and already
  gone; None when more than `max_dropped` were dropped or nothing is left.
  """
  if dropped > max_dropped:
    return None
  ordered = sorted(times)
  kept = ordered[max_dropped:len(ordered) - (max_dropped - dropped)]
  return sum(kept) / len(kept) if kept else None


def quality_target(benchmark: str, ruleset: str) -> float | None:
  """The target from our rules, else from the official checker's closed rules."""
  rule = rules_lib.find(benchmark, ruleset)
  if rule is not None:
    return rule.quality.target
  path = compliance.checker_package_dir() / f"training_{ruleset}" / f"closed_{benchmark}.yaml"
  if not path.is_file():
    return None
  m = re.search(r"ATLEAST_ONE_CHECK:.*?[<>]=\s*([0-9.]+)", path.read_text())
  return float(m.group(1)) if m else None


def _runs(files: list[tuple[Path, ResultLog]], outcomes: list[official.Outcome],
          epochs: dict[str, Any]) -> list[Run]:
  out = []
  for (path, log), outcome in zip(files, outcomes):
    start, took_ms = log.first("run_start"), log.time_to_train_ms
    minutes = None if took_ms is None else took_ms / 60000
    converged = outcome.error is None and bool(outcome.value and outcome.value["valid"])
    evals = [((ln.time_ms - start.time_ms) / 60000, float(ln.value))
             for ln in log.all("eval_accuracy")
             if start is not None and isinstance(ln.value, (int, float))]
    info = epochs.get(str(path), {})
    out.append(Run(path, minutes, converged, info.get("epochs"), evals, outcome.error))
  return out


def _judge(files: list[tuple[Path, ResultLog]], ruleset: str, usage: str,
           tools: official.Isolated) -> list[official.Outcome]:
  """The compliance checker's outcome on each log; a log the screen stops is not run."""
  calls = [compliance.checker_args(p, log.benchmark, ruleset, usage) for p, log in files]
  stopped = [screen.check(log, call[2]) for (_, log), call in zip(files, calls)]
  run = [i for i, s in enumerate(stopped) if s is None]
  done = dict(zip(run, tools.map(official._tool_compliance, [calls[i] for i in run])))
  return [done[i] if s is None else official.Outcome(error=f"not run: {s.reason}")
          for i, s in enumerate(stopped)]


def _rcp(bench: BenchmarkDir, runs: list[Run], ruleset: str, division: str | None, usage: str,
         tools: official.Isolated) -> tuple[str | None, float | None]:
  rule = rules_lib.find(bench.benchmark, ruleset)
  if (division != "closed" or ruleset not in official.RULESETS_WITH_PACKAGE_CHECKS
      or (rule is not None and not rule.official)):
    return None, None
  if unjudged := [r for r in runs if r.problem is not None]:  # It would stall on it too.
    return f"Not run ({unjudged[0].path.name} not judged)", None
  return rcp_label(rcp_lib.rcp(tools, [r.path for r in runs], usage, ruleset, False))


def rcp_label(result: official.Outcome) -> tuple[str, float | None]:
  """The RCP checker's outcome in result_summarizer's words, and its score factor."""
  if result.error:
    return rcp_verdict(f"Error: {result.error}"), None
  r = result.value
  if r["passed"]:
    return "Pass", r["factor"]
  return rcp_verdict(r["message"]), r["factor"]


RCP_VERDICTS = {"RCP found": "Fail", "RCP Interpolation": "Interp. Fail",
                "Cannot find any RCPs": "No RCP", "Insufficient convergence": "Too few converged",
                "Could not detect global_batch_size": "No batch size"}
"""rcp_checker.check_directory's failure messages (mlperf-logging 4.1.68 L531-559)."""


def rcp_verdict(message: object, width: int = 60) -> str:
  """A failed RCP check as one short line: a known message's verdict, any other text with
  its whitespace (newlines, tracebacks) collapsed and cut to `width` characters."""
  text = " ".join(str(message).split())
  if text in RCP_VERDICTS:
    return RCP_VERDICTS[text]
  if text.startswith("Missing RCP"):
    return "Missing"
  return text if len(text) <= width else text[:width - 1].rstrip() + "…"


def _scaling(folder: Path) -> float:
  """scaling.json's factor; 1.0 without the file.

  Raises:
    UserError: the file holds no positive number `scaling_factor` (a score
      without the factor it claims would be silently wrong).
  """
  f = folder / "scaling.json"
  if not f.exists() and not f.is_symlink():
    return 1.0
  try:
    factor = float(json.loads(read_text(f))["scaling_factor"])
  except (ValueError, KeyError, TypeError) as e:
    raise UserError(f"{f} holds no scaling_factor ({type(e).__name__}: {e}); fix or remove "
                    "it") from None
  if not (math.isfinite(factor) and factor > 0):
    raise UserError(f"{f}: scaling_factor {factor} is not a positive number; fix or remove it")
  return factor


@dataclasses.dataclass(frozen=True)
class _Folder:
  """One benchmark folder to score: its logs read, its ruleset and system known."""

  source: Path
  bench: BenchmarkDir
  files: list[tuple[Path, ResultLog]]
  ruleset: str
  desc: dict[str, Any]
  scaling: float


def _entry(folder: _Folder, usage: str, tools: official.Isolated) -> Entry:
  bench, files, ruleset, desc = folder.bench, folder.files, folder.ruleset, folder.desc
  outcomes = _judge(files, ruleset, usage, tools)
  tool_rs = rules_lib.checker_ruleset(bench.benchmark, ruleset)
  per_file, problem = _convergence(files, outcomes, tool_rs)
  gbs = next((v["gbs"] for v in per_file.values() if v.get("gbs", -1) != -1), None)
  division = desc.get("division") or next((log.division for _, log in files if log.division), None)
  runs = _runs(files, outcomes, per_file)
  rcp, factor = _rcp(bench, runs, ruleset, division, usage, tools)
  return Entry(folder.source, bench, ruleset, desc, runs, folder.scaling,
               gbs if division == "closed" else None, rcp, factor,
               quality_target(bench.benchmark, ruleset), division=division,
               epochs_problem=problem)


def _convergence(files: list[tuple[Path, ResultLog]], outcomes: list[official.Outcome],
                 ruleset: str) -> tuple[dict[str, Any], str | None]:
  """Batch size and epochs (or samples) to converge of each log the checker judged, as
  the RCP checker reads them; and why the folder has none (as get_submission_epochs)."""
  out = {}
  for (path, log), outcome in zip(files, outcomes):
    try:
      c = log.convergence(ruleset)
      epochs = float(c.epochs) if c.converged else None
    except (ValueError, TypeError) as e:
      return {}, f"reading epochs to converge: {path.name} {e}"
    if outcome.error is None:
      out[str(path)] = {"converged": c.converged, "gbs": c.gbs, "epochs": epochs}
  if len({repr(v["gbs"]) for v in out.values()}) > 1:
    return out, "reading epochs to converge: the runs' global batch sizes differ"
  return out, None


def compare(paths: Sequence[Path], *, ruleset: str | None = None, usage: str = "training",
            timeout_s: float = 120.0) -> list[Entry]:
  """Scores every benchmark of every system under each path, in argument order.

  Every path is read, and its rulesets and system descriptions known, before
  any official tool runs: bad input is a one-line error at once.
  """
  folders = [f for source in paths for f in _folders(Path(source), ruleset)]
  with official.sigterm_raises(), official.Isolated(2, timeout_s) as tools:
    entries = [_entry(folder, usage, tools) for folder in folders]
  _speedups(entries)
  return entries


def _folders(source: Path, ruleset: str | None) -> list[_Folder]:
  target = find(source)
  if target.kind == "log":
    raise UserError(f"{source} is a single log; compare needs result folders "
                    "or packages (a score takes all the runs)")
  out = []
  for _, dirs in groups(target).items():
    logs = {b.folder: [(f, ResultLog.read(f)) for f in b.files] for b in dirs}
    every = [log for pairs in logs.values() for _, log in pairs]
    if not every:
      continue
    rs = ruleset or detect_ruleset(every)[0]
    out += [_Folder(source, b, logs[b.folder], rs, _system(b), _scaling(b.folder))
            for b in dirs if logs[b.folder]]
  return out


def _system(bench: BenchmarkDir) -> dict[str, Any]:
  desc, problem = read_system(bench.system_file)
  if problem is not None and bench.system_file.exists():  # missing: its columns stay empty
    raise UserError(f"{problem}; fix it, or move it away to compare without its columns")
  return desc or {}


def _speedups(entries: list[Entry]) -> None:
  """Each entry against the first scored entry of its benchmark (the baseline).

  Only entries that train to the same quality target compare: across rounds a
  benchmark key can change its bar (BERT 0.712 -> 0.720) or even its model
  (`ssd` was SSD-ResNet34 in 0.7.0 and RetinaNet in 4.0.0).
  """
  base: dict[tuple[str, float | None], float] = {}
  for e in entries:
    if e.score is not None:
      base.setdefault((e.bench.benchmark, e.target), e.score)
  for e in entries:
    b = base.get((e.bench.benchmark, e.target))
    e.speedup = b / e.score if b is not None and e.score else None


def _system_columns(desc: dict[str, Any], system: str) -> dict[str, Any]:
  def num(key: str) -> int | None:
    try:
      return int(desc[key]) * int(desc["number_of_nodes"])
    except (KeyError, ValueError, TypeError):
      return None

  notes = ";".join(s for s in (desc.get("hw_notes", ""), desc.get("sw_notes", "")) if s)
  return {"division": desc.get("division"), "availability": desc.get("status"),
          "submitter": desc.get("submitter"), "system": desc.get("system_name") or system,
          "number_of_nodes": desc.get("number_of_nodes"),
          "host_processor_model_name": desc.get("host_processor_model_name"),
          "host_processors_count": num("host_processors_per_node"),
          "accelerator_model_name": desc.get("accelerator_model_name"),
          "accelerators_count": num("accelerators_per_node"), "framework": desc.get("framework"),
          "notes": notes, "private_id": ""}


def rows(entries: list[Entry]) -> list[dict[str, Any]]:
  """One row per submission and system, in result_summarizer's detailed columns
  (`<benchmark>:time_to_train`, ...), then mlbench's (`<benchmark>:speedup`, ...)."""
  benchmarks = sorted({e.bench.benchmark for e in entries})
  out: dict[tuple[str, str], dict[str, Any]] = {}
  for e in entries:
    row = out.setdefault((str(e.source), e.bench.system), {
        "source": str(e.source), "ruleset": e.ruleset, **_system_columns(e.desc, e.bench.system),
        **{f"{b}:{c}": None for b in benchmarks for c in BENCHMARK_COLUMNS + EXTRA_COLUMNS}})
    b = e.bench.benchmark
    row.update({f"{b}:time_to_train": e.score, f"{b}:GBS": e.gbs,
                f"{b}:samples_to_converge": e.samples_to_converge, f"{b}:RCP": e.rcp,
                f"{b}:rcp_scaling_factor": e.scaling, f"{b}:rcp_factor": e.rcp_factor,
                f"{b}:speedup": e.speedup, f"{b}:runs": len(e.runs),
                f"{b}:converged_runs": len(e.runs) - e.dropped,
                f"{b}:run_minutes": [r.minutes for r in e.runs]})
  return list(out.values())
