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
import json
import os
import secrets
import signal
import threading
from collections.abc import Callable

from rich.console import Console

from mlbench import compliance, config as config_lib, paths, results, storage
from mlbench import pending as pending_lib
from mlbench.train import checkpoint, loop, peers, runtime as runtime_lib, signals, telemetry
from mlbench.config import RunConfig
from mlbench.errors import Interrupted, UserError
from mlbench.mllog import MLLog
from mlbench.train.plan import Plan, check_inputs, make_plan
from mlbench.train.progress import RunProgress


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
      rc.coordinator, rc.num_processes, rc.process_id), compile_cache=rc.compile_cache)
  plan = make_plan(rc, runtime)
  if runtime.is_leader:
    # A link out of --results-dir, or a folder (or bucket) that cannot be written,
    # fails now, before the data is prepared and before any compile.
    results.benchmark_dir(rc.results_dir, plan.system, plan.workload.benchmark)
    storage.check_writable(rc.results_dir, "--results-dir", parents=True)
    if rc.checkpoint_dir is not None:
      storage.check_writable(rc.checkpoint_dir, "--checkpoint-dir")
    if rc.resume is not None:
      storage.check_writable(rc.resume, "the checkpoint folder of --resume")
  if plan.workload.input.prepare is not None:
    with paths.errors("cannot write the dataset under --data-dir", rc.data_dir):
      plan.workload.input.prepare(plan.cfg, rc.data_dir)
  # Listing the files is not reading them: a missing dataset (or starting point) fails
  # here, before anything is written, instead of after run_start.
  with paths.errors("--data-dir", rc.data_dir):
    check_inputs(plan)
    if plan.workload.input.bind is not None:
      plan = dataclasses.replace(plan, cfg=plan.workload.input.bind(plan.cfg, rc.data_dir))
  if not runtime.is_leader:
    return plan
  with paths.errors("cannot write under --results-dir", rc.results_dir):
    on_disk = results.ensure_system(rc.results_dir, plan.system_desc)
  return dataclasses.replace(plan, system_desc=on_disk)


def run_all(plan: Plan, *, console: Console,
            on_outcome: Callable[[Outcome], None] = lambda o: None) -> list[Outcome]:
  """All runs of the plan, one after another (or the one run `--resume` continues)."""
  if plan.runtime.is_leader:
    _tidy(plan, console)
  if plan.rc.resume is not None:
    record, folder = checkpoint.find_run(plan.rc.resume)
    todo = [(record.index, record.seeds[record.index], record.run_id, folder)]
    seed_list = list(record.seeds)
  else:
    seed_list = seeds(plan.rc, plan.runtime.process_count)
    ids = _run_ids(len(seed_list), plan.runtime.process_count)
    todo = [(i, s, rid, None) for i, (s, rid) in enumerate(zip(seed_list, ids))]
  outcomes = []
  watch = peers.PeerWatch(plan.runtime.process_index, plan.runtime.process_count).start()
  for index, seed, rid, resume in todo:
    outcome = _one(plan, Run(index, seed, rid, tuple(seed_list), resume), console, watch)
    on_outcome(outcome)
    outcomes.append(outcome)
    signum = signals.requested()
    if signum is not None:  # It came after the run's last step: the run is filed, stop here.
      raise Interrupted(signum, f"stopped by {signal.Signals(signum).name} after run "
                                f"{index + 1}, whose log is {outcome.result.log}; the "
                                "remaining runs were not started")
  return outcomes


def _run_ids(n: int, process_count: int) -> list[str]:
  """A fresh id per run (its run folder's name), the same on every process."""
  ids = [results.new_run_id() for _ in range(n)]
  if process_count > 1:
    import numpy as np
    from jax.experimental import multihost_utils

    as_int = multihost_utils.broadcast_one_to_all(np.asarray([int(i, 16) for i in ids], np.int64))
    ids = [f"{int(i):08x}" for i in as_int]
  return ids


