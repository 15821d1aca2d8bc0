"""Dead peers in a multi-process run: notice within seconds, say which, exit without a result.

When one process of a jax.distributed run dies, the others would wait in a
collective, or be aborted by the coordination service after its heartbeat
timeout with a C++ stack trace that names no process in words. Instead every
process writes a heartbeat (a timestamp) into the coordination service's
key-value store every second and reads the others'; a peer silent for
`timeout_s`, or a coordinator that no longer answers (process 0 died), ends
this process within about `timeout_s`: the run's `on_lost` callback closes
and files away its log, one line names the lost process, and the exit code is 1.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

INTERVAL_S = 1.0
TIMEOUT_S = 15.0
_KEY = "mlbench/heartbeat/{}"


def _client():
  from jax._src import distributed

  return distributed.global_state.client


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
    self._thread = threading.Thread(target=self._watch, daemon=True, name="mlbench-peers")

  def start(self) -> PeerWatch:
    if self._n > 1 and _client() is not None:
      self._thread.start()
    return self

  def stop(self) -> None:
    self._stop.set()

  def settle(self) -> None:
    """After an error in a collective: give the watch time to name a lost peer (it
    then ends the process); returns if every peer is still there."""
    if self._thread.is_alive():
      time.sleep(self._timeout_s + 3 * INTERVAL_S)

  def _beat(self, client, now: float) -> None:
    client.key_value_set(_KEY.format(self._me), f"{now:.3f}", allow_overwrite=True)

  def _silent(self, client, now: float) -> list[int]:
    """Peers whose heartbeat has not changed for `timeout_s` (on this host's clock)."""
    silent = []
    for peer in range(self._n):
      if peer == self._me:
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
      elif now - last[1] > self._timeout_s:
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
      if lost:
        self._lose(lost)

  def _lose(self, lost: list[int]) -> None:
    names = ", ".join(f"process {p}" + (" (the coordinator)" if p == 0 else "") for p in lost)
    message = (f"error: {names} of {self._n} stopped responding (no heartbeat for "
               f"{self._timeout_s:g} s); process {self._me} stops without writing a result")
    try:
      self.on_lost(message)
    finally:
      sys.stderr.write(message + "\n")
      sys.stderr.flush()
      os._exit(1)
