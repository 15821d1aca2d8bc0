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
In a multi-process run the hosts agree on each save first (`agreement`).

orbax reports a failure of its background save threads in ERROR logs with tracebacks,
several per save, asyncio one about each task whose error orbax never retrieved, and
TensorStore's callbacks that complete after orbax closed the save's event loop each print
"RuntimeError: Event loop is closed" as an unraisable exception. The failure itself comes
back to the run as an exception, which it says in one line, so `quiet()` keeps those off
the console: the records of the threads a save started (and of the thread waiting for it,
while it waits: `saving()`), and the late callbacks' errors of a process that saves; orbax's
errors elsewhere (a restore's) still show. The threads of a failed save that wait for a signal it
never sent are ended (`release_waiters`), not left to orbax's timeout.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterator
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

  def failed(self, step: int, fault: faults.Fault, resumable: int | None, *,
             stop: bool = True) -> None:
    """The save of `step` failed with `fault` (on any host); `resumable`: the newest
    committed step.

    Raises:
      StorageFailed: the `LIMIT`th failure in a row (when `stop`).
    """
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


_saved = threading.Event()  # this process has made saves: their late callbacks may come


def _signaling_threads() -> list[threading.Thread]:
  try:
    from orbax.checkpoint._src.futures import future
  except ImportError:
    return []
  kind = getattr(future, "_SignalingThread", ())
  return [t for t in threading.enumerate() if isinstance(t, kind) and t.is_alive()]


def cancel_waiters() -> None:
  """Cancels orbax's save threads of this process that wait for a signal: once woken, a
  cancelled thread does no work (it writes nothing)."""
  # The coroutines the cancelled threads never started are collected unawaited.
  warnings.filterwarnings("ignore", r"coroutine '.*' was never awaited", RuntimeWarning)
  for t in _signaling_threads():
    try:
      t.cancel()
    except Exception:  # Its event loop is closed already: it is ending anyway.
      pass


def wake_waiters() -> None:
  """Sends orbax's waiting save threads the signals they wait for, so they end now. The
  signals are keys of jax.distributed's store, shared by every process: a thread of another
  process waiting for the same signal wakes too, and must be cancelled already, or it
  writes its part of a save that failed (`agreement.SaveVotes.wait` sees to it)."""
  from orbax.checkpoint._src.futures import future

  for t in _signaling_threads():
    try:
      future.set_signals(t._receive_signals, operation_id=t._operation_id)
    except Exception:  # Another orbax version: it ends at orbax's timeout instead.
      pass


def release_waiters() -> None:
  """Ends orbax's save threads that wait for what a failed save never did.

  The threads of one save wait for signals of each other (the step's folder created, ...),
  across processes too; a thread that fails sends none, and the others wait out orbax's
  coordination timeout (300 s), non-daemon threads that also keep the process from exiting.
  After a failure none of them has anything left to do: each is cancelled and sent the
  signals it waits for, so it ends at once. With several processes, only once every
  process has cancelled its own (after their vote on the save, `agreement`).
  """
  cancel_waiters()
  wake_waiters()


# The threads a save started, and those waiting for one (while they wait).
_save_threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
_waiting: dict[threading.Thread, set[threading.Thread]] = {}  # waiter -> threads before
_lock = threading.Lock()


@contextlib.contextmanager
def saving() -> Iterator[None]:
  """Marks the current thread as making or waiting for a save while inside; the threads
  started meanwhile (orbax's, for that save) are the save's from then on."""
  me = threading.current_thread()
  _saved.set()
  with _lock:
    _waiting[me] = set(threading.enumerate())
  try:
    yield
  finally:
    with _lock:
      _save_threads.update(set(threading.enumerate()) - _waiting.pop(me))


def _of_a_save() -> bool:
  """Whether the current thread is one of a save's, or waits for one."""
  me = threading.current_thread()
  with _lock:
    if me in _save_threads or me in _waiting:
      return True
    if any(me not in before for before in _waiting.values()):
      _save_threads.add(me)  # Started while a save was being made: one of its threads.
      return True
  return False


def _shown(record: logging.LogRecord) -> bool:
  """False for orbax's ERROR records about a save (said by the run in one line), and
  asyncio's about the tasks of a failed save whose storage errors orbax never retrieved."""
  if record.levelno < logging.ERROR:
    return True
  if record.name == "asyncio":
    error = record.exc_info[1] if record.exc_info else None
    in_orbax = error is not None and any(
        "/orbax/" in f.filename for f in traceback.extract_tb(error.__traceback__))
    return not (_of_a_save() or (in_orbax and faults.diagnose(error, "") is not None))
  return not ("/orbax/" in record.pathname.replace("\\", "/") and _of_a_save())


def _late_callback(unraisable: Any) -> bool:
  """A TensorStore callback of a save (a failed one), arriving after orbax closed its loop."""
  e = unraisable.exc_value
  if not (_saved.is_set() and isinstance(e, RuntimeError) and str(e) == "Event loop is closed"):
    return False
  frames = [f.name for f in traceback.extract_tb(unraisable.exc_traceback)]
  return frames[-2:] == ["call_soon_threadsafe", "_check_closed"]


_quiet = False


def quiet() -> None:
  """Once per process: what orbax says of a failed save stays off the console (see the
  module docstring); everything else it logs, and other unraisable errors, still show."""
  global _quiet
  if _quiet:
    return
  _quiet = True
  for name in ("absl", "asyncio"):
    logging.getLogger(name).addFilter(_shown)
  before = sys.unraisablehook

  def hook(unraisable: Any) -> None:
    if not _late_callback(unraisable):
      before(unraisable)

  sys.unraisablehook = hook
