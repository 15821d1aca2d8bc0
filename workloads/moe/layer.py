"""The Mixture-of-Experts feed-forward: GShard top-2 (or Switch top-1) routing with
expert capacity, the auxiliary losses, and expert parallelism by all-to-all.

Routing (`route`) follows GShard's Algorithm 1 (Lepikhin et al. 2020) as the
Lingvo/praxis `top2_gating` implements it: router logits and softmax in
float32; the first expert is the argmax, the second the argmax with the first
masked out; the two gates are renormalised to sum to 1 before any token is
dropped; given uniform numbers, the second expert is dispatched only where one is
below 2 x its gate (GShard's random routing, Algorithm 1; Lingvo's policy 'random' at
threshold 0.5, tensorflow/lingvo e0be5dc4 lingvo/core/gshard_layers.py L2272-2290), a
token that loses it keeping its first expert's share; each expert takes at most
C = ceil(capacity_factor * k * S / E) tokens per group, positions are given in
token order, and every first choice is served before any second choice. Top-1
(Switch Transformer) keeps the raw router probability as its gate. A token an expert cannot take gets nothing from
it; a token no expert takes passes through the layer's residual unchanged.

Losses: GShard's load-balancing loss `E^2 * mean_{g,e}(f_ge * p_ge)` (f: share
of the group's tokens whose first choice is e; p: mean router probability of e)
and ST-MoE's router z-loss `mean(logsumexp(logits)^2)` (Zoph et al. 2022).

Expert parallelism (`moe_ffn` with a mesh): an explicit per-device program
(`jax.shard_map`) over the token axes (`data`, `expert`). Each device routes
its own groups, all-to-alls the dispatched slots to the devices holding their
experts (mesh axis `expert`), runs its experts, and all-to-alls the results
back: two all-to-alls per layer and direction, and no token is all-gathered
(GSPMD sharding annotations alone were seen to all-gather the tokens on CPU).

Shape suffixes: G groups (one sequence each), S tokens per group, E experts,
C capacity (slots per expert and group), M model width, F expert hidden width.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from workloads.common import expert_mesh

EXPERT, TOKEN_AXES = expert_mesh.EXPERT, expert_mesh.TOKEN_AXES
token_axes, expert_shards = expert_mesh.token_axes, expert_mesh.expert_shards


def capacity(tokens: int, experts: int, k: int, factor: float) -> int:
  """Slots per expert and group: C = ceil(capacity_factor * k * tokens / experts)."""
  return max(1, math.ceil(factor * k * tokens / experts))


@dataclasses.dataclass(frozen=True)
class Routing:
  """Where every token of every group goes, and what routing it cost.

  Attributes:
    combine_GSEC: the gate weight of token s in slot c of expert e (0: not there).
    dispatch_GSEC: 1 where token s occupies slot c of expert e, else 0.
    aux_loss: GShard's load-balancing loss, averaged over groups.
    z_loss: the router z-loss, averaged over tokens.
    counts: sums over this shard's tokens, added across devices before use:
      `tokens`, `assignments` (k per token, less the second experts not drawn),
      `dropped_assignments` (routed but over capacity), `dropped_tokens` (served
      by no expert), `load_E` (first and second choices per expert, before capacity).
  """

  combine_GSEC: jax.Array
  dispatch_GSEC: jax.Array
  aux_loss: jax.Array
  z_loss: jax.Array
  counts: dict[str, jax.Array]


SECOND_EXPERT_THRESHOLD = 0.5
"""The second expert is dispatched with probability min(1, gate / this): 2 x gate."""


def route(logits_GSE: jax.Array, *, k: int, capacity_per_group: int,
          uniform_GS: jax.Array | None = None) -> Routing:
  """GShard top-2 (k=2) or Switch top-1 (k=1) routing of `logits_GSE`; with
  `uniform_GS` (uniform numbers in [0, 1), one per token), the second expert at random.
  k > 2 extends GShard's order (`_choices`): every j-th choice is served before any
  (j+1)-th."""
  if k < 1 or k > logits_GSE.shape[-1]:
    raise ValueError(f"top_k must be between 1 and the {logits_GSE.shape[-1]} experts, got {k}")
  logits_GSE = logits_GSE.astype(jnp.float32)
  e, c = logits_GSE.shape[-1], capacity_per_group
  gates_GSE = jax.nn.softmax(logits_GSE, axis=-1)
  choices = _choices(logits_GSE, gates_GSE, k, uniform_GS)
  # Load balancing counts first choices only (GShard eq. 4; Switch for k=1).
  aux_loss = jnp.mean(jnp.mean(choices[0][0], axis=1) * jnp.mean(gates_GSE, axis=1)) * e * e
  z_loss = jnp.mean(jnp.square(jax.nn.logsumexp(logits_GSE, axis=-1)))
  load_E = sum(jnp.sum(m, axis=(0, 1)) for m, _ in choices)

  combine_GSEC = jnp.zeros(logits_GSE.shape + (c,), jnp.float32)
  dispatch_GSEC = jnp.zeros_like(combine_GSEC)
  served_GE = jnp.zeros(logits_GSE.shape[:1] + (e,), jnp.float32)  # slots already taken
  kept_GS = jnp.zeros(logits_GSE.shape[:2], jnp.float32)
  for mask_GSE, gate_GS in choices:
    # Exclusive cumulative count: the token's place in its expert's queue, after
    # every token of earlier choices (first choices are served first).
    position_GSE = jnp.cumsum(mask_GSE, axis=1) - mask_GSE + served_GE[:, None, :]
    mask_GSE = mask_GSE * (position_GSE < c)
    served_GE = served_GE + jnp.sum(mask_GSE, axis=1)
    slot_GSC = jax.nn.one_hot(jnp.sum(position_GSE * mask_GSE, axis=-1).astype(jnp.int32), c,
                              dtype=jnp.float32)
    placed_GSEC = mask_GSE[..., None] * slot_GSC[:, :, None, :]
    dispatch_GSEC = dispatch_GSEC + placed_GSEC
    combine_GSEC = combine_GSEC + gate_GS[..., None, None] * placed_GSEC
    kept_GS = kept_GS + jnp.sum(mask_GSE, axis=-1)
  tokens = jnp.asarray(kept_GS.size, jnp.float32)
  assigned = jnp.sum(load_E)  # first choices and the dispatched second ones
  counts = {"tokens": tokens, "assignments": assigned,
            "dropped_assignments": assigned - jnp.sum(kept_GS),
            "dropped_tokens": jnp.sum((kept_GS == 0).astype(jnp.float32)), "load_E": load_E}
  return Routing(combine_GSEC, dispatch_GSEC, aux_loss, z_loss, counts)


def _choices(logits_GSE: jax.Array, gates_GSE: jax.Array, k: int,
             uniform_GS: jax.Array | None) -> list[tuple[jax.Array, jax.Array]]:
  """[(one-hot expert [G, S, E], gate [G, S])] of each token's k choices, in order: the
  j-th is the argmax of the logits with the earlier ones masked; for k > 1 the k gates are
  renormalised to sum to 1 (a softmax over the k chosen logits) before any token is
  dropped, so a token that loses an expert keeps only the others' shares (GShard)."""
  e = logits_GSE.shape[-1]
  masks = [jax.nn.one_hot(jnp.argmax(logits_GSE, axis=-1), e, dtype=jnp.float32)]
  for _ in range(k - 1):
    # The earlier choices at -inf: the same order as the gates, without ties between
    # gates that underflow to 0.
    masked_GSE = jnp.where(sum(masks) > 0, -jnp.inf, logits_GSE)
    masks.append(jax.nn.one_hot(jnp.argmax(masked_GSE, axis=-1), e, dtype=jnp.float32))
  chosen = [jnp.sum(gates_GSE * m, axis=-1) for m in masks]
  if k > 1:
    denom_GS = jnp.maximum(sum(chosen), jnp.finfo(jnp.float32).eps)
    chosen = [g / denom_GS for g in chosen]
  if k == 2 and uniform_GS is not None:  # lingvo gshard_layers.py L2286-2290
    sampled_GS = (uniform_GS < chosen[1] / SECOND_EXPERT_THRESHOLD).astype(jnp.float32)
    masks[1], chosen[1] = masks[1] * sampled_GS[..., None], chosen[1] * sampled_GS
  return list(zip(masks, chosen))


