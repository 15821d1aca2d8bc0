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
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mlbench.fields import AttentionImpl
from mlbench.train import attention

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
  """Multi-head dot-product attention: `query`, `key`, `value`, `output` projections, the
  scores by the harness's one attention entry point (`mlbench.train.attention.attend`:
  a fused kernel where the platform has one that can serve the shape, XLA elsewhere).

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
    causal: position i attends to positions <= i.
    implementation: `model.attention` (auto: chosen per platform and shape).
    mesh: `StepContext.mesh`, the platform and the axes the kernels run under.
    what: which attention of the model this is, in reports ("encoder self-attention").
  """

  num_heads: int
  head_dim: int
  dropout: float = 0.0
  dtype: Any = jnp.float32
  kernel_init: Callable[..., Any] = nn.initializers.xavier_uniform()
  decode: bool = False
  use_bias: bool = True
  causal: bool = False
  implementation: AttentionImpl = AttentionImpl.AUTO
  mesh: Any = None
  what: str = "self-attention"

  @nn.compact
  def __call__(self, x_BLH: jax.Array, kv_BSH: jax.Array | None = None,
               masks: Mapping[str, jax.Array] | None = None,
               deterministic: bool = True) -> jax.Array:
    """Attends from `x_BLH` to `kv_BSH` (default: itself) under `masks`: the keyword
    masks of `attend` (`kv_lengths_B`, `q_segments_BL`, `kv_segments_BS`, `bias`)."""
    proj = functools.partial(nn.DenseGeneral, features=(self.num_heads, self.head_dim),
                             kernel_init=self.kernel_init, dtype=self.dtype,
                             use_bias=self.use_bias)
    source_BSH = x_BLH if kv_BSH is None else kv_BSH
    q_BLND = proj(name="query")(x_BLH)
    k_BSND = proj(name="key")(source_BSH)
    v_BSND = proj(name="value")(source_BSH)
    masks = dict(masks or {})
    causal = self.causal
    if self.decode:
      k_BSND, v_BSND, masks, causal = self._cached(k_BSND, v_BSND, masks, causal)
    dropout = None
    if not deterministic and self.dropout > 0.0:
      # The kernel draws its mask from this layer's key for the step; XLA keeps flax's.
      drop = functools.partial(nn.Dropout(self.dropout), deterministic=False)
      dropout = attention.Dropout(self.dropout, self.make_rng("dropout"), apply=drop)
    out_BLND = attention.attend(q_BLND, k_BSND, v_BSND, name=self.what,
                                implementation=self.implementation, mesh=self.mesh,
                                causal=causal, dropout=dropout, **masks)
    return nn.DenseGeneral(x_BLH.shape[-1], axis=(-2, -1), kernel_init=self.kernel_init,
                           dtype=self.dtype, use_bias=self.use_bias, name="output")(out_BLND)

  def _cached(self, k_B1ND: jax.Array, v_B1ND: jax.Array, masks: dict[str, jax.Array],
              causal: bool) -> tuple[jax.Array, jax.Array, dict[str, jax.Array], bool]:
    """Writes this position's key and value into the cache; attends to positions <= it
    (the cache's first i + 1 keys, as lengths)."""
    ready = self.has_variable("cache", "cached_key")
    key = self.variable("cache", "cached_key", jnp.zeros, k_B1ND.shape, k_B1ND.dtype)
    value = self.variable("cache", "cached_value", jnp.zeros, v_B1ND.shape, v_B1ND.dtype)
    index = self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))
    if not ready:  # init: the cache is created at the full decode length
      return k_B1ND, v_B1ND, masks, causal
    i = index.value
    key.value = jax.lax.dynamic_update_slice(key.value, k_B1ND, (0, i, 0, 0))
    value.value = jax.lax.dynamic_update_slice(value.value, v_B1ND, (0, i, 0, 0))
    index.value = i + 1
    seen_B = jnp.full((k_B1ND.shape[0],), i + 1, jnp.int32)
    return key.value, value.value, {**masks, "kv_lengths_B": seen_B}, False


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
