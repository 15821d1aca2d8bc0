"""GPipe pipeline parallelism over the mesh's `stage` axis (Huang et al. 2019, "GPipe").

A layer stack's L layers (parameters stacked on a leading axis, which the sharding
rules split over `stage` into S contiguous blocks of L/S) run as S stages, and each
batch is split into M microbatches that flow through them: M + S - 1 iterations, in
each of which every stage applies its layers to one microbatch and hands the result to
the next stage. The first S - 1 iterations fill the pipeline and the last S - 1 drain
it, so every stage computes on padding in S - 1 of the M + S - 1 iterations: the
bubble, (S - 1) / (M + S - 1) of the stack's time.

Built from JAX's own primitives, as MaxText's pipeline is: one `jax.shard_map`, manual
over `stage` only (the data, model and expert axes stay with GSPMD, so stages compose
with data, FSDP and tensor parallelism), a `lax.scan` over the iterations and
`lax.ppermute` for the hand-offs (collective-permutes). Differentiating it gives the
backward pipeline, the permutes reversed. Each stage runs under `jax.checkpoint`
(GPipe's rematerialisation): the forward pass keeps only each iteration's stage input,
the backward pass recomputes the stage from it.

Inputs and outputs are spread over the stages, not replicated (MaxText's rotating
`state_io`): stage s starts with microbatches s*Q .. s*Q + Q - 1 (Q = M / S) in Q slots.
At iteration t stage 0 takes slot t % Q as its input; then that slot moves one stage
towards stage 0 everywhere, and the last stage writes its output into it. After the
last iteration stage s holds the outputs of the microbatches it started with, rotated
by S - 1 slots. The stack's output so comes back split over `stage` (and `data`): what
follows it (the head, the loss) runs split over both, not once per stage.

Shape suffixes: B batch, M microbatches, Q microbatches per stage, b microbatch (B / M).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mlbench.errors import UserError

STAGE = "stage"
BATCH_AXES = ("data", "expert")
"""The mesh axes that split a batch's rows: data parallelism, and the MoE's tokens."""

LayerFn = Callable[..., tuple[Any, dict[str, Any]]]
"""`layer_fn(layer_params, x_b, per_example_b, shared, rng) -> (x_b, aux)`: one layer on
one microbatch; `aux` a dict of scalars (summed over layers, averaged over microbatches)."""


def bubble_fraction(stages: int, microbatches: int) -> float:
  """The share of a pipelined stack's time each stage idles: (S - 1) / (M + S - 1)."""
  return (stages - 1) / (microbatches + stages - 1) if stages > 1 else 0.0


def stage_count(mesh: Any) -> int:
  return 1 if mesh is None else int(mesh.shape.get(STAGE, 1))


def batch_axes(mesh: Any) -> tuple[str, ...]:
  """The axes of `BATCH_AXES` that `mesh` splits (empty: the rows stay whole)."""
  return () if mesh is None else tuple(a for a in BATCH_AXES if mesh.shape.get(a, 1) > 1)


def check(*, stages: int, microbatches: int, layers: int, what: str,
          per_replica: Mapping[str, int]) -> None:
  """One-line errors for a schedule that cannot run: a stage count that does not divide
  the layers, microbatches that are not a multiple of the stages or do not divide a
  batch's examples per data-parallel replica (`per_replica`: {batch key: examples})."""
  if layers % stages:
    divisors = [d for d in range(2, layers + 1) if layers % d == 0]
    raise UserError(f"--mesh stage={stages} does not divide the {layers} layers of {what}'s "
                    f"layer stack; use a stage count from {', '.join(map(str, divisors))}")
  if microbatches % stages:
    raise UserError(f"pipeline.microbatches={microbatches} is not a multiple of the {stages} "
                    f"stages; --set pipeline.microbatches= {stages}, {2 * stages}, ...")
  for key, n in per_replica.items():
    if n % microbatches:
      fits = [m for m in range(stages, n + 1, stages) if n % m == 0]
      fix = (f"--set pipeline.microbatches= one of {', '.join(map(str, fits))}" if fits
             else f"--set {key}= a multiple of {microbatches} per data-parallel replica")
      raise UserError(f"{key} gives {n} examples per data-parallel replica, which "
                      f"pipeline.microbatches={microbatches} does not divide; {fix}")


