"""The hosts of a multi-process run agree on each checkpoint save, and never wait forever.

orbax's multi-host save has process 0 commit a step once every process has written its
shards: each process's background thread waits at a barrier for the others. A process
whose writes fail (its disk full, its writes refused) never reaches that barrier, and the
others wait at it for orbax's timeout (20 minutes), then judge the save by themselves: one
host sees a failed save, another a successful one, and a host that stops reaches the
others as a lost peer. Here every wait of a save has a deadline, and its outcome is one
verdict for all:

- `SaveVotes.barrier` is orbax's barrier (`AsyncOptions.barrier_sync_fn`): each process
  marks its arrival in the coordination service's key-value store (jax.distributed's, which
  every process already holds) and waits for the others', unless a peer has voted its save
  failed, this process gave the save up, or the save's deadline (`savetime`) passes.
  orbax's barriers of its "save in progress" flag, which mlbench never reads, are local:
  they alone would hold a failed host's save thread, and the run with it, until the others
  give up.
- `SaveVotes.wait` waits for this process's part of a save, watching for a peer's failed
  vote meanwhile (then orbax's threads of this process that wait for that peer are
  cancelled, and woken once every process has cancelled its own: `failed_saves`).
- `SaveVotes.vote` posts this process's outcome (a process whose part failed cancels its
  waiting threads first), meets the others at a jax.distributed
  barrier (with a deadline) and reads every outcome: a save failed anywhere failed for all,
  and every host names the same cause (the first storage fault, by process; a process that
  did not vote while its heartbeat went on is named unresponsive, not its storage). The
  first host to judge the vote posts its verdict, and every host keeps that one (a host
  that reaches the vote after the others gave up on it agrees with them). Every host has
  finished with the save once the vote is in, so only then is a half-written step removed.

The keys are named by the run's id, which process 0 chose and every host has, never by a
host's path of the checkpoint folder: hosts that mount the shared folder at different
paths meet.

`same_line` gives every host the line process 0 ends a run with (it alone knows where the
log is kept). In a one-process run nothing here touches the key-value store.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from mlbench.storage import faults
from mlbench.train.lifecycle import savetime

POLL_S = 0.05
MAX_POLL_S = 0.5
SAVED, FAULT, PEER, TIMEOUT, HUNG, BUG = "saved", "fault", "peer", "timeout", "hung", "bug"
_LOCAL_BARRIERS = ("ThreadSaveMultiHostValueHolder",)
"""orbax's barriers of `CheckpointManager.is_saving_in_progress()`: kept local (see above)."""


def client() -> Any:
  """jax.distributed's client (its key-value store and barriers), or None."""
  from jax._src import distributed

  return distributed.global_state.client


class PeerFailed(Exception):
  """A barrier of a save gave up: a peer's part of it failed, or this process left it."""


class Deadline(TimeoutError):
  """A wait of a save ran past its deadline."""


class OthersLate(Deadline):
  """This process's part of a save was done, and the deadline passed while it waited at a
  barrier for the others' (their storage, or their main thread, is to blame: never its)."""


@dataclasses.dataclass(frozen=True)
class Outcome:
  """One process's part of a save: `kind` (SAVED, FAULT, PEER, TIMEOUT, HUNG, BUG) and, when
  it failed, the cause and the fix in words; `running`: the steps of saves this process gave
  up waiting for whose threads still run (what they wrote cannot be removed yet);
  `seconds`: how long its save took to commit (0: not known)."""

  process: int
  kind: str
  cause: str = ""
  fix: str = ""
  running: tuple[int, ...] = ()
  seconds: float = 0.0

  @property
  def ok(self) -> bool:
    return self.kind == SAVED

  def fault(self) -> faults.Fault:
    return faults.Fault(self.cause, self.fix)


def outcome(process: int, error: BaseException | None, where: Any,
            running: tuple[int, ...] = (), *, timeout_s: float = 0.0,
            seconds: float = 0.0) -> Outcome:
  """This process's part of a save, from what its wait raised (None: it saved);
  `timeout_s`: the save's deadline; `seconds`: how long it took to commit."""
  if error is None:
    return Outcome(process, SAVED, running=running, seconds=seconds)
  if isinstance(error, (PeerFailed, OthersLate)):
    return Outcome(process, PEER, str(error), "", running)
  if isinstance(error, TimeoutError) and error.errno is None:  # orbax's waits, or ours
    return Outcome(process, TIMEOUT, f"the save did not finish within {timeout_s:.0f} s at "
                   f"{where}", f"check {where}", running)
  fault = faults.diagnose(error, where)
  if fault is not None:
    return Outcome(process, FAULT, fault.cause, fault.fix, running)
  return Outcome(process, BUG, f"process {process} failed ({type(error).__name__}; see its "
                 "report)", "", running)


