"""The other processes of a multi-process run: notice a dead one within seconds, and leave
together.

When one process of a jax.distributed run dies, the others would wait in a
collective, or be aborted by the coordination service after its heartbeat
timeout with a C++ stack trace that names no process in words. Instead every
process writes a heartbeat (a timestamp) into the coordination service's
key-value store every second and reads the others'; a peer silent for
`timeout_s`, or a coordinator that no longer answers (process 0 died), ends
this process within about `timeout_s`: the run's `on_lost` callback closes
and files away its log, one line names the lost process, and the exit code is 1.

Leaving (`leave`, at the end of every `mlbench` command). A process that is done posts its
exit code (`Exit`) in the store and waits, still beating, until every process has: a
process that ends early (its runs over, the others still filing) never takes the
coordination service away from one still using it. Then it stops its watch, joined (no
thread of it is inside jax's client any more), and shuts jax.distributed down with the
others (jax's shutdown barrier), before the interpreter exits. A daemon thread inside
jax's client at interpreter exit is ended by pthread cancellation inside C++, which aborts
the process ("terminate called ... FATAL: exception not rethrown", SIGABRT): a successful
run's second process ended so. Every process exits with one code (`agreed`). A peer that
posts a failure and stops (an error, a signal) ends a process still running its run
`timeout_s` later, with the peer's code. A process that ends with os._exit (a lost peer,
the stop watchdog) posts that first (`abrupt`): it meets nobody at jax's shutdown barrier,
where jax would wait for its heartbeat timeout and abort the process, so the others end
with os._exit too, after their own orderly stop.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

INTERVAL_S = 1.0
TIMEOUT_S = 15.0
LEAVE_WAIT_S = 900.0
"""How long a process that is done waits for the others (their compliance check, a final
save) before it leaves without them."""
ABRUPT_WAIT_S = 10.0
"""How long process 0, ending abruptly, waits for the others to end first."""
_KEY = "mlbench/heartbeat/{}"
_EXIT = "mlbench/exit/"


def _client() -> Any:
  from jax._src import distributed

  return distributed.global_state.client


@dataclasses.dataclass(frozen=True)
class Exit:
  """How one process ends: its exit `code`; `finished`: its runs ended (filed, or short of
  the target), not an error or a stop; `abrupt`: by os._exit, past jax's shutdown."""

  process: int
  code: int
  finished: bool
  abrupt: bool = False


def agreed(exits: list[Exit]) -> int:
  """The one exit code of every process: theirs where all agree, else the first nonzero
  code (by process) of one that did not finish, else of any (a failed run fails on every
  process, with one code)."""
  codes = {e.code for e in exits}
  if len(codes) == 1:
    return codes.pop()
  ordered = sorted(exits, key=lambda e: e.process)
  for e in [e for e in ordered if not e.finished] + ordered:
    if e.code:
      return e.code
  return 0


def _post(client: Any, mine: Exit) -> None:
  client.key_value_set(_EXIT + str(mine.process), json.dumps(dataclasses.asdict(mine)),
                       allow_overwrite=True)


def _exits(client: Any) -> dict[int, Exit]:
  return {e.process: e for e in (Exit(**json.loads(v)) for _, v in client.key_value_dir_get(
      _EXIT))}


_current: PeerWatch | None = None


def watch(process_index: int, process_count: int) -> PeerWatch:
  """This process's watch of the others, started at its first use."""
  return _current or PeerWatch(process_index, process_count).start()


def responding(process: int) -> bool:
  """Whether `process`'s heartbeat has changed within the last `timeout_s` (as this
  process's watch saw it; False without a watch)."""
  return _current is not None and _current.beating(process)


