"""A decoder-only Transformer LM with a Mixture-of-Experts feed-forward in every other layer.

Pre-LayerNorm blocks (GPT-2 style) built from the shared `Attention` and `Mlp`
(`workloads.common.transformer`), causal self-attention, sinusoidal positions,
and the output projection tied to the token embedding. In MoE layers the
feed-forward is `MoeMlp` (`layer.moe_ffn`: GShard top-2 or Switch top-1), one
routing group per sequence. Given a mesh with an `expert` axis, the
activations are split over `data` x `expert` (GShard: every device holds
tokens and is data parallel outside the experts), and the MoE layers dispatch
by all-to-all.

Shape suffixes: B batch, L sequence, H width, V vocabulary, E experts,
F expert hidden width.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from mlbench.train import layers
from workloads.common import transformer as blocks
from workloads.moe import layer
from workloads.moe.config import ModelConfig, SecondExpert

Stats = dict[str, jax.Array]


def _dtype(cfg: ModelConfig) -> Any:
  return jnp.dtype(cfg.dtype.value)


def is_moe_layer(cfg: ModelConfig, index: int) -> bool:
  return index % cfg.moe.every == cfg.moe.every - 1


class MoeMlp(nn.Module):
  """The MoE feed-forward: `router` [H, E] (float32), `intermediate` [E, H, F] and
  `output` [E, F, H] (every expert's two kernels, split over `expert`)."""

  cfg: ModelConfig
  capacity_factor: float
  mesh: Any = None

  @nn.compact
  def __call__(self, x_BLH: jax.Array, deterministic: bool = True) -> tuple[jax.Array, Stats]:
    m = self.cfg.moe
    h = x_BLH.shape[-1]
    init = nn.initializers.xavier_uniform(in_axis=-2, out_axis=-1, batch_axis=(0,))
    router_HE = self.param("router", nn.initializers.normal(0.02), (h, m.num_experts))
    wi_EHF = self.param("intermediate", init, (m.num_experts, h, m.expert_size))
    wo_EFH = self.param("output", init, (m.num_experts, m.expert_size, h))
    # GShard dispatches the second expert at random in training (`layer.route`); drawn
    # for the whole batch, so any split over devices routes alike.
    random = (not deterministic and m.top_k == 2 and m.second_expert is SecondExpert.RANDOM)
    uniform_BL = (jax.random.uniform(self.make_rng("gating"), x_BLH.shape[:2])
                  if random else None)
    return layer.moe_ffn(x_BLH, router_HE, wi_EHF, wo_EFH, k=m.top_k,
                         capacity_factor=self.capacity_factor, mesh=self.mesh,
                         uniform_GS=uniform_BL)


class Block(nn.Module):
  """Pre-LN: x + attention(LN(x)); x + ffn(LN(x)), the ffn dense or MoE."""

  cfg: ModelConfig
  moe: bool
  capacity_factor: float
  mesh: Any = None

  @nn.compact
  def __call__(self, x_BLH: jax.Array, deterministic: bool) -> tuple[jax.Array, Stats | None]:
    c = self.cfg
    drop = functools.partial(nn.Dropout(c.dropout), deterministic=deterministic)
    h_BLH = nn.LayerNorm(dtype=_dtype(c), name="attention_layer_norm")(x_BLH)
    h_BLH = blocks.Attention(c.num_heads, c.width // c.num_heads, dropout=c.dropout,
                             dtype=_dtype(c), causal=True, implementation=c.attention,
                             mesh=self.mesh, what="causal self-attention", name="attention")(
                                 h_BLH, deterministic=deterministic)
    x_BLH = x_BLH + drop(h_BLH)
    h_BLH = nn.LayerNorm(dtype=_dtype(c), name="mlp_layer_norm")(x_BLH)
    stats = None
    if self.moe:
      h_BLH, stats = MoeMlp(c, self.capacity_factor, self.mesh, name="moe")(h_BLH,
                                                                             deterministic)
    else:
      h_BLH = blocks.Mlp(c.mlp_size, dropout=c.dropout, dtype=_dtype(c), name="mlp")(
          h_BLH, deterministic=deterministic)
    return x_BLH + drop(h_BLH), stats


class Group(nn.Module):
  """`every` consecutive layers, the last one MoE: the repeated unit of scanned layers."""

  cfg: ModelConfig
  capacity_factor: float
  mesh: Any = None

  @nn.compact
  def __call__(self, x_BLH: jax.Array, deterministic: bool) -> tuple[jax.Array, Stats]:
    every = self.cfg.moe.every
    for j in range(every):
      x_BLH, stats = Block(self.cfg, j == every - 1, self.capacity_factor, self.mesh,
                           name=f"layer_{j}")(x_BLH, deterministic)
    return x_BLH, stats


class MoeLM(nn.Module):
  """`tokens_BL -> (logits_BLV float32, stats)`; stats are the MoE layers' routing numbers
  (`layer.moe_ffn`), averaged over the MoE layers. Scanned layers (`scan_layers`: groups
  of `moe.every` layers) are the harness's layer stack, which a `stage` mesh axis runs
  as `microbatches` GPipe microbatches (their stats averaged over the microbatches)."""

  cfg: ModelConfig
  capacity_factor: float
  mesh: Any = None
  microbatches: int = 1

  @nn.compact
  def __call__(self, tokens_BL: jax.Array, deterministic: bool = True
               ) -> tuple[jax.Array, Stats]:
    c = self.cfg
    # Unit-scale token vectors next to unit-scale position encodings (as "Attention Is
    # All You Need"); the tied output projection sees the unscaled table.
    embed = nn.Embed(c.vocab_size, c.width, name="token_embeddings",
                     embedding_init=nn.initializers.normal(c.width ** -0.5))
    length = tokens_BL.shape[1]
    x_BLH = (embed(tokens_BL) * c.width ** 0.5
             + blocks.sinusoidal_positions(length, c.width)[None])
    x_BLH = self._split_tokens(nn.Dropout(c.dropout)(x_BLH, deterministic=deterministic)
                               .astype(_dtype(c)))
    if c.scan_layers:
      groups = c.num_layers // c.moe.every
      x_BLH, summed = layers.stack(
          functools.partial(Group, c, self.capacity_factor, self.mesh), x_BLH, length=groups,
          kwargs={"deterministic": deterministic}, has_aux=True,
          mesh=self.mesh, microbatches=self.microbatches, rngs=("dropout", "gating"))
      stats = {k: v / groups for k, v in summed.items()}
    else:
      per_layer: list[Stats] = []
      for i in range(c.num_layers):
        x_BLH, layer_stats = Block(c, is_moe_layer(c, i), self.capacity_factor, self.mesh,
                                   name=f"layer_{i}")(x_BLH, deterministic)
        if layer_stats is not None:
          per_layer.append(layer_stats)
      n = len(per_layer)
      stats = {k: sum(s[k] for s in per_layer) / n for k in per_layer[0]} if n else {}
    x_BLH = nn.LayerNorm(name="output_layer_norm")(x_BLH.astype(jnp.float32))
    return embed.attend(x_BLH), stats

  def _split_tokens(self, x_BLH: jax.Array) -> jax.Array:
    """With an `expert` mesh axis, the batch is split over data x expert from here on."""
    if layer.expert_shards(self.mesh) == 1:
      return x_BLH
    from jax.sharding import NamedSharding, PartitionSpec as P

    return jax.lax.with_sharding_constraint(
        x_BLH, NamedSharding(self.mesh, P(layer.token_axes(self.mesh))))
