"""The run clock, with MLPerf semantics.

JAX dispatches work asynchronously, so the host's wall clock runs ahead of the
devices. Every timestamp the clock hands out is read after the given arrays are
ready, so `run_stop - run_start` covers all device work of the run. The clock
never pauses: MLPerf times evaluation too ("no pausing"); `segments` only
records where the time went, for the run summary.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any


def _block(trees: tuple[Any, ...]) -> None:
  if trees:
    import jax

    jax.block_until_ready(trees)


class Clock:
  """Device-synced wall clock with named marks and accumulated segments.

  Args:
    now: seconds since the epoch; injectable for tests of the arithmetic.
  """

  def __init__(self, now: Callable[[], float] = time.time):
    self._now = now
    self.marks: dict[str, float] = {}
    self.segments: collections.Counter[str] = collections.Counter()

  def read(self, *trees: Any) -> float:
    """Seconds since the epoch, after every array in `trees` is computed."""
    _block(trees)
    return self._now()

  def mark(self, name: str, *trees: Any) -> int:
    """Records `name` at the current (synced) time; returns it in ms for mllog."""
    t = self.read(*trees)
    self.marks[name] = t
    return int(t * 1000)

  def since(self, name: str, *trees: Any) -> float:
    """Seconds from mark `name` until now (synced)."""
    return self.read(*trees) - self.marks[name]

  def between(self, start: str, stop: str) -> float:
    """Seconds between two marks."""
    return self.marks[stop] - self.marks[start]

  def add(self, segment: str, seconds: float) -> None:
    """Accounts `seconds` of the run to `segment` (e.g. 'train', 'eval')."""
    self.segments[segment] += seconds
