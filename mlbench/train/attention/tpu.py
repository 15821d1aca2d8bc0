"""The Pallas TPU kernels behind `mlbench.train.attention.attend`.

Splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`) serves every call
without a bias: causal masks as block-sparse masks (the fully masked blocks are skipped),
padding and packed sequences as segment ids, grouped-query heads as one multi-query kernel
per key/value head (its queries share the keys, as MaxText runs it). Flash attention
(`...ops.tpu.flash_attention`) serves calls that add a bias to the logits, which splash
cannot take. A training call with attention dropout runs mlbench's own kernel
(`dropout_kernel`), its random bits numbered by global row and head so that every device
draws its own share of one mask. All run per device under `jax.shard_map`: rows split over
the mesh's batch axes, heads over `model` where it divides them, the rest whole, so GSPMD
never has to partition a kernel it cannot see into. Block sizes are the largest of 512,
256 and 128 that divide the sequence (512 is MaxText's default for splash on v4/v5p).

On a CPU the kernels run in Pallas's TPU interpreter: slow, and only for checking them
against XLA (tests, `--set model.attention=pallas` on a CPU).

Shape suffixes: B batch, L query length, S key length, N query heads, K key/value heads,
G query heads per key/value head, D head size.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from mlbench.train.attention import dropout_bits, dropout_kernel

BLOCKS = (512, 256, 128)
"""Kernel block sizes, largest first; a sequence must be a multiple of the smallest."""


def cannot(site: Any) -> str:
  """Why the kernels cannot serve an `attention.Site` ("" when they can)."""
  if site.q_len % BLOCKS[-1] or site.kv_len % BLOCKS[-1]:
    return (f"{site.q_len} x {site.kv_len} tokens; the kernels need multiples of "
            f"{BLOCKS[-1]} on both sides")
  if site.dropout and site.bias:
    return (f"attention dropout {site.dropout:g} with a bias; the dropout kernel takes "
            "causal, padding and segment masks, no bias")
  if site.dropout and site.kv_len * site.head_dim > dropout_kernel.MAX_ROW_ELEMENTS:
    return (f"attention dropout {site.dropout:g} over {site.kv_len} keys of {site.head_dim}; "
            "the dropout kernel holds a row's keys whole in VMEM, at most "
            f"{dropout_kernel.MAX_ROW_ELEMENTS:,} key elements")
  return ""


def block(length: int) -> int:
  """The largest of `BLOCKS` that divides `length`."""
  return next(b for b in BLOCKS if length % b == 0)


def attend(q_BLND: jax.Array, k_BSKD: jax.Array, v_BSKD: jax.Array, *, mesh: Any,
           interpret: bool, causal: bool, kv_lengths_B: jax.Array | None,
           q_segments_BL: jax.Array | None, kv_segments_BS: jax.Array | None,
           bias: jax.Array | None, dropout: Any = None) -> jax.Array:
  """Attention [B, L, N, D] per device: by the dropout kernel (an `attention.Dropout`
  with a rate), else splash (no bias) or flash (bias) attention."""
  batch, length, heads, head_dim = q_BLND.shape
  kv_len, kv_heads = k_BSKD.shape[1], k_BSKD.shape[2]
  q_seg, kv_seg = _segments(batch, length, kv_len, kv_lengths_B, q_segments_BL,
                            kv_segments_BS)
  # Scaled before the kernel: flash attention scales the biased logits, splash not at all.
  q_BLND = q_BLND * jnp.asarray(head_dim ** -0.5, q_BLND.dtype)
  rows, head_axis = _split(mesh, batch, heads, kv_heads)
  from jax.sharding import PartitionSpec as P

  if dropout is not None and dropout.rate:
    kernel = functools.partial(_dropping, causal=causal, rate=dropout.rate, heads=heads,
                               rows=rows, head_axis=head_axis, interpret=interpret)
    extra, extra_spec = dropout_bits.seeds(dropout.key), P()
  else:
    kernel = functools.partial(_flash if bias is not None else _splash, causal=causal,
                               interpret=interpret)
    extra, extra_spec = bias, None
    if bias is not None:
      extra_spec = P(rows or None if bias.shape[0] == batch else None,
                     head_axis if bias.shape[1] == heads else None, None, None)
  if not rows and head_axis is None:
    return kernel(q_BLND, k_BSKD, v_BSKD, q_seg, kv_seg, extra)
  qkv = P(rows or None, None, head_axis, None)
  seg = None if q_seg is None else P(rows or None, None)
  fn = jax.shard_map(kernel, mesh=mesh, in_specs=(qkv, qkv, qkv, seg, seg, extra_spec),
                     out_specs=qkv, check_vma=False)
  return fn(q_BLND, k_BSKD, v_BSKD, q_seg, kv_seg, extra)


def _dropping(q_BLND: jax.Array, k_BSKD: jax.Array, v_BSKD: jax.Array,
              q_seg: jax.Array | None, kv_seg: jax.Array | None, seed: jax.Array, *,
              causal: bool, rate: float, heads: int, rows: tuple[str, ...],
              head_axis: str | None, interpret: bool) -> jax.Array:
  """The dropout kernel on this device's rows and heads, its random bits numbered by
  global row and head (`heads`: all of them), so no two devices draw the same mask."""
  first_row = jax.lax.axis_index(rows) * q_BLND.shape[0] if rows else 0
  first_head = jax.lax.axis_index(head_axis) * q_BLND.shape[2] if head_axis else 0
  scalars = jnp.concatenate([seed, jnp.stack([jnp.asarray(first_row, jnp.int32),
                                              jnp.asarray(first_head, jnp.int32)])])
  spec = dropout_kernel.Spec(causal=causal, rate=rate, heads=heads,
                             segments=q_seg is not None, interpret=interpret)
  seg = [None, None] if q_seg is None else [q_seg[:, None, :], kv_seg[:, None, :]]
  out_BNLD = dropout_kernel.attend(spec, *(x.transpose(0, 2, 1, 3)
                                           for x in (q_BLND, k_BSKD, v_BSKD)), *seg, scalars)
  return out_BNLD.transpose(0, 2, 1, 3)


def _split(mesh: Any, batch: int, heads: int, kv_heads: int) -> tuple[tuple[str, ...],
                                                                       str | None]:
  """(mesh axes the rows split over, the axis the heads split over or None)."""
  from mlbench.train import pipeline

  if mesh is None or mesh.devices.size == 1:
    return (), None
  rows: tuple[str, ...] = ()
  for axis in pipeline.batch_axes(mesh):
    size = int(mesh.shape[axis])
    if batch % (size * _product(mesh, rows)) == 0:
      rows += (axis,)
  model = int(mesh.shape.get("model", 1))
  head_axis = "model" if model > 1 and heads % model == 0 and kv_heads % model == 0 else None
  return rows, head_axis


def _product(mesh: Any, axes: tuple[str, ...]) -> int:
  out = 1
  for a in axes:
    out *= int(mesh.shape[a])
  return out


def _segments(batch: int, length: int, kv_len: int, kv_lengths_B: jax.Array | None,
              q_segments_BL: jax.Array | None, kv_segments_BS: jax.Array | None
              ) -> tuple[jax.Array | None, jax.Array | None]:
  """int32 segment ids [B, L], [B, S] for the kernels: padding from lengths becomes
  segment 0 after the length and 1 before it, queries all in segment 1 where only the
  keys are given; None where there is no padding."""
  if kv_lengths_B is not None:
    kv_segments_BS = (jnp.arange(kv_len)[None, :] < kv_lengths_B[:, None])
  if kv_segments_BS is None:
    return None, None
  if q_segments_BL is None:
    q_segments_BL = jnp.ones((batch, length), jnp.int32)
  return q_segments_BL.astype(jnp.int32), kv_segments_BS.astype(jnp.int32)


def _splash(q_BLND: jax.Array, k_BSKD: jax.Array, v_BSKD: jax.Array, q_seg: jax.Array | None,
            kv_seg: jax.Array | None, bias: None, *, causal: bool,
            interpret: bool) -> jax.Array:
  """Splash attention on this device's rows and heads."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

  del bias
  b, length, heads, d = q_BLND.shape
  kv_len, kv_heads = k_BSKD.shape[1], k_BSKD.shape[2]
  group = heads // kv_heads
  one = sm.CausalMask((length, kv_len)) if causal else sm.FullMask((length, kv_len))
  bq, bkv = block(length), block(kv_len)
  sizes = sk.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq,
                        block_kv_dkv=bkv, block_kv_dkv_compute=bkv, block_q_dq=bq,
                        block_kv_dq=bkv)
  make = sk.make_splash_mha if group == 1 else sk.make_splash_mqa
  kernel = make(sm.MultiHeadMask([one] * (heads if group == 1 else group)), block_sizes=sizes,
                head_shards=1, q_seq_shards=1, interpret=interpret)
  k_BKSD, v_BKSD = k_BSKD.transpose(0, 2, 1, 3), v_BSKD.transpose(0, 2, 1, 3)
  per_row = lambda q, k, v, ids: kernel(q, k, v, segment_ids=ids)  # noqa: E731
  if group == 1:
    q_B = q_BLND.transpose(0, 2, 1, 3)                                   # [B, N, L, D]
  else:
    q_B = q_BLND.transpose(0, 2, 1, 3).reshape(b, kv_heads, group, length, d)
    per_row = jax.vmap(per_row, in_axes=(0, 0, 0, None))                # over K

  def row(q, k, v, qs, ks):
    ids = None if qs is None else sk.SegmentIds(q=qs, kv=ks)
    return per_row(q, k, v, ids)

  out = jax.vmap(row)(q_B, k_BKSD, v_BKSD, q_seg, kv_seg)
  return out.reshape(b, heads, length, d).transpose(0, 2, 1, 3)


