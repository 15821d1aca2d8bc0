"""A run that reached its target but could not file its result: `--resume` files its log.

A run whose result upload was refused (HTTP 403, a full results disk) after its target was
reached stops with exit 75 and keeps its log, complete with its successful `run_stop`, in
its run folder (`filing.RunEnd.storage_failed`). Resuming it from its last checkpoint
would train again to a target already reached: instead `--resume` finds that log, checks
that it is this run's (it begins with the log its newest checkpoint holds), whole (every
line an MLLOG record) and successful, files it as the next `result_<i>.txt`, and judges it
as a run's end does (the official checker): no train step, no compile.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from mlbench.resultlog import ResultLog
from mlbench.storage import faults, paths, pending, results, writes
from mlbench.train.lifecycle.runrecord import FINISHED_FILE
from mlbench.train.result import RunResult

if TYPE_CHECKING:
  from rich.console import Console

  from mlbench.train.lifecycle.checkpoint import RunSaver
  from mlbench.train.plan import Plan


def kept_success(run_folder: paths.Path, prefix: str) -> paths.Path | None:
  """The complete, successful log kept in `run_folder` (`partial*.log`) that continues
  `prefix` (the log of the run's newest checkpoint), or None."""
  if not prefix:
    return None
  for log in sorted(paths.path(run_folder).glob("partial*.log")):
    with writes.fetched(log, "the kept log") as local:
      if not local.read_text(errors="replace").startswith(prefix):
        continue
      got = ResultLog.read(local)
    if not got.errors and got.success and got.lines and got.lines[-1].key == "run_stop":
      return log
  return None


def _result(log: ResultLog, quality_key: str, seed: int) -> RunResult:
  """What a report says of a run, from its log alone."""
  evals = [(float(ln.metadata.get("epoch_num", 0)), float(ln.value))
           for ln in log.all(quality_key)]
  last = log.all(quality_key)[-1:] or log.all("run_stop")
  init = [log.first(k) for k in ("init_start", "init_stop")]
  return RunResult(
      seed=seed, success=log.success, time_to_train_s=(log.time_to_train_ms or 0) / 1000,
      init_s=(init[1].time_ms - init[0].time_ms) / 1000 if all(init) else 0.0,
      evals=evals, epoch=evals[-1][0] if evals else 0.0,
      samples=int(last[0].metadata.get("samples_count", 0)) if last else 0)


def file_kept(plan: Plan, saver: RunSaver, run_folder: paths.Path, seed: int,
              console: Console) -> tuple[RunResult, object] | None:
  """Files the run's kept successful log (process 0); every process learns whether it
  did. Returns (the run's result, the checker's verdict on process 0), or None: there is
  none, and the run resumes from its checkpoint.

  Raises:
    StorageFailed: the result cannot be written yet (the run stays resumable).
  """
  from mlbench import compliance

  kept = kept_success(run_folder, saver.meta["log"]) if plan.runtime.is_leader else None
  if plan.runtime.process_count > 1:
    import numpy as np
    from jax.experimental import multihost_utils

    found = bool(multihost_utils.broadcast_one_to_all(np.int32(kept is not None)))
  else:
    found = kept is not None
  if not found:
    return None
  if not plan.runtime.is_leader:  # Process 0 files it; a successful run, for the exit code.
    return RunResult(seed=seed, success=True), None
  bench = results.benchmark_dir(plan.rc.results_dir, plan.system, plan.workload.benchmark)
  with writes.fetched(kept, "the kept log") as local:
    with faults.needed(bench):
      bench.mkdir(parents=True, exist_ok=True)
      filed = pending.publish(local, bench)
    check = compliance.check_log(local, plan.rule, paths.default_cache_dir())
    result = _result(ResultLog.read(local), plan.rule.quality.key, seed)
  result.log = filed
  writes.remove(kept)
  try:
    writes.write_new(saver.directory / FINISHED_FILE, json.dumps({"log": str(filed)}) + "\n")
  except Exception as e:  # --resume still refuses it: its log is among the results.
    if faults.diagnose(e, saver.directory) is None:
      raise
  console.print(f"note: this run had reached its target; its complete log, kept at {kept} "
                f"when the result could not be filed, is filed now as {filed} (nothing "
                "trained again)", highlight=False, markup=False)
  return result, check