def _tidy(plan: Plan, console: Console) -> None:
  """Moves the pending logs of runs that no longer run (killed) out of the result folder;
  leaves those of live runs, of this host or another, alone."""
  rc, bench = plan.rc, plan.workload.benchmark
  with paths.errors("--results-dir", rc.results_dir):
    pending_lib.tidy(results.benchmark_dir(rc.results_dir, plan.system, bench),
                     lambda rid: results.run_folder(rc.results_dir, plan.system, bench, rid),
                     stale_after=rc.stale_after,
                     say=lambda line: console.print(line, highlight=False))


@dataclasses.dataclass(frozen=True)
class Run:
  """One run of the invocation: which, its seed and id; `resume`: its checkpoint folder."""

  index: int
  seed: int
  run_id: str
  seeds: tuple[int, ...]
  resume: paths.Path | None = None


def _saver(plan: Plan, run: Run) -> tuple[checkpoint.RunSaver | None, paths.Path]:
  """The run's checkpointing (None when off) and its run folder."""
  rc = plan.rc
  folder = results.run_folder(rc.results_dir, plan.system, plan.workload.benchmark, run.run_id)
  if run.resume is not None:
    return checkpoint.RunSaver(run.resume, rc.checkpoint_every, resuming=True), folder
  if not rc.checkpoint_every:
    return None, folder
  ckpt_dir = (rc.checkpoint_dir / run.run_id if rc.checkpoint_dir is not None
              else folder / "checkpoints")
  if plan.runtime.is_leader:
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    record = checkpoint.RunRecord(
        run_id=run.run_id, workload=plan.workload.name, config=rc.config,
        overrides=tuple(rc.overrides), seeds=run.seeds, index=run.index, system=plan.system,
        submitter=rc.submitter, division=rc.division.value, ruleset=plan.rule.ruleset,
        results_dir=str(paths.resolve(rc.results_dir)), checkpoint_every=rc.checkpoint_every)
    storage.write_new(ckpt_dir / checkpoint.RUN_FILE, record.to_json())
    if rc.checkpoint_dir is not None:  # The run folder says where its checkpoints are.
      folder.mkdir(parents=True, exist_ok=True)
      storage.write_new(folder / "checkpoints.txt", f"{paths.resolve(ckpt_dir)}\n")
  return checkpoint.RunSaver(ckpt_dir, rc.checkpoint_every), folder


def _refuse_if_published(plan: Plan, saver: checkpoint.RunSaver) -> None:
  """A run killed after its log became a result_<i>.txt but before finished.json was
  written is filed already: resuming it would count it twice. Its result begins with
  the log saved in its last checkpoint (timestamps and seed make that prefix unique).
  """
  prefix = saver.meta["log"].encode()
  folder = results.benchmark_dir(plan.rc.results_dir, plan.system, plan.workload.benchmark)
  for log in results.result_files(folder) if prefix else []:
    with log.open("rb") as f:
      if f.read(len(prefix)) != prefix:
        continue
    storage.write_new(saver.directory / checkpoint.FINISHED_FILE,
                      json.dumps({"log": str(log)}) + "\n")
    raise UserError(f"--resume {saver.directory}: that run already finished ({log}); start a "
                    "new run instead")


def _one(plan: Plan, run: Run, console: Console, watch: peers.PeerWatch) -> Outcome:
  with signals.StopOnSignals():  # Before the log exists: a signal never finds it unguarded.
    return _guarded_one(plan, run, console, watch)


