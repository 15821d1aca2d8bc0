"""BERT: a post-LayerNorm Transformer encoder with masked-LM and next-sentence heads.

The architecture of google-research/bert's `modeling.py` (and the MLPerf
reference): word + position + token-type embeddings, LayerNorm; per layer
self-attention and a GELU MLP, each followed by dropout, a residual add and
LayerNorm; a tanh pooler over [CLS]. The masked-LM head (dense, GELU,
LayerNorm, then the word embeddings transposed plus a bias) runs only at the
masked positions. Attention and the MLP are the blocks shared with the other
transformer workloads (`workloads.common.transformer`); their parameter names
are what the shared partition rules match.

A batch is either one sequence a row, padded on the right (the reference's records), or
packed rows (workloads/bert/packing.py), told apart by their `sequence_ids`: there
attention stays within each sequence (its ids as segments), positions restart at each
sequence (`position_ids`), and the next-sentence head reads every slot's [CLS]
(`cls_positions`).

Shape suffixes: B batch (rows), L sequence (row length), P masked positions, H hidden,
S next-sentence slots of a row, V vocabulary.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from mlbench.train import layers
from workloads.bert.config import ModelConfig, Remat
from workloads.common import transformer as blocks


def gelu(x: jax.Array) -> jax.Array:
  """The reference's GELU: the tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  (mlcommons/training retired_benchmarks/bert/modeling.py L263-276), not the exact erf form."""
  return nn.gelu(x, approximate=True)


def _init(cfg: ModelConfig) -> Any:
  return nn.initializers.truncated_normal(cfg.initializer_range)


def _dtype(cfg: ModelConfig) -> Any:
  return jnp.dtype(cfg.dtype.value)


class Layer(nn.Module):
  cfg: ModelConfig
  mesh: Any = None

  @nn.compact
  def __call__(self, x_BLH: jax.Array, keys: jax.Array, deterministic: bool) -> jax.Array:
    """`keys`: the real tokens of each row, as lengths [B] (padded rows) or sequence ids
    [B, L] (packed rows; attention within a sequence)."""
    c = self.cfg
    norm = functools.partial(nn.LayerNorm, epsilon=c.layer_norm_epsilon, dtype=_dtype(c))
    drop = functools.partial(nn.Dropout(c.dropout), deterministic=deterministic)
    attended = blocks.Attention(c.num_heads, c.hidden_size // c.num_heads, dropout=c.dropout,
                                dtype=_dtype(c), kernel_init=_init(c),
                                implementation=c.attention, mesh=self.mesh, name="attention")(
                                    x_BLH, masks=_masks(keys), deterministic=deterministic)
    x_BLH = norm(name="attention_layer_norm")(x_BLH + drop(attended))
    out_BLH = blocks.Mlp(c.intermediate_size, activation=gelu, dtype=_dtype(c),
                         kernel_init=_init(c), name="mlp")(x_BLH)
    return norm(name="output_layer_norm")(x_BLH + drop(out_BLH))


def _masks(keys: jax.Array) -> dict[str, jax.Array]:
  if keys.ndim == 1:
    return {"kv_lengths_B": keys}
  return {"q_segments_BL": keys, "kv_segments_BS": keys}


class Bert(nn.Module):
  """`(masked-LM logits [B, P, V], next-sentence logits [B, 2], or [B, S, 2] for packed
  rows)`, both float32. Scanned
  layers (`scan_layers`) are the harness's layer stack: a `stage` mesh axis runs them as
  `microbatches` GPipe microbatches."""

  cfg: ModelConfig
  mesh: Any = None
  microbatches: int = 1

  @nn.compact
  def __call__(self, batch: dict[str, jax.Array], deterministic: bool = True
               ) -> tuple[jax.Array, jax.Array]:
    c = self.cfg
    embed = functools.partial(nn.Embed, features=c.hidden_size, embedding_init=_init(c))
    word = embed(c.vocab_size, name="word_embeddings")
    ids_BL = batch["input_ids"]
    packed = "sequence_ids" in batch
    positions = batch["position_ids"] if packed else jnp.arange(ids_BL.shape[1])[None]
    x_BLH = (word(ids_BL)
             + embed(c.max_position_embeddings, name="position_embeddings")(positions)
             + embed(c.type_vocab_size, name="token_type_embeddings")(batch["segment_ids"]))
    x_BLH = nn.LayerNorm(epsilon=c.layer_norm_epsilon, name="embeddings_layer_norm")(x_BLH)
    x_BLH = nn.Dropout(c.dropout)(x_BLH, deterministic=deterministic).astype(_dtype(c))
    # The reference's records are padded on the right: input_mask is 1 for the first
    # `length` tokens, so padding is a length (which the fused kernels skip). Packed rows
    # give each token its sequence's id (0: padding), segments to every kernel.
    keys = (batch["sequence_ids"] if packed
            else batch["input_mask"].sum(-1).astype(jnp.int32))
    # Under remat each layer keeps only its input for the backward pass;
    # `deterministic` (argument 3, counting the module) stays a Python bool.
    if c.scan_layers:
      x_BLH = layers.stack(functools.partial(Layer, c, self.mesh), x_BLH, length=c.num_layers,
                           per_example=(keys,), kwargs={"deterministic": deterministic},
                           mesh=self.mesh, microbatches=self.microbatches,
                           remat_policy=None if c.remat is Remat.NONE
                           else jax.checkpoint_policies.nothing_saveable)
    else:
      layer = Layer if c.remat is Remat.NONE else nn.remat(Layer, static_argnums=(3,))
      for i in range(c.num_layers):
        x_BLH = layer(c, self.mesh, name=f"layer_{i}")(x_BLH, keys, deterministic)
    cls = batch["cls_positions"] if packed else None
    return (self._masked_lm(x_BLH, batch["masked_lm_positions"], word),
            self._next_sentence(x_BLH, cls))

  def _masked_lm(self, x_BLH: jax.Array, positions_BP: jax.Array, word: nn.Embed) -> jax.Array:
    c = self.cfg
    x_BPH = jnp.take_along_axis(x_BLH, positions_BP[..., None], axis=1)
    x_BPH = gelu(nn.Dense(c.hidden_size, kernel_init=_init(c), dtype=_dtype(c),
                          name="mlm_transform")(x_BPH))
    x_BPH = nn.LayerNorm(epsilon=c.layer_norm_epsilon, name="mlm_layer_norm")(x_BPH)
    bias_V = self.param("mlm_output_bias", nn.initializers.zeros, (c.vocab_size,))
    # The tied embedding, transposed: operands in the compute dtype (no float32 copy
    # of the table or the activations), products accumulated and returned in float32.
    dt = _dtype(c)
    logits_BPV = jnp.einsum("bph,vh->bpv", x_BPH.astype(dt), word.embedding.astype(dt),
                            preferred_element_type=jnp.float32)
    return logits_BPV + bias_V

  def _next_sentence(self, x_BLH: jax.Array, cls_BS: jax.Array | None) -> jax.Array:
    """The pooler (tanh dense) and classifier on each sequence's [CLS]: position 0 of a
    padded row, `cls_BS` of a packed one."""
    c = self.cfg
    first = x_BLH[:, 0] if cls_BS is None else jnp.take_along_axis(
        x_BLH, cls_BS[..., None], axis=1)
    pooled = jnp.tanh(nn.Dense(c.hidden_size, kernel_init=_init(c), dtype=_dtype(c),
                               name="pooler")(first))
    return nn.Dense(2, kernel_init=_init(c), name="next_sentence")(pooled).astype(jnp.float32)
