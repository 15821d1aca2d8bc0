"""XLA's attention: the path every platform has, and the reference the kernels are tested
against. It materialises the [B, N, L, S] scores; with dropout, it keeps them in the
compute dtype (`softmax_in`); with `chunk`, causal attention holds one block's at a time.

Shape suffixes: B batch, L query length, S key length, N query heads, K key/value heads,
D head size.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mlbench.errors import UserError

NEG_INF = -1e9
"""Added to the logits of positions that must not be attended to."""


@dataclasses.dataclass(frozen=True)
class Dropout:
  """Dropout on the attention probabilities at `rate`, in training.

  `key` is the layer's dropout key for this step (flax's `make_rng("dropout")`: it differs
  from step to step and layer to layer); the fused TPU kernel draws its mask from it
  (`dropout_bits`: per row, head, query and key). `apply(probs) -> probs` is how XLA
  drops [B, N, L, S] probabilities (a workload's own `nn.Dropout`, unchanged since before
  the kernel); None: with the kernel's very mask, so XLA and the kernel compute the same
  function (the tests' reference)."""

  rate: float
  key: jax.Array
  apply: Callable[[jax.Array], jax.Array] | None = None

  def on_probs(self) -> Callable[[jax.Array], jax.Array]:
    """XLA's dropout of [B, N, L, S] probabilities."""
    if self.apply is not None:
      return self.apply
    from mlbench.train.attention import dropout_bits

    return functools.partial(dropout_bits.apply, dropout_bits.seeds(self.key), self.rate)


def allowed_mask(q_len: int, kv_len: int, *, causal: bool = False,
                 kv_lengths_B: jax.Array | None = None, q_segments_BL: jax.Array | None = None,
                 kv_segments_BS: jax.Array | None = None) -> jax.Array | None:
  """[B or 1, 1, L, S] booleans, True where a query may attend to a key; None: all."""
  mask = None

  def both(m):
    return m if mask is None else jnp.logical_and(mask, m)

  if causal:
    mask = both(jnp.asarray(np.tril(np.ones((q_len, kv_len), bool)))[None, None])
  if kv_lengths_B is not None:
    mask = both((jnp.arange(kv_len)[None, :] < kv_lengths_B[:, None])[:, None, None, :])
  if kv_segments_BS is not None:
    q_seg = (q_segments_BL if q_segments_BL is not None
             else jnp.ones(kv_segments_BS.shape[:1] + (q_len,), kv_segments_BS.dtype))
    mask = both((q_seg[:, :, None] == kv_segments_BS[:, None, :])[:, None])
  return mask


def attend(q_BLND: jax.Array, k_BSKD: jax.Array, v_BSKD: jax.Array, *, causal: bool = False,
        kv_lengths_B: jax.Array | None = None, q_segments_BL: jax.Array | None = None,
        kv_segments_BS: jax.Array | None = None, bias: jax.Array | None = None,
        dropout: Dropout | None = None, chunk: int = 0) -> jax.Array:
  """XLA's attention: the reference every kernel is tested against."""
  length, kv_len = q_BLND.shape[1], k_BSKD.shape[1]
  padded = kv_lengths_B is not None or kv_segments_BS is not None
  if dropout is not None and dropout.rate:
    mask = allowed_mask(length, kv_len, causal=causal, kv_lengths_B=kv_lengths_B,
                        q_segments_BL=q_segments_BL, kv_segments_BS=kv_segments_BS)
    total = 0.0 if bias is None else bias.astype(jnp.float32)
    if mask is not None:
      total = total + jnp.where(mask, 0.0, NEG_INF).astype(jnp.float32)
    groups = q_BLND.shape[2] // k_BSKD.shape[2]
    k_BSND, v_BSND = (jnp.repeat(x, groups, axis=2) if groups > 1 else x
                      for x in (k_BSKD, v_BSKD))
    return attention_with_dropout(q_BLND, k_BSND, v_BSND,
                                  None if mask is None and bias is None else total,
                                  dropout.on_probs())
  if chunk and causal and not padded and bias is None and chunk < length:
    return _chunked_causal(q_BLND, k_BSKD, v_BSKD, chunk)
  mask = allowed_mask(length, kv_len, kv_lengths_B=kv_lengths_B, q_segments_BL=q_segments_BL,
                      kv_segments_BS=kv_segments_BS)
  return jax.nn.dot_product_attention(q_BLND, k_BSKD, v_BSKD, bias=bias, mask=mask,
                                      is_causal=causal, implementation="xla")


def _chunked_causal(q_BLND: jax.Array, k_BLKD: jax.Array, v_BLKD: jax.Array,
                    chunk: int) -> jax.Array:
  """Causal attention by query blocks: block b (positions [b*chunk, (b+1)*chunk)) attends
  to keys [0, (b+1)*chunk) under its own `jax.checkpoint` (same result, one block's scores
  in memory at a time, the fully masked upper blocks never computed)."""
  length = q_BLND.shape[1]
  if length % chunk:
    raise UserError(f"attention_chunk {chunk} must divide the sequence length {length}")
  block = jax.checkpoint(lambda q, k, v, m: jax.nn.dot_product_attention(q, k, v, mask=m))
  outs = []
  for b in range(length // chunk):
    end = (b + 1) * chunk
    allowed_QS = np.arange(b * chunk, end)[:, None] >= np.arange(end)[None, :]
    outs.append(block(q_BLND[:, b * chunk:end], k_BLKD[:, :end], v_BLKD[:, :end],
                      jnp.asarray(allowed_QS)[None, None]))
  return jnp.concatenate(outs, axis=1)


def attention_with_dropout(q_BLND: jax.Array, k_BSND: jax.Array, v_BSND: jax.Array,
                           bias_B1LS: jax.Array | None,
                           dropout: Callable[[jax.Array], jax.Array]) -> jax.Array:
  """Attention with `dropout` on the probabilities: scores accumulated in float32,
  probabilities kept in the compute dtype, so the [B, N, L, S] tensors saved for the
  backward pass are the low-precision probabilities and the dropout mask, not float32
  logits and probabilities."""
  q_BLND = q_BLND * jnp.asarray(q_BLND.shape[-1] ** -0.5, q_BLND.dtype)
  logits_BNLS = jnp.einsum("blnd,bsnd->bnls", q_BLND, k_BSND,
                           preferred_element_type=jnp.float32)
  if bias_B1LS is not None:
    logits_BNLS = logits_BNLS + bias_B1LS
  probs_BNLS = dropout(softmax_in(logits_BNLS, v_BSND.dtype))
  return jnp.einsum("bnls,bsnd->blnd", probs_BNLS, v_BSND)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def softmax_in(logits: jax.Array, dtype: Any) -> jax.Array:
  """softmax over the last axis, computed in float32 and returned in `dtype`; its
  gradient is computed from that `dtype` copy. jax.nn.softmax would keep its float32
  output for the backward pass, a second, larger copy of every [B, N, L, S]
  probability tensor beside the one the value matmul keeps."""
  return jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(dtype)


def _softmax_in_fwd(logits: jax.Array, dtype: Any) -> tuple[jax.Array, tuple[jax.Array, Any]]:
  probs = softmax_in(logits, dtype)
  return probs, (probs, jnp.zeros((), logits.dtype))


def _softmax_in_bwd(dtype: Any, res: tuple[jax.Array, jax.Array], g: jax.Array):
  del dtype
  probs, like = res
  y, g = probs.astype(jnp.float32), g.astype(jnp.float32)
  return ((y * (g - (g * y).sum(-1, keepdims=True))).astype(like.dtype),)


softmax_in.defvjp(_softmax_in_fwd, _softmax_in_bwd)
