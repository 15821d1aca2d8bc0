"""The run clock: synced marks, segments."""

from __future__ import annotations

import jax.numpy as jnp

from mlbench.train.clock import Clock


def test_marks_and_segments_use_the_injected_time():
  times = iter([100.0, 101.5, 103.0, 110.25])
  clock = Clock(now=lambda: next(times))
  assert clock.mark("run_start") == 100_000
  x = jnp.ones(3) * 2
  assert clock.since("run_start", x) == 1.5  # Reads after x is computed.
  clock.add("eval", 0.5)
  clock.add("eval", 0.25)
  assert clock.mark("run_stop") == 103_000
  assert clock.between("run_start", "run_stop") == 3.0
  assert clock.segments["eval"] == 0.75
  assert clock.read() == 110.25
