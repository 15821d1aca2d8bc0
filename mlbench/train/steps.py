"""The train state and the step functions the harness builds from a workload.

Workloads provide a pure loss and a pure eval step; this module turns them into
the three programs a run needs (init, train step, eval step) and compiles them
ahead of time against the mesh, from shapes alone, with explicit input and
output shardings and the train state donated. Only the harness calls `jax.jit`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from mlbench.train import attention, data, mesh as mesh_lib, sharding
from mlbench.workload import Batch, Schedule, Split, StepContext, Workload


@flax.struct.dataclass
class TrainState:
  """Everything that changes during training, as one pytree."""

  step: jax.Array
  params: Any
  model_state: Any
  opt_state: Any
  rng: jax.Array


@dataclasses.dataclass(frozen=True)
class Programs:
  """The compiled programs of one run, and the shardings they expect."""

  init: Any              # rng -> TrainState
  train: Any             # (state, metric_sums, batch) -> (state, metric_sums)
  eval: Any              # (state, batch) -> per-example outputs
  state_sharding: Any
  metric_names: tuple[str, ...]
  sums_sharding: Any
  batch_sharding: Any
  train_spec: Mapping[str, jax.ShapeDtypeStruct]
  eval_spec: Mapping[str, jax.ShapeDtypeStruct]
  opt_state_bytes: int = 0             # optimizer state one device holds
  opt_state_bytes_replicated: int = 0  # the whole optimizer state
  attention: tuple[attention.Used, ...] = ()  # what each program's attention runs on

  def fresh_sums(self) -> dict[str, jax.Array]:
    """Zeroed train-metric accumulators (the train step donates them)."""
    return {k: mesh_lib.replicated_value(self.sums_sharding[k].mesh, np.zeros((), np.float32))
            for k in self.metric_names}

  def init_state(self, seed: int) -> TrainState:
    """The initial train state of a run, on the mesh, from its seed."""
    mesh = self.sums_sharding["loss"].mesh
    return self.init(mesh_lib.replicated_value(mesh, np.uint32(seed % 2**32)))


def batch_spec(workload: Workload, cfg: Any, split: Split, global_batch: int,
               shard: Any) -> dict[str, jax.ShapeDtypeStruct]:
  """Global batch shapes, read off a one-row synthetic batch (`global_batch` rows: for
  packed training, `Schedule.rows()`)."""
  one = workload.synthetic_batch(cfg, split, 1, np.random.default_rng(0))
  if split is Split.EVAL:
    one = {**one, data.MASK: np.ones((1,), np.int32)}
  return {k: jax.ShapeDtypeStruct((global_batch,) + tuple(np.shape(v)[1:]), np.asarray(v).dtype,
                                  sharding=shard) for k, v in one.items()}


def init_fn(workload: Workload, cfg: Any, tx: optax.GradientTransformation):
  """seed -> TrainState: model parameters, model state and optimizer state."""

  def init(seed: jax.Array) -> TrainState:
    init_rng, train_rng = jax.random.split(jax.random.key(seed))
    params, model_state = workload.init(cfg, init_rng)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, model_state=model_state,
                      opt_state=tx.init(params), rng=train_rng)

  return init


def microbatches(batch: Batch, k: int) -> Batch:
  """[B, ...] -> [k, B/k, ...]; microbatch j holds rows j, j + k, j + 2k, ..., so every
  device that holds a contiguous block of rows has its share of every microbatch."""
  return jax.tree.map(lambda x: x.reshape((x.shape[0] // k, k) + x.shape[1:]).swapaxes(0, 1),
                      batch)


def value_and_grad(workload: Workload, cfg: Any, ctx: StepContext, params: Any,
                   model_state: Any, batch: Batch, rng: jax.Array, accumulate: int = 1):
  """((loss, (model_state, metrics)), grads) of the workload's loss on `batch`; with
  `accumulate` > 1, means over that many microbatches run one after another."""

  def one(state, mb, key):
    mb = mesh_lib.split_images(mb, workload.spatial_inputs, ctx.mesh)
    return jax.value_and_grad(
        lambda p: workload.loss(cfg, ctx, p, state, mb, key), has_aux=True)(params)

  if accumulate == 1:
    return one(model_state, batch, rng)

  def body(carry, xs):
    state, acc = carry
    mb, j = xs
    (loss, (state, metrics)), grads = one(state, mb, jax.random.fold_in(rng, j))
    out = (loss, metrics, grads)
    return (state, jax.tree.map(jnp.add, acc, out)), None

  zeros = jax.eval_shape(lambda: one(model_state, jax.tree.map(lambda x: x[0],
                                                               microbatches(batch, accumulate)),
                                     rng))
  acc0 = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                      (zeros[0][0], zeros[0][1][1], zeros[1]))
  (model_state, (loss, metrics, grads)), _ = jax.lax.scan(
      body, (model_state, acc0), (microbatches(batch, accumulate), jnp.arange(accumulate)))
  mean = lambda t: jax.tree.map(lambda x: x / accumulate, t)
  return (mean(loss), (model_state, mean(metrics))), mean(grads)


def train_fn(workload: Workload, cfg: Any, ctx: StepContext, tx: optax.GradientTransformation,
             update_sharding: Any = None, param_sharding: Any = None, accumulate: int = 1):
  """(state, metric_sums, batch) -> (state, metric_sums): one optimizer step.

  With `update_sharding` (weight-update sharding), gradients and parameters are
  constrained to it for the optimizer update, and the new parameters back to
  `param_sharding`: XLA reduce-scatters, updates shards, all-gathers. With
  `accumulate` > 1 the gradient is the mean over that many microbatches.
  """

  def step(state: TrainState, sums: dict[str, jax.Array], batch: Batch):
    rng = jax.random.fold_in(state.rng, state.step)
    (loss, (model_state, metrics)), grads = value_and_grad(
        workload, cfg, ctx, state.params, state.model_state, batch, rng, accumulate)
    params = state.params
    if update_sharding is not None:
      grads = jax.lax.with_sharding_constraint(grads, update_sharding)
      params = jax.lax.with_sharding_constraint(params, update_sharding)
    updates, opt_state = tx.update(grads, state.opt_state, params)
    params = optax.apply_updates(params, updates)
    if update_sharding is not None:
      params = jax.lax.with_sharding_constraint(params, param_sharding)
    new_state = state.replace(step=state.step + 1, params=params, model_state=model_state,
                              opt_state=opt_state)
    metrics = {"loss": loss, **metrics}
    return new_state, {k: sums[k] + jnp.asarray(v, jnp.float32) for k, v in metrics.items()}

  return step


def eval_fn(workload: Workload, cfg: Any, ctx: StepContext):
  def step(state: TrainState, batch: Batch) -> dict[str, jax.Array]:
    batch = mesh_lib.split_images(batch, workload.spatial_inputs, ctx.mesh)
    return workload.eval.step(cfg, ctx, state.params, state.model_state, batch)

  return step


def compile_programs(workload: Workload, cfg: Any, schedule: Schedule, mesh: Any,
                     ctx: StepContext, tx: optax.GradientTransformation, *,
                     weight_update_sharding: bool = False) -> Programs:
  """Lowers and compiles init, train and eval for `mesh` from shapes alone."""
  rng_spec = jax.ShapeDtypeStruct((), jnp.uint32, sharding=mesh_lib.replicated(mesh))
  init = init_fn(workload, cfg, tx)
  state_shapes = jax.eval_shape(init, rng_spec)
  stack = workload.layer_stack(cfg)
  state_sh = sharding.tree_shardings(state_shapes, workload.partition_rules(cfg), mesh,
                                     stack=stack.path if stack else None)
  update_sh = None
  if weight_update_sharding:
    state_sh = state_sh.replace(opt_state=sharding.over_data(state_shapes.opt_state,
                                                             state_sh.opt_state, mesh))
    update_sh = sharding.over_data(state_shapes.params, state_sh.params, mesh)
  batch_sh = mesh_lib.batch_sharding(mesh)
  rep = mesh_lib.replicated(mesh)
  train_spec = batch_spec(workload, cfg, Split.TRAIN, schedule.rows(), batch_sh)
  eval_spec = batch_spec(workload, cfg, Split.EVAL, schedule.eval_batch_size, batch_sh)

  train = train_fn(workload, cfg, ctx, tx, update_sh, state_sh.params,
                   accumulate=schedule.gradient_accumulation_steps)
  names = metric_names(workload, cfg, ctx, state_shapes, train_spec)
  sums_sh = {k: rep for k in names}
  state_in = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          state_shapes, state_sh)
  sums_in = {k: jax.ShapeDtypeStruct((), jnp.float32, sharding=rep) for k in names}

  init_c = jax.jit(init, out_shardings=state_sh).lower(rng_spec).compile()
  with attention.recording() as used:
    with attention.program("train step", mesh):
      train_lowered = jax.jit(train, in_shardings=(state_sh, sums_sh, batch_sh),
                              out_shardings=(state_sh, sums_sh),
                              donate_argnums=(0, 1)).lower(state_in, sums_in, train_spec)
    with attention.program("eval step", mesh):
      eval_lowered = jax.jit(eval_fn(workload, cfg, ctx), in_shardings=(state_sh, batch_sh),
                             out_shardings=batch_sh).lower(state_in, eval_spec)
  eval_c = eval_lowered.compile()
  train_c = train_lowered.compile()
  return Programs(init=init_c, train=train_c, eval=eval_c, state_sharding=state_sh,
                  metric_names=tuple(names), sums_sharding=sums_sh,
                  batch_sharding=batch_sh, train_spec=train_spec,
                  eval_spec=eval_spec,
                  opt_state_bytes=sharding.bytes_per_device(state_shapes.opt_state,
                                                            state_sh.opt_state),
                  opt_state_bytes_replicated=_nbytes(state_shapes.opt_state),
                  attention=tuple(used))


def _nbytes(tree: Any) -> int:
  return int(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def metric_names(workload: Workload, cfg: Any, ctx: StepContext, state: Any,
                 spec: Mapping[str, jax.ShapeDtypeStruct]) -> list[str]:
  """'loss' plus the names of the workload's train metrics, from shapes."""
  _, (_, metrics) = jax.eval_shape(
      lambda st, b: workload.loss(cfg, ctx, st.params, st.model_state, b, jax.random.key(0)),
      state, spec)
  if "loss" in metrics:
    raise ValueError(f"{workload.name}: loss() must not return a metric named 'loss'")
  return ["loss", *metrics]


def count_params(workload: Workload, cfg: Any) -> int:
  """Trainable parameters of a config, from shapes alone (nothing allocated)."""
  params, _ = jax.eval_shape(lambda k: workload.init(cfg, k), jax.random.key(0))
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def flops_per_example(workload: Workload, cfg: Any, ctx: StepContext) -> float:
  """Model FLOPs of one training example (forward and backward).

  The workload's analytic count if it gives one; else XLA's cost analysis of
  the gradient of the loss on a one-example batch, lowered but not compiled.
  """
  if workload.flops_per_example is not None:
    return float(workload.flops_per_example(cfg))
  params, model_state = jax.eval_shape(lambda k: workload.init(cfg, k), jax.random.key(0))
  one = workload.synthetic_batch(cfg, Split.TRAIN, 1, np.random.default_rng(0))
  spec = {k: jax.ShapeDtypeStruct(np.shape(v), np.asarray(v).dtype) for k, v in one.items()}

  def grad(p, s, b):
    return jax.grad(lambda p: workload.loss(cfg, ctx, p, s, b, jax.random.key(0))[0])(p)

  cost = jax.jit(grad).lower(params, model_state, spec).cost_analysis()
  if isinstance(cost, list):
    cost = cost[0]
  return float(cost["flops"])
