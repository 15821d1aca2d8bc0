"""A save's deadline: from the bytes the busiest host writes and a rate (`savetime`)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from mlbench.train.lifecycle import savetime
from mlbench.train.lifecycle.savetime import FLOOR_S, MARGIN, SaveTime


def _array(mesh, spec, shape=(64, 40)):
  x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
  return jax.device_put(x, NamedSharding(mesh, spec))


def test_each_distinct_shard_counts_once_as_orbax_writes_it():
  """Replicated, sharded, and sharded over one axis of a 2-D mesh while replicated over the
  other: each array's bytes once (one process here holds every device), never per replica;
  an RNG key array (its data is saved as a few bytes) does not count."""
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
  tree = {"replicated": _array(mesh, P()), "sharded": _array(mesh, P("data", "model")),
          "half": _array(mesh, P("data")), "key": jax.random.key(0)}
  assert savetime.bytes_by_host(tree) == {0: 3 * 64 * 40 * 4}
  assert savetime.bytes_by_host({"host": np.zeros(10, np.float64)}) == {0: 80}


@pytest.mark.parametrize("gb", [60, 120])
def test_the_deadline_scales_with_the_bytes_the_busiest_host_writes(gb):
  """A pod host writing a 60 GB share at the assumed 100 MB/s needs 600 s: the deadline is
  4 x that (twice the bytes, twice the deadline), where a fixed 600 s failed every save."""
  t = SaveTime(busiest=gb * 10**9)
  assert t.expected_s == pytest.approx(gb * 10)
  assert t.seconds == pytest.approx(MARGIN * gb * 10) and t.seconds > 600
  assert f"{t.seconds:,.0f} s" in t.describe() and "assumed" in t.describe()


def test_a_small_save_gets_the_floor_and_a_rate_given_or_measured_moves_the_deadline():
  assert SaveTime(busiest=2 * 10**6).seconds == FLOOR_S  # a mini's megabytes
  given = SaveTime(rate=500e6, busiest=60 * 10**9)
  assert given.seconds == pytest.approx(MARGIN * 120) and given.basis == "--save-rate"
  assert not given.measure(5, 1000.0)  # --save-rate is what the user knows: it stays
  t = SaveTime(busiest=60 * 10**9)
  assert t.measure(5, 300.0)  # the run's first save, from its slowest host
  assert t.seconds == pytest.approx(MARGIN * 300) and t.rate_used == pytest.approx(200e6)
  assert "measured on the save of step 5" in t.describe()
  assert not t.measure(10, 900.0) and t.seconds == pytest.approx(MARGIN * 300)  # only the first
  assert t.to_json()["basis"] == "measured"