class PeerWatch:
  """Watches the other processes of this run from a daemon thread (one per process).

  Args:
    process_index, process_count: this process and how many there are.
    on_lost: called with the message before the process exits (closes the log).
  """

  def __init__(self, process_index: int, process_count: int,
               on_lost: Callable[[str], None] = lambda message: None,
               timeout_s: float = TIMEOUT_S):
    self._me, self._n = process_index, process_count
    self.on_lost = on_lost
    self._timeout_s = timeout_s
    self._stop = threading.Event()
    self._seen: dict[int, tuple[str, float]] = {}  # peer -> (last value, when it changed)
    self._exits: dict[int, tuple[Exit, float]] = {}  # peer -> (its exit, when first seen)
    self.leaving: Exit | None = None  # this process's, once posted
    self._thread = threading.Thread(target=self._watch, daemon=True, name="mlbench-peers")

  def start(self) -> PeerWatch:
    global _current
    if self._n > 1 and _client() is not None:
      self._thread.start()
      _current = self
    return self

  def stop(self) -> None:
    self._stop.set()

  def close(self) -> None:
    """Stops the watch and waits until its thread has left jax's client for good."""
    global _current
    self._stop.set()
    if self._thread.is_alive() and self._thread is not threading.current_thread():
      self._thread.join()
    if _current is self:
      _current = None

  def settle(self) -> None:
    """After an error in a collective: give the watch time to name a lost peer (it
    then ends the process); returns if every peer is still there."""
    if self._thread.is_alive():
      time.sleep(self._timeout_s + 3 * INTERVAL_S)

  def beating(self, peer: int) -> bool:
    """Whether `peer`'s heartbeat changed within the last `timeout_s`."""
    last = self._seen.get(peer)
    return (self._thread.is_alive() and last is not None and last[0] is not None
            and time.monotonic() - last[1] <= self._timeout_s)

  def _beat(self, client, now: float) -> None:
    client.key_value_set(_KEY.format(self._me), f"{now:.3f}", allow_overwrite=True)

  def _silent(self, client, now: float) -> list[int]:
    """Peers whose heartbeat has not changed for `timeout_s` (on this host's clock), and,
    while this process still runs, peers that ended abruptly or stopped with an error
    `timeout_s` ago (a peer that finished, or any once this process leaves too, is waited
    for by `leave`)."""
    for peer, e in _exits(client).items():
      if peer != self._me:  # Seen first when: an error's grace counts from there.
        self._exits[peer] = (e, self._exits.get(peer, (e, now))[1])
    silent = []
    for peer in range(self._n):
      if peer == self._me:
        continue
      if peer in self._exits:
        e, seen = self._exits[peer]
        if self.leaving is None and (e.abrupt or not e.finished
                                     and now - seen > self._timeout_s):
          silent.append(peer)
        continue
      try:
        value = client.key_value_try_get(_KEY.format(peer))
      except Exception as e:  # Not there yet: the peer has not beaten once.
        if "NOT_FOUND" not in str(e):
          raise
        value = None
      last = self._seen.get(peer)
      if last is None or last[0] != value:
        self._seen[peer] = (value, now)
      elif now - last[1] > self._timeout_s and not (value is None and self.leaving):
        # Once this process leaves, a peer that has not beaten yet is one whose command
        # starts its watch only as it leaves (a `check` still compiling): `leave` waits.
        silent.append(peer)
    return silent

  def _watch(self) -> None:
    client = _client()
    unreachable_since = None
    while not self._stop.wait(INTERVAL_S):
      now = time.monotonic()
      try:
        self._beat(client, time.time())
        lost = self._silent(client, now)
        unreachable_since = None
      except Exception:  # The coordinator (process 0) no longer answers.
        unreachable_since = unreachable_since or now
        if now - unreachable_since < self._timeout_s:
          continue
        lost = [0] if self._me != 0 else []
        if not lost:
          continue
      if lost and not self._stop.is_set():
        self._lose(lost)

  def _lose(self, lost: list[int]) -> None:
    posted = [self._exits[p][0] for p in lost if p in self._exits]
    silent = [p for p in lost if p not in self._exits]
    says = [f"process {e.process} stopped with exit code {e.code}" for e in posted] + [
        ", ".join(f"process {p}" + (" (the coordinator)" if p == 0 else "") for p in silent)
        + f" of {self._n} stopped responding (no heartbeat for {self._timeout_s:g} s)"
        for _ in silent[:1]]
    code = (self.leaving.code if self.leaving is not None else 0) or next(
        (e.code for e in posted if e.code), 1)
    message = (f"error: {'; '.join(says)}; process {self._me} stops without writing a "
               "result")
    try:
      self.on_lost(message)
    finally:
      sys.stderr.write(message + "\n")
      abrupt(code, gone=silent)


