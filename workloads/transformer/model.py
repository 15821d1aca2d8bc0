"""The encoder-decoder Transformer ("Attention Is All You Need"), pre-LayerNorm.

One embedding (`embed`) is shared by the source, the target and the output
projection (scaled by sqrt(width) on input, as tensor2tensor); sinusoidal
positions; attention projections without biases (as tensor2tensor); every
block is LayerNorm -> sublayer -> dropout -> residual add, with
a final LayerNorm after each stack, as the Transformer of Google's MLPerf JAX
submissions (the Flax WMT example). Attention and the MLP are the blocks shared
with the other transformer workloads (`workloads.common.transformer`), so their
parameters carry the shared partition rules.

`decode=True` builds the autoregressive decoder: one target position per call,
keys and values kept in the `cache` collection (see `Attention`).

Shape suffixes: B batch, S source length, L target length, H width, V vocabulary.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from workloads.common import transformer as blocks
from workloads.transformer.config import ModelConfig


def _dtype(cfg: ModelConfig) -> Any:
  return jnp.dtype(cfg.dtype.value)


class _Block(nn.Module):
  """One encoder (self-attention, MLP) or decoder (self, cross, MLP) layer."""

  cfg: ModelConfig
  decode: bool = False

  @nn.compact
  def __call__(self, x_BLH: jax.Array, self_bias: jax.Array | None,
               encoded_BSH: jax.Array | None, cross_bias: jax.Array | None,
               deterministic: bool) -> jax.Array:
    c = self.cfg
    attention = functools.partial(blocks.Attention, c.num_heads, c.width // c.num_heads,
                                  dropout=c.dropout, dtype=_dtype(c), use_bias=False)
    drop = functools.partial(nn.Dropout(c.dropout), deterministic=deterministic)
    norm = functools.partial(nn.LayerNorm, dtype=_dtype(c))
    h_BLH = norm(name="self_attention_norm")(x_BLH)
    x_BLH = x_BLH + drop(attention(decode=self.decode, name="self_attention")(
        h_BLH, bias_B1LS=self_bias, deterministic=deterministic))
    if encoded_BSH is not None:
      h_BLH = norm(name="cross_attention_norm")(x_BLH)
      x_BLH = x_BLH + drop(attention(name="cross_attention")(
          h_BLH, encoded_BSH, bias_B1LS=cross_bias, deterministic=deterministic))
    h_BLH = norm(name="mlp_norm")(x_BLH)
    return x_BLH + drop(blocks.Mlp(c.mlp_width, dropout=c.dropout, dtype=_dtype(c),
                                   name="mlp")(h_BLH, deterministic=deterministic))


class Transformer(nn.Module):
  """`__call__(inputs_BS, targets_BL) -> logits [B, L, V]` (float32), teacher-forced."""

  cfg: ModelConfig
  decode: bool = False

  def setup(self):
    c = self.cfg
    self.embed = nn.Embed(c.vocab_size, c.width,
                          embedding_init=nn.initializers.normal(stddev=c.width ** -0.5))
    self.encoder_layers = [_Block(c, name=f"encoder_{i}") for i in range(c.encoder_layers)]
    self.decoder_layers = [_Block(c, decode=self.decode, name=f"decoder_{i}")
                           for i in range(c.decoder_layers)]
    self.encoder_norm = nn.LayerNorm(dtype=_dtype(c))
    self.decoder_norm = nn.LayerNorm(dtype=_dtype(c))
    self.dropout = nn.Dropout(c.dropout)
    if self.decode:  # the next target position
      self.position = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))

  def encode(self, inputs_BS: jax.Array, deterministic: bool = True) -> jax.Array:
    """Encoder states [B, S, H]; padding (id 0) is masked out."""
    x_BSH = self._embed_at(inputs_BS, 0, deterministic)
    bias = blocks.padding_bias(inputs_BS)
    for layer in self.encoder_layers:
      x_BSH = layer(x_BSH, bias, None, None, deterministic)
    return self.encoder_norm(x_BSH)

  def decode_logits(self, encoded_BSH: jax.Array, inputs_BS: jax.Array,
                    targets_in_BL: jax.Array, deterministic: bool = True) -> jax.Array:
    """Next-token logits [B, L, V] for the (right-shifted) target prefix."""
    if self.decode:
      offset = self.position.value
      if not self.is_initializing():
        self.position.value = offset + targets_in_BL.shape[1]
      self_bias = None
    else:
      offset = 0
      self_bias = blocks.causal_bias(targets_in_BL.shape[1])
    x_BLH = self._embed_at(targets_in_BL, offset, deterministic)
    cross_bias = blocks.padding_bias(inputs_BS)
    for layer in self.decoder_layers:
      x_BLH = layer(x_BLH, self_bias, encoded_BSH, cross_bias, deterministic)
    x_BLH = self.decoder_norm(x_BLH)
    return self.embed.attend(x_BLH.astype(jnp.float32))

  def _embed_at(self, ids_BL: jax.Array, offset: Any, deterministic: bool) -> jax.Array:
    c = self.cfg
    table_PH = jnp.asarray(blocks.sinusoidal_positions(MAX_POSITIONS, c.width))
    pos_LH = jax.lax.dynamic_slice_in_dim(table_PH, offset, ids_BL.shape[1])
    x_BLH = self.embed(ids_BL) * jnp.sqrt(c.width).astype(jnp.float32) + pos_LH[None]
    return self.dropout(x_BLH, deterministic=deterministic).astype(_dtype(c))

  def __call__(self, inputs_BS: jax.Array, targets_BL: jax.Array,
               deterministic: bool = True) -> jax.Array:
    encoded_BSH = self.encode(inputs_BS, deterministic)
    return self.decode_logits(encoded_BSH, inputs_BS, shift_right(targets_BL), deterministic)


MAX_POSITIONS = 1024
"""Rows of the sinusoidal position table; sequences are at most this long."""


def shift_right(targets_BL: jax.Array) -> jax.Array:
  """The decoder's input: the targets one position later, starting from 0 (padding
  doubles as the start token, as in tensor2tensor)."""
  return jnp.pad(targets_BL, ((0, 0), (1, 0)))[:, :-1]