def _constrain(x: Any, mesh: Any, spec: Any) -> Any:
  import jax
  from jax.sharding import NamedSharding

  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def to_stages(x_BX: Any, stages: int, microbatches: int, mesh: Any) -> Any:
  """[B, ...] -> [S, Q, b, ...]: row i*M + s*Q + j is row i of microbatch s*Q + j. Every
  data shard holds its share of every microbatch, so this is local slicing."""
  import jax.numpy as jnp
  from jax.sharding import PartitionSpec as P

  b = x_BX.shape[0] // microbatches
  # Split by batch first (an FSDP embedding leaves its output split by width): resharding
  # after the reshape would replicate the activations to get there.
  rows = batch_axes(mesh)
  x = _constrain(x_BX, mesh, P(rows)).reshape((b, stages, microbatches // stages)
                                             + x_BX.shape[1:])
  return _constrain(jnp.moveaxis(x, 0, 2), mesh, P(STAGE, None, rows))


def from_stages(y_SQbX: Any, mesh: Any) -> Any:
  """The inverse of `to_stages`: [B, ...] split over data (and expert) x stage."""
  import jax.numpy as jnp
  from jax.sharding import PartitionSpec as P

  y = jnp.moveaxis(y_SQbX, 2, 0)
  return _constrain(y.reshape((-1,) + y.shape[3:]), mesh, P((*batch_axes(mesh), STAGE)))


def by_microbatch(x_BX: Any, microbatches: int, mesh: Any) -> Any:
  """[B, ...] -> [M, b, ...] with the rows `to_stages` gives microbatch m."""
  from jax.sharding import PartitionSpec as P

  b = x_BX.shape[0] // microbatches
  x = x_BX.reshape((b, microbatches) + x_BX.shape[1:]).swapaxes(0, 1)
  return _constrain(x, mesh, P(None, batch_axes(mesh)))


def _stage(layer_fn: LayerFn, policy: Any, mesh: Any, params: Any, x_bX: Any, extras: Any,
           shared: Any, key: Any, first_layer: Any) -> tuple[Any, dict[str, Any]]:
  """This stage's layers (a scan over its block of the stack) on one microbatch."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import PartitionSpec as P

  # Inside shard_map: a bare spec, read against the mesh with `stage` manual.
  batch = P(batch_axes(mesh))

  def one(h, xs):
    p, i = xs
    k = None if key is None else jax.random.fold_in(key, first_layer + i)
    # The microbatch stays split by rows: parameters split over `data` (FSDP) are
    # gathered, not the activations re-split.
    return layer_fn(p, jax.lax.with_sharding_constraint(h, batch), extras, shared, k)

  if policy is not None:
    one = jax.checkpoint(one, policy=policy, prevent_cse=False)
  n = jax.tree.leaves(params)[0].shape[0]
  x_bX, aux = jax.lax.scan(one, x_bX, (params, jnp.arange(n)))
  return x_bX, jax.tree.map(lambda a: a.sum(0), aux)


def _run_stages(layer_fn: LayerFn, policy: Any, mesh: Any, microbatches: int,
                params: Any, io_1QbX: Any, extras_MbX: Any, shared: Any, key: Any):
  """The per-stage program inside `shard_map`: M + S - 1 iterations (see the module doc)."""
  import jax
  import jax.numpy as jnp

  s, stages = jax.lax.axis_index(STAGE), stage_count(mesh)
  io_QbX = io_1QbX[0]
  per = io_QbX.shape[0]
  n = jax.tree.leaves(params)[0].shape[0]
  # GPipe's rematerialisation at the stage boundary: only the stage input is kept.
  stage = jax.checkpoint(functools.partial(_stage, layer_fn, policy, mesh), prevent_cse=False)
  pick = lambda m: jax.tree.map(lambda e: e[m], extras_MbX)  # noqa: E731
  _, aux0 = jax.eval_shape(stage, params, io_QbX[0], pick(0), shared, key, 0)
  aux0 = jax.tree.map(lambda a: jax.lax.pcast(jnp.zeros(a.shape, a.dtype), STAGE, to="varying"),
                      aux0)
  forward = [(i, i + 1) for i in range(stages - 1)]
  back = [(i + 1, i) for i in range(stages - 1)]

  def iteration(carry, t):
    io, shift, aux_sum = carry
    k, m = t % per, t - s  # the slot stage 0 reads; the microbatch this stage works on
    mc = jnp.clip(m, 0, microbatches - 1)
    x_in = jnp.where(s == 0, io[k], shift)
    key_m = None if key is None else jax.random.fold_in(key, mc)
    y, aux = stage(params, x_in, pick(mc), shared, key_m, s * n)
    real = (m >= 0) & (m < microbatches)
    aux_sum = jax.tree.map(lambda a, b: a + jnp.where(real, b, 0), aux_sum, aux)
    shift = jax.lax.ppermute(y, STAGE, forward)
    slot = jnp.where(s == stages - 1, y, jax.lax.ppermute(io[k], STAGE, back))
    return (jax.lax.dynamic_update_index_in_dim(io, slot, k, 0), shift, aux_sum), None

  carry = (io_QbX, jnp.zeros_like(io_QbX[0]), aux0)
  (io_QbX, _, aux), _ = jax.lax.scan(iteration, carry, jnp.arange(microbatches + stages - 1))
  aux = jax.tree.map(lambda a: jax.lax.psum(a, STAGE) / microbatches, aux)
  return jnp.roll(io_QbX, -(stages - 1), axis=0)[None], aux


def gpipe(layer_fn: LayerFn, params: Any, x_BX: Any, *, mesh: Any, microbatches: int,
          per_example: Sequence[Any] = (), shared: Sequence[Any] = (), rng: Any = None,
          policy: Any = None) -> tuple[Any, dict[str, Any]]:
  """Runs a layer stack as a GPipe pipeline over the mesh's `stage` axis.

  Args:
    layer_fn: one layer on one microbatch (see `LayerFn`).
    params: the stack's parameters, every leaf [L, ...], split over `stage` on axis 0.
    x_BX: the stack's input [B, ...], B split over `data`.
    mesh: the device mesh; its `stage` axis (S > 1) runs the stages.
    microbatches: M, a multiple of S dividing each data shard's rows.
    per_example: arrays [B, ...] each layer also takes, per microbatch (masks, biases).
    shared: arrays every layer takes whole (position tables).
    rng: a key; layer l of microbatch m gets fold_in(fold_in(rng, m), l).
    policy: a `jax.checkpoint` policy for each layer inside the stage's recomputation.

  Returns:
    (the stack's output [B, ...] split over data x stage, the layers' aux summed over
    layers and averaged over microbatches).
  """
  import jax
  from jax.sharding import PartitionSpec as P

  stages = stage_count(mesh)
  io = to_stages(x_BX, stages, microbatches, mesh)
  extras = tuple(by_microbatch(e, microbatches, mesh) for e in per_example)
  program = functools.partial(_run_stages, layer_fn, policy, mesh, microbatches)
  run = jax.shard_map(program, mesh=mesh, in_specs=(P(STAGE), P(STAGE), P(), P(), P()),
                      out_specs=(P(STAGE), P()), axis_names={STAGE})
  y, aux = run(params, io, extras, tuple(shared), rng)
  return from_stages(y, mesh), aux
