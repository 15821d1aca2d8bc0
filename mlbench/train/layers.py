"""Layers the harness gives workloads so that scaling features reach every model.

`BatchNorm` is distributed batch norm (Ying et al. 2018, "Image Classification
at Supercomputer Scale"): batch statistics over `num_groups` equal groups of the
global batch. Batches are sharded over the data axis in order, so a group is
the examples of `devices / num_groups` neighbouring devices and XLA reduces the
statistics within those devices only. With one group it is the usual batch norm
over the global batch; with as many groups as devices, per-device batch norm.
The running statistics average the groups' statistics every step, so they are
always the same on every replica (nothing to synchronise before evaluation).
Parameter and statistic names match flax.linen.BatchNorm.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


class BatchNorm(nn.Module):
  """Batch norm over groups of the batch. Input [B, ..., C]; B divisible by num_groups."""

  use_running_average: bool = False
  num_groups: int = 1
  momentum: float = 0.99
  epsilon: float = 1e-5
  dtype: Any = None
  scale_init: Any = nn.initializers.ones
  bias_init: Any = nn.initializers.zeros

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    c = x.shape[-1]
    mean_var = self.variable("batch_stats", "mean", lambda: jnp.zeros((c,), jnp.float32))
    var_var = self.variable("batch_stats", "var", lambda: jnp.ones((c,), jnp.float32))
    scale = self.param("scale", self.scale_init, (c,), jnp.float32)
    bias = self.param("bias", self.bias_init, (c,), jnp.float32)
    if self.use_running_average:
      y = (x.astype(jnp.float32) - mean_var.value) * jax.lax.rsqrt(var_var.value + self.epsilon)
    else:
      y, mean_G, var_G = _grouped_normalize(x, self.num_groups, self.epsilon)
      if not self.is_initializing():
        m = self.momentum
        mean_var.value = m * mean_var.value + (1 - m) * mean_G.mean(axis=0)
        var_var.value = m * var_var.value + (1 - m) * var_G.mean(axis=0)
    y = y * scale + bias
    return y.astype(self.dtype or x.dtype)


def _grouped_normalize(x: jax.Array, groups: int, epsilon: float):
  """Normalises each group by its own statistics; returns (y, mean[G, C], var[G, C])."""
  b = x.shape[0]
  if b % groups:
    raise ValueError(f"batch {b} does not split into {groups} batch-norm groups")
  x_G = x.astype(jnp.float32).reshape((groups, b // groups) + x.shape[1:])
  axes = tuple(range(1, x_G.ndim - 1))
  mean = x_G.mean(axis=axes, keepdims=True)
  var = jnp.maximum((x_G * x_G).mean(axis=axes, keepdims=True) - mean * mean, 0.0)
  y = ((x_G - mean) * jax.lax.rsqrt(var + epsilon)).reshape(x.shape)
  flat = (groups, x.shape[-1])
  return y, mean.reshape(flat), var.reshape(flat)
