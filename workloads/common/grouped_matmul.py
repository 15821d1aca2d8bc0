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
`auto` takes `gmm` on TPUs (costed, so `mlbench check` estimates the step; as fast as XLA's
kernel by XLA's own estimate) and `ragged_dot` elsewhere.

Rows past the last group (sum(sizes) < R) come out as zeros from `ragged_dot` and
unspecified from `gmm`: callers select them away (never multiply: they may be NaN).

Shape suffixes: R rows, K contracted width, N output width, G groups.
"""

from __future__ import annotations

import enum

import jax
import jax.numpy as jnp


class Grouped(enum.Enum):
  """Which kernel computes the grouped matmuls (`--set model.grouped_matmul=`)."""

  AUTO = "auto"              # gmm on TPUs, ragged_dot elsewhere
  RAGGED_DOT = "ragged_dot"  # jax.lax.ragged_dot, XLA's own
  GMM = "gmm"                # Pallas megablox (interpreted off a TPU)


ROW_TILES = (512, 256, 128)
"""gmm's row tiles, largest first: rows are padded to a multiple of the smallest."""
WIDTH_TILE = 1024
"""gmm's tile of the contracted and output widths (MaxText's default for megablox)."""


def resolve(choice: Grouped, platform: str) -> Grouped:
  """The kernel `choice` means on `platform` (`auto` made concrete)."""
  if choice is Grouped.AUTO:
    return Grouped.GMM if platform == "tpu" else Grouped.RAGGED_DOT
  return choice


def grouped_matmul(x_RK: jax.Array, w_GKN: jax.Array, sizes_G: jax.Array, *,
                   kernel: Grouped, platform: str) -> jax.Array:
  """[R, N] in x's dtype: each group of rows times its group's matrix (module docstring);
  `kernel` is a concrete choice (`resolve`), `platform` the one compiled for."""
  w_GKN = w_GKN.astype(x_RK.dtype)
  sizes_G = sizes_G.astype(jnp.int32)
  if kernel is Grouped.RAGGED_DOT:
    return jax.lax.ragged_dot(x_RK, w_GKN, sizes_G)
  return _gmm(x_RK, w_GKN, sizes_G, interpret=platform != "tpu")


def _gmm(x_RK: jax.Array, w_GKN: jax.Array, sizes_G: jax.Array, *,
         interpret: bool) -> jax.Array:
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


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple
