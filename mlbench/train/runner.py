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
import secrets
import signal
from collections.abc import Callable

from rich.console import Console

from mlbench import compliance, config as config_lib, system
from mlbench.config import RunConfig
from mlbench.errors import Interrupted, StorageFailed, UserError
from mlbench.mllog import MLLog
from mlbench.storage import faults, paths, results, writes
from mlbench.storage import pending as pending_lib
from mlbench.train import compile_cache, loop, runtime as runtime_lib, telemetry
from mlbench.train.lifecycle import checkpoint, peers, refile, resume, signals, space
from mlbench.train.lifecycle.filing import RunEnd
from mlbench.train.lifecycle.lease import Lease
from mlbench.train.lifecycle.runrecord import FINISHED_FILE, RUN_FILE, find_run, new_record
from mlbench.train.plan import Plan, check_inputs, make_plan
from mlbench.train.progress import RunProgress
from mlbench.train.result import RunResult


@dataclasses.dataclass(frozen=True)
class Outcome:
  """A finished run and, on process 0, the checker's verdict on its log."""

  index: int
  result: RunResult
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
  if rc.resume is not None:  # The recorded mesh on this run's devices (resharding).
    rc = dataclasses.replace(rc, mesh=resume.fit_mesh(rc.mesh, len(runtime.devices)))
  plan = make_plan(rc, runtime)
  if runtime.is_leader:
    # A link out of --results-dir, or a folder (or bucket) that cannot be written,
    # fails now, before the data is prepared and before any compile.
    results.benchmark_dir(rc.results_dir, plan.system, plan.workload.benchmark)
    writes.check_writable(rc.results_dir, "--results-dir", parents=True, min_free_bytes=0)
    if rc.checkpoint_dir is not None:
      writes.check_writable(rc.checkpoint_dir, "--checkpoint-dir", min_free_bytes=0)
    if rc.resume is not None:
      writes.check_writable(rc.resume, "the checkpoint folder of --resume", min_free_bytes=0)
    # Room for what the runs will write (checkpoints, logs, the compile cache), counted.
    saves = bool(rc.checkpoint_every) or rc.resume is not None
    space.check(space.needs(plan, state=space.state_bytes(plan) if saves else 0,
                            cache=compile_cache.stats().folder))
  if plan.workload.input.prepare is not None:
    with paths.errors("cannot write the dataset under --data-dir", rc.data_dir):
      plan.workload.input.prepare(plan.cfg, rc.data_dir)
  # Listing the files is not reading them: a missing dataset (or starting point) fails
  # here, before anything is written, instead of after run_start.
  with paths.errors("--data-dir", rc.data_dir):
    check_inputs(plan)
    if plan.workload.input.bind is not None:
      plan = dataclasses.replace(plan, cfg=plan.workload.input.bind(plan.cfg, rc.data_dir))
  if rc.resume is not None:  # What only a running JAX knows: processes, the config resolved.
    problems = resume.plan_differences(find_run(rc.resume)[0], config_lib.flatten(plan.cfg),
                                       runtime.process_count)
    if problems:
      raise UserError(resume.refusal(rc.resume, problems))
  if not runtime.is_leader:
    return plan
  with paths.errors("cannot write under --results-dir", rc.results_dir):
    on_disk = system.ensure_system(rc.results_dir, plan.system_desc)
  return dataclasses.replace(plan, system_desc=on_disk)


def run_all(plan: Plan, *, console: Console,
            on_outcome: Callable[[Outcome], None] = lambda o: None) -> list[Outcome]:
  """All runs of the plan, one after another (or the one run `--resume` continues)."""
  if plan.runtime.is_leader:
    _tidy(plan, console)
  if plan.rc.resume is not None:
    record, folder = find_run(plan.rc.resume)
    todo = [(record.index, record.seeds[record.index], record.run_id, folder)]
    seed_list = list(record.seeds)
  else:
    seed_list = seeds(plan.rc, plan.runtime.process_count)
    ids = _run_ids(len(seed_list), plan.runtime.process_count)
    todo = [(i, s, rid, None) for i, (s, rid) in enumerate(zip(seed_list, ids))]
  outcomes = []
  watch = peers.watch(plan.runtime.process_index, plan.runtime.process_count)
  for index, seed, rid, ckpt in todo:
    outcome = _one(plan, Run(index, seed, rid, tuple(seed_list), ckpt), console, watch)
    on_outcome(outcome)
    outcomes.append(outcome)
    signum = signals.requested()
    if signum is None:
      continue
    # It came after the run's last evaluation: the run is filed as it ended.
    if index != todo[-1][0]:
      raise Interrupted(signum, f"stopped by {signal.Signals(signum).name} after run "
                                f"{index + 1}, whose log is {outcome.result.log}; the "
                                "remaining runs were not started")
    if plan.runtime.is_leader:
      console.print(f"note: {signal.Signals(signum).name} arrived after the last evaluation "
                    "of the run, which is filed as it ended", highlight=False)
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


