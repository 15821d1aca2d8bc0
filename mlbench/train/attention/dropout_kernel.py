"""Fused attention that drops out, on TPU (Pallas): the forward and backward kernels.

softmax(q k^T + masks) v with dropout on the probabilities, computed block by block in
VMEM: a row's [L, S] scores, probabilities and dropout mask never reach HBM. A grid step
takes `bq` queries of one row and head against that row's keys and values, held whole in
VMEM, and walks them in chunks of `bk` keys with flash attention's online softmax (a
running max and sum rescale what came before; `dropout_math`). The mask is drawn inside
the kernel from the call's seed and each score's coordinates (`dropout_bits`), and drawn
again by the backward kernel, which recomputes the probabilities from q and k: its inputs
are q, k, v, the output's gradient, the segment ids and the seed; nothing of [L, S] size
is stored between the passes, not even softmax statistics. Packed rows and padding are
segment ids (a query attends to the keys of its own segment), causal masks compare
positions. bfloat16 (or float32) in, float32 scores and accumulators.

The backward kernel writes dq for its query block and adds the block's share of dk and
dv into float32 accumulators that stay in VMEM across the query blocks of a row and head
(grouped-query heads: per query head, summed after). With one chunk (S <= bk: BERT's 512
and the Transformer's 256 tokens) it computes P once; with more, it takes three passes
over the chunks (the softmax statistics, rowsum(P dP), the gradients).

Block sizes (`blocks`): the largest of 512, 256 and 128 that divides the length, for
queries (bq) and keys (bk) alike. Why, for v4 and v5p: their MXUs are 128 x 128, four per
TensorCore (jax's `pltpu.get_tpu_info()`: `mxu_column_size` 128, `num_mxus` 4), so blocks
are multiples of 128; a backward step holds about six [bq, bk] float32 tiles (scores, P,
the mask, dP, dS, a low-precision copy): 6 MiB at 512 x 512, which with the double-buffered
blocks fits v4's 16 MiB of VMEM per TensorCore (v5p has 64 MiB, same source), where
1024 x 1024 (24 MiB) would not; and the largest block that fits makes the fewest grid
steps, each with a fixed cost (its DMAs issued and waited for), against 67 MFLOP of MXU
work at 512 x 512 x 64 (about 0.5 us at a v4 TensorCore's 137 TFLOP/s, `tpu_info`'s
`bf16_ops_per_second`). A row's keys and values stay whole in VMEM: `MAX_ROW_ELEMENTS`.

Each kernel declares its cost to XLA (`pl.CostEstimate`), so `mlbench check`'s estimate
and roofline count it: FLOPs and transcendentals as jax's Pallas cost rules count the
functions each chunk runs (`pl.estimate_cost` of `dropout_math`: matmuls, arithmetic,
exps; compares, selects, shifts and reductions count nothing), times the chunks run;
bytes as the blocks moved between HBM and VMEM.

Shape suffixes: B batch, N query heads, K key/value heads, L query length, S key length,
D head size.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from mlbench.train.attention import dropout_bits, dropout_math as dm

BLOCKS = (512, 256, 128)
MAX_ROW_ELEMENTS = 2048 * 64
"""The most key x head-size elements of a row held whole in VMEM: 2,048 keys of 64."""


@dataclasses.dataclass(frozen=True)
class Spec:
  """What a call's kernels are compiled for."""

  causal: bool
  rate: float      # dropout rate; 0: none
  heads: int       # N over the whole mesh: streams are numbered by global head
  segments: bool   # segment ids given
  interpret: bool  # run by Pallas's interpreter (on a CPU)


def blocks(length: int) -> int:
  """The block size for a sequence: the largest of `BLOCKS` that divides it."""
  return next(b for b in BLOCKS if length % b == 0)


def attend(spec: Spec, q_BNLD: jax.Array, k_BKSD: jax.Array, v_BKSD: jax.Array,
           q_seg_B1L: jax.Array | None, kv_seg_B1S: jax.Array | None,
           scalars: jax.Array) -> jax.Array:
  """Attention [B, N, L, D] of pre-scaled queries. `scalars`, int32[4]: the seed's two
  words (`dropout_bits.seeds`), then the global index of this device's first row and of
  its first head."""
  return _attend(spec, q_BNLD, k_BKSD, v_BKSD, q_seg_B1L, kv_seg_B1S, scalars)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attend(spec, q, k, v, q_seg, kv_seg, scalars):
  return _forward(spec, q, k, v, q_seg, kv_seg, scalars)


def _attend_fwd(spec, q, k, v, q_seg, kv_seg, scalars):
  return _forward(spec, q, k, v, q_seg, kv_seg, scalars), (q, k, v, q_seg, kv_seg, scalars)


