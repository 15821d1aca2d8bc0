"""A Llama-3.1-style decoder-only language model in Flax.

Pre-RMSNorm blocks: x + attention(norm(x)), then x + swiglu(norm(x)). Attention is
grouped-query (N query heads share K key/value heads, N/K each) with rotary position
embeddings on queries and keys, Llama 3.1's frequency scaling, and runs through the
harness's attention entry point (`mlbench.train.attention`), so GPUs get cuDNN's fused
flash attention and TPUs the Pallas splash kernel. Input embedding and output projection
are separate matrices (untied); no projection has a bias. Rotary embeddings rotate the two
halves of each head (`workloads/common/decoder.py`, Megatron and NeMo's layout).

Initialisation follows Megatron (NeMo's Llama recipe): N(0, init_std) everywhere,
N(0, init_std / sqrt(2 * layers)) for the two projections that write into the
residual stream, RMSNorm scales at 1.

Shape suffixes: B batch, L length, H width, N query heads, K key/value heads,
D head size, F MLP width, V vocabulary.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mlbench.train import attention, layers
from workloads.common import decoder
from workloads.common.decoder import apply_rope
from workloads.llama31_8b.config import ModelConfig, Remat, RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> np.ndarray:
  """[D/2] rotation frequencies (radians per position), with Llama 3.1's scaling."""
  freq = decoder.inverse_frequencies(rope.theta, head_dim)
  if not rope.scaled:
    return freq
  wavelength = 2 * math.pi / freq
  low_wavelength = rope.original_context / rope.low_freq_factor    # longer: stretched
  high_wavelength = rope.original_context / rope.high_freq_factor  # shorter: kept
  smooth = ((rope.original_context / wavelength - rope.low_freq_factor)
            / (rope.high_freq_factor - rope.low_freq_factor))
  between = (1 - smooth) * freq / rope.factor + smooth * freq
  return np.where(wavelength < high_wavelength, freq,
                  np.where(wavelength > low_wavelength, freq / rope.factor, between))


def rope_tables(rope: RopeConfig, head_dim: int, length: int) -> tuple[np.ndarray, np.ndarray]:
  """(cos_LD, sin_LD), float32, D/2 wide: the angle of position l in pair i is l * freq_i."""
  return decoder.rope_tables(inverse_frequencies(rope, head_dim), length)


def _dtype(cfg: ModelConfig) -> Any:
  return jnp.dtype(cfg.dtype.value)


def _residual_init(cfg: ModelConfig) -> Any:
  return nn.initializers.normal(cfg.init_std / math.sqrt(2 * cfg.num_layers))


class Attention(nn.Module):
  """Grouped-query causal self-attention: `query` [H, N, D], `key` and `value` [H, K, D],
  `output` [N, D, H]; the scores by the harness's attention entry point."""

  cfg: ModelConfig
  mesh: Any = None

  @nn.compact
  def __call__(self, x_BLH: jax.Array, cos_LD: jax.Array, sin_LD: jax.Array) -> jax.Array:
    c = self.cfg
    proj = functools.partial(nn.DenseGeneral, use_bias=False, dtype=_dtype(c),
                             kernel_init=nn.initializers.normal(c.init_std))
    q_BLND = apply_rope(proj((c.num_heads, c.head_dim), name="query")(x_BLH), cos_LD, sin_LD)
    k_BLKD = apply_rope(proj((c.num_kv_heads, c.head_dim), name="key")(x_BLH), cos_LD, sin_LD)
    v_BLKD = proj((c.num_kv_heads, c.head_dim), name="value")(x_BLH)
    out_BLND = attention.attend(q_BLND, k_BLKD, v_BLKD, name="causal self-attention",
                                implementation=c.attention, mesh=self.mesh, causal=True,
                                chunk=c.attention_chunk)
    return nn.DenseGeneral(x_BLH.shape[-1], axis=(-2, -1), use_bias=False, dtype=_dtype(c),
                           kernel_init=_residual_init(c), name="output")(out_BLND)


class SwiGlu(nn.Module):
  """down(silu(gate(x)) * up(x)): `gate` and `up` [H, F], `down` [F, H]."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BLH: jax.Array) -> jax.Array:
    c = self.cfg
    dense = functools.partial(nn.Dense, use_bias=False, dtype=_dtype(c),
                              kernel_init=nn.initializers.normal(c.init_std))
    h_BLF = nn.silu(dense(c.mlp_size, name="gate")(x_BLH)) * dense(c.mlp_size, name="up")(x_BLH)
    return nn.Dense(x_BLH.shape[-1], use_bias=False, dtype=_dtype(c),
                    kernel_init=_residual_init(c), name="down")(h_BLF)


class Block(nn.Module):
  """One decoder layer."""

  cfg: ModelConfig
  mesh: Any = None

  @nn.compact
  def __call__(self, x_BLH: jax.Array, cos_LD: jax.Array, sin_LD: jax.Array) -> jax.Array:
    c = self.cfg
    norm = functools.partial(nn.RMSNorm, epsilon=c.norm_epsilon, dtype=_dtype(c))
    x_BLH = x_BLH + Attention(c, self.mesh, name="attention")(norm(name="attention_norm")(x_BLH),
                                                   cos_LD, sin_LD)
    return x_BLH + SwiGlu(c, name="mlp")(norm(name="mlp_norm")(x_BLH))


class Llama(nn.Module):
  """`tokens_BL -> logits_BLV` (float32). With a mesh, the residual stream is kept split
  over `data` by batch, so parameters split over `data` (FSDP) are gathered, not the
  activations re-split. Scanned layers are the harness's layer stack: a `stage` mesh
  axis runs them as `microbatches` GPipe microbatches."""

  cfg: ModelConfig
  mesh: Any = None
  microbatches: int = 1

  @nn.compact
  def __call__(self, tokens_BL: jax.Array) -> jax.Array:
    c = self.cfg
    x_BLH = nn.Embed(c.vocab_size, c.width, embedding_init=nn.initializers.normal(c.init_std),
                     name="embedding")(tokens_BL).astype(_dtype(c))
    cos_LD, sin_LD = (jnp.asarray(t) for t in rope_tables(c.rope, c.head_dim, tokens_BL.shape[1]))
    if c.scan_layers:
      x_BLH = layers.stack(functools.partial(Block, c, self.mesh), x_BLH, length=c.num_layers,
                           shared=(cos_LD, sin_LD), mesh=self.mesh,
                           microbatches=self.microbatches, remat_policy=decoder.remat_policy(c.remat))
    else:
      block = Block if c.remat is Remat.NONE else nn.remat(Block, policy=decoder.remat_policy(c.remat))
      for i in range(c.num_layers):
        x_BLH = block(c, self.mesh, name=f"layer_{i}")(decoder.by_batch(self.mesh, x_BLH), cos_LD,
                                                       sin_LD)
    x_BLH = nn.RMSNorm(epsilon=c.norm_epsilon, dtype=_dtype(c), name="final_norm")(x_BLH)
    logits_BLV = nn.Dense(c.vocab_size, use_bias=False, dtype=_dtype(c),
                          kernel_init=nn.initializers.normal(c.init_std), name="output")(x_BLH)
    return logits_BLV.astype(jnp.float32)
