"""Transformer building blocks shared by BERT, the Transformer and the MoE LM.

`Attention` (multi-head dot-product attention, self or cross, with an optional
key/value cache for autoregressive decoding) and `Mlp` (the position-wise
feed-forward block) name their parameters the same way in every model, so one
table of partition rules (`PARTITION_RULES`) gives all of them Megatron-style
model parallelism by annotation: heads and hidden units over `model`.
The FLOP counts here are what the workloads' `flops_per_example` add up.

Shape suffixes: B batch, L query length, S key length, H model width,
N heads, D head size, F feed-forward width.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

NEG_INF = -1e9
"""Added to attention logits of positions that must not be attended to."""


def partition_rules() -> list[tuple[str, Any]]:
  """Logical partition specs of every `Attention` and `Mlp` parameter, wherever
  it sits in a model (the patterns match path suffixes)."""
  from jax.sharding import PartitionSpec as P

  return [
      (r"attention/(query|key|value)/kernel$", P("embed", "heads", "kv")),
      (r"attention/(query|key|value)/bias$", P("heads", "kv")),
      (r"attention/output/kernel$", P("heads", "kv", "embed")),
      (r"mlp/intermediate/kernel$", P("embed", "mlp")),
      (r"mlp/intermediate/bias$", P("mlp")),
      (r"mlp/output/kernel$", P("mlp", "embed")),
  ]


class Attention(nn.Module):
  """Multi-head dot-product attention: `query`, `key`, `value`, `output` projections.

  Attributes:
    num_heads: N.
    head_dim: D.
    dropout: dropout rate on the attention probabilities.
    dtype: activation and matmul dtype; scores and softmax run in float32.
    kernel_init: initialiser of the four projection kernels.
    decode: self-attention one position at a time, with keys and values kept in
      the `cache` collection (created, at full length, by `init` with decode on).
    use_bias: biases on the projections (BERT has them; tensor2tensor's
      Transformer does not, and the key bias would only receive rounding noise:
      softmax ignores a constant added to every logit).
  """

  num_heads: int
  head_dim: int
  dropout: float = 0.0
  dtype: Any = jnp.float32
  kernel_init: Callable[..., Any] = nn.initializers.xavier_uniform()
  decode: bool = False
  use_bias: bool = True

  @nn.compact
  def __call__(self, x_BLH: jax.Array, kv_BSH: jax.Array | None = None,
               bias_B1LS: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """Attends from `x_BLH` to `kv_BSH` (default: itself).

    `bias_B1LS` (broadcastable) is added to the logits: 0 where attention is
    allowed, `NEG_INF` where it is not.
    """
    proj = functools.partial(nn.DenseGeneral, features=(self.num_heads, self.head_dim),
                             kernel_init=self.kernel_init, dtype=self.dtype,
                             use_bias=self.use_bias)
    source_BSH = x_BLH if kv_BSH is None else kv_BSH
    q_BLND = proj(name="query")(x_BLH)
    k_BSND = proj(name="key")(source_BSH)
    v_BSND = proj(name="value")(source_BSH)
    if self.decode:
      k_BSND, v_BSND, bias_B1LS = self._cached(k_BSND, v_BSND, bias_B1LS)
    if deterministic or self.dropout == 0.0:
      # The fused kernel where the backend has one (cuDNN on GPU when asked for; XLA's
      # own otherwise). It has no dropout on the probabilities, hence the other path.
      out_BLND = jax.nn.dot_product_attention(q_BLND, k_BSND, v_BSND, bias=bias_B1LS)
    else:
      drop = functools.partial(nn.Dropout(self.dropout), deterministic=False)
      out_BLND = attention_with_dropout(q_BLND, k_BSND, v_BSND, bias_B1LS, drop)
    return nn.DenseGeneral(x_BLH.shape[-1], axis=(-2, -1), kernel_init=self.kernel_init,
                           dtype=self.dtype, use_bias=self.use_bias, name="output")(out_BLND)

  def _cached(self, k_B1ND: jax.Array, v_B1ND: jax.Array, bias: jax.Array | None):
    """Writes this position's key and value into the cache; attends to positions <= it."""
    ready = self.has_variable("cache", "cached_key")
    key = self.variable("cache", "cached_key", jnp.zeros, k_B1ND.shape, k_B1ND.dtype)
    value = self.variable("cache", "cached_value", jnp.zeros, v_B1ND.shape, v_B1ND.dtype)
    index = self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))
    if not ready:  # init: the cache is created at the full decode length
      return k_B1ND, v_B1ND, bias
    i = index.value
    key.value = jax.lax.dynamic_update_slice(key.value, k_B1ND, (0, i, 0, 0))
    value.value = jax.lax.dynamic_update_slice(value.value, v_B1ND, (0, i, 0, 0))
    index.value = i + 1
    seen_S = jnp.arange(key.value.shape[1]) <= i
    step_bias = jnp.where(seen_S, 0.0, NEG_INF)[None, None, None, :]
    return key.value, value.value, step_bias if bias is None else bias + step_bias


