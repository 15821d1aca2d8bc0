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

`stack` is a stack of identical layers with their parameters stacked on a leading
layer axis (`nn.scan`): scanned on one device group, or, with a `stage` mesh axis,
split into GPipe pipeline stages (`mlbench.train.pipeline`). A workload that builds
its repeated layers with it and declares them as its `Workload.layer_stack` gets
pipeline parallelism from `--mesh ...,stage=S`, with no pipeline code of its own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from mlbench.train import pipeline


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


def batch_norm(cfg: Any, *, train: bool, groups: int = 1) -> Callable[..., BatchNorm]:
  """`BatchNorm` as a convolutional model's config sets it (`cfg.bn_momentum`,
  `cfg.bn_epsilon`, the compute dtype `cfg.dtype`): statistics over `groups` groups of the
  batch in training (`StepContext.bn_groups`), the running averages in evaluation."""
  return functools.partial(BatchNorm, use_running_average=not train, num_groups=groups,
                           momentum=cfg.bn_momentum, epsilon=cfg.bn_epsilon,
                           dtype=jnp.dtype(cfg.dtype.value))


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


class _Body(nn.Module):
  """One layer of a stack as an `nn.scan` body: (x, (per_example, shared)) -> (x, aux)."""

  layer: Callable[..., nn.Module]
  kwargs: tuple[tuple[str, Any], ...] = ()
  mesh: Any = None

  @nn.compact
  def __call__(self, x: jax.Array, args: tuple[tuple, tuple]) -> tuple[jax.Array, Any]:
    per_example, shared = args
    rows = pipeline.batch_axes(self.mesh)
    if rows:
      # Keep the carried activations split by rows: parameters split over `data`
      # (FSDP) are then gathered, not the activations re-split.
      from jax.sharding import NamedSharding, PartitionSpec

      x = jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, PartitionSpec(rows)))
    out = self.layer(name="layer")(x, *per_example, *shared, **dict(self.kwargs))
    return out if isinstance(out, tuple) else (out, None)


def stack(layer: Callable[..., nn.Module], x: jax.Array, *, length: int,
          per_example: Sequence[jax.Array] = (), shared: Sequence[jax.Array] = (),
          kwargs: Mapping[str, Any] | None = None, has_aux: bool = False, mesh: Any = None,
          microbatches: int = 1, remat_policy: Any = None, name: str = "layers",
          rngs: Sequence[str] = ("dropout",)) -> Any:
  """`length` layers `layer(name="layer")`, applied in turn to `x`; call it inside a
  Flax module's compact method. Parameters live under `name/layer/...`, each with a
  leading axis of `length` (declare `LayerStack(path=name, layers=length)`).

  Args:
    layer: builds one layer (a Module class or a partial of one); it is called as
      `layer(x, *per_example, *shared, **kwargs)` and returns x, or (x, aux dict)
      with `has_aux`.
    per_example: arrays [B, ...] that go with the rows of `x` (attention masks).
    shared: arrays every row uses (position tables, a causal mask).
    kwargs: static keyword arguments (`deterministic`).
    mesh, microbatches: `StepContext.mesh` and `StepContext.microbatches`; with a
      `stage` axis (and outside `init`) the layers run as a GPipe pipeline.
    remat_policy: None (keep every activation) or a `jax.checkpoint` policy for each
      layer (`jax.checkpoint_policies.nothing_saveable`: keep only layer inputs).
    rngs: the random streams the layer draws from (`dropout`; MoE's `gating`): split
      per layer when scanned, folded per microbatch and layer when pipelined (other
      draws, same distribution).

  Returns:
    x after the layers, or (x, aux summed over layers) with `has_aux`.
  """
  static = tuple(sorted((kwargs or {}).items()))
  body = _Body if remat_policy is None else nn.remat(_Body, policy=remat_policy,
                                                      prevent_cse=False)
  scanned = nn.scan(body, variable_axes={"params": 0},
                    split_rngs={"params": True, **{r: True for r in rngs}},
                    in_axes=nn.broadcast, length=length)(layer, static, mesh, name=name)
  if pipeline.stage_count(mesh) == 1 or scanned.is_initializing():
    y, aux = scanned(x, (tuple(per_example), tuple(shared)))
    aux = {} if aux is None else jax.tree.map(lambda a: a.sum(0), aux)
  else:
    streams = tuple(r for r in rngs if scanned.has_rng(r))
    rng = scanned.make_rng(streams[0]) if streams else None
    y, aux = pipeline.gpipe(functools.partial(_apply_layer, layer, static, has_aux, streams),
                            scanned.variables["params"]["layer"], x, mesh=mesh,
                            microbatches=microbatches, per_example=per_example,
                            shared=shared, rng=rng, policy=remat_policy)
  return (y, aux) if has_aux else y


def _apply_layer(layer: Callable[..., nn.Module], static: tuple, has_aux: bool,
                 streams: tuple[str, ...], params: Any, x: jax.Array, per_example: tuple,
                 shared: tuple, rng: Any) -> tuple[Any, Any]:
  """One pipelined layer: the layer module applied to its own slice of the stack, each
  random stream with its own key."""
  rngs = {} if rng is None else {r: jax.random.fold_in(rng, i) for i, r in enumerate(streams)}
  out = layer(parent=None).apply({"params": params}, x, *per_example, *shared, **dict(static),
                                 rngs=rngs)
  return out if has_aux else (out, {})