def experts(x_EGCM: jax.Array, wi_EMF: jax.Array, wo_EFM: jax.Array,
            activation: Callable[[jax.Array], jax.Array] = jax.nn.relu,
            wi_gate_EMF: jax.Array | None = None) -> jax.Array:
  """Each expert's two-layer feed-forward over its slots (no biases, as GShard); with
  `wi_gate_EMF`, a gated one: activation(x wi_gate) * (x wi) (SwiGLU with silu)."""
  up = lambda w: jnp.einsum("egcm,emf->egcf", x_EGCM, w.astype(x_EGCM.dtype))  # noqa: E731
  h_EGCF = (activation(up(wi_EMF)) if wi_gate_EMF is None
            else activation(up(wi_gate_EMF)) * up(wi_EMF))
  return jnp.einsum("egcf,efm->egcm", h_EGCF, wo_EFM.astype(x_EGCM.dtype))


def summarize(aux_loss: jax.Array, z_loss: jax.Array, counts: dict[str, jax.Array]
              ) -> dict[str, jax.Array]:
  """The layer's reported numbers, from counts summed over all groups."""
  load_E = counts["load_E"]
  return {"aux_loss": aux_loss, "z_loss": z_loss,
          "dropped_tokens": counts["dropped_tokens"] / counts["tokens"],
          "dropped_assignments": counts["dropped_assignments"] / counts["assignments"],
          "load_max_over_mean": jnp.max(load_E) / jnp.maximum(jnp.mean(load_E), 1e-9)}