def _guarded_one(plan: Plan, run: Run, console: Console, watch: peers.PeerWatch) -> Outcome:
  leader = plan.runtime.is_leader
  saver, folder = _saver(plan, run)
  if leader and saver is not None and saver.resuming:
    _refuse_if_published(plan, saver)
  pending = (pending_lib.PendingRun(results.benchmark_dir(
      plan.rc.results_dir, plan.system, plan.workload.benchmark), run.run_id).start()
             if leader else None)
  log = MLLog(pending.log_path if pending else None,
              prefix=saver.meta["log"] if saver and saver.resuming else "")
  title = (f"{plan.workload.name} run {run.index + 1}/{len(run.seeds)} (seed {run.seed})"
           + (" resumed" if run.resume else ""))
  stop = _Stop(plan, log, pending, folder, saver, console)
  tele = telemetry.for_run(plan, folder)
  signals.on_timeout(stop.cut_short)
  watch.on_lost = stop.peer_lost
  try:
    with RunProgress(title=title, total_samples=plan.schedule.max_train_samples,
                     train_examples=plan.schedule.train_examples, console=console,
                     enabled=leader) as progress:
      result = loop.run_once(plan, run.seed, log, progress, saver, tele)
  except Interrupted as e:
    raise Interrupted(e.signum, stop.interrupted(e.signum)) from None
  except BaseException:
    stop.crashed()
    watch.settle()  # A collective that failed because a peer died: say which one.
    raise
  finally:
    tele.close()
    signals.on_timeout(lambda signum: None)
    watch.on_lost = lambda message: None
  stop.finished()
  if saver is not None:
    saver.final()
    saver.close()
    result.checkpoint_saves = saver.saves
  check = None
  if leader:
    result.log = pending.publish()
    if saver is not None:
      storage.write_new(saver.directory / checkpoint.FINISHED_FILE,
                        json.dumps({"log": str(result.log)}) + "\n")
    with storage.fetched(result.log, "the run's log") as local:  # The checker reads files.
      check = compliance.check_log(local, plan.rule, config_lib.default_cache_dir())
  return Outcome(run.index, result, check)


class _Stop:
  """How one run ends early: by a signal, cut short by the watchdog, or a crash.

  Whichever comes first closes the log (run_stop, status aborted) and moves it
  out of the result folder, once.
  """

  def __init__(self, plan: Plan, log: MLLog, pending: pending_lib.PendingRun | None,
               folder: paths.Path, saver: checkpoint.RunSaver | None, console: Console):
    self._plan, self._log, self._pending, self._folder = plan, log, pending, folder
    self._saver, self._console = saver, console
    self._lock = threading.Lock()
    self._kept: paths.Path | None = None
    self._done = False

  def _close_log(self, stopped: bool) -> paths.Path | None:
    with self._lock:
      if not self._done:
        self._done = True
        if stopped:
          self._log.run_stop(False)
        self._log.close()
        if self._pending is not None:  # Out of the result folder, where nothing may count it.
          self._kept = self._pending.shelve(self._folder)
      return self._kept

  def interrupted(self, signum: int) -> str:
    """The final checkpoint, the log kept; returns the one-line message."""
    step = None
    if self._saver is not None:
      step = self._saver.final()
      self._saver.close()
    kept = self._close_log(stopped=True)
    signals.stopped()
    what = f"interrupted by {signal.Signals(signum).name}"
    if kept is not None:
      what += f": the partial log is kept at {kept}"
    if step is None:
      return what + ("; no checkpoint to resume from (use --checkpoint-every N to make runs "
                     "resumable)")
    return (f"{what}, the checkpoint of step {step} in {self._saver.directory}; resume with: "
            f"mlbench run {self._plan.workload.name} --resume {self._saver.directory}")

  def finished(self) -> None:
    """The run ended normally: close its log; nothing left for a stop to do."""
    with self._lock:
      self._done = True
      self._log.close()

  def cut_short(self, signum: int) -> None:
    """The watchdog's last words when the run could not stop in time."""
    filed = self._done and self._kept is None
    kept = self._close_log(stopped=True)
    where = ("the run's log was already filed" if filed
             else f"the partial log is kept at {kept}")
    os.write(2, (f"interrupted by {signal.Signals(signum).name} (no safe point reached in "
                 f"{signals.GRACE_S:g} s): {where}\n").encode())

  def peer_lost(self, message: str) -> None:
    """Another process died: the run cannot finish; file its log away (no result)."""
    self._close_log(stopped=True)

  def crashed(self) -> None:
    if self._saver is not None:
      self._saver.close()
    kept = self._close_log(stopped=False)
    if kept is not None:
      self._console.print(f"[yellow]the incomplete log of this run is kept at {kept}",
                          highlight=False)
