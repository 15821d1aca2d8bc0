"""How long a checkpoint save may take: from the bytes each host writes and a rate.

Every wait of a save has a deadline (orbax's own timeout, each barrier, the vote:
`agreement`), and a stop by signal allows a save in flight and the final one to finish
(`signals.allow_for_saves`). A fixed deadline fails a pod: a host writing a 60 GB share at
100 MB/s needs 600 s per save, a mini's megabytes a second. So both come from the bytes the
busiest host writes per save (`bytes_by_host`: the shards orbax writes from it, the same
count on every host) and a rate: `--save-rate MB/s` where given, else `ASSUMED_RATE` until
the run's first save, then the rate that save measured (its slowest host's time, which
every host learns from the vote, so all hosts keep one deadline). The deadline is `MARGIN`
times the expected time, and never under `FLOOR_S` (the latency of a small save; the
longest a hung storage holds a run of a small state). The run's log says the deadline and
how it was found (`mlbench_save_deadline`, not an MLPerf key: the checker ignores it).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

from mlbench.train.lifecycle import signals

ASSUMED_RATE = 100e6
"""bytes/s a host is assumed to write a save at, until the run's first save is measured
(a persistent disk, or a bucket, per host)."""
FLOOR_S = 300.0
MARGIN = 4.0


def bytes_by_host(tree: Any) -> dict[int, int]:
  """{process: bytes it writes} for `tree` in one save. orbax (without replica-parallel
  writes) writes each distinct shard of an array once, from the device that holds its first
  replica, as jax numbers replicas: in `devices_indices_map`'s order. Arrays not on devices
  (and extended dtypes, the RNG key: its data is saved, a few bytes) count on process 0."""
  import numpy as np

  out: collections.Counter[int] = collections.Counter()
  for x in _leaves(tree):
    sharding, shape = getattr(x, "sharding", None), tuple(getattr(x, "shape", ()))
    try:
      itemsize = np.dtype(x.dtype).itemsize
    except TypeError:  # A key array's extended dtype.
      continue
    if sharding is None or not hasattr(sharding, "devices_indices_map"):
      out[0] += math.prod(shape) * itemsize
      continue
    seen = set()
    for device, index in sharding.devices_indices_map(shape).items():
      bounds = tuple(s.indices(n)[:2] if isinstance(s, slice) else (s, s + 1)
                     for s, n in zip(index, shape))
      if bounds not in seen:
        seen.add(bounds)
        out[device.process_index] += math.prod(b - a for a, b in bounds) * itemsize
  return dict(out)


def _leaves(tree: Any) -> list[Any]:
  import jax

  return jax.tree.leaves(tree)


@dataclasses.dataclass
class SaveTime:
  """The deadline of a run's saves (see the module docstring).

  Attributes:
    rate: `--save-rate` in bytes/s (None: assumed, then measured).
    busiest: the bytes of one save on the host that writes the most (0: not known yet).
    measured: bytes/s of the run's first save that committed, from its slowest host.
    measured_step: that save's step.
  """

  rate: float | None = None
  busiest: int = 0
  measured: float | None = None
  measured_step: int | None = None
  durations: list[float] = dataclasses.field(default_factory=list, init=False)
  """Seconds from each save's start to its commit, on this process."""
  _starts: collections.deque[float] = dataclasses.field(default_factory=collections.deque,
                                                        init=False, repr=False)

  def sized(self, tree: Any) -> None:
    """The run's first state to save is `tree`: the busiest host's bytes; a stop allows
    for saves of the expected time until one is measured."""
    self.busiest = max(bytes_by_host(tree).values(), default=0)
    signals.allow_for_saves(self.expected_s, f"save time expected of the busiest host's "
                            f"{self.busiest / 1e6:,.1f} MB at {self.rate_used / 1e6:,.3g} MB/s")

  def started(self) -> None:
    self._starts.append(time.perf_counter())

  def dropped(self, *, every: bool = False) -> None:
    """The last save started (`every`: every save not committed) will not commit."""
    if every:
      self._starts.clear()
    elif self._starts:
      self._starts.pop()

  def committed(self) -> None:
    """A save committed (they commit in the order they started): a stop allows twice the
    longest save's time."""
    self.durations.append(time.perf_counter() - self._starts.popleft())
    signals.allow_for_saves(max(self.durations), "longest checkpoint save of this run")

  @property
  def rate_used(self) -> float:
    return self.rate or self.measured or ASSUMED_RATE

  @property
  def basis(self) -> str:
    if self.rate:
      return "--save-rate"
    if self.measured:
      return f"measured on the save of step {self.measured_step}"
    return "assumed until the first save is measured; --save-rate MB/s sets it"

  @property
  def expected_s(self) -> float:
    """How long one save is expected to take."""
    return self.busiest / self.rate_used

  @property
  def seconds(self) -> float:
    """The deadline of every wait of a save."""
    return max(FLOOR_S, MARGIN * self.expected_s)

  def measure(self, step: int, seconds: float) -> bool:
    """The run's first committed save, of `step`, took `seconds` on its slowest host;
    returns whether that changed the deadline."""
    if self.measured is not None or seconds <= 0 or not self.busiest:
      return False
    before = self.seconds
    self.measured, self.measured_step = self.busiest / seconds, step
    # Every host's stop allows for it (orbax times a save's commit on process 0 alone).
    signals.allow_for_saves(max([seconds, *self.durations]), f"checkpoint save of step {step} "
                            "on its slowest host")
    return self.seconds != before

  def describe(self) -> str:
    """The deadline and where it comes from, in words."""
    return (f"checkpoint saves may take up to {self.seconds:,.0f} s each ({MARGIN:g} x "
            f"{self.busiest / 1e6:,.1f} MB on the busiest host at "
            f"{self.rate_used / 1e6:,.3g} MB/s, {self.basis}; at least {FLOOR_S:g} s)")

  def announce(self, log: Any, say: Callable[[str], None] | None) -> None:
    """Says the deadline in the run's log (`log`, an MLLog or None) and, where it is not
    the floor, on the console (`say`, None off process 0)."""
    if log is not None:  # Not an MLPerf key: the checker ignores it.
      log.event("mlbench_save_deadline", round(self.seconds), self.to_json())
    if say is not None and self.seconds > FLOOR_S:
      say(self.describe())

  def to_json(self) -> dict[str, Any]:
    return {"busiest_host_bytes": self.busiest, "rate_mb_s": round(self.rate_used / 1e6, 3),
            "basis": "flag" if self.rate else "measured" if self.measured else "assumed",
            "margin": MARGIN, "floor_s": FLOOR_S}