def _local(x_GSM: jax.Array, router_ME: jax.Array, wi_EMF: jax.Array, wo_EFM: jax.Array,
           uniform_GS: jax.Array | None, wi_gate_EMF: jax.Array | None, *, k: int,
           capacity_factor: float, activation: Callable, expert_axis: str | None,
           reduce_axes: tuple[str, ...]) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The MoE layer on one device's groups; with `expert_axis`, its experts are a shard."""
  e = router_ME.shape[-1]
  logits_GSE = jnp.einsum("gsm,me->gse", x_GSM.astype(jnp.float32), router_ME)
  routing = route(logits_GSE, k=k, uniform_GS=uniform_GS,
                  capacity_per_group=capacity(x_GSM.shape[1], e, k, capacity_factor))
  x_EGCM = jnp.einsum("gsec,gsm->egcm", routing.dispatch_GSEC.astype(x_GSM.dtype), x_GSM)
  if expert_axis is not None:  # [E, G, ...] -> this device's experts: [E/n, n*G, ...]
    x_EGCM = jax.lax.all_to_all(x_EGCM, expert_axis, split_axis=0, concat_axis=1, tiled=True)
  y_EGCM = experts(x_EGCM, wi_EMF, wo_EFM, activation, wi_gate_EMF)
  if expert_axis is not None:  # and back to the devices that hold the tokens
    y_EGCM = jax.lax.all_to_all(y_EGCM, expert_axis, split_axis=1, concat_axis=0, tiled=True)
  y_GSM = jnp.einsum("gsec,egcm->gsm", routing.combine_GSEC.astype(y_EGCM.dtype), y_EGCM)
  counts, aux, z = routing.counts, routing.aux_loss, routing.z_loss
  if reduce_axes:  # Every device holds the same number of groups: means are pmeans.
    counts = jax.lax.psum(counts, reduce_axes)
    aux, z = jax.lax.pmean(aux, reduce_axes), jax.lax.pmean(z, reduce_axes)
  return y_GSM, summarize(aux, z, counts)


def moe_ffn(x_GSM: jax.Array, router_ME: jax.Array, wi_EMF: jax.Array, wo_EFM: jax.Array, *,
            k: int, capacity_factor: float, mesh: Any | None = None,
            activation: Callable[[jax.Array], jax.Array] = jax.nn.relu,
            uniform_GS: jax.Array | None = None, wi_gate_EMF: jax.Array | None = None
            ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The MoE feed-forward of groups of tokens, and its routing statistics.

  Args:
    x_GSM: the tokens, one group per row.
    router_ME: the router's weights (float32).
    wi_EMF, wo_EFM: every expert's two weight matrices.
    k: experts per token (2: GShard, 1: Switch).
    capacity_factor: capacity relative to a perfectly even split.
    mesh: run as an explicit per-device program over this mesh (groups split
      over `data` and `expert`, experts over `expert`); None: one program.
    activation: the experts' hidden activation.
    uniform_GS: uniform numbers in [0, 1), one per token, drawn for the whole batch
      (so a split over devices routes as one device does): the second expert is
      dispatched at random, GShard's way (`route`). None: always.
    wi_gate_EMF: gated experts (`experts`): activation(x wi_gate) * (x wi_EMF).

  Returns:
    (y_GSM, stats): the layer output (0 for tokens no expert took) and scalars
    `aux_loss`, `z_loss`, `dropped_tokens`, `dropped_assignments` (fractions)
    and `load_max_over_mean` (the busiest expert's first and second choices
    over the mean; 1 is perfect balance), over all groups.
  """
  if expert_mesh.one_program(mesh):
    return _local(x_GSM, router_ME, wi_EMF, wo_EFM, uniform_GS, wi_gate_EMF, k=k,
                  capacity_factor=capacity_factor, activation=activation, expert_axis=None,
                  reduce_axes=())
  axes, shards = expert_mesh.check_split(mesh, experts=router_ME.shape[-1],
                                         rows=x_GSM.shape[0])
  body = expert_mesh.per_device(
      lambda x, r, wi, wo, u, wg: _local(x, r, wi, wo, u, wg, k=k,
                                         capacity_factor=capacity_factor,
                                         activation=activation,
                                         expert_axis=EXPERT if shards > 1 else None,
                                         reduce_axes=axes),
      mesh, (expert_mesh.TOKENS, expert_mesh.WHOLE, expert_mesh.EXPERTS, expert_mesh.EXPERTS,
             expert_mesh.WHOLE if uniform_GS is None else expert_mesh.TOKENS,
             expert_mesh.EXPERTS),
      axes=axes, sharded=shards > 1)
  return body(x_GSM, router_ME, wi_EMF, wo_EFM, uniform_GS, wi_gate_EMF)
