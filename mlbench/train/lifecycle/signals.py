"""SIGTERM and SIGINT during a run: stop at the next safe point, within seconds.

A preempted VM or a cancelled job gets SIGTERM; a person presses Ctrl-C. The
first signal only sets a flag (a thread reads it off the wakeup fd, so even a
long compile in the main thread does not delay it): the loop calls `check()` after every train step
and between evaluation batches, and raises `Interrupted` there, where the
train state is consistent, so a final checkpoint and `run_stop` (status
aborted) can be written. Where the main thread cannot reach a safe point in
time (inside a long XLA compile, say), a watchdog runs the run's `on_timeout`
(which closes the log) and ends the process with 128 + signal number, so a
stop never takes more than its grace. The grace is `GRACE_S`, plus twice the
longest checkpoint save the run has measured (`allow_for_saves`): a save in
flight, then the final one, both finish before the process exits; the message
of the first signal says how long that is and why. A second signal exits at once.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from mlbench.errors import Interrupted
from mlbench.train.lifecycle import peers

SIGNALS = (signal.SIGTERM, signal.SIGINT)
GRACE_S = 8.0  # A stop without checkpoints: within 10 s; the rest is the process's own exit.


class _State:
  """What the handlers share with the loop (signal handlers are process-wide)."""

  def __init__(self) -> None:
    self.signum: int | None = None
    self.count = 0
    self.lock = threading.Lock()
    self.on_timeout: Callable[[int], None] = lambda signum: None
    self.done = threading.Event()
    self.base_s = self.grace_s = GRACE_S
    self.grace_why = ""


_state = _State()


def _name(signum: int) -> str:
  return signal.Signals(signum).name


def _watchdog(signum: int, grace_s: float) -> None:
  if _state.done.wait(grace_s):
    return
  try:
    _state.on_timeout(signum)
  finally:
    peers.abrupt(128 + signum)


def _received(signum: int) -> None:
  with _state.lock:
    _state.count += 1
    if _state.count > 1:  # The second signal: no more waiting.
      os.write(2, f"\n{_name(signum)} again: exiting now\n".encode())
      peers.abrupt(128 + signum)
    _state.signum = signum
    grace_s, why = grace()
  os.write(2, f"\n{_name(signum)}: stopping the run at the next step, within {grace_s:.0f} s"
              f"{why} (again to exit at once)\n".encode())
  threading.Thread(target=_watchdog, args=(signum, grace_s), daemon=True,
                   name="mlbench-stop-watchdog").start()


def allow_for_saves(save_s: float, how: str) -> None:
  """A checkpoint save takes about `save_s` seconds (`how`: measured or estimated): a stop
  allows a save in flight and the final one to finish, twice that, before it exits."""
  _state.grace_s = _state.base_s + 2 * save_s
  _state.grace_why = f"{_state.base_s:g} s + 2 x {save_s:.1f} s, the {how}"


def grace() -> tuple[float, str]:
  """(seconds a stop may take, why, as ": ..." or "")."""
  return _state.grace_s, f" ({_state.grace_why})" if _state.grace_why else ""


def _listen(sock: socket.socket) -> None:
  """Python runs signal handlers in the main thread only, and only between
  bytecodes: not during an XLA compile. The C-level handler writes the signal
  number to the wakeup fd at once, though; this thread reads it there."""
  while True:
    try:
      data = sock.recv(16)
    except OSError:
      return
    if not data:
      return
    for signum in data:
      _received(signum)


class StopOnSignals:
  """Handles SIGTERM and SIGINT for the duration of a `with` block (main thread only).

  Args:
    grace_s: how long the loop has to reach a safe point after the first signal.
  """

  def __init__(self, grace_s: float = GRACE_S):
    self._grace_s = grace_s
    self._old: dict[int, Any] = {}
    self._old_fd = -1
    self._socks: tuple[socket.socket, socket.socket] | None = None

  def __enter__(self) -> StopOnSignals:
    _state.signum, _state.count, _state.done = None, 0, threading.Event()
    _state.base_s = _state.grace_s = self._grace_s
    _state.grace_why = ""
    if threading.current_thread() is not threading.main_thread():
      return self
    self._socks = socket.socketpair()
    for sock in self._socks:
      sock.setblocking(True)
    self._socks[1].setblocking(False)  # The wakeup fd must not block the handler.
    self._old_fd = signal.set_wakeup_fd(self._socks[1].fileno(), warn_on_full_buffer=False)
    threading.Thread(target=_listen, args=(self._socks[0],), daemon=True,
                     name="mlbench-signals").start()
    for s in SIGNALS:  # The Python-level handler has nothing left to do.
      self._old[s] = signal.signal(s, lambda signum, frame: None)
    return self

  def __exit__(self, *exc: Any) -> None:
    _state.done.set()
    for s, old in self._old.items():
      signal.signal(s, old)
    self._old.clear()
    if self._socks is not None:
      signal.set_wakeup_fd(self._old_fd)
      for sock in self._socks:
        sock.close()
      self._socks = None


def on_timeout(callback: Callable[[int], None]) -> None:
  """What the watchdog does before it ends the process (the current run's last words)."""
  _state.on_timeout = callback


def requested() -> int | None:
  """The signal that asked the run to stop, if any."""
  return _state.signum


def check() -> None:
  """Raises `Interrupted` if a stop was requested; call at safe points."""
  if _state.signum is not None:
    raise Interrupted(_state.signum, f"interrupted by {_name(_state.signum)}")


def stopped() -> None:
  """The main thread has handled the stop: the watchdog stands down."""
  _state.done.set()


def guarded(items: Iterable[Any]) -> Iterator[Any]:
  """`items`, checking for a stop request before each one (evaluation batches)."""
  for item in items:
    check()
    yield item