def _attend_bwd(spec, res, do):
  return (*_backward(spec, *res, do), None, None, None)


_attend.defvjp(_attend_fwd, _attend_bwd)


@dataclasses.dataclass(frozen=True)
class _Shape:
  batch: int
  heads: int
  group: int
  q_len: int
  kv_len: int
  head_dim: int
  bq: int
  bk: int

  @staticmethod
  def of(q: jax.Array, k: jax.Array) -> _Shape:
    b, n, length, d = q.shape
    return _Shape(b, n, n // k.shape[1], length, k.shape[2], d, blocks(length),
                  blocks(k.shape[2]))

  @property
  def chunks(self) -> int:
    return self.kv_len // self.bk

  def specs(self, segments: bool) -> tuple[Any, Any, list[Any]]:
    """BlockSpecs of a query-shaped block, a whole row of keys, and the segment ids."""
    from jax.experimental import pallas as pl

    g = self.group  # lax.div: `//` lowers through `sign`, which Mosaic asks the device of
    q_spec = pl.BlockSpec((1, 1, self.bq, self.head_dim), lambda b, h, i, s: (b, h, i, 0))
    kv_spec = pl.BlockSpec((1, 1, self.kv_len, self.head_dim),
                           lambda b, h, i, s: (b, h if g == 1 else lax.div(h, g), 0, 0))
    segs = [pl.BlockSpec((1, 1, self.bq), lambda b, h, i, s: (b, 0, i)),
            pl.BlockSpec((1, 1, self.kv_len), lambda b, h, i, s: (b, 0, 0))] if segments else []
    return q_spec, kv_spec, segs


def _column(row_1Q: jax.Array) -> jax.Array:
  """A [1, bq] row as a [bq, 1] column (a transpose of its broadcast to 128 rows)."""
  return jnp.broadcast_to(row_1Q, (128, row_1Q.shape[1])).T[:, :1]


def _block_inputs(spec: Spec, shape: _Shape, scalars_ref, seg_refs):
  """(this block's query segments [bq, 1] or None, the stream's keys or None, row0)."""
  from jax.experimental import pallas as pl

  b, h, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  seg_q = _column(seg_refs[0][0]) if spec.segments else None
  keys = None
  if spec.rate:
    stream = (scalars_ref[2] + b) * spec.heads + scalars_ref[3] + h
    keys = dropout_bits.stream_keys(scalars_ref[0], scalars_ref[1], stream)
  return seg_q, keys, i * shape.bq


def _chunk(shape: _Shape, k_ref, v_ref, seg_refs, c):
  """(k, v, key segments [1, bk] or None, col0) of chunk `c` of the row's keys."""
  from jax.experimental import pallas as pl

  col0 = c * shape.bk
  cols = pl.ds(col0, shape.bk) if shape.chunks > 1 else slice(None)
  seg_k = seg_refs[1][0, :, cols] if seg_refs else None
  return k_ref[0, 0, cols, :], v_ref[0, 0, cols, :], seg_k, col0


def _forward_kernel(scalars_ref, q_ref, k_ref, v_ref, *refs, spec: Spec, shape: _Shape):
  seg_refs, o_ref = refs[:-1], refs[-1]
  seg_q, keys, row0 = _block_inputs(spec, shape, scalars_ref, seg_refs)
  q = q_ref[0, 0]
  kw = dict(causal=spec.causal, rate=spec.rate, kv_len=shape.kv_len)

  def body(c, carry):
    k, v, seg_k, col0 = _chunk(shape, k_ref, v_ref, seg_refs, c)
    return dm.forward_chunk(*carry, q, k, v, seg_q, seg_k, keys, row0, col0, **kw)

  carry = (*dm.first_stats(shape.bq), jnp.zeros((shape.bq, shape.head_dim), jnp.float32))
  if shape.chunks == 1:
    _, l, acc = body(0, carry)
  else:
    _, l, acc = lax.fori_loop(0, shape.chunks, body, carry)
  o_ref[0, 0] = (acc / (l * (1.0 - spec.rate))).astype(o_ref.dtype)


