"""The math of one block of the dropout attention kernels (`dropout_kernel`): pure
functions of a block of queries [bq, D] against a chunk of keys and values [bk, D], which
the kernels run inside Pallas and `pl.estimate_cost` counts for their cost estimates.

Dropout acts on the normalised probabilities P (as XLA's path does): the output is
sum_j P_ij keep_ij / (1 - rate) v_j. Its gradient: dV = P_dropped^T dO; dP = (dO V^T)
keep / (1 - rate); dS = P (dP - rowsum(P dP)); dQ = dS K; dK = dS^T Q. rowsum(P dP) is
rowsum(dO * O), computed here from P and dP so the backward pass needs no O.

`row0`, `col0`: the block's first query and first key in the row's [L, S] matrix.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from mlbench.train.attention import dropout_bits

NEG_INF = -1e9
_NT = (((1,), (1,)), ((), ()))  # a @ b^T


def masked(q, k, seg_q, seg_k, row0, col0, *, causal: bool) -> jax.Array:
  """[bq, bk] float32 logits, NEG_INF where a query may not see a key (`seg_q` [bq, 1],
  `seg_k` [1, bk] segment ids, or None)."""
  s = lax.dot_general(q, k, _NT, preferred_element_type=jnp.float32)
  allowed = None if seg_q is None else seg_q == seg_k
  if causal:
    rows = lax.broadcasted_iota(jnp.int32, s.shape, 0) + row0
    cols = lax.broadcasted_iota(jnp.int32, s.shape, 1) + col0
    allowed = cols <= rows if allowed is None else allowed & (cols <= rows)
  return s if allowed is None else jnp.where(allowed, s, NEG_INF)


def kept(keys, shape, row0, col0, *, kv_len: int, rate: float) -> jax.Array:
  """[bq, bk] True where dropout keeps a score (`keys`: the stream's two int32 keys)."""
  rows = lax.broadcasted_iota(jnp.int32, shape, 0) + row0
  cols = lax.broadcasted_iota(jnp.int32, shape, 1) + col0
  return dropout_bits.keep(keys[0], keys[1], rows, cols, kv_len, rate)


def first_stats(bq: int) -> tuple[jax.Array, jax.Array]:
  """The running max and sum before the first chunk."""
  return jnp.full((bq, 1), -jnp.inf, jnp.float32), jnp.zeros((bq, 1), jnp.float32)


def forward_chunk(m, l, acc, q, k, v, seg_q, seg_k, keys, row0, col0, *, causal: bool,
                  rate: float, kv_len: int):
  """One chunk of keys folded into a block's running max `m`, sum `l` and output `acc`
  [bq, D] (undivided: the kernel divides by l (1 - rate) at the end)."""
  s = masked(q, k, seg_q, seg_k, row0, col0, causal=causal)
  m_new = jnp.maximum(m, s.max(axis=1, keepdims=True))
  alpha = jnp.exp(m - m_new)
  p = jnp.exp(s - m_new)
  l = alpha * l + p.sum(axis=1, keepdims=True)
  if rate:
    p = jnp.where(kept(keys, s.shape, row0, col0, kv_len=kv_len, rate=rate), p, 0.0)
  pv = lax.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
  return m_new, l, alpha * acc + pv


def stats_chunk(m, l, q, k, seg_q, seg_k, row0, col0, *, causal: bool):
  """Backward pass 1 (several chunks): the forward's running max and sum again."""
  s = masked(q, k, seg_q, seg_k, row0, col0, causal=causal)
  m_new = jnp.maximum(m, s.max(axis=1, keepdims=True))
  return m_new, jnp.exp(m - m_new) * l + jnp.exp(s - m_new).sum(axis=1, keepdims=True)


def _probs_and_dp(m, l, q, k, v, do, seg_q, seg_k, keys, row0, col0, *, causal: bool,
                  rate: float, kv_len: int):
  """(P, dP, the dropout mask or None); `m`, `l` None: the chunk is the whole row."""
  s = masked(q, k, seg_q, seg_k, row0, col0, causal=causal)
  if m is None:
    m = s.max(axis=1, keepdims=True)
    p = jnp.exp(s - m)
    p = p / p.sum(axis=1, keepdims=True)
  else:
    p = jnp.exp(s - m) / l
  dp = lax.dot_general(do, v, _NT, preferred_element_type=jnp.float32)
  keep = None
  if rate:
    keep = kept(keys, s.shape, row0, col0, kv_len=kv_len, rate=rate)
    dp = jnp.where(keep, dp, 0.0) * (1.0 / (1.0 - rate))
  return p, dp, keep


def di_chunk(di, m, l, q, k, v, do, seg_q, seg_k, keys, row0, col0, **kw):
  """Backward pass 2 (several chunks): the running rowsum(P dP)."""
  p, dp, _ = _probs_and_dp(m, l, q, k, v, do, seg_q, seg_k, keys, row0, col0, **kw)
  return di + (p * dp).sum(axis=1, keepdims=True)


def grads_chunk(di, m, l, q, k, v, do, seg_q, seg_k, keys, row0, col0, *, causal: bool,
                rate: float, kv_len: int):
  """(dq's share [bq, D], the chunk's dk [bk, D], its dv [bk, D]), float32. With `di`,
  `m`, `l` None the chunk is the whole row: all from one P and dP."""
  p, dp, keep = _probs_and_dp(m, l, q, k, v, do, seg_q, seg_k, keys, row0, col0,
                              causal=causal, rate=rate, kv_len=kv_len)
  if di is None:
    di = (p * dp).sum(axis=1, keepdims=True)
  dropped = p if keep is None else jnp.where(keep, p, 0.0) * (1.0 / (1.0 - rate))
  dv = lax.dot(dropped.T.astype(do.dtype), do, preferred_element_type=jnp.float32)
  ds = (p * (dp - di)).astype(q.dtype)
  dq = lax.dot(ds, k, preferred_element_type=jnp.float32)
  dk = lax.dot(ds.T, q, preferred_element_type=jnp.float32)
  return dq, dk, dv