def _saver(plan: Plan, run: Run,
           console: Console) -> tuple[checkpoint.RunSaver | None, paths.Path, Lease | None]:
  """The run's checkpointing (None when off), its run folder and, on process 0, its lease
  on the checkpoint folder (held until the run ends)."""
  rc = plan.rc
  folder = results.run_folder(rc.results_dir, plan.system, plan.workload.benchmark, run.run_id)

  def say(line: str) -> None:
    console.print(line, style="yellow", highlight=False, markup=False)

  if run.resume is not None:
    lease = _own(plan, run.resume, run.run_id, f"--resume {run.resume}", console)
    try:
      return checkpoint.RunSaver(run.resume, rc.checkpoint_every, resuming=True, say=say,
                                 key=run.run_id, save_rate=rc.save_rate), folder, lease
    except BaseException:
      if lease is not None:
        lease.release()
      raise
  if not rc.checkpoint_every:
    return None, folder, None
  ckpt_dir = (rc.checkpoint_dir / run.run_id if rc.checkpoint_dir is not None
              else folder / "checkpoints")
  if plan.runtime.is_leader:
    with faults.needed(ckpt_dir):
      ckpt_dir.mkdir(parents=True, exist_ok=True)
      record = new_record(plan, run.run_id, run.seeds, run.index)
      writes.write_new(ckpt_dir / RUN_FILE, record.to_json())
    if rc.checkpoint_dir is not None:  # The run folder says where its checkpoints are.
      with faults.needed(folder):
        folder.mkdir(parents=True, exist_ok=True)
        writes.write_new(folder / "checkpoints.txt", f"{paths.resolve(ckpt_dir)}\n")
  lease = _own(plan, ckpt_dir, run.run_id, f"the checkpoint folder {ckpt_dir}", console)
  return checkpoint.RunSaver(ckpt_dir, rc.checkpoint_every, key=run.run_id,
                            save_rate=rc.save_rate), folder, lease


def _own(plan: Plan, directory: paths.Path, run_id: str, what: str,
         console: Console) -> Lease | None:
  """Process 0 takes the lease on a checkpoint folder; every process learns whether it did."""
  lease, error = None, None
  if plan.runtime.is_leader:
    try:
      lease = Lease.take(directory, run_id, stale_after=plan.rc.stale_after, what=what,
                         say=lambda line: console.print(line, highlight=False, markup=False))
    except UserError as e:
      error = e
  if plan.runtime.process_count > 1:
    import numpy as np
    from jax.experimental import multihost_utils

    if not multihost_utils.broadcast_one_to_all(np.int32(error is None)) and error is None:
      error = UserError(f"{what}: process 0 could not take the run folder (see its message)")
  if error is not None:
    raise error
  return lease


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
    writes.write_new(saver.directory / FINISHED_FILE, json.dumps({"log": str(log)}) + "\n")
    raise UserError(f"--resume {saver.directory}: that run already finished ({log}); start a "
                    "new run instead")


def _one(plan: Plan, run: Run, console: Console, watch: peers.PeerWatch) -> Outcome:
  with signals.StopOnSignals():  # Before the log exists: a signal never finds it unguarded.
    return _guarded_one(plan, run, console, watch)


def _guarded_one(plan: Plan, run: Run, console: Console, watch: peers.PeerWatch) -> Outcome:
  try:
    saver, folder, lease = _saver(plan, run, console)
  except StorageFailed as e:
    raise _not_begun(plan, run, e) from None
  end = None
  try:
    if plan.runtime.is_leader and saver is not None and saver.resuming:
      _refuse_if_published(plan, saver)
    if saver is not None and saver.resuming:  # Reached its target, not filed: file it.
      if (kept := refile.file_kept(plan, saver, folder, run.seed, console)) is not None:
        return Outcome(run.index, *kept)
    log, pending = _log(plan, run, saver)
    end = RunEnd(plan.workload.name, log, pending, folder, saver, lease, console,
                 run_id=run.run_id)
    signals.on_timeout(end.cut_short)
    watch.on_lost = end.peer_lost
    return _run_and_file(plan, run, console, watch, saver, folder, end)
  except StorageFailed as e:
    if not e.final:
      raise _not_begun(plan, run, e) from None
    if run.resume is None and run.index + 1 < len(run.seeds):
      raise StorageFailed(e.cause, e.fix, f"{e.message}; the runs after it were not "
                          "started") from None
    raise
  finally:
    signals.on_timeout(lambda signum: None)
    watch.on_lost = lambda message: None
    if end is not None:
      end.release()
    elif lease is not None:
      lease.release()


def _log(plan: Plan, run: Run,
         saver: checkpoint.RunSaver | None) -> tuple[MLLog, pending_lib.PendingRun | None]:
  """The run's log (and on process 0 its pending record): writes it cannot do without."""
  if not plan.runtime.is_leader:
    return MLLog(None), None
  folder = results.benchmark_dir(plan.rc.results_dir, plan.system, plan.workload.benchmark)
  with faults.needed(folder):
    pending = pending_lib.PendingRun(folder, run.run_id).start()
  try:
    with faults.needed(folder):
      return MLLog(pending.log_path, prefix=saver.meta["log"] if saver and saver.resuming
                   else ""), pending
  except BaseException:
    pending.abandon()
    raise


def _not_begun(plan: Plan, run: Run, e: StorageFailed) -> StorageFailed:
  """The line of a storage fault before the run began (nothing of it was written)."""
  fix = e.fix or "fix it"
  if run.resume is not None:
    what, go_on = "the run did not begin", (f"resume with: mlbench run {plan.workload.name} "
                                             f"--resume {run.resume}")
  elif run.index:
    what, go_on = (f"run {run.index + 1} of {len(run.seeds)} did not begin (the runs before it "
                   "are filed)", "start the runs from it again")
  else:
    what, go_on = "the run did not begin", "run the same command again"
  return StorageFailed(e.cause, e.fix, f"{e.cause}: {what}; {fix} and {go_on}")


def _run_and_file(plan: Plan, run: Run, console: Console, watch: peers.PeerWatch,
                  saver: checkpoint.RunSaver | None, folder: paths.Path, end: RunEnd) -> Outcome:
  """The run, then its log filed at once (a result, or kept in its run folder)."""
  title = (f"{plan.workload.name} run {run.index + 1}/{len(run.seeds)} (seed {run.seed})"
           + (" resumed" if run.resume else ""))
  tele = telemetry.for_run(plan, folder)
  try:
    with RunProgress(title=title, total_samples=plan.schedule.max_train_samples,
                     train_examples=plan.schedule.train_examples, console=console,
                     enabled=plan.runtime.is_leader) as progress:
      result = loop.run_once(plan, run.seed, end.log, progress, saver, tele)
    result.log = end.finished()  # Before any wait: a signal from now on costs nothing.
  except Interrupted as e:
    raise Interrupted(e.signum, end.interrupted(e.signum)) from None
  except StorageFailed as e:  # Stopped as a preemption stops it, without a final save.
    raise StorageFailed(e.cause, e.fix, end.storage_failed(e)) from None
  except BaseException:
    end.crashed()
    watch.settle()  # A collective that failed because a peer died: say which one.
    raise
  finally:
    tele.close()
  if saver is not None:  # The saves in flight; a finished run needs no final one.
    saver.close()
    result.checkpoint_saves = saver.saves
  check = None
  if result.log is not None:
    with writes.fetched(result.log, "the run's log") as local:  # The checker reads files.
      check = compliance.check_log(local, plan.rule, paths.default_cache_dir())
  return Outcome(run.index, result, check)
