"""The run clock: synced marks, segments."""

from __future__ import annotations

import jax
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


def test_every_reading_waits_until_the_given_arrays_are_computed():
  # JAX returns from a dispatch while the device still computes; a clock that read
  # the time then would stop time-to-train before the work is done. The injected
  # `now` records whether the array was ready at the moment the time is read.
  @jax.jit
  def slow(x):  # about a second of device work per call on one CPU core
    return jax.lax.fori_loop(0, 60, lambda i, a: jnp.tanh(a @ a), x)

  x = jnp.full((384, 384), 0.01)
  slow(x).block_until_ready()  # compiled outside the measurement
  ready_when_read = []
  pending = {}
  clock = Clock(now=lambda: ready_when_read.append(pending["y"].is_ready()) or 0.0)
  for read in (lambda y: clock.read(y), lambda y: clock.mark("m", {"out": [y]}),
               lambda y: clock.since("m", 1.0, y)):
    pending["y"] = y = slow(x)
    assert not y.is_ready()  # still computing: the reading below has to wait
    read(y)
  assert ready_when_read == [True, True, True]