def attention_with_dropout(q_BLND: jax.Array, k_BSND: jax.Array, v_BSND: jax.Array,
                           bias_B1LS: jax.Array | None,
                           dropout: Callable[[jax.Array], jax.Array]) -> jax.Array:
  """Attention with `dropout` on the probabilities (BERT's and the MLPerf Transformer's
  0.1 in training): scores accumulated in float32, probabilities kept in the compute
  dtype, so the [B, N, L, S] tensors saved for the backward pass are the low-precision
  probabilities and the dropout mask, not float32 logits and probabilities."""
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


class Mlp(nn.Module):
  """The position-wise feed-forward block: `intermediate` (H -> F), activation,
  dropout, `output` (F -> H)."""

  intermediate_size: int
  activation: Callable[[jax.Array], jax.Array] = nn.relu
  dropout: float = 0.0
  dtype: Any = jnp.float32
  kernel_init: Callable[..., Any] = nn.initializers.xavier_uniform()

  @nn.compact
  def __call__(self, x_BLH: jax.Array, deterministic: bool = True) -> jax.Array:
    dense = functools.partial(nn.Dense, kernel_init=self.kernel_init, dtype=self.dtype)
    h_BLF = self.activation(dense(self.intermediate_size, name="intermediate")(x_BLH))
    h_BLF = nn.Dropout(self.dropout)(h_BLF, deterministic=deterministic)
    return dense(x_BLH.shape[-1], name="output")(h_BLF)


def padding_bias(mask_BS: jax.Array) -> jax.Array:
  """[B, 1, 1, S] attention bias: keys where `mask_BS` is 0 are not attended to."""
  return jnp.where(mask_BS[:, None, None, :] > 0, 0.0, NEG_INF).astype(jnp.float32)


def causal_bias(length: int) -> jax.Array:
  """[1, 1, L, L] attention bias: position i attends to positions <= i."""
  allowed_LL = jnp.tril(jnp.ones((length, length), bool))
  return jnp.where(allowed_LL, 0.0, NEG_INF).astype(jnp.float32)[None, None]


def sinusoidal_positions(length: int, width: int, max_timescale: float = 1e4) -> np.ndarray:
  """[length, width] float32 position encodings of "Attention Is All You Need"
  (sines in the first half of the channels, cosines in the second, as tensor2tensor)."""
  half = width // 2
  inv_freq = np.exp(-np.log(max_timescale) * np.arange(half) / max(half - 1, 1))
  angle = np.arange(length)[:, None] * inv_freq[None, :]
  out = np.zeros((length, width), np.float32)
  out[:, :half], out[:, half:2 * half] = np.sin(angle), np.cos(angle)
  return out


def attention_flops(query_len: int, key_len: int, width: int) -> float:
  """Forward FLOPs of one `Attention` over one sequence: the four projections
  (key/value over `key_len` positions) plus scores and weighted values."""
  projections = 2 * width * width * (2 * query_len + 2 * key_len)
  return float(projections + 4 * query_len * key_len * width)


def mlp_flops(length: int, width: int, intermediate: int) -> float:
  """Forward FLOPs of one `Mlp` over one sequence."""
  return float(4 * length * width * intermediate)
