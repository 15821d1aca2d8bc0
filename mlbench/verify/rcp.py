"""The package checker's seed and RCP checks, on logs validate has read once.

The official seed checker and the RCP checker's reader parse every log again (the
package checker's second and third pass over them). mlbench's reader reads lines as
the official parser does (mlbench.resultlog, tested against each round's parser), so
the seed check is made here on those lines, with the seed checker's rules
(mlperf_logging/package_checker/seed_checker.py, `_assert_unique_seed_per_run`), and
the RCP checker's own `check_directory` runs in a worker on the epochs to converge as
its `get_submission_epochs` reads them (`submission_epochs`, from
`ResultLog.convergence`): its RCP records, statistics, interpolation, bypass and
scaling are the official code's. tests/unit/test_published_shapes.py and
tests/unit/test_verdicts.py hold both to the official tools.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mlbench.resultlog import ResultLog
from mlbench.verify.official import Isolated, Outcome


def seed_errors(logs: Sequence[ResultLog]) -> list[str]:
  """What the official seed checker reports of these runs' logs ([] when it passes): a
  log it cannot parse, one without a seed or with one int() cannot read, the same seed
  on the same source line in two runs."""
  errors, seen = [], {}
  for log in logs:
    where = str(log.path)
    try:
      if log.errors:
        raise ValueError("Log lines had parsing errors.")
      records = [(ln.metadata["file"], ln.metadata["lineno"], int(ln.value))
                 for ln in log.lines if ln.key == "seed"]
    except (KeyError, TypeError, ValueError) as e:
      errors.append(f"Error found when querying seeds from {where}: {e}")
      continue
    if not records:
      errors.append(f"Result file {where} logs no seed.")
    for record in records:
      if record in seen:
        errors.append(f"Result file {where} logs seed {record[2]} on {record[0]}:{record[1]}. "
                      f"However, result file {seen[record]} already logs the same seed on the "
                      "same line.")
      else:
        seen[record] = where
  return errors


@dataclasses.dataclass(frozen=True)
class Epochs:
  """get_submission_epochs' reading of a folder: batch size (-1: none, or the runs
  differ), epochs (or samples) to converge per run (None past one non-converged run,
  four for unet3d), benchmark, and the warning it logs."""

  gbs: Any
  epochs: list[float] | None
  benchmark: Any
  warning: str | None = None


def submission_epochs(logs: Sequence[ResultLog], ruleset: str) -> Epochs:
  """As rcp_checker.get_submission_epochs reads the runs' logs.

  Raises:
    ValueError: a log the official reader cannot read, named, with its line.
  """
  epochs, failed, gbs, benchmark = [], 0, -1, None
  for log in logs:
    try:
      c = log.convergence(ruleset)
    except ValueError as e:
      raise ValueError(f"cannot read {log.path.name} ({e})") from None
    epochs.append(c.epochs)
    failed += not c.converged
    if gbs == -1:
      gbs = c.gbs
    elif c.gbs != gbs:
      return Epochs(-1, None, None, "Batch sizes in files do not match.")
    if benchmark is None:
      benchmark = c.benchmark
    elif c.benchmark != benchmark:
      return Epochs(-1, None, None, "Benchmark names in files do not match.")
  if failed > (4 if benchmark == "unet3d" else 1):
    return Epochs(gbs, None, benchmark)
  return Epochs(gbs, epochs, benchmark)


def rcp(tools: Isolated, files: Sequence[Path], usage: str, ruleset: str,
        bypass: bool) -> Outcome:
  """The RCP checker, as package_checker runs it, on the logs `files` of one folder."""
  return rcps(tools, [([ResultLog.read(f) for f in files], usage, ruleset, bypass)])[0]


def rcps(tools: Isolated, calls: Sequence[tuple[Sequence[ResultLog], str, str, bool]]
         ) -> list[Outcome]:
  """The RCP checker on benchmark folders, (logs, usage, ruleset, bypass) each.

  It rewrites scaling.json in the folder it checks: it is given an empty temporary one,
  made and removed here, in this process (a worker killed for its time limit leaves
  nothing behind). One call at a time: the checker imports scipy (seconds), once in the
  worker that runs it.
  """
  out: list[Outcome | None] = [None] * len(calls)
  todo = []
  for i, (logs, usage, ruleset, bypass) in enumerate(calls):
    try:
      todo.append((i, (usage, ruleset, bypass, submission_epochs(logs, ruleset))))
    except ValueError as e:
      out[i] = Outcome(error=str(e))
  tmp = tempfile.mkdtemp(prefix="mlbench-rcp-")
  try:
    folders = [Path(tmp, str(i)) for i, _ in todo]
    for folder in folders:
      folder.mkdir()
    done = tools.map(_tool_rcp, [(str(f), *args) for f, (_, args) in zip(folders, todo)],
                     at_once=1)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  for (i, _), result in zip(todo, done):
    warned = [m.split(" - ", 1)[-1].strip() for m in result.messages
              if m.startswith("WARNING")]
    if result.error and warned:  # e.g. "Batch sizes in files do not match." before a KeyError
      result = dataclasses.replace(result, error=f"{result.error} (after: {warned[-1]})")
    out[i] = result
  return out  # type: ignore[return-value]


def _tool_rcp(folder: str, usage: str, ruleset: str, bypass: bool,
              epochs: Epochs) -> dict[str, Any]:
  """The official check_directory on `folder` (empty: it only writes scaling.json there),
  given the runs' epochs as its get_submission_epochs would read them."""
  from mlperf_logging.rcp_checker import rcp_checker

  def read(*_: Any) -> tuple[Any, list[float] | None, Any]:
    if epochs.warning:
      logging.warning(" %s", epochs.warning)
    return epochs.gbs, None if epochs.epochs is None else list(epochs.epochs), epochs.benchmark

  official = rcp_checker.get_submission_epochs
  rcp_checker.get_submission_epochs = read
  try:
    passed, msg, factor = rcp_checker.check_directory(
        folder, usage, ruleset, False, False, rcp_pass="pruned_rcps", rcp_bypass=bypass,
        set_scaling=True)
  finally:
    rcp_checker.get_submission_epochs = official
  return {"passed": bool(passed), "message": msg, "factor": float(factor)}
