"""Distributed batch norm: statistics over groups of replicas, checked against NumPy."""

from __future__ import annotations

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from mlbench.train import mesh as mesh_lib
from mlbench.train.layers import BatchNorm

DEVICES = 8


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


def _replica_groups(line: str) -> list[tuple[int, ...]]:
  """The device groups of an HLO all-reduce, in either of XLA's notations:
  `replica_groups={{0,1},{2,3}}`, or `replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}`
  (devices 0..7 in row-major order over the named axes, reduced over those in braces)."""
  m = re.search(r"replica_groups=mesh\[([^\]]*)\] \{([^}]*)\}", line)
  if m:
    axes = [(a.split("=")[0].strip("'"), int(a.split("=")[1])) for a in m.group(1).split(",")]
    reduced = {a.strip().strip("'") for a in m.group(2).split(",")}
    kept = [i for i, (name, _) in enumerate(axes) if name not in reduced]
    over = [i for i, (name, _) in enumerate(axes) if name in reduced]
    ids = np.arange(DEVICES).reshape([size for _, size in axes]).transpose(kept + over)
    groups = ids.reshape(-1, int(np.prod([axes[i][1] for i in over]))).tolist()
  else:
    m = re.search(r"replica_groups=\{((?:\{[\d,]+\},?)+)\}", line)
    assert m, f"no replica groups in {line}"
    groups = [[int(d) for d in g.split(",")] for g in re.findall(r"\{([\d,]+)\}", m.group(1))]
  return sorted(tuple(sorted(g)) for g in groups)


@pytest.mark.parametrize("groups", [1, 2, 4, 8])
def test_groups_reduce_within_their_devices_only(groups):
  """XLA sums each group's statistics over that group's neighbouring devices only:
  with 4 groups over 8 devices, over {0,1}, {2,3}, {4,5} and {6,7}."""
  mesh = mesh_lib.make_mesh()
  m = BatchNorm(num_groups=groups)
  x = jnp.ones((64, 4, 4, 16))
  v = m.init(jax.random.key(0), x)
  hlo = jax.jit(lambda v, x: m.apply(v, x, mutable=["batch_stats"]),
                in_shardings=(NamedSharding(mesh, P()), NamedSharding(mesh, P("data")))
                ).lower(v, x).compile().as_text()
  # The group statistics: per-channel sums of one group, [1 group, 16 channels] per
  # device. (Other all-reduces average the replicated running statistics.)
  stats = [ln for ln in hlo.splitlines()
           if " all-reduce(" in ln and re.search(r"= \(f32\[1,16\]", ln)]
  per_group = DEVICES // groups
  want = [tuple(range(g * per_group, (g + 1) * per_group)) for g in range(groups)]
  if per_group == 1:
    assert stats == []  # every device is its own group: nothing to reduce
  else:
    assert stats and all(_replica_groups(ln) == want for ln in stats), stats


def test_a_batch_that_does_not_split_is_refused():
  with pytest.raises(ValueError, match="does not split into 3 batch-norm groups"):
    BatchNorm(num_groups=3).init(jax.random.key(0), jnp.ones((8, 2)))
