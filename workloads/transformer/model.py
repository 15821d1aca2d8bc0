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
  """One encoder (self-attention, MLP) or decoder (causal self, cross, MLP) layer."""

  cfg: ModelConfig
  decode: bool = False
  mesh: Any = None

  @nn.compact
  def __call__(self, x_BLH: jax.Array, self_masks: Masks, encoded_BSH: jax.Array | None,
               cross_masks: Masks | None, deterministic: bool) -> jax.Array:
    c = self.cfg
    decoder = encoded_BSH is not None
    attention = functools.partial(blocks.Attention, c.num_heads, c.width // c.num_heads,
                                  dropout=c.dropout, dtype=_dtype(c), use_bias=False,
                                  implementation=c.attention, mesh=self.mesh)
    drop = functools.partial(nn.Dropout(c.dropout), deterministic=deterministic)
    norm = functools.partial(nn.LayerNorm, dtype=_dtype(c))
    h_BLH = norm(name="self_attention_norm")(x_BLH)
    x_BLH = x_BLH + drop(attention(
        decode=self.decode, causal=decoder, name="self_attention",
        what="decoder self-attention" if decoder else "encoder self-attention")(
            h_BLH, masks=self_masks, deterministic=deterministic))
    if decoder:
      h_BLH = norm(name="cross_attention_norm")(x_BLH)
      x_BLH = x_BLH + drop(attention(name="cross_attention", what="cross-attention")(
          h_BLH, encoded_BSH, masks=cross_masks, deterministic=deterministic))
    h_BLH = norm(name="mlp_norm")(x_BLH)
    return x_BLH + drop(blocks.Mlp(c.mlp_width, dropout=c.dropout, dtype=_dtype(c),
                                   name="mlp")(h_BLH, deterministic=deterministic))


class Transformer(nn.Module):
  """`__call__(inputs_BS, targets_BL) -> logits [B, L, V]` (float32), teacher-forced."""

  cfg: ModelConfig
  decode: bool = False
  mesh: Any = None  # StepContext.mesh: where the attention kernels run

  def setup(self):
    c = self.cfg
    self.embed = nn.Embed(c.vocab_size, c.width,
                          embedding_init=nn.initializers.normal(stddev=c.width ** -0.5))
    # Under remat each layer keeps only its input for the backward pass (the cached
    # decoder runs no backward pass); `deterministic` (argument 5, counting the module)
    # stays a Python bool.
    block = (_Block if c.remat is Remat.NONE or self.decode
             else nn.remat(_Block, static_argnums=(5,)))
    self.encoder_layers = [block(c, mesh=self.mesh, name=f"encoder_{i}")
                           for i in range(c.encoder_layers)]
    self.decoder_layers = [block(c, decode=self.decode, mesh=self.mesh, name=f"decoder_{i}")
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
    seg_BS = p.get("inputs_segmentation", inputs_BS != 0)
    masks = {"q_segments_BL": seg_BS, "kv_segments_BS": seg_BS}
    for layer in self.encoder_layers:
      x_BSH = layer(x_BSH, masks, None, None, deterministic)
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
    offset = 0
    if self.decode:
      offset = self.position.value
      if not self.is_initializing():
        self.position.value = offset + targets_in_BL.shape[1]
    x_BLH = self._embed_at(targets_in_BL, offset, deterministic, p.get("targets_position"))
    # Causal self-attention; a query attends to the keys of its own sentence (packed rows)
    # and never to padding (Google's make_padding_mask(segmentation_mask=True), models.py
    # L372-382). Unpacked rows: the targets' padding follows every real token, so the
    # causal mask keeps it out; the inputs' padding is a segment of its own.
    self_masks: Masks = {}
    cross_masks: Masks = {"kv_segments_BS": inputs_BS != 0}
    if "targets_segmentation" in p:
      t_seg, i_seg = p["targets_segmentation"], p["inputs_segmentation"]
      self_masks = {"q_segments_BL": t_seg, "kv_segments_BS": t_seg}
      cross_masks = {"q_segments_BL": t_seg, "kv_segments_BS": i_seg}
    for layer in self.decoder_layers:
      x_BLH = layer(x_BLH, self_masks, encoded_BSH, cross_masks, deterministic)
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

Masks = dict
"""The keyword masks of `mlbench.train.attention.attend` (segments, lengths)."""


def shift_right(targets_BL: jax.Array) -> jax.Array:
  """The decoder's input: the targets one position later, starting from 0 (padding
  doubles as the start token, as in tensor2tensor)."""
  return jnp.pad(targets_BL, ((0, 0), (1, 0)))[:, :-1]
