"""The official mlperf-logging tools, run where they cannot hurt us.

Each call runs in a worker process (spawned, so nothing of the caller's JAX or
TensorFlow state is inherited) under a time limit. A tool that raises, crashes
or hangs gives an `Outcome` with `error` set instead of taking mlbench down.
The tools log through the root logger; a worker collects those messages and
returns them. Tools that write into the tree they check (the RCP checker
rewrites scaling.json) are given a temporary copy.

The functions named `_tool_*` run inside the workers.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from typing import Any

RULESETS_WITH_PACKAGE_CHECKS = ("1.0.0", "1.1.0", "2.0.0", "2.1.0", "3.0.0", "3.1.0", "4.0.0",
                                "4.1.0", "5.0.0", "5.1.0", "6.0.0", "6.1.0")


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What a tool returned, or why it did not return."""

  value: Any = None
  messages: tuple[str, ...] = ()
  error: str | None = None


class _Collect(logging.Handler):
  def __init__(self):
    super().__init__(logging.INFO)
    self.records: list[str] = []

  def emit(self, record: logging.LogRecord) -> None:
    self.records.append(f"{record.levelname} - {record.getMessage()}")


def _in_worker(fn: Callable[..., Any], args: tuple) -> tuple[Any, list[str], str | None]:
  """Runs `fn(*args)` in a worker, with the root logger captured."""
  handler = _Collect()
  root = logging.getLogger()
  root.handlers[:] = [handler]
  root.setLevel(logging.INFO)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
      value, error = fn(*args), None
    except BaseException as e:  # The official tools raise anything; report it, do not die.
      value, error = None, f"{type(e).__name__}: {e}"
  notes = [f"WARNING - {w.message}" for w in caught]
  return value, handler.records + notes, error


class Isolated:
  """A pool of worker processes for official tool calls, with a per-call time limit."""

  def __init__(self, processes: int = 2, timeout_s: float = 120.0):
    self._processes = max(1, processes)
    self._timeout = timeout_s
    self._pool = None

  def __enter__(self) -> Isolated:
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()

  def close(self) -> None:
    if self._pool is not None:
      self._pool.terminate()
      self._pool.join()
      self._pool = None

  def _start(self) -> Any:
    if self._pool is None:
      self._pool = multiprocessing.get_context("spawn").Pool(self._processes)
    return self._pool

  def map(self, fn: Callable[..., Any], calls: Sequence[tuple]) -> list[Outcome]:
    """`fn(*args)` for every args tuple, in order; a hung call is killed and reported."""
    out: list[Outcome | None] = [None] * len(calls)
    todo = list(range(len(calls)))
    while todo:
      pool = self._start()
      pending = [(i, pool.apply_async(_in_worker, (fn, calls[i]))) for i in todo]
      todo = []
      for n, (i, result) in enumerate(pending):
        try:
          value, messages, error = result.get(timeout=self._timeout)
          out[i] = Outcome(value, tuple(messages), error)
        except multiprocessing.TimeoutError:
          out[i] = Outcome(error=f"timed out after {self._timeout:.0f} s")
          todo = [j for j, _ in pending[n + 1:]]  # Resubmit the rest to a fresh pool.
          self.close()
          break
    return out  # type: ignore[return-value]

  def call(self, fn: Callable[..., Any], *args: Any) -> Outcome:
    return self.map(fn, [args])[0]


def _silence_checker_globals() -> None:
  from mlperf_logging.compliance_checker import mlp_compliance

  mlp_compliance.enqueued_configs.clear()  # Left over by an earlier crash in this worker.


def _tool_compliance(path: str, usage: str, ruleset: str, config: str | None) -> dict[str, Any]:
  """The compliance checker on one log: verdict and its messages, by kind."""
  from mlperf_logging.compliance_checker import mlp_compliance, mlp_parser

  _silence_checker_globals()
  checker = mlp_compliance.make_checker(usage, ruleset, quiet=False, werror=False)
  valid, _, _, _ = mlp_compliance.main(path, config or f"{usage}_{ruleset}/common.yaml", checker)
  _, errors = mlp_parser.parse_file(path, ruleset=ruleset)
  return {"valid": bool(valid), "errors": list(checker.overwritable.values())
          + list(checker.not_overwritable), "warnings": list(checker.warnings.values()),
          "parse_errors": [[line, msg] for line, msg in errors]}


def _tool_seeds(files: list[str], ruleset: str) -> bool:
  from mlperf_logging.package_checker.seed_checker import SeedChecker

  return bool(SeedChecker(ruleset).check_seeds(files))


def _tool_system(path: str, usage: str, ruleset: str) -> bool:
  from mlperf_logging.system_desc_checker import system_desc_checker

  return bool(system_desc_checker.check_system_desc(path, usage, ruleset)[0])


def _tool_rcp(folder: str, usage: str, ruleset: str, bypass: bool) -> dict[str, Any]:
  """The RCP checker as package_checker runs it, on a copy (it rewrites scaling.json)."""
  from mlperf_logging.rcp_checker import rcp_checker

  with tempfile.TemporaryDirectory() as tmp:
    copy = os.path.join(tmp, os.path.basename(folder.rstrip("/")))
    shutil.copytree(folder, copy)
    passed, msg, factor = rcp_checker.check_directory(
        copy, usage, ruleset, False, False, rcp_pass="pruned_rcps", rcp_bypass=bypass,
        set_scaling=True)
  return {"passed": bool(passed), "message": msg, "factor": float(factor)}


def _tool_epochs(files: list[str], ruleset: str) -> dict[str, Any]:
  """Global batch size and epochs (or samples) to converge per file, as RCPs count them."""
  from mlperf_logging.rcp_checker import rcp_checker

  per_file = {f: rcp_checker.read_submission_file(f, ruleset, False) for f in files}
  return {f: {"converged": not r[0], "epochs": None if r[0] else float(r[1]), "gbs": r[2]}
          for f, r in per_file.items()}
