"""Checkpoint saves that fail: one warning each, training goes on, too many in a row stop.

A save can fail where the run's storage does (a full disk, a quota, a refused write, a
bucket still answering 503 after the clients' retries). The checkpoint is a convenience of
the run, not its result: the state is in memory, the previous checkpoint stays the one to
resume from (orbax deletes old checkpoints only after a new one commits), and the next
save is tried at its time. Each failure is one warning naming the folder and the cause
(`mlbench.storage.faults`); its half-written step (`<step>.orbax-checkpoint-tmp` on a disk, the
step's objects without `commit_success.txt` in a bucket) is removed, which also gives a
full disk its space back. `LIMIT` failures in a row stop the run as a preemption does
(`StorageFailed`: the partial log kept, the line naming the cause and the `--resume`).

orbax reports a failure of its background save threads in ERROR logs with tracebacks,
several per save, asyncio one about each task whose error orbax never retrieved, and
TensorStore's callbacks that complete after orbax closed the save's
event loop each print "RuntimeError: Event loop is closed" as an unraisable exception.
The failure itself comes back to the run as an exception, which it says in one line, so
`quiet()` keeps both off the console. The threads of a failed save that wait for a
signal it never sent are ended (`release_waiters`), not left to orbax's timeout.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

from mlbench.storage import faults, paths

LIMIT = 3
"""Failed saves in a row that stop the run (the saves are on storage that keeps failing)."""


class FailedSaves:
  """The saves into `directory` that failed in a row, and the warnings about them.

  Args:
    directory: the checkpoint folder.
    say: where the one-line warnings go (default: stderr).
  """

  def __init__(self, directory: paths.Path, say: Callable[[str], None] | None = None):
    self.directory = directory
    self._say = say or (lambda line: print(line, file=sys.stderr))
    self.in_a_row = 0

  def succeeded(self) -> None:
    self.in_a_row = 0

  def failed(self, step: int, error: BaseException, resumable: int | None, *,
             stop: bool = True) -> None:
    """The save of `step` failed with `error`; `resumable`: the newest committed step.

    Raises:
      StorageFailed: the `LIMIT`th failure in a row (when `stop`).
      the error itself: it is no storage fault but a bug.
    """
    fault = faults.diagnose(error, self.directory)
    if fault is None:
      raise error
    remove_partial(self.directory, step)
    self.in_a_row += 1
    if stop and self.in_a_row >= LIMIT:
      raise fault.stop_after(f"{LIMIT} checkpoint saves in a row failed")
    left = LIMIT - self.in_a_row
    self._say(f"warning: the checkpoint of step {step} was not saved ({fault.cause}); "
              "training goes on, "
              + (f"the checkpoint of step {resumable} stays the one to resume from"
                 if resumable is not None else "with no checkpoint to resume from yet")
              + (f"; {left} more failed save(s) in a row stop the run" if stop else ""))


def remove_partial(directory: paths.Path, step: int) -> None:
  """Removes what a failed save of `step` wrote (only process 0: the folder is shared)."""
  import jax

  if jax.process_index() != 0:
    return
  directory = paths.path(directory)
  try:
    partial = list(directory.glob(f"{step}.orbax-checkpoint-tmp*"))
    step_dir = directory / str(step)
    if step_dir.is_dir() and not (step_dir / "commit_success.txt").exists() and paths.is_remote(
        directory):  # A bucket has no temporary names: the step itself, uncommitted.
      partial.append(step_dir)
    for p in partial:
      p.rmtree(missing_ok=True) if p.is_dir() else p.unlink(missing_ok=True)
  except Exception:  # The storage still fails: a later save's cleanup, or a resume, retries.
    pass


def release_waiters() -> None:
  """Ends orbax's save threads that wait for what a failed save never did.

  The threads of one save wait for signals of each other (the step's folder created, ...);
  a thread that fails sends none, and the others wait out orbax's coordination timeout
  (300 s), non-daemon threads that also keep the process from exiting. After a failure
  none of them has anything left to do: each is cancelled and sent the signals it waits
  for, so it ends at once (a cancelled thread does no work once it wakes).
  """
  try:
    from orbax.checkpoint._src.futures import future
  except ImportError:
    return
  # The coroutines the cancelled threads never started are collected unawaited.
  warnings.filterwarnings("ignore", r"coroutine '.*' was never awaited", RuntimeWarning)
  for t in threading.enumerate():
    if not isinstance(t, getattr(future, "_SignalingThread", ())) or not t.is_alive():
      continue
    try:
      t.cancel()
    except Exception:  # Its event loop is closed already: it is ending anyway.
      pass
    try:
      future.set_signals(t._receive_signals, operation_id=t._operation_id)
    except Exception:  # Another orbax version: it ends at orbax's timeout instead.
      pass


def _not_orbax_errors(record: logging.LogRecord) -> bool:
  """False for orbax's ERROR records (its save failures, said by the run in one line), and
  asyncio's about the tasks and futures of a failed save whose errors orbax never retrieved
  (TensorStore's storage errors, collected after the run has said what failed)."""
  if record.levelno < logging.ERROR:
    return True
  if record.name == "asyncio":
    error = record.exc_info[1] if record.exc_info else None
    return not ("/orbax/" in record.getMessage()
                or (error is not None and faults.diagnose(error, "") is not None))
  return "/orbax/" not in record.pathname.replace(os.sep, "/")


_quiet = False


def quiet() -> None:
  """Once per process: orbax's error logs of failed saves and the "Event loop is closed" of
  TensorStore callbacks arriving after them stay off the console (see the module)."""
  global _quiet
  if _quiet:
    return
  _quiet = True
  for name in ("absl", "asyncio"):
    logging.getLogger(name).addFilter(_not_orbax_errors)
  before = sys.unraisablehook

  def hook(unraisable: Any) -> None:
    e = unraisable.exc_value
    if isinstance(e, RuntimeError) and str(e) == "Event loop is closed":
      return
    before(unraisable)

  sys.unraisablehook = hook