def _flash(q_BLND: jax.Array, k_BSKD: jax.Array, v_BSKD: jax.Array, q_seg: jax.Array | None,
           kv_seg: jax.Array | None, bias: jax.Array, *, causal: bool,
           interpret: bool) -> jax.Array:
  """Flash attention with a bias on this device's rows and heads."""
  b, length, heads, _ = q_BLND.shape
  kv_len, group = k_BSKD.shape[1], heads // k_BSKD.shape[2]
  k_BNSD, v_BNSD = (jnp.repeat(x, group, axis=2).transpose(0, 2, 1, 3) if group > 1
                    else x.transpose(0, 2, 1, 3) for x in (k_BSKD, v_BSKD))
  bias_BNLS = jnp.broadcast_to(bias.astype(jnp.float32), (b, heads, length, kv_len))
  run = functools.partial(_flash_kernel, causal, block(length), block(kv_len))
  if interpret:
    run = _interpreted(run)
  out_BNLD = run(q_BLND.transpose(0, 2, 1, 3), k_BNSD, v_BNSD, bias_BNLS, q_seg, kv_seg)
  return out_BNLD.transpose(0, 2, 1, 3)


def _flash_kernel(causal: bool, bq: int, bk: int, q: jax.Array, k: jax.Array, v: jax.Array,
                  bias: jax.Array, q_seg: jax.Array | None, kv_seg: jax.Array | None):
  from jax.experimental.pallas.ops.tpu import flash_attention as fa

  sizes = fa.BlockSizes(block_q=bq, block_k_major=bk, block_k=bk, block_b=1,
                        block_q_major_dkv=bq, block_k_major_dkv=bk, block_k_dkv=bk,
                        block_q_dkv=bq, block_k_major_dq=bk, block_k_dq=bk, block_q_dq=bq)
  ids = None if q_seg is None else fa.SegmentIds(q=q_seg, kv=kv_seg)
  return fa.flash_attention(q, k, v, bias, ids, causal=causal, sm_scale=1.0,
                            block_sizes=sizes)


def _interpreted(fn: Any) -> Any:
  """`fn` with its forward and backward kernels run by Pallas's TPU interpreter.

  Flash attention takes no `interpret` argument, and its backward kernels are traced
  when the gradient is, outside any context the forward ran in; so the backward pass
  recomputes the forward under the interpreter and differentiates that (twice the work,
  for checking only)."""
  from jax.experimental.pallas import tpu as pltpu

  def run(*args):
    with pltpu.force_tpu_interpret_mode():
      return fn(*args)

  @jax.custom_vjp
  def wrapped(q, k, v, bias, q_seg, kv_seg):
    return run(q, k, v, bias, q_seg, kv_seg)

  def fwd(q, k, v, bias, q_seg, kv_seg):
    return run(q, k, v, bias, q_seg, kv_seg), (q, k, v, bias, q_seg, kv_seg)

  def bwd(res, g):
    q, k, v, bias, q_seg, kv_seg = res
    with pltpu.force_tpu_interpret_mode():
      _, vjp = jax.vjp(lambda *a: fn(*a, q_seg, kv_seg), q, k, v, bias)
      grads = vjp(g)
    return (*grads, None, None)

  wrapped.defvjp(fwd, bwd)
  return wrapped