def verdict(outcomes: list[Outcome]) -> Outcome | None:
  """The save's one outcome: None when every process saved, else the failure every host
  names (a storage fault before a timeout before anything else, the first by process)."""
  failed = [o for o in outcomes if not o.ok]
  for kind in (FAULT, TIMEOUT, HUNG, BUG, PEER):
    for o in sorted(failed, key=lambda o: o.process):
      if o.kind == kind:
        return o
  return None


class SaveVotes:
  """The agreement on the saves into one checkpoint folder (one per `Checkpoints`).

  Args:
    key: names the keys, the same on every process (the run's id).
    process_index, process_count: this process, and how many there are.
    timeout_s: the deadline of every wait of a save (`savetime`; settable as it is found).
    say: where a warning about a late host goes.
  """

  def __init__(self, key: str, process_index: int, process_count: int,
               timeout_s: float = savetime.FLOOR_S, say: Callable[[str], None] = print):
    self._me, self._n, self._say = process_index, process_count, say
    self.timeout_s = timeout_s
    self._client = client() if process_count > 1 else None
    self._prefix = "mlbench/saves/" + hashlib.sha1(key.encode()).hexdigest()[:16]
    self._seq, self._step = 0, None
    self._passed: Counter[str] = Counter()
    self._left = threading.Event()  # this process gave the save in flight up
    self._at_barrier: set[str] = set()  # the barriers where this process waits for others

  @property
  def shared(self) -> bool:
    return self._client is not None

  def begin(self, step: int) -> None:
    """A save of `step` starts (on every process, in the same order)."""
    self._seq, self._step = self._seq + 1, step
    self._left.clear()

  def leave(self) -> None:
    """This process gives the save in flight up: its barriers end at once."""
    self._left.set()

  def _key(self, *parts: Any, seq: int | None = None) -> str:
    return "/".join([self._prefix, str(self._seq if seq is None else seq), *map(str, parts)])

  def failed_peers(self) -> list[Outcome]:
    """The peers that voted the save in flight failed."""
    if self._client is None:
      return []
    got = self._client.key_value_dir_get(self._key("vote") + "/")
    return [o for o in map(_read, got) if not o.ok]

  def barrier(self, *, key: str, timeout_ms: int) -> None:
    """orbax's barrier of this save (see the module docstring).

    Raises:
      PeerFailed: a peer voted the save failed, or this process left it.
      OthersLate: the others did not arrive within the time orbax gives (at most
        `timeout_s`).
    """
    if self._client is None or key.startswith(_LOCAL_BARRIERS):
      return
    self._passed[key] += 1
    base = self._key("barrier", key, self._passed[key])
    self._client.key_value_set(f"{base}/{self._me}", "1")
    deadline = time.monotonic() + min(timeout_ms / 1000, self.timeout_s)
    pause = POLL_S / 4
    self._at_barrier.add(key)
    try:
      while len(self._client.key_value_dir_get(base + "/")) < self._n:
        failed = self.failed_peers()
        if failed or self._left.is_set():
          raise PeerFailed(failed[0].cause if failed else "this process left the save")
        if time.monotonic() > deadline:
          raise self._others_late(key)
        time.sleep(pause)  # Soon at first (the others are mostly close behind), then less
        pause = min(2 * pause, MAX_POLL_S)  # often: a pod's hosts all ask one coordinator.
    finally:
      self._at_barrier.discard(key)

  def _others_late(self, key: str) -> OthersLate:
    return OthersLate(f"the other processes did not reach {key} of the save of step "
                      f"{self._step} within {self.timeout_s:.0f} s")

  def wait(self, finish: Callable[[], None], cancel: Callable[[], None],
           wake: Callable[[], None],
           timeout_s: float | None = None) -> tuple[BaseException | None, threading.Thread]:
    """Runs `finish` (orbax's wait for this process's part of the save) to its end or
    `timeout_s` (default: the save's deadline), and returns what it raised (None: nothing;
    `Deadline`: it still runs) and the thread that runs it.

    A peer's failed vote meanwhile means this process's threads of the save may wait for
    a signal of that peer that never comes: they are cancelled (`cancel`), and once every
    process has cancelled its own or voted (a voter cancelled its own first), woken
    (`wake`: orbax's signals are shared keys, so a thread woken uncancelled would write
    its part of the failed save after it is removed)."""
    box: list[BaseException | None] = [None]

    def run() -> None:
      try:
        finish()
      except BaseException as e:  # Handed to the caller, in its thread.
        box[0] = e

    worker = threading.Thread(target=run, daemon=True, name="mlbench-save-wait")
    worker.start()
    timeout_s = timeout_s or self.timeout_s
    deadline, cancelled, woken = time.monotonic() + timeout_s, False, False
    while worker.is_alive():
      worker.join(POLL_S * 4)
      if not worker.is_alive() or not self.shared:
        continue
      if not cancelled and self.failed_peers():
        cancelled = True
        cancel()
        self._client.key_value_set(self._key("cancelled", self._me), "1")
      if cancelled and not woken and self._all_cancelled():
        woken = True
        wake()
      if time.monotonic() > deadline:
        # Given up: its threads waiting for others end now, orbax's own timeouts end the rest.
        late = (tuple(self._at_barrier) or (None,))[0]  # its part done, it waits for others
        self.leave()
        cancel()
        wake()
        return (self._others_late(late) if late is not None else Deadline(
            f"the save of step {self._step} did not finish within {timeout_s:.0f} s")), worker
    error = box.pop()  # The box is in the error's traceback: no cycle keeps orbax's
    return error, worker  # manager (and its threads) alive once the caller lets it go.

  def _all_cancelled(self) -> bool:
    """Whether every process has cancelled its waiting threads of this save, or voted."""
    done = {k.rsplit("/", 1)[-1] for what in ("vote", "cancelled")
            for k, _ in self._client.key_value_dir_get(self._key(what) + "/")}
    return len(done) >= self._n

  def post(self, mine: Outcome) -> None:
    """Says this process's outcome without waiting for the others' (a failed part ends
    the others' waits for it: a final save, where they may be at no vote)."""
    if self._client is not None:
      self._client.key_value_set(self._key("vote", self._me),
                                 json.dumps(dataclasses.asdict(mine)))

  def vote(self, mine: Outcome, timeout_s: float | None = None) -> list[Outcome]:
    """Posts this process's outcome and returns every process's, once all have voted (a
    process that has not within `timeout_s`, default the save's deadline, counts as a
    failed part: unresponsive where its heartbeat goes on)."""
    if self._client is None:
      return [mine]
    timeout_s = timeout_s or self.timeout_s
    self.post(mine)
    try:
      self._client.wait_at_barrier(self._key("voted"), int(timeout_s * 1000))
    except Exception:  # jax raises its runtime error: a deadline, or a peer gone.
      pass  # What was voted is read below; the missing count as failed.
    got = {o.process: o for o in map(_read, self._client.key_value_dir_get(
        self._key("vote") + "/"))}
    if self._seq > 1:  # Every process is past the previous save's vote: its keys can go.
      self._client.key_value_delete(self._key(seq=self._seq - 1) + "/")
    return [got.get(p) or self._missing(p, timeout_s) for p in range(self._n)]

  def _missing(self, process: int, timeout_s: float) -> Outcome:
    """The part of a process that did not vote in time."""
    from mlbench.train.lifecycle import peers

    if peers.responding(process):
      return Outcome(process, HUNG, f"process {process} did not report on the save of step "
                     f"{self._step} within {timeout_s:.0f} s while its heartbeat went on: it is "
                     "unresponsive (its main thread hangs), not its storage",
                     f"see what process {process} is doing (py-spy dump --pid PID on its host)")
    return Outcome(process, TIMEOUT, f"process {process} did not report on the save of step "
                   f"{self._step} within {timeout_s:.0f} s", "check that host's storage")

  def agree(self, outcomes: list[Outcome]) -> Outcome | None:
    """The save's one verdict (`verdict`), the same on every host: the first host to judge
    posts its own, and every host keeps that one. A save process 0 finished is committed
    (orbax commits once every host has written): a host late to the vote is a warning."""
    failed = self._agreed(outcomes)
    if failed is not None and outcomes[0].ok:
      self._say(f"warning: {failed.cause}; the checkpoint of step {self._step} was saved")
      return None
    return failed

  def _agreed(self, outcomes: list[Outcome]) -> Outcome | None:
    failed = verdict(outcomes)
    if self._client is None:
      return failed
    key = self._key("verdict")
    try:  # Without overwrite: only the first host's verdict is kept.
      self._client.key_value_set(key, json.dumps(dataclasses.asdict(failed) if failed else {}))
    except Exception:  # Another host's verdict was there first: it stands.
      pass
    try:
      posted = json.loads(self._client.blocking_key_value_get(key, 10_000))
    except Exception:  # The store no longer answers: this host's own judgement.
      return failed
    return _outcome(posted) if posted else None


def _read(item: tuple[str, str]) -> Outcome:
  """An outcome from its key-value pair."""
  return _outcome(json.loads(item[1]))


def _outcome(fields: dict[str, Any]) -> Outcome:
  return Outcome(**{**fields, "running": tuple(fields.get("running", ()))})


def same_line(key: str, line: str, *, leader: bool, process_count: int,
              timeout_s: float = 60.0) -> str:
  """The line process 0 ends a run with, on every process (each passes its own `line`;
  a process that does not hear from process 0 within `timeout_s` keeps its own)."""
  kv = client() if process_count > 1 else None
  if kv is None:
    return line
  key = "mlbench/line/" + hashlib.sha1(key.encode()).hexdigest()[:16]
  if leader:
    kv.key_value_set(key, line, allow_overwrite=True)
    return line
  try:
    return kv.blocking_key_value_get(key, int(timeout_s * 1000))
  except Exception:  # Not heard (process 0 failed otherwise): this process's own line.
    return line