def _backward_kernel(scalars_ref, q_ref, k_ref, v_ref, do_ref, *refs, spec: Spec,
                     shape: _Shape):
  from jax.experimental import pallas as pl

  seg_refs, (dq_ref, dk_ref, dv_ref, dk_acc, dv_acc) = refs[:-5], refs[-5:]
  i = pl.program_id(2)

  @pl.when(i == 0)
  def _():
    dk_acc[...] = jnp.zeros_like(dk_acc)
    dv_acc[...] = jnp.zeros_like(dv_acc)

  seg_q, keys, row0 = _block_inputs(spec, shape, scalars_ref, seg_refs)
  q, do = q_ref[0, 0], do_ref[0, 0]
  kw = dict(causal=spec.causal, rate=spec.rate, kv_len=shape.kv_len)
  chunk = functools.partial(_chunk, shape, k_ref, v_ref, seg_refs)
  if shape.chunks == 1:
    k, v, seg_k, _ = chunk(0)
    dq, dk, dv = dm.grads_chunk(None, None, None, q, k, v, do, seg_q, seg_k, keys, row0, 0,
                                **kw)
    dk_acc[...] += dk
    dv_acc[...] += dv
  else:
    def stats(c, ml):
      k, _, seg_k, col0 = chunk(c)
      return dm.stats_chunk(*ml, q, k, seg_q, seg_k, row0, col0, causal=spec.causal)

    m, l = lax.fori_loop(0, shape.chunks, stats, dm.first_stats(shape.bq))

    def di(c, acc):
      k, v, seg_k, col0 = chunk(c)
      return dm.di_chunk(acc, m, l, q, k, v, do, seg_q, seg_k, keys, row0, col0, **kw)

    d_i = lax.fori_loop(0, shape.chunks, di, jnp.zeros((shape.bq, 1), jnp.float32))

    def grads(c, dq):
      k, v, seg_k, col0 = chunk(c)
      dq_c, dk, dv = dm.grads_chunk(d_i, m, l, q, k, v, do, seg_q, seg_k, keys, row0, col0,
                                    **kw)
      dk_acc[pl.ds(col0, shape.bk), :] += dk
      dv_acc[pl.ds(col0, shape.bk), :] += dv
      return dq + dq_c

    dq = lax.fori_loop(0, shape.chunks, grads, jnp.zeros(q.shape, jnp.float32))
  dq_ref[0, 0] = dq.astype(dq_ref.dtype)

  @pl.when(i == pl.num_programs(2) - 1)
  def _():
    dk_ref[0, 0] = dk_acc[...].astype(dk_ref.dtype)
    dv_ref[0, 0] = dv_acc[...].astype(dv_ref.dtype)


def _forward(spec: Spec, q, k, v, q_seg, kv_seg, scalars):
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import tpu as pltpu

  from mlbench.train.attention import dropout_cost

  shape = _Shape.of(q, k)
  q_spec, kv_spec, seg_specs = shape.specs(spec.segments)
  segs = [q_seg, kv_seg] if spec.segments else []
  out = jax.ShapeDtypeStruct(q.shape, q.dtype)
  return pl.pallas_call(
      functools.partial(_forward_kernel, spec=spec, shape=shape),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=(shape.batch, shape.heads, shape.q_len // shape.bq),
          in_specs=[q_spec, kv_spec, kv_spec, *seg_specs], out_specs=q_spec),
      out_shape=out,
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",) * 3),
      cost_estimate=dropout_cost.forward(spec, shape, [scalars, q, k, v, *segs], [out]),
      interpret=spec.interpret, name="attention_dropout_fwd")(scalars, q, k, v, *segs)


def _backward(spec: Spec, q, k, v, q_seg, kv_seg, scalars, do):
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import tpu as pltpu

  from mlbench.train.attention import dropout_cost

  shape = _Shape.of(q, k)
  q_spec, k_spec, seg_specs = shape.specs(spec.segments)
  # dk and dv per query head (a group's heads summed below, in float32 where it has several).
  _, dkv_spec, _ = dataclasses.replace(shape, group=1).specs(False)
  kv_dtype = k.dtype if shape.group == 1 else jnp.float32
  kv_out = jax.ShapeDtypeStruct((shape.batch, shape.heads, shape.kv_len, shape.head_dim),
                                kv_dtype)
  outs = [jax.ShapeDtypeStruct(q.shape, q.dtype), kv_out, kv_out]
  segs = [q_seg, kv_seg] if spec.segments else []
  dq, dk, dv = pl.pallas_call(
      functools.partial(_backward_kernel, spec=spec, shape=shape),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=(shape.batch, shape.heads, shape.q_len // shape.bq),
          in_specs=[q_spec, k_spec, k_spec, q_spec, *seg_specs],
          out_specs=[q_spec, dkv_spec, dkv_spec],
          scratch_shapes=[pltpu.VMEM((shape.kv_len, shape.head_dim), jnp.float32)] * 2),
      out_shape=outs,
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "arbitrary")),
      cost_estimate=dropout_cost.backward(spec, shape, [scalars, q, k, v, do, *segs], outs),
      interpret=spec.interpret, name="attention_dropout_bwd")(scalars, q, k, v, do, *segs)
  if shape.group > 1:
    b, kv_heads = k.shape[:2]
    dk, dv = (x.reshape(b, kv_heads, shape.group, shape.kv_len, shape.head_dim).sum(2)
              .astype(k.dtype) for x in (dk, dv))
  return dq, dk, dv
