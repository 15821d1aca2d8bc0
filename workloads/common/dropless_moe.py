"""A dropless Mixture-of-Experts feed-forward on grouped matmuls (gpt-oss, MLPerf 6.x).

Routing: the router's logits in float32 (x in float32 times the float32 router), each
token's top k experts chosen on the logits, their gates a softmax over those k logits
(Megatron's `moe_router_pre_softmax: false`, the gpt_oss_20b reference's; GShard's top-k
gates renormalised over the chosen experts are the same numbers). No capacity: every
token reaches exactly its k experts at any load, and no auxiliary loss is computed.

Computation: the N x k assignments sorted by expert (a stable argsort), the tokens
gathered in that order, and each expert's SwiGLU feed-forward (`silu(x wi_gate) * (x wi_up)
wo`, no biases, no clamp) run over its run of rows by grouped matmuls
(`workloads.common.grouped_matmul`: Pallas megablox `gmm` on TPUs, `jax.lax.ragged_dot`
elsewhere); the results gathered back to assignment order and summed over each token's k
experts weighted by its gates (in float32). Every shape is static: N x k rows whatever
the routing, only the group sizes change.

Expert parallelism: with a mesh axis `expert` of n > 1 devices, a per-device program
(`workloads.common.expert_mesh`, GShard's split: tokens over `data` x `expert`, experts
over `expert`): each device routes and sorts its tokens, the all-to-alls of
`workloads.common.expert_exchange` carry the rows to their experts' devices (a receive
buffer sized for the worst case, since dropless has no capacity: n times an even load's
rows, which XLA's estimate and memory count in full) and back. Without an `expert` axis
the same per-device program over the token axes runs every expert on its own tokens, the
experts' weights gathered whole (FSDP: sharded by annotation outside, gathered per layer
as GSPMD's all-gather, their gradients reduce-scattered): exact rows, no worst case.

Shape suffixes: B batch, T tokens per sequence, N tokens, M width, E experts, F expert
hidden width, K the k choices per token, A = N k assignments, R receive buffer rows.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from workloads.common import expert_exchange, expert_mesh
from workloads.common.grouped_matmul import Grouped, grouped_matmul, resolve


def route(logits_NE: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """(experts [N, k] int32, gates [N, k] float32): the top k of the float32 logits, best
  first, and a softmax over those k logits."""
  top_NK, experts_NK = jax.lax.top_k(logits_NE.astype(jnp.float32), k)
  return experts_NK.astype(jnp.int32), jax.nn.softmax(top_NK, axis=-1)


def _inverse(order_A: jax.Array) -> jax.Array:
  """The inverse of a permutation (where each element went)."""
  return jnp.zeros_like(order_A).at[order_A].set(jnp.arange(order_A.shape[0],
                                                            dtype=order_A.dtype))


def experts(x_RM: jax.Array, sizes_E: jax.Array, wi_gate_EMF: jax.Array | None,
            wi_up_EMF: jax.Array, wo_EFM: jax.Array, *, kernel: Grouped, platform: str,
            activation: Callable[[jax.Array], jax.Array] = jax.nn.silu) -> jax.Array:
  """Each expert's feed-forward over its run of rows (rows sorted by expert, `sizes_E`
  rows each; rows past the runs unspecified): gated, activation(x wi_gate) * (x wi_up) wo
  (SwiGLU with silu), or without `wi_gate_EMF` activation(x wi_up) wo."""
  mm = functools.partial(grouped_matmul, sizes_G=sizes_E, kernel=kernel, platform=platform)
  h_RF = activation(mm(x_RM, wi_gate_EMF if wi_gate_EMF is not None else wi_up_EMF))
  if wi_gate_EMF is not None:
    h_RF = h_RF * mm(x_RM, wi_up_EMF)
  return mm(h_RF, wo_EFM)


def combine(y_AM: jax.Array, gates_NK: jax.Array, dtype: Any) -> jax.Array:
  """[N, M]: each token's k expert outputs (in assignment order) weighted by its gates,
  summed in float32."""
  n, k = gates_NK.shape
  y_NKM = y_AM.reshape(n, k, -1).astype(jnp.float32)
  return jnp.einsum("nkm,nk->nm", y_NKM, gates_NK).astype(dtype)


def _local(x_NM: jax.Array, router_ME: jax.Array, weights: tuple[jax.Array | None, ...], *,
           k: int, kernel: Grouped, platform: str, axis: str | None, devices: int,
           activation: Callable[[jax.Array], jax.Array]) -> jax.Array:
  """The layer on one device's tokens; with `axis` (`devices` > 1), its experts are the
  local shard of `weights` and the rows travel to their experts' devices and back."""
  experts_NK, gates_NK = route(x_NM.astype(jnp.float32) @ router_ME.astype(jnp.float32), k)
  experts_A = experts_NK.reshape(-1)
  order_A = jnp.argsort(experts_A, stable=True)  # sorted position -> assignment
  expert_A = experts_A[order_A]
  x_AM = x_NM[order_A // k]
  here = weights[1].shape[0]                      # experts on this device
  run = functools.partial(experts, wi_gate_EMF=weights[0], wi_up_EMF=weights[1],
                          wo_EFM=weights[2], kernel=kernel, platform=platform,
                          activation=activation)
  if axis is None:
    sizes_E = jnp.zeros((here,), jnp.int32).at[expert_A].add(1)
    y_AM = run(x_AM, sizes_E)
  else:
    rows_RM, local_R, way = expert_exchange.send(
        x_AM, expert_A % here, expert_A // here, axis=axis, devices=devices,
        experts_here=here, per_source=x_NM.shape[0] * min(k, here),
        ragged=expert_exchange.platform_ragged(platform))
    # Sorted again by local expert; the buffer's empty rows (expert `here`) go last.
    order_R = jnp.argsort(local_R, stable=True)
    sizes_E = jnp.zeros((here,), jnp.int32).at[local_R].add(1, mode="drop")
    y_RM = run(rows_RM[order_R], sizes_E)
    y_RM = jnp.where((local_R[order_R] < here)[:, None], y_RM, jnp.zeros((), y_RM.dtype))
    y_AM = expert_exchange.back(y_RM[_inverse(order_R)], way)
  return combine(y_AM[_inverse(order_A)], gates_NK, x_NM.dtype)


def dropless_ffn(x_BTM: jax.Array, router_ME: jax.Array, wi_gate_EMF: jax.Array | None,
                 wi_up_EMF: jax.Array, wo_EFM: jax.Array, *, k: int, mesh: Any = None,
                 grouped: Grouped = Grouped.AUTO,
                 activation: Callable[[jax.Array], jax.Array] = jax.nn.silu) -> jax.Array:
  """The dropless MoE feed-forward of `x_BTM` (module docstring), in x's dtype.

  Args:
    x_BTM: the tokens.
    router_ME: the router (float32).
    wi_gate_EMF, wi_up_EMF, wo_EFM: every expert's weights (cast to x's dtype); without
      `wi_gate_EMF` (None) the experts are ungated (`experts`).
    k: experts per token.
    mesh: the step's mesh: expert parallel over its `expert` axis where it has one of
      more than one device; None: one program.
    grouped: which kernel computes the grouped matmuls (`grouped_matmul`).
    activation: the experts' (silu: SwiGLU with a gate).
  """
  from mlbench.train.attention import platform_of

  platform = platform_of(mesh)
  kernel = resolve(grouped, platform)
  # In x's dtype before the per-device program: FSDP gathers them in it (half float32's).
  weights = tuple(None if w is None else w.astype(x_BTM.dtype)
                  for w in (wi_gate_EMF, wi_up_EMF, wo_EFM))
  b, t, m = x_BTM.shape
  if expert_mesh.one_program(mesh):
    y = _local(x_BTM.reshape(b * t, m), router_ME, weights, k=k, kernel=kernel,
               platform=platform, axis=None, devices=1, activation=activation)
    return y.reshape(b, t, m)
  axes, shards = expert_mesh.check_split(mesh, experts=router_ME.shape[-1], rows=b)

  def body(x, r, wg, wu, wo):
    bl = x.shape[0]
    y = _local(x.reshape(bl * t, m), r, (wg, wu, wo), k=k, kernel=kernel, platform=platform,
               axis=expert_mesh.EXPERT if shards > 1 else None, devices=shards,
               activation=activation)
    return y.reshape(bl, t, m)

  kinds = (expert_mesh.TOKENS, expert_mesh.WHOLE) + (expert_mesh.EXPERTS,) * 3
  return expert_mesh.per_device(body, mesh, kinds, axes=axes, sharded=shards > 1,
                                out_kinds=expert_mesh.TOKENS,
                                check_vma=kernel is not Grouped.GMM)(x_BTM, router_ME, *weights)


class DroplessMoE(nn.Module):
  """The dropless MoE feed-forward as a Flax module: `x_BTM -> y_BTM`.

  Parameters: `router` [M, E] (float32), `wi_gate` and `wi_up` [E, M, F], `wo` [E, F, M],
  all initialised from a normal of standard deviation `init_std` (`wo` from
  `output_init_std` where given: Megatron scales its output layers' by 1/sqrt(2 layers)).
  """

  experts: int
  top_k: int
  hidden: int
  ffn: int
  dtype: Any = jnp.bfloat16
  param_dtype: Any = jnp.float32
  init_std: float = 0.02
  output_init_std: float | None = None
  mesh: Any = None
  grouped: Grouped = Grouped.AUTO

  @nn.compact
  def __call__(self, x_BTM: jax.Array) -> jax.Array:
    e, m, f = self.experts, self.hidden, self.ffn
    init = nn.initializers.normal(self.init_std)
    out_init = nn.initializers.normal(self.output_init_std or self.init_std)
    router_ME = self.param("router", init, (m, e), jnp.float32)
    wi_gate_EMF = self.param("wi_gate", init, (e, m, f), self.param_dtype)
    wi_up_EMF = self.param("wi_up", init, (e, m, f), self.param_dtype)
    wo_EFM = self.param("wo", out_init, (e, f, m), self.param_dtype)
    return dropless_ffn(x_BTM.astype(self.dtype), router_ME, wi_gate_EMF, wi_up_EMF, wo_EFM,
                        k=self.top_k, mesh=self.mesh, grouped=self.grouped)
