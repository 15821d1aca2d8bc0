"""GPT-OSS 20B as the MLPerf reference builds it (Megatron-core GPTModel, Primus config), in Flax.

Pre-RMSNorm blocks: x + attention(norm(x)), then x + moe(norm(x)). Attention is
grouped-query (N query heads share K key/value heads, N/K each; heads of D = 64, so the
queries are N x D = 4,096 wide against a residual stream of H = 2,880): queries and keys
get an RMSNorm over each head (Megatron's qk_layernorm, before the rotation), then rotary
embeddings (`workloads/common/decoder.py`), and the scores come from the harness's
attention entry point, causal everywhere and limited to a sliding window in the layers
`ModelConfig.sliding` names. The feed-forward of every layer is the dropless
Mixture of Experts (`workloads/common/dropless_moe.py`): a float32 router, the top_k
experts of each token by logit weighted by a softmax over those k, SwiGLU experts run on
grouped matmuls, every token kept. Untied input and output embeddings; no biases; no
attention sinks; no shared expert.

Initialisation follows Megatron: N(0, init_std) everywhere (the router and both
embeddings included), N(0, init_std / sqrt(2 * layers)) for the projections that write
into the residual stream (attention output, the experts' down projection), RMSNorm
scales at 1.

Shape suffixes: B batch, L length, H width, N query heads, K key/value heads, D head size,
V vocabulary.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from mlbench.train import attention, layers
from workloads.common import decoder
from workloads.common.dropless_moe import DroplessMoE
from workloads.gpt_oss_20b.config import ModelConfig

TOKEN_AXES = ("data", "expert")
"""Mesh axes the residual stream is split over by batch: every device of the experts' mesh
holds tokens (GShard)."""


def _dtype(cfg: ModelConfig) -> Any:
  return jnp.dtype(cfg.dtype.value)


def residual_std(cfg: ModelConfig) -> float:
  """Megatron's output_layer_init_method: init_std / sqrt(2 * num_layers)."""
  return cfg.init_std / math.sqrt(2 * cfg.num_layers)


class Attention(nn.Module):
  """Grouped-query causal self-attention with per-head query and key RMSNorm: `query`
  [H, N, D], `key` and `value` [H, K, D], `query_norm` and `key_norm` [D], `output`
  [N, D, H]; sliding over `window` keys back where `sliding`."""

  cfg: ModelConfig
  sliding: bool
  mesh: Any = None

  @nn.compact
  def __call__(self, x_BLH: jax.Array, cos_LD: jax.Array, sin_LD: jax.Array) -> jax.Array:
    c = self.cfg
    proj = functools.partial(nn.DenseGeneral, use_bias=False, dtype=_dtype(c),
                             kernel_init=nn.initializers.normal(c.init_std))
    norm = functools.partial(nn.RMSNorm, epsilon=c.norm_epsilon, dtype=_dtype(c))
    q_BLND = norm(name="query_norm")(proj((c.num_heads, c.head_dim), name="query")(x_BLH))
    k_BLKD = norm(name="key_norm")(proj((c.num_kv_heads, c.head_dim), name="key")(x_BLH))
    v_BLKD = proj((c.num_kv_heads, c.head_dim), name="value")(x_BLH)
    q_BLND = decoder.apply_rope(q_BLND, cos_LD, sin_LD)
    k_BLKD = decoder.apply_rope(k_BLKD, cos_LD, sin_LD)
    window = {"window": c.window} if self.sliding else {}
    out_BLND = attention.attend(
        q_BLND, k_BLKD, v_BLKD, name="sliding self-attention" if self.sliding else
        "causal self-attention", implementation=c.attention, mesh=self.mesh, causal=True,
        chunk=c.attention_chunk, **window)
    return nn.DenseGeneral(x_BLH.shape[-1], axis=(-2, -1), use_bias=False, dtype=_dtype(c),
                           kernel_init=nn.initializers.normal(residual_std(c)),
                           name="output")(out_BLND)


class Block(nn.Module):
  """One decoder layer: attention (sliding or full) and the dropless MoE."""

  cfg: ModelConfig
  sliding: bool
  mesh: Any = None

  @nn.compact
  def __call__(self, x_BLH: jax.Array, cos_LD: jax.Array, sin_LD: jax.Array) -> jax.Array:
    c = self.cfg
    norm = functools.partial(nn.RMSNorm, epsilon=c.norm_epsilon, dtype=_dtype(c))
    x_BLH = decoder.by_batch(self.mesh, x_BLH, TOKEN_AXES)
    x_BLH = x_BLH + Attention(c, self.sliding, self.mesh, name="attention")(
        norm(name="attention_norm")(x_BLH), cos_LD, sin_LD)
    moe = DroplessMoE(experts=c.num_experts, top_k=c.top_k, hidden=c.width, ffn=c.expert_size,
                      dtype=_dtype(c), param_dtype=jnp.float32, init_std=c.init_std,
                      output_init_std=residual_std(c), mesh=self.mesh, name="moe")
    return x_BLH + moe(norm(name="moe_norm")(x_BLH))


class Group(nn.Module):
  """`window_skip_freq` consecutive layers (the attention pattern's period), `layer_<i>`:
  the repeated unit of scanned layers."""

  cfg: ModelConfig
  mesh: Any = None

  @nn.compact
  def __call__(self, x_BLH: jax.Array, cos_LD: jax.Array, sin_LD: jax.Array) -> jax.Array:
    for i in range(self.cfg.window_skip_freq):
      x_BLH = Block(self.cfg, self.cfg.sliding(i), self.mesh, name=f"layer_{i}")(
          x_BLH, cos_LD, sin_LD)
    return x_BLH


class GptOss(nn.Module):
  """`tokens_BL -> logits_BLV` (float32). Scanned layer groups are the harness's layer
  stack: a `stage` mesh axis runs them as `microbatches` GPipe microbatches."""

  cfg: ModelConfig
  mesh: Any = None
  microbatches: int = 1

  @nn.compact
  def __call__(self, tokens_BL: jax.Array) -> jax.Array:
    c = self.cfg
    x_BLH = nn.Embed(c.vocab_size, c.width, embedding_init=nn.initializers.normal(c.init_std),
                     name="embedding")(tokens_BL).astype(_dtype(c))
    freq = decoder.inverse_frequencies(c.rope_theta, c.head_dim)
    cos_LD, sin_LD = (jnp.asarray(t) for t in decoder.rope_tables(freq, tokens_BL.shape[1]))
    policy = decoder.remat_policy(c.remat)
    if c.scan_layers:
      x_BLH = layers.stack(functools.partial(Group, c, self.mesh), x_BLH,
                           length=c.num_layers // c.window_skip_freq, shared=(cos_LD, sin_LD),
                           mesh=self.mesh, microbatches=self.microbatches,
                           remat_policy=policy)
    else:
      block = Block if policy is None else nn.remat(Block, policy=policy)
      for i in range(c.num_layers):
        x_BLH = block(c, c.sliding(i), self.mesh, name=f"layer_{i}")(x_BLH, cos_LD, sin_LD)
    x_BLH = nn.RMSNorm(epsilon=c.norm_epsilon, dtype=_dtype(c), name="final_norm")(x_BLH)
    logits_BLV = nn.Dense(c.vocab_size, use_bias=False, dtype=_dtype(c),
                          kernel_init=nn.initializers.normal(c.init_std), name="output")(x_BLH)
    return logits_BLV.astype(jnp.float32)
