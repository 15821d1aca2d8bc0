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
      mean_C, var_C = mean_var.value, var_var.value
    else:
      mean_G, var_G = _group_statistics(x, self.num_groups)
      if not self.is_initializing():
        m = self.momentum
        mean_var.value = m * mean_var.value + (1 - m) * mean_G.mean(axis=0)
        var_var.value = m * var_var.value + (1 - m) * var_G.mean(axis=0)
      mean_C, var_C = mean_G, var_G
    # Folded into one multiply-add per element, in the activations' dtype: the
    # statistics and the per-channel factors are float32, but no float32 copy of a
    # bfloat16 activation is made (or kept for the backward pass).
    a = scale * jax.lax.rsqrt(var_C + self.epsilon)
    b = bias - mean_C * a
    dtype = self.dtype or x.dtype
    return _per_group(x, a.astype(dtype), b.astype(dtype)).astype(dtype)


def _group_statistics(x: jax.Array, groups: int) -> tuple[jax.Array, jax.Array]:
  """(mean[G, C], var[G, C]) of each group of the batch, accumulated in float32."""
  b = x.shape[0]
  if b % groups:
    raise ValueError(f"batch {b} does not split into {groups} batch-norm groups")
  x_G = x.reshape((groups, b // groups) + x.shape[1:])
  axes = tuple(range(1, x_G.ndim - 1))
  mean = jnp.mean(x_G, axis=axes, dtype=jnp.float32)
  var = jnp.maximum(jnp.mean(jnp.square(x_G.astype(jnp.float32)), axis=axes) - mean * mean, 0.0)
  return mean, var


def _per_group(x: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
  """x * a + b with a, b of shape [C] or [G, C] (one row per group of the batch)."""
  if a.ndim == 1:
    return x * a + b
  groups = a.shape[0]
  x_G = x.reshape((groups, x.shape[0] // groups) + x.shape[1:])
  shape = (groups,) + (1,) * (x.ndim - 1) + (a.shape[-1],)
  return (x_G * a.reshape(shape) + b.reshape(shape)).reshape(x.shape)
