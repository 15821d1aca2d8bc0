"""How one run's log ends up: filed as a result, or kept in its run folder.

A run that ends (its target reached, or its budget spent) is filed at once: its
log becomes the lowest free `result_<i>.txt` and `finished.json` marks its
checkpoint folder done, before anything waits (the checkpoint saves still in
flight, the compliance check). So a signal that arrives after the run's last
evaluation never costs its result, and a watchdog that ends the process finds it
filed. A run stopped early (a signal, the watchdog, a lost peer, a crash) gets
`run_stop` (aborted) and its log moves to its run folder as `partial.log`, never
counted. Whichever comes first happens, once; the lease on the run folder is let
go either way. A run stopped because its storage fails (`StorageFailed`: the log,
the result, the checkpoints cannot be written) is kept the same way, without a final
checkpoint, and where even that cannot be written its log stays, whole, where it was.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from typing import TYPE_CHECKING

from rich.console import Console

from mlbench.storage import faults, paths, writes
from mlbench.errors import StorageFailed
from mlbench.mllog import MLLog
from mlbench.storage.pending import PendingRun
from mlbench.train.lifecycle import agreement, signals
from mlbench.train.lifecycle.lease import Lease
from mlbench.train.lifecycle.runrecord import FINISHED_FILE

if TYPE_CHECKING:
  from mlbench.train.lifecycle.checkpoint import RunSaver

RUNNING, KEPT, FILED = "running", "kept", "filed"


class RunEnd:
  """The end of one run (see the module docstring).

  Args:
    log, pending: the run's log, and its pending log and record (None off process 0).
    folder: the run folder, where a stopped run's log is kept.
    saver: its checkpointing (a `checkpoint.RunSaver`), or None.
    lease: its lease on the checkpoint folder, or None (off process 0, no checkpoints).
    run_id: the run's id, the same on every host (names what the hosts agree on; default
      the run folder's name).
  """

  def __init__(self, name: str, log: MLLog, pending: PendingRun | None, folder: paths.Path,
               saver: RunSaver | None, lease: Lease | None, console: Console, *,
               run_id: str | None = None):
    self.log, self._name, self._pending, self._folder = log, name, pending, folder
    self._run_id = run_id or paths.path(folder).name
    self._saver, self._lease, self._console = saver, lease, console
    self._lock = threading.Lock()
    self._state = RUNNING
    self._ended = False  # run_stop is logged
    self._where: paths.Path | None = None

  def _keep(self, stopped: bool) -> paths.Path | None:
    """Closes the log (with run_stop aborted if `stopped`) and moves it out of the result
    folder, where nothing may count it. The caller holds the lock. Where the storage fails,
    the log stays whole where it is (the next run there moves it)."""
    if self._state == RUNNING:
      self._state = KEPT
      try:
        if stopped and not self._ended:
          self.log.run_stop(False)
      except StorageFailed:  # The log ends at its last whole line.
        pass
      self.log.close()
      if self._pending is not None:
        try:
          self._where = self._pending.shelve(self._folder)
        except Exception as e:  # Kept where it was written, if the storage fails there too.
          if faults.diagnose(e, self._folder) is None:
            raise
          self._where = paths.path(self._pending.log_path)  # local (a bucket's spool)
    return self._where

  def finished(self) -> paths.Path | None:
    """The run ended normally (run_stop is logged): file its log now; returns the result
    (None off process 0, or when another run took the run folder over meanwhile)."""
    with self._lock:
      if self._state != RUNNING:
        return None
      self.log.close()
      self._ended = True
      if self._lease is not None and not self._lease.ours():
        self._state = KEPT
        self._where = self._pending.shelve(self._folder)
        self._console.print(f"another run took {self._lease.folder} over while this one ran "
                            f"(no heartbeat for --stale-after?): its log is kept at "
                            f"{self._where}, not filed", style="red", highlight=False,
                            markup=False)
        return None
      if self._pending is not None:  # Not filed, the run can be resumed: StorageFailed.
        with faults.needed(self._pending.folder):
          self._where = self._pending.publish()
      self._state = FILED
      if self._saver is not None and self._where is not None:
        self._mark_finished()
    self.release()  # Filed: nothing may continue the run folder now.
    return self._where

  def _mark_finished(self) -> None:
    """finished.json in the checkpoint folder; where it cannot be written, --resume still
    refuses the run, finding its log among the results."""
    try:
      writes.write_new(self._saver.directory / FINISHED_FILE,
                        json.dumps({"log": str(self._where)}) + "\n")
    except Exception as e:
      fault = faults.diagnose(e, self._saver.directory)
      if fault is None:
        raise
      self._console.print(f"warning: the run is filed, but {FINISHED_FILE} could not be "
                          f"written ({fault.cause})", style="yellow", highlight=False,
                          markup=False)

  def release(self) -> None:
    """Lets the run folder go (idempotent)."""
    if self._lease is not None:
      self._lease.release()
      self._lease = None

  def interrupted(self, signum: int) -> str:
    """The final checkpoint, the log kept; returns the one-line message."""
    step = None
    if self._saver is not None:
      step = self._saver.final()
      self._saver.close()
    with self._lock:
      kept = self._keep(stopped=True)
    self.release()
    signals.stopped()
    what = f"interrupted by {signal.Signals(signum).name}"
    if kept is not None:
      what += f": the partial log is kept at {kept}"
    if step is None:
      return what + ("; no checkpoint to resume from (use --checkpoint-every N to make runs "
                     "resumable)")
    return (f"{what}, the checkpoint of step {step} in {self._saver.directory}; resume with: "
            f"mlbench run {self._name} --resume {self._saver.directory}")

  def storage_failed(self, e: StorageFailed) -> str:
    """A write the run needs failed: no final checkpoint (the storage fails), the saves in
    flight waited for, the log kept; returns the one-line message."""
    step = self._saver.abandon() if self._saver is not None else None
    with self._lock:
      kept = self._keep(stopped=True)
    self.release()
    what = e.cause + (f": the partial log is kept at {kept}" if kept is not None else "")
    fix = e.fix or "fix it"
    if step is None:
      line = what + (f"; no checkpoint to resume from; {fix} and run the same command again"
                     if self._saver is not None else
                     f"; no checkpoint to resume from (use --checkpoint-every N to make runs "
                     f"resumable); {fix} and run the same command again")
    else:
      line = (f"{what}, the checkpoint of step {step} in {self._saver.directory}; {fix} and "
              f"resume with: mlbench run {self._name} --resume {self._saver.directory}")
    # Every host stops on the line process 0 says (it knows where the log is kept).
    import jax

    return agreement.same_line(self._run_id, line, leader=jax.process_index() == 0,
                               process_count=jax.process_count())

  def cut_short(self, signum: int) -> None:
    """The watchdog's last words when the run could not stop in time."""
    if not self._lock.acquire(timeout=2.0):
      where = "its log was being filed"
    else:
      try:
        if self._state == FILED:
          where = f"the run had finished and its log is filed ({self._where})"
        else:
          where = f"the partial log is kept at {self._keep(stopped=True)}"
      finally:
        self._lock.release()
    self.release()
    grace_s, why = signals.grace()
    os.write(2, (f"interrupted by {signal.Signals(signum).name} (no safe point reached in "
                 f"{grace_s:.0f} s{why}): {where}\n").encode())

  def peer_lost(self, message: str) -> None:
    """Another process died: the run cannot finish; file its log away (no result)."""
    with self._lock:
      self._keep(stopped=True)

  def crashed(self) -> None:
    if self._saver is not None:
      self._saver.abandon()
    with self._lock:
      kept = self._keep(stopped=False)
    if kept is not None:
      self._console.print(f"the incomplete log of this run is kept at {kept}", style="yellow",
                          highlight=False, markup=False)
