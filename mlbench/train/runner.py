"""Runs `--runs N` time-to-quality runs of one plan and files their results.

Per run: a fresh log file (pending until the run ends), the run itself, then
the log is published as the next free `result_<i>.txt` and checked by the
official compliance checker under the run's rules. A run that crashes or is
interrupted is not published: its log (evidence) moves to its run folder,
`runs/<system>/<benchmark>/<run id>/`, outside `results/`, as does the pending
log of a run that was killed outright, at the start of the next run.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable

from rich.console import Console

from mlbench import compliance, config as config_lib, results
from mlbench.train import loop, runtime as runtime_lib
from mlbench.config import RunConfig
from mlbench.errors import UserError
from mlbench.mllog import MLLog
from mlbench.train.plan import Plan, make_plan
from mlbench.train.progress import RunProgress
from mlbench.workload import Split


@dataclasses.dataclass(frozen=True)
class Outcome:
  """A finished run and, on process 0, the checker's verdict on its log."""

  index: int
  result: loop.RunResult
  check: compliance.CheckResult | None


def seeds(rc: RunConfig, process_count: int) -> list[int]:
  """One distinct seed per run: `--seed`, +1 per run; else from the OS entropy pool.

  Every process must use the same seeds, so process 0's are broadcast.
  """
  if rc.seed is not None:
    return [rc.seed + i for i in range(rc.runs)]
  drawn: list[int] = []
  while len(drawn) < rc.runs:
    s = secrets.randbits(31)
    if s not in drawn:
      drawn.append(s)
  if process_count > 1:
    import numpy as np
    from jax.experimental import multihost_utils

    drawn = [int(s) for s in multihost_utils.broadcast_one_to_all(np.asarray(drawn, np.int64))]
  return drawn


def prepare(rc: RunConfig) -> Plan:
  """Process setup, validation, data preparation: everything before the first run.

  Nothing is written under --results-dir until every check has passed.
  """
  runtime = runtime_lib.setup(cpu_devices=rc.cpu_devices, distributed=runtime_lib.Distributed(
      rc.coordinator, rc.num_processes, rc.process_id))
  plan = make_plan(rc, runtime)
  if runtime.is_leader:
    # A link out of --results-dir, or a folder that cannot be written, fails now,
    # before the data is prepared and before any compile.
    results.benchmark_dir(rc.results_dir, plan.system, plan.workload.benchmark)
    results.check_writable(rc.results_dir, "--results-dir", parents=True)
  if plan.workload.input.prepare is not None:
    try:
      plan.workload.input.prepare(plan.cfg, rc.data_dir)
    except OSError as e:
      raise UserError(f"cannot write the dataset under {rc.data_dir} ({e.strerror or e}); "
                      "choose a writable --data-dir") from None
  # Listing the files is not reading them: a missing dataset fails here, before
  # anything is written, instead of after run_start.
  for split in (Split.TRAIN, Split.EVAL):
    plan.workload.input.files(plan.cfg, rc.data_dir, split)
  if plan.workload.input.bind is not None:
    plan = dataclasses.replace(plan, cfg=plan.workload.input.bind(plan.cfg, rc.data_dir))
  if not runtime.is_leader:
    return plan
  try:
    on_disk = results.ensure_system(rc.results_dir, plan.system_desc)
  except OSError as e:
    raise UserError(f"cannot write under --results-dir {rc.results_dir} ({e.strerror or e}); "
                    "choose a writable folder") from None
  return dataclasses.replace(plan, system_desc=on_disk)


def run_all(plan: Plan, *, console: Console,
            on_outcome: Callable[[Outcome], None] = lambda o: None) -> list[Outcome]:
  """All runs of the plan, one after another."""
  if plan.runtime.is_leader:
    _tidy(plan, console)
  outcomes = []
  for i, seed in enumerate(seeds(plan.rc, plan.runtime.process_count)):
    outcome = _one(plan, i, seed, console)
    on_outcome(outcome)
    outcomes.append(outcome)
  return outcomes


def _tidy(plan: Plan, console: Console) -> None:
  """Moves the pending logs of runs that no longer run (killed) out of the result folder."""
  folder = results.benchmark_dir(plan.rc.results_dir, plan.system, plan.workload.benchmark)
  stale, live = results.pending_logs(folder)
  for pending in stale:
    kept = results.shelve(pending, plan.rc.results_dir)
    console.print(f"note: {pending.name} was left by a run that no longer runs; its log is "
                  f"kept at {kept} and is not a result", highlight=False)
  if live:
    console.print(f"note: {len(live)} other run(s) still log into {folder}", highlight=False)


def _one(plan: Plan, index: int, seed: int, console: Console) -> Outcome:
  leader = plan.runtime.is_leader
  pending = (results.pending_log(plan.rc.results_dir, plan.system, plan.workload.benchmark)
             if leader else None)
  log = MLLog(pending)
  title = f"{plan.workload.name} run {index + 1}/{plan.rc.runs} (seed {seed})"
  try:
    with RunProgress(title=title, total_samples=plan.schedule.max_train_samples,
                     train_examples=plan.schedule.train_examples, console=console,
                     enabled=leader) as progress:
      result = loop.run_once(plan, seed, log, progress)
  except BaseException:
    log.close()
    if pending is not None:  # Out of the result folder, where nothing may count it.
      kept = results.shelve(pending, plan.rc.results_dir)
      console.print(f"[yellow]the incomplete log of this run is kept at {kept}", highlight=False)
    raise
  log.close()
  check = None
  if leader:
    result.log = results.publish(pending)
    check = compliance.check_log(result.log, plan.rule, config_lib.default_cache_dir())
  return Outcome(index, result, check)
