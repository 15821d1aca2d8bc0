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
from workloads.transformer.config import MAX_POSITIONS, ModelConfig, Remat


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
    # Under remat each layer keeps only its input for the backward pass (the cached
    # decoder runs no backward pass); `deterministic` (argument 5, counting the module)
    # stays a Python bool.
    block = (_Block if c.remat is Remat.NONE or self.decode
             else nn.remat(_Block, static_argnums=(5,)))
    self.encoder_layers = [block(c, name=f"encoder_{i}") for i in range(c.encoder_layers)]
    self.decoder_layers = [block(c, decode=self.decode, name=f"decoder_{i}")
                           for i in range(c.decoder_layers)]
    self.encoder_norm = nn.LayerNorm(dtype=_dtype(c))
    self.decoder_norm = nn.LayerNorm(dtype=_dtype(c))
    self.dropout = nn.Dropout(c.dropout)
    if self.decode:  # the next target position
      self.position = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))

  def encode(self, inputs_BS: jax.Array, deterministic: bool = True,
             packing: Packing | None = None) -> jax.Array:
    """Encoder states [B, S, H]; padding (id 0) is masked out, and, for packed
    rows, attention between different segments."""
    p = packing or {}
    x_BSH = self._embed_at(inputs_BS, 0, deterministic, p.get("inputs_position"))
    bias = blocks.padding_bias(inputs_BS)
    if "inputs_segmentation" in p:
      bias = bias + segment_bias(p["inputs_segmentation"], p["inputs_segmentation"])
    for layer in self.encoder_layers:
      x_BSH = layer(x_BSH, bias, None, None, deterministic)
    return self.encoder_norm(x_BSH)

  def decode_logits(self, encoded_BSH: jax.Array, inputs_BS: jax.Array,
                    targets_in_BL: jax.Array, deterministic: bool = True,
                    packing: Packing | None = None) -> jax.Array:
    """Next-token logits [B, L, V] (float32) for the (right-shifted) target prefix."""
    return self.project(self.decode_features(encoded_BSH, inputs_BS, targets_in_BL,
                                             deterministic, packing))

  def decode_features(self, encoded_BSH: jax.Array, inputs_BS: jax.Array,
                      targets_in_BL: jax.Array, deterministic: bool = True,
                      packing: Packing | None = None) -> jax.Array:
    """The decoder's normalised output [B, L, H] (compute dtype), before `project`."""
    p = packing or {}
    if self.decode:
      offset = self.position.value
      if not self.is_initializing():
        self.position.value = offset + targets_in_BL.shape[1]
      self_bias = None
    else:
      offset = 0
      self_bias = blocks.causal_bias(targets_in_BL.shape[1])
    x_BLH = self._embed_at(targets_in_BL, offset, deterministic, p.get("targets_position"))
    cross_bias = blocks.padding_bias(inputs_BS)
    if "targets_segmentation" in p:
      t_seg, i_seg = p["targets_segmentation"], p["inputs_segmentation"]
      self_bias = self_bias + segment_bias(t_seg, t_seg)
      cross_bias = cross_bias + segment_bias(t_seg, i_seg)
    for layer in self.decoder_layers:
      x_BLH = layer(x_BLH, self_bias, encoded_BSH, cross_bias, deterministic)
    return self.decoder_norm(x_BLH)

  def project(self, x_BLH: jax.Array) -> jax.Array:
    """Logits [B, L, V]: `x_BLH` times the shared embedding, transposed. Both operands
    in the compute dtype, the product accumulated and returned in float32: a float32
    copy of the activations (or of the table) would double the matmul's traffic, and
    bfloat16 logits would round away the differences softmax needs."""
    dt = _dtype(self.cfg)
    return jnp.einsum("blh,vh->blv", x_BLH.astype(dt), self.embed.embedding.astype(dt),
                      preferred_element_type=jnp.float32)

  def _embed_at(self, ids_BL: jax.Array, offset: Any, deterministic: bool,
                positions_BL: jax.Array | None = None) -> jax.Array:
    """Token embeddings plus the position encodings of `offset`, `offset + 1`, ...,
    or, for packed rows, of each token's position within its own sentence
    (Google's AddPositionEmbs with inputs_positions, models.py L428-470)."""
    c = self.cfg
    table_PH = jnp.asarray(blocks.sinusoidal_positions(MAX_POSITIONS, c.width))
    if positions_BL is None:
      pos_BLH = jax.lax.dynamic_slice_in_dim(table_PH, offset, ids_BL.shape[1])[None]
    else:
      pos_BLH = table_PH[positions_BL]
    x_BLH = self.embed(ids_BL) * jnp.sqrt(c.width).astype(jnp.float32) + pos_BLH
    return self.dropout(x_BLH, deterministic=deterministic).astype(_dtype(c))

  def __call__(self, inputs_BS: jax.Array, targets_BL: jax.Array,
               deterministic: bool = True, packing: Packing | None = None) -> jax.Array:
    """Teacher-forced logits [B, L, V] (float32). `packing`: the `*_segmentation` and
    `*_position` arrays of packed rows. The whole row is shifted right, as the
    reference does (models.py L878-880)."""
    return self.project(self.features(inputs_BS, targets_BL, deterministic, packing))

  def features(self, inputs_BS: jax.Array, targets_BL: jax.Array,
               deterministic: bool = True, packing: Packing | None = None) -> jax.Array:
    """Teacher-forced decoder output [B, L, H] before `project`: what the training loss
    turns into logits a slice of positions at a time (see train.token_losses)."""
    encoded_BSH = self.encode(inputs_BS, deterministic, packing)
    return self.decode_features(encoded_BSH, inputs_BS, shift_right(targets_BL),
                                deterministic, packing)


Packing = dict
"""{inputs,targets}_{segmentation,position} arrays [B, S] / [B, L] of packed rows."""


def segment_bias(query_seg_BL: jax.Array, key_seg_BS: jax.Array) -> jax.Array:
  """[B, 1, L, S] attention bias: a query attends only to keys of its own segment
  (Google's make_padding_mask(segmentation_mask=True), models.py L372-382)."""
  same = query_seg_BL[:, None, :, None] == key_seg_BS[:, None, None, :]
  return jnp.where(same, 0.0, blocks.NEG_INF).astype(jnp.float32)


def shift_right(targets_BL: jax.Array) -> jax.Array:
  """The decoder's input: the targets one position later, starting from 0 (padding
  doubles as the start token, as in tensor2tensor)."""
  return jnp.pad(targets_BL, ((0, 0), (1, 0)))[:, :-1]
