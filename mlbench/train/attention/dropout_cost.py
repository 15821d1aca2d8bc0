"""What the dropout attention kernels declare to XLA (`pl.CostEstimate`).

libtpu counts a Pallas kernel without a cost estimate as free (mlbench/pod/xlacost.py),
so `mlbench check` could neither estimate a step that runs one nor count its FLOPs and
bytes in the roofline. These kernels declare theirs:
- FLOPs and transcendentals: `pl.estimate_cost` of the very `dropout_math` functions a
  grid step runs, on one block's shapes, times the chunks each step runs and the steps of
  the grid. Those are jax's Pallas cost rules: matmuls (2 per multiply-add), elementwise
  arithmetic, exp; compares, selects, shifts and reductions count nothing, so the
  dropout hash's multiplies and xors count, its shifts and compare do not.
- Bytes: the blocks the grid moves between HBM and VMEM: every operand and result once
  (a row's keys and values are fetched once per row and key/value head, its queries once
  per block), the segment ids once per head (their blocks are fetched again as the head
  changes).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from mlbench.train.attention import dropout_math as dm


def _bytes(arrays: list[Any]) -> int:
  return sum(math.prod(a.shape) * jnp.dtype(a.dtype).itemsize for a in arrays)


def _blocks(spec: Any, shape: Any, dtype: Any) -> dict[str, Any]:
  """ShapeDtypeStructs of one grid step's blocks, as `dropout_math` takes them."""
  f32, i32 = jnp.float32, jnp.int32
  sds = jax.ShapeDtypeStruct
  scalar = sds((), i32)
  return dict(
      q=sds((shape.bq, shape.head_dim), dtype), k=sds((shape.bk, shape.head_dim), dtype),
      v=sds((shape.bk, shape.head_dim), dtype), do=sds((shape.bq, shape.head_dim), dtype),
      seg_q=sds((shape.bq, 1), i32) if spec.segments else None,
      seg_k=sds((1, shape.bk), i32) if spec.segments else None,
      keys=(scalar, scalar) if spec.rate else None, row0=scalar, col0=scalar,
      m=sds((shape.bq, 1), f32), l=sds((shape.bq, 1), f32), di=sds((shape.bq, 1), f32),
      acc=sds((shape.bq, shape.head_dim), f32))


def _count(fn: Any, blk: dict[str, Any], names: str, **kw) -> tuple[int, int]:
  """(FLOPs, transcendentals) of `fn` on the blocks named (space-separated; None: '-')."""
  from jax.experimental import pallas as pl

  args = [None if n == "-" else blk[n] for n in names.split()]
  cost = pl.estimate_cost(functools.partial(fn, **kw), *args)
  return cost.flops, cost.transcendentals


def _estimate(steps: int, per_step: list[tuple[int, int]], ins: list[Any], outs: list[Any],
              spec: Any, shape: Any, segments: list[Any]) -> Any:
  from jax.experimental import pallas as pl

  flops = steps * sum(f for f, _ in per_step)
  transcendentals = steps * sum(t for _, t in per_step)
  moved = _bytes(ins) + _bytes(outs) + (shape.heads - 1) * _bytes(segments)
  return pl.CostEstimate(flops=int(flops), transcendentals=int(transcendentals),
                         bytes_accessed=int(moved))


def forward(spec: Any, shape: Any, ins: list[Any], outs: list[Any]) -> Any:
  """The forward kernel's cost: `ins` its operands, `outs` its results."""
  blk = _blocks(spec, shape, ins[1].dtype)
  kw = dict(causal=spec.causal, rate=spec.rate, kv_len=shape.kv_len)
  chunk = _count(dm.forward_chunk, blk, "m l acc q k v seg_q seg_k keys row0 col0", **kw)
  # The end of a block: acc / (l * (1 - rate)).
  end = (shape.bq * shape.head_dim + shape.bq, 0)
  steps = shape.batch * shape.heads * (shape.q_len // shape.bq)
  return _estimate(steps, [(chunk[0] * shape.chunks, chunk[1] * shape.chunks), end], ins,
                   outs, spec, shape, ins[4:])


def backward(spec: Any, shape: Any, ins: list[Any], outs: list[Any]) -> Any:
  """The backward kernel's cost: one pass over the chunks, or three with several."""
  blk = _blocks(spec, shape, ins[1].dtype)
  kw = dict(causal=spec.causal, rate=spec.rate, kv_len=shape.kv_len)
  tail = "q k v do seg_q seg_k keys row0 col0"
  if shape.chunks == 1:
    per_step = [_count(dm.grads_chunk, blk, "- - - " + tail, **kw)]
  else:
    passes = [_count(dm.stats_chunk, blk, "m l q k seg_q seg_k row0 col0",
                     causal=spec.causal),
              _count(dm.di_chunk, blk, "di m l " + tail, **kw),
              _count(dm.grads_chunk, blk, "di m l " + tail, **kw)]
    per_step = [(f * shape.chunks, t * shape.chunks) for f, t in passes]
  steps = shape.batch * shape.heads * (shape.q_len // shape.bq)
  return _estimate(steps, per_step, ins, outs, spec, shape, ins[5:])
