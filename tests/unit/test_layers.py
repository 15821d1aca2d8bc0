"""Distributed batch norm: statistics over groups of replicas, checked against NumPy."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from mlbench.train import mesh as mesh_lib
from mlbench.train.layers import BatchNorm


def _batch():
  rng = np.random.default_rng(0)
  # Every device's slice comes from its own distribution, so groups really differ.
  shift = np.repeat(np.arange(8.0), 8)[:, None, None, None]
  return (rng.standard_normal((64, 3, 3, 5)) * (1 + shift / 4) + shift).astype(np.float32)


@pytest.mark.parametrize("groups", [1, 2, 4, 8])
def test_grouped_statistics_match_numpy_over_each_groups_union(groups):
  x = _batch()
  mesh = mesh_lib.make_mesh()
  m = BatchNorm(num_groups=groups, momentum=0.9)
  variables = m.init(jax.random.key(0), x)
  apply = jax.jit(lambda v, x: m.apply(v, x, mutable=["batch_stats"]),
                  in_shardings=(NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))))
  y, updates = apply(variables, x)
  # Reference: group g is the union of the batches of devices g*K .. (g+1)*K - 1.
  xg = x.reshape(groups, -1, 3, 3, 5)
  mean = xg.mean(axis=(1, 2, 3), keepdims=True)
  var = xg.var(axis=(1, 2, 3), keepdims=True)
  want = ((xg - mean) / np.sqrt(var + 1e-5)).reshape(x.shape)
  np.testing.assert_allclose(np.asarray(y), want, atol=2e-4)
  stats = updates["batch_stats"]
  np.testing.assert_allclose(stats["mean"], 0.1 * mean.reshape(groups, 5).mean(0), rtol=1e-5)
  np.testing.assert_allclose(stats["var"], 0.9 + 0.1 * var.reshape(groups, 5).mean(0),
                             rtol=1e-5)


def test_one_group_is_flax_batch_norm():
  x = _batch()
  ours, theirs = BatchNorm(momentum=0.9), nn.BatchNorm(use_running_average=False, momentum=0.9)
  v = ours.init(jax.random.key(0), x)
  assert jax.tree.map(jnp.shape, v) == jax.tree.map(jnp.shape, theirs.init(jax.random.key(0), x))
  y1, s1 = ours.apply(v, x, mutable=["batch_stats"])
  y2, s2 = theirs.apply(v, x, mutable=["batch_stats"])
  np.testing.assert_allclose(y1, y2, atol=1e-5)
  for a, b in zip(jax.tree.leaves(s1), jax.tree.leaves(s2)):
    np.testing.assert_allclose(a, b, rtol=1e-5)  # float32 summation order


def test_groups_reduce_within_their_devices_only():
  """XLA reduces the statistics over groups of neighbouring devices, not all eight."""
  mesh = mesh_lib.make_mesh()
  m = BatchNorm(num_groups=4)
  x = jnp.ones((64, 4, 4, 16))
  v = m.init(jax.random.key(0), x)
  hlo = jax.jit(lambda v, x: m.apply(v, x, mutable=["batch_stats"]),
                in_shardings=(NamedSharding(mesh, P()), NamedSharding(mesh, P("data")))
                ).lower(v, x).compile().as_text()
  stats = [ln for ln in hlo.splitlines() if " all-reduce(" in ln and "reduce_fusion" in ln]
  assert stats and all("'axis_0'=4,'axis_1'=2" in ln for ln in stats), stats


def test_a_batch_that_does_not_split_is_refused():
  with pytest.raises(ValueError, match="does not split into 3 batch-norm groups"):
    BatchNorm(num_groups=3).init(jax.random.key(0), jnp.ones((8, 2)))
