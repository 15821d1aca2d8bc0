"""The grouped matrix multiplication of a dropless MoE layer, and which kernel computes it.

`grouped_matmul(x_RK, w_GKN, sizes_G)` multiplies consecutive groups of rows of x by their
group's matrix: rows [0, sizes[0]) by w[0], the next sizes[1] rows by w[1], and so on
(`jax.lax.ragged_dot`'s contract). The implementations:
- `ragged_dot` (`jax.lax.ragged_dot`), every platform. XLA's TPU compiler turns it into
  a Mosaic kernel of its own whose custom call declares no cost estimate, though XLA does
  cost it (measured, libtpu 0.0.52, v5p, 32768 x 2880 x 2880 bf16 over 32 groups: 1.70 ms,
  as gmm's declared cost gives 1.71 ms); `mlbench.pod.xlacost` counts such a kernel as
  free and gives the program no estimate. XLA's CPU compiler expands it to a dense
  matmul per group over all rows (masked): G times the FLOPs.
- `gmm`: the Pallas megablox kernel (`jax.experimental.pallas.ops.tpu.megablox`), TPU
  only (Pallas's TPU interpreter elsewhere: for checking, not speed). It declares its
  cost (`pl.CostEstimate`: 2 R K N FLOPs over all R rows, and the bytes of the tiles it
  reads), visits only the tiles of rows that are in a group (its grid is sized at run
  time), and has a custom gradient (gmm for the rows, tgmm for the weights).
- `chunked`: every platform, pure JAX: a loop over chunks of `tile` rows of each group
  (at most R / tile + G of them, a static count), each a dense matmul of its chunk by its
  group's matrix, the loop body rematerialised so the backward pass keeps no per-chunk
  weights. (R + G tile) rows of work where XLA's CPU `ragged_dot` does G R.
`auto` takes `gmm` on TPUs (costed, so `mlbench check` estimates the step; as fast as XLA's
kernel by XLA's own estimate), `chunked` on CPUs and `ragged_dot` on GPUs (not measured
here: no GPU).

Rows past the last group (sum(sizes) < R) come out as zeros from `ragged_dot` and
unspecified from `gmm`: callers select them away (never multiply: they may be NaN).

Shape suffixes: R rows, K contracted width, N output width, G groups.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # jax is imported where it runs: configs import `Grouped` light
  import jax


class Grouped(enum.Enum):
  """Which kernel computes the grouped matmuls (`--set model.grouped_matmul=`)."""

  AUTO = "auto"              # gmm on TPUs, chunked on CPUs, ragged_dot on GPUs
  RAGGED_DOT = "ragged_dot"  # jax.lax.ragged_dot, XLA's own
  GMM = "gmm"                # Pallas megablox (interpreted off a TPU)
  CHUNKED = "chunked"        # a loop of dense matmuls over chunks of each group


ROW_TILES = (512, 256, 128)
"""gmm's row tiles, largest first: rows are padded to a multiple of the smallest."""
WIDTH_TILE = 1024
"""gmm's tile of the contracted and output widths (MaxText's default for megablox)."""
CHUNK = 128
"""`chunked`'s rows a chunk, at most (fewer where a quarter of an even group is fewer)."""


def resolve(choice: Grouped, platform: str) -> Grouped:
  """The kernel `choice` means on `platform` (`auto` made concrete)."""
  if choice is Grouped.AUTO:
    return {"tpu": Grouped.GMM, "cpu": Grouped.CHUNKED}.get(platform, Grouped.RAGGED_DOT)
  return choice


def grouped_matmul(x_RK: jax.Array, w_GKN: jax.Array, sizes_G: jax.Array, *,
                   kernel: Grouped, platform: str) -> jax.Array:
  """[R, N] in x's dtype: each group of rows times its group's matrix (module docstring);
  `kernel` is a concrete choice (`resolve`), `platform` the one compiled for."""
  import jax
  import jax.numpy as jnp

  w_GKN = w_GKN.astype(x_RK.dtype)
  sizes_G = sizes_G.astype(jnp.int32)
  if kernel is Grouped.RAGGED_DOT:
    return jax.lax.ragged_dot(x_RK, w_GKN, sizes_G)
  if kernel is Grouped.CHUNKED:
    return chunked(x_RK, w_GKN, sizes_G)
  return _gmm(x_RK, w_GKN, sizes_G, interpret=platform != "tpu")


def _gmm(x_RK: jax.Array, w_GKN: jax.Array, sizes_G: jax.Array, *,
         interpret: bool) -> jax.Array:
  import jax.numpy as jnp
  from jax.experimental.pallas.ops.tpu.megablox import ops as megablox

  rows, k = x_RK.shape
  n = w_GKN.shape[-1]
  pad = -rows % ROW_TILES[-1]
  if pad:  # rows past the groups: in no group, dropped below
    x_RK = jnp.pad(x_RK, ((0, pad), (0, 0)))
  tm = next(t for t in ROW_TILES if x_RK.shape[0] % t == 0)
  tiling = (tm, min(WIDTH_TILE, _round_up(k, 128)), min(WIDTH_TILE, _round_up(n, 128)))
  out = megablox.gmm(x_RK, w_GKN, sizes_G, x_RK.dtype, tiling, None, None, False, interpret)
  return out[:rows]


def chunked(x_RK: jax.Array, w_GKN: jax.Array, sizes_G: jax.Array,
            tile: int | None = None) -> jax.Array:
  """The grouped matmul as a loop over chunks of `tile` rows of each group (module
  docstring); rows past the groups come out as zeros."""
  import jax
  import jax.numpy as jnp

  rows, groups = x_RK.shape[0], w_GKN.shape[0]
  # A quarter of an even group: at most R / 4 rows of padding work, in chunks of at most CHUNK.
  tile = tile or max(8, min(CHUNK, _round_up(-(-rows // (4 * groups)), 8)))
  count = -(-rows // tile) + groups           # chunks, at most
  ends_G = jnp.cumsum(sizes_G)
  starts_G = ends_G - sizes_G
  chunks_G = -(-sizes_G // tile)
  first_G = jnp.cumsum(chunks_G) - chunks_G  # each group's first chunk
  c = jnp.arange(count)
  group_C = jnp.minimum(jnp.searchsorted(first_G + chunks_G, c, side="right"), groups - 1)
  start_C = starts_G[group_C] + (c - first_G[group_C]) * tile
  x_RK = jnp.pad(x_RK, ((0, tile), (0, 0)))   # a chunk may run past the last row

  @jax.checkpoint
  def one(chunk):
    start, group = chunk
    rows_TK = jax.lax.dynamic_slice_in_dim(x_RK, start, tile)
    return rows_TK @ jax.lax.dynamic_index_in_dim(w_GKN, group, keepdims=False)

  y_CTN = jax.lax.map(one, (jnp.minimum(start_C, rows), group_C))
  r = jnp.arange(rows)
  group_R = jnp.minimum(jnp.searchsorted(ends_G, r, side="right"), groups - 1)
  within_R = r - starts_G[group_R]
  y_RN = y_CTN[first_G[group_R] + within_R // tile, within_R % tile]
  return jnp.where((r < ends_G[-1])[:, None], y_RN, jnp.zeros((), y_RN.dtype))


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple
