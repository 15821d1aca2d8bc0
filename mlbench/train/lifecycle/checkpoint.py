"""Checkpoints of a run with orbax-checkpoint, and resuming from them.

A run with `--checkpoint-every N` saves, every N steps and asynchronously (the step loop
only waits for the device-to-host copy), everything needed to carry on as if nothing had
happened:

    state  the whole TrainState: parameters, optimizer state, batch-norm statistics,
           step, and the RNG key (as raw key data)
    sums   the train-metric sums of the block in progress
    meta   the MLPerf log written so far, the clock's marks and segments, the
           evaluations so far; the input position is the step: the pipelines are
           deterministic per seed, so resuming skips exactly `step` batches

The checkpoint folder also holds `run.json` (`runrecord`), so `--resume` repeats the run
exactly, and the lease of the live run that owns it (`lease`). Every process saves its own
shards into the same folder (a disk or a bucket every host writes to); orbax has process 0
commit the step once all have written, and the processes agree on every save's outcome
(`agreement`), each wait of a save within a deadline from the bytes the busiest host writes
(`savetime`). Restoring (`restore`) reshards onto whatever mesh the resumed run has and
skips a damaged checkpoint. Each save's full duration is measured: a stop by signal allows
the final save twice the longest (`signals.allow_for_saves`). A save that fails is one
warning, and the run goes on; too many in a row stop it (`failed_saves`).
"""

from __future__ import annotations

import pathlib
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax

from mlbench.storage import paths
from mlbench.train.lifecycle import agreement, failed_saves, restore as restore_lib, savetime
from mlbench.train.lifecycle.restore import Snapshot, abstract_state, continue_clock, manager

if TYPE_CHECKING:
  from mlbench.mllog import MLLog
  from mlbench.train.clock import Clock
  from mlbench.train.result import RunResult
  from mlbench.train.plan import Plan
  from mlbench.train.steps import Programs


class Checkpoints:
  """The checkpoints of one run.

  Args:
    directory: the run's checkpoint folder.
    every: save after every `every` steps (0: only the final checkpoint of a stop).
    clock, result: the run's clock and RunResult, read at every step.
    log_path: the run's log on process 0, a local file (None elsewhere).
    say: where one-line warnings go; log: the run's MLLog (says the saves' deadline).
    key, save_rate: the run's id (names what the hosts agree on; default the folder's
      name) and `--save-rate` in bytes/s (None: assumed, then measured; `savetime`).
  """

  def __init__(self, directory: paths.Path, every: int, clock: Clock, result: RunResult,
               log_path: pathlib.Path | None, say: Callable[[str], None] | None = None, *,
               log: MLLog | None = None, key: str | None = None,
               save_rate: float | None = None):
    self.directory, self._every = paths.path(directory), every
    self._clock, self._result, self._log_path, self._log = clock, result, log_path, log
    self._time = savetime.SaveTime(rate=save_rate)
    failed_saves.quiet()
    self._say = say or (lambda line: print(line, file=sys.stderr))
    self._votes = agreement.SaveVotes(key or self.directory.name, jax.process_index(),
                                      jax.process_count(), self._time.seconds, self._say)
    self._mgr = self._manager()
    self._failures = failed_saves.FailedSaves(self.directory, say)
    self._in_flight: int | None = None  # the step of the save not yet agreed on
    self._raised: Exception | None = None  # what its save() raised at once
    self._stuck = False  # the last manager's wait never ended: it is left, not closed
    self._closed = False  # the manager is closed (after the last save)
    self._waits: dict[int, threading.Thread] = {}  # the waits for failed saves' parts
    self._last: Snapshot | None = None
    self.saves: list[tuple[int, float]] = []  # (step, seconds the loop waited)
    self.durations = self._time.durations  # from each save's start to its commit

  def _manager(self) -> Any:
    self._mgr_timeout_s = self._votes.timeout_s  # orbax's own, fixed per manager
    with failed_saves.saving():
      return manager(self.directory, on_saved=self._time.committed,
                     barrier=self._votes.barrier, timeout_s=self._mgr_timeout_s)

  def _timed(self) -> None:
    """The saves' deadline is found, or a measured save changed it (alike on every host): the
    waits keep it, the log says it, a shorter manager's timeout is renewed (none in flight)."""
    self._votes.timeout_s = self._time.seconds
    self._time.announce(self._log, self._say if jax.process_index() == 0 else None)
    if self._time.seconds > self._mgr_timeout_s:
      self._renew()

  def after_step(self, step: int, state: Any, sums: Any) -> None:
    """Remembers the run after `step`; saves if `step` is a multiple of `every`."""
    self._last = Snapshot(
        step=step, state=state, sums=sums,
        log_bytes=self._log_path.stat().st_size if self._log_path else 0,
        marks=dict(self._clock.marks), segments=dict(self._clock.segments),
        evals=list(self._result.evals), input_wait_s=self._result.input_wait_s,
        taken=time.time())
    if not self._time.busiest:  # The first state seen: the saves' size, and deadline.
      self._time.sized((state, sums))
      self._timed()
    if self._every and step % self._every == 0:
      self._save(self._last)

  def final(self) -> int | None:
    """Saves the last step seen (if not saved yet) and waits; returns its step."""
    snap = self._last
    # Processes act on their own signals and may stop a step or two apart: a final save
    # of "my last step" would hold one process's shards. A multi-process run keeps the
    # periodic saves (the same steps everywhere) and waits alone for its part of the one in
    # flight (another may be blocked in a step this one never takes: at no save to agree
    # on); orbax commits a step only once every process has written it.
    if jax.process_count() > 1:
      step, self._in_flight = self._in_flight, None
      error = self._wait(step) if step is not None else None
      if error is not None:
        mine = agreement.outcome(jax.process_index(), error, self.directory)
        self._votes.post(mine)  # The others' waits for this part end.
        self._failed(step, mine, error if mine.kind == agreement.BUG else None, stop=False,
                     reopen=False)
      return self.newest()
    self.settle(stop=False)
    if snap is not None and snap.step != self.newest():
      self._save(snap, stop=False)
      self.settle(stop=False)
    return self.newest()

  def _wait(self, step: int) -> BaseException | None:
    """This process's part of the save of `step`: what failed it (None: it saved)."""
    error, self._raised = self._raised, None
    if error is None:
      with failed_saves.saving():
        error, self._waits[step] = self._votes.wait(
            self._mgr.wait_until_finished, failed_saves.cancel_waiters,
            failed_saves.wake_waiters)
    self._stuck = step in self._waits and self._waits[step].is_alive()  # blocks close()
    if error is not None:  # Cancelled before the vote: once woken they write nothing.
      failed_saves.cancel_waiters()
    return error

  def settle(self, *, stop: bool = True, last: bool = False) -> None:
    """Waits for this process's part of the save in flight, and agrees on its outcome with
    the others (`agreement`); a failure is said (`failed_saves`), and a fresh manager goes
    on (orbax's re-raises it) unless it is the `last` save; with `stop`, the LIMIT-th in a
    row raises StorageFailed."""
    step, self._in_flight = self._in_flight, None
    if step is None:  # No save since the last one agreed on, on any process.
      return
    error = self._wait(step)
    mine = agreement.outcome(jax.process_index(), error, self.directory, running=tuple(
        s for s, wait in self._waits.items() if wait.is_alive()),
        timeout_s=self._votes.timeout_s, seconds=self.durations[-1] if self.durations else 0)
    outcomes = self._votes.vote(mine)
    failed = self._votes.agree(outcomes)
    if failed is None:
      self._waits.pop(step, None)
      self._remove_finished(outcomes)
      self._failures.succeeded()
      if self._time.measure(step, max(o.seconds for o in outcomes)):
        self._timed()
      return
    self._waits.setdefault(step, threading.Thread())  # (a save that failed at once)
    self._failed(step, failed, error if mine.kind == agreement.BUG else None, stop=stop,
                 reopen=not last, outcomes=outcomes)

  def _failed(self, step: int, failed: agreement.Outcome, bug: BaseException | None, *,
              stop: bool, reopen: bool, outcomes: list[agreement.Outcome] | None = None) -> None:
    """The save of `step` failed (`failed` says why); `bug`: this process's error, no
    storage fault, raised (after any vote: the others do not wait for it)."""
    self._time.dropped(every=True)  # No commit will come for it.
    if bug is not None:
      raise bug
    self._renew(reopen=reopen)
    if outcomes is not None:  # Agreed on: every process is done with it (see below).
      self._remove_finished(outcomes)
    self._failures.failed(step, failed.fault(), self.newest(), stop=stop)

  def _remove_finished(self, outcomes: list[agreement.Outcome]) -> None:
    """Removes what failed saves wrote once every process's wait for them has ended (one
    that gave a save up at its deadline: at a later vote; hung writes past it are unseen)."""
    running = {s for o in outcomes for s in o.running}
    for step in sorted(set(self._waits) - running):
      failed_saves.remove_partial(self.directory, step)
      del self._waits[step]

  def newest(self) -> int | None:
    return self._mgr.latest_step()  # The newest committed step.

  def _renew(self, *, reopen: bool = True) -> None:
    """Closes the manager of a failed save and (`reopen`) goes on with a fresh one."""
    failed_saves.release_waiters()
    self._close_manager()
    if reopen:
      self._stuck = self._closed = False
      self._mgr = self._manager()

  def _close_manager(self) -> None:
    """orbax's close() raises the failure again (once per thread: the wait ran in another)
    before it closes: twice; a wait that never ended would block it, so never then."""
    for _ in range(0 if self._stuck or self._closed else 2):
      with failed_saves.saving():
        try:
          self._mgr.close()
          break
        except Exception:  # The failure, reported already.
          continue
    self._closed = True

  def close(self) -> None:
    """Waits for the save in flight (a failure only warns: nothing waits for it); stops."""
    self.settle(stop=False, last=True)
    if not (self._closed or self._stuck):
      with failed_saves.saving():
        self._mgr.close()
    self._closed = True

  def leave(self) -> None:
    """Stops saving; a save in flight of a multi-process run is left, not agreed on: where
    one process stops alone (a crash, its log's storage) the others are at no save."""
    if self._in_flight is None or not self._votes.shared:
      return self.close()
    self._in_flight = None
    self._votes.leave()
    failed_saves.release_waiters()

  def _save(self, snap: Snapshot, *, stop: bool = True) -> None:
    import orbax.checkpoint as ocp

    t0 = time.perf_counter()
    self.settle(stop=stop)  # orbax's save() waits for it too; here a failure is said.
    self._votes.begin(snap.step)
    self._time.started()
    self._in_flight = snap.step
    # The step loop forbids implicit transfers; saving is an intended one.
    with jax.transfer_guard("allow"), failed_saves.saving():
      state = snap.state.replace(rng=jax.random.key_data(snap.state.rng))
      try:
        self._mgr.save(snap.step, force=True, args=ocp.args.Composite(
            state=ocp.args.PyTreeSave(state), sums=ocp.args.PyTreeSave(snap.sums),
            meta=ocp.args.JsonSave(snap.meta(self._log_path))))
      except Exception as e:  # Failed at once: agreed on at the next settle, as a failure
        self._time.dropped()  # in the background is (others may wait for its writes).
        self._raised = e
        return
      except BaseException:
        self._time.dropped()
        self._in_flight = None
        raise
    waited = time.perf_counter() - t0
    self._clock.add("checkpoint", waited)
    self.saves.append((snap.step, waited))


class RunSaver:
  """A run's checkpointing and resuming, as the loop sees it.

  Args:
    directory: the run's checkpoint folder.
    every: checkpoint every this many steps (0: only when stopped by a signal).
    resuming: continue from the newest usable checkpoint in `directory`.
    say: where the one-line reports of damaged checkpoints go (process 0 only).
    key, save_rate: the run's id and `--save-rate` (`Checkpoints`).
  """

  def __init__(self, directory: paths.Path, every: int, *, resuming: bool = False,
               say: Callable[[str], None] | None = None, key: str | None = None,
               save_rate: float | None = None):
    self.directory = paths.path(directory)
    self.every, self.resuming, self._key, self._rate = every, resuming, key, save_rate
    self._leader = jax.process_index() == 0
    self._say = say or (lambda line: print(line, file=sys.stderr))
    self.meta, self.step = None, None
    if resuming:
      self.step, self.meta, damaged = restore_lib.newest_readable(self.directory,
                                                                  leader=self._leader)
      self._report(damaged, self.step)
    self._ckpts: Checkpoints | None = None
    self._result: Any = None

  def _report(self, damaged: list[tuple[int, str]], step: int) -> None:
    for line in restore_lib.report(self.directory, damaged, step) if self._leader else []:
      self._say(line)

  def continue_clock(self, clock: Clock, result: RunResult) -> None:
    self._result = result
    continue_clock(clock, result, self.meta)

  def restore(self, plan: Plan, programs: Programs, clock: Clock,
              log: MLLog) -> tuple[Any, int, Any]:
    """(state, step, sums) of the newest usable checkpoint, on this run's mesh; logs the
    resume."""
    from mlbench.train import steps

    init = steps.init_fn(plan.workload, plan.cfg, plan.tx)
    got = self._restorable(abstract_state(init, programs.state_sharding, plan.mesh),
                           programs.sums_sharding, clock, log)
    state, sums = restore_lib.placed(got, programs, clock, log, directory=self.directory,
                                     devices=len(plan.runtime.devices))
    return state, got.step, sums

  def _restorable(self, abstract: Any, sums_sharding: Any, clock: Clock,
                  log: MLLog) -> restore_lib.Restored:
    """The checkpoint chosen at the start, or the newest older one that reads back whole
    (`restore.readable`), with the log and clock put back to that one."""
    got, damaged = restore_lib.readable(self.directory, self.step, abstract, sums_sharding,
                                        leader=self._leader)
    if got.step != self.step:
      self._report(damaged, got.step)
      restore_lib.rewind(got.meta, clock, self._result, log.path)
      self.meta = got.meta
    return got

  def start(self, clock: Clock, result: RunResult, log: MLLog) -> None:
    """Begins saving (after the state exists and the clock runs)."""
    self._ckpts = Checkpoints(self.directory, self.every, clock, result, log.path, say=self._say,
                              log=log, key=self._key, save_rate=self._rate)

  def after_step(self, step: int, state: Any, sums: Any) -> None:
    self._ckpts.after_step(step, state, sums)

  def final(self) -> int | None:
    """Saves the last step seen, waits for every save; returns the step (None: no state yet)."""
    return None if self._ckpts is None else self._ckpts.final()

  def close(self) -> None:
    """Waits for the saves in flight and stops saving."""
    if self._ckpts is not None:
      self._ckpts.close()

  def abandon(self) -> int | None:
    """Stops saving without a final save (the storage fails, the run crashed), and without
    waiting for other processes (`Checkpoints.leave`); returns the newest committed step,
    the one to resume from (None: there is none)."""
    if self._ckpts is None:
      return self.step
    self._ckpts.leave()
    return self._ckpts.newest()

  @property
  def saves(self) -> list[tuple[int, float]]:
    return [] if self._ckpts is None else self._ckpts.saves