def abrupt(code: int, *, gone: Iterable[int] = ()) -> None:
  """Ends this process with `code` at once (os._exit: no Python exit handlers, no jax
  shutdown), first telling the others so, which then do the same (see the module
  docstring). For a process whose peers are gone or whose main thread cannot stop.
  Process 0 goes last (its coordination service ends with it, and jax aborts every
  process still connected): it waits, briefly, for the others but the `gone` ones."""

  def tell() -> None:
    try:
      client = _client() if "jax" in sys.modules else None
      if client is None:
        return
      from jax._src import distributed

      me, n = distributed.global_state.process_id, distributed.global_state.num_processes
      _post(client, Exit(me, code, False, abrupt=True))
      deadline, waited = time.monotonic() + ABRUPT_WAIT_S, set(range(1, n)) - set(gone)
      while me == 0 and time.monotonic() < deadline:
        if all(p in ended and ended[p].abrupt for ended in [_exits(client)] for p in waited):
          return
        time.sleep(0.05)
    except Exception:  # The coordinator is gone: nobody is left to tell.
      return

  teller = threading.Thread(target=tell, daemon=True, name="mlbench-abrupt")
  teller.start()
  # A coordinator that does not answer must not hold an exit "at once" long.
  teller.join(ABRUPT_WAIT_S + 2.0)
  _flush_and_exit(code)


def _flush_and_exit(code: int) -> None:
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except Exception:  # A closed pipe: nothing more can be said.
      pass
  os._exit(code)


def leave(code: int, *, finished: bool) -> int:
  """Ends this process's part of a multi-process run (see the module docstring): posts
  `code`, waits for every process to be done, stops the watch, shuts jax.distributed down
  with the others; returns the code every process exits with. Alone: `code`."""
  client = _client()
  if client is None:
    return code
  from jax._src import distributed

  me, n = distributed.global_state.process_id, distributed.global_state.num_processes
  w = watch(me, n)
  w.on_lost = lambda message: None  # The runs are over: nothing is left to file away.
  w.leaving = Exit(me, code, finished)
  _post(client, w.leaving)
  exits = _wait_for_all(client, w, n)
  w.close()
  final = agreed(list(exits.values()))
  if final != code:
    who = min(e.process for e in exits.values() if e.code == final)
    sys.stderr.write(f"error: process {who} of {n} exited with code {final} (see its output); "
                     f"process {me} exits with it too\n")
  if any(e.abrupt for e in exits.values()):  # jax's shutdown would wait for the gone peer,
    abrupt(final, gone=[e.process for e in exits.values() if e.abrupt])  # then abort.
  try:
    distributed.shutdown()
  except Exception as e:  # jax's shutdown barrier failed: a peer went meanwhile.
    sys.stderr.write(f"error: jax.distributed did not shut down with the others ({e})\n")
    return final or 1
  return final


def _wait_for_all(client: Any, w: PeerWatch, n: int) -> dict[int, Exit]:
  """Every process's exit, once each has posted one; a peer that dies meanwhile ends this
  process (the watch), and one alive but not done within `LEAVE_WAIT_S` is left behind."""
  deadline, pause = time.monotonic() + LEAVE_WAIT_S, 0.01
  while len(exits := _exits(client)) < n:
    if time.monotonic() > deadline:
      missing = sorted(set(range(n)) - set(exits))
      w.close()
      sys.stderr.write(f"error: process(es) {', '.join(map(str, missing))} of {n} did not end "
                       f"within {LEAVE_WAIT_S:g} s of this one while their heartbeat went on "
                       f"(unresponsive); process {w.leaving.process} leaves without them\n")
      abrupt(w.leaving.code or 1, gone=missing)
    time.sleep(pause)
    pause = min(2 * pause, 0.25)
  return exits
