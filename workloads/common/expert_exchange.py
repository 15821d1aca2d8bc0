"""Expert parallelism for the dropless MoE: the all-to-alls that carry each device's
expert-sorted rows to the devices that hold their experts, and the results back.

Inside a per-device program over the mesh axis `axis` (n devices, E_l experts each),
every device holds A rows (its tokens' assignments) sorted by expert, so the rows for
device d are one contiguous run of `sizes_D[d]` rows. How many rows a device sends and
receives changes with every batch (dropless: no capacity), but shapes must be static,
so the receive buffer has room for the worst case: every token of every device of the
axis choosing this device's experts, P = tokens x min(k, E_l) rows from each of the n
devices (a token sends at most min(k, E_l) rows to one device). That buffer is n times
the rows an even load brings: memory is sized for the worst case, never a token dropped.
- `ragged` (TPUs, GPUs): `jax.lax.ragged_all_to_all` sends each run alone (only the rows
  routed cross the links) into the receive buffer, each source's rows one after another.
- `padded` (CPUs, whose XLA has no ragged all-to-all: "not supported by XLA:CPU
  ThunkEmitter", jax 0.10.2): each run is padded to P rows and `jax.lax.all_to_all` sends
  n x P rows; the buffer holds source s's rows at [s P, s P + its count).
Either way the receiver gets, beside the rows, each row's local expert (E_l where a row of
the buffer is empty), and the way back (`Route.back`) returns every row to its sender at
its sorted position.

Shape suffixes: A rows a device sends (its assignments), R = n P receive buffer rows,
M width, D devices of the axis.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Route:
  """Where one device's rows went: enough to bring the results back."""

  axis: str
  ragged: bool
  sizes_D: jax.Array        # rows sent to each device
  starts_D: jax.Array       # where each device's run starts in the sorted rows
  recv_sizes_D: jax.Array   # rows received from each device (ragged)
  recv_starts_D: jax.Array  # where they sit in the receive buffer (ragged)
  home_D: jax.Array         # where each source's run started on that source (ragged)
  rows: int                 # A


def send(x_AM: jax.Array, local_A: jax.Array, device_A: jax.Array, *, axis: str, devices: int,
         experts_here: int, per_source: int, ragged: bool) -> tuple[jax.Array, jax.Array, Route]:
  """(received rows [R, M], their local experts [R] (`experts_here` where empty), the
  route back), for rows `x_AM` sorted by expert whose device is `device_A` and expert
  there `local_A`; `per_source` is P, the rows any one device may send here."""
  sizes_D = jnp.zeros((devices,), jnp.int32).at[device_A].add(1)
  starts_D = jnp.cumsum(sizes_D) - sizes_D
  if not ragged:
    send_DP = _padded_slots(sizes_D, starts_D, per_source)
    valid_DP = send_DP < x_AM.shape[0]
    take = jnp.minimum(send_DP, x_AM.shape[0] - 1).reshape(-1)
    rows_RM = jnp.where(valid_DP.reshape(-1, 1), x_AM[take], jnp.zeros((), x_AM.dtype))
    ids_R = jnp.where(valid_DP.reshape(-1), local_A[take], experts_here)
    exchange = lambda a: jax.lax.all_to_all(a, axis, 0, 0, tiled=True)
    route = Route(axis, False, sizes_D, starts_D, sizes_D, starts_D, starts_D, x_AM.shape[0])
    return exchange(rows_RM), exchange(ids_R), route
  everyone_DD = jax.lax.all_gather(sizes_D, axis)       # [source, destination]
  starts_DD = jax.lax.all_gather(starts_D, axis)
  me = jax.lax.axis_index(axis)
  # Where my run lands on device d: after the runs of the sources before me.
  out_starts_D = (jnp.cumsum(everyone_DD, axis=0) - everyone_DD)[me]
  recv_sizes_D = everyone_DD[:, me]
  recv_starts_D = jnp.cumsum(recv_sizes_D) - recv_sizes_D
  buffer = devices * per_source
  rows_RM = jax.lax.ragged_all_to_all(x_AM, jnp.zeros((buffer,) + x_AM.shape[1:], x_AM.dtype),
                                      starts_D, sizes_D, out_starts_D, recv_sizes_D,
                                      axis_name=axis)
  ids_R = jax.lax.ragged_all_to_all(local_A.astype(jnp.int32),
                                    jnp.full((buffer,), experts_here, jnp.int32),
                                    starts_D, sizes_D, out_starts_D, recv_sizes_D,
                                    axis_name=axis)
  route = Route(axis, True, sizes_D, starts_D, recv_sizes_D, recv_starts_D, starts_DD[:, me],
                x_AM.shape[0])
  return rows_RM, ids_R, route


def back(y_RM: jax.Array, route: Route) -> jax.Array:
  """The results of the received rows, returned to their senders: [A, M] in the order the
  rows were sent (`send`'s x_AM)."""
  if route.ragged:
    return jax.lax.ragged_all_to_all(
        y_RM, jnp.zeros((route.rows,) + y_RM.shape[1:], y_RM.dtype), route.recv_starts_D,
        route.recv_sizes_D, route.home_D, route.sizes_D, axis_name=route.axis)
  back_RM = jax.lax.all_to_all(y_RM, route.axis, 0, 0, tiled=True)
  per_source = y_RM.shape[0] // route.sizes_D.shape[0]
  # Sorted row a went to device d = the run it is in, at slot a - starts[d].
  a = jnp.arange(route.rows)
  device_A = jnp.sum(a[:, None] >= route.starts_D[None, 1:], axis=1)
  return back_RM[device_A * per_source + a - route.starts_D[device_A]]


def _padded_slots(sizes_D: jax.Array, starts_D: jax.Array, per_source: int) -> jax.Array:
  """[D, P]: the sorted row each padded slot sends (A, past the end, where empty)."""
  r = jnp.arange(per_source)[None, :]
  return jnp.where(r < sizes_D[:, None], starts_D[:, None] + r, jnp.iinfo(jnp.int32).max)


def platform_ragged(platform: str) -> bool:
  """Whether XLA has a ragged all-to-all on `platform` (not on CPUs)."""
  return platform != "cpu"

