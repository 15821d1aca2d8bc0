"""The random bits of attention dropout: a counter-based hash of (seed, row, head, query,
key), the same in the fused kernel (`dropout_kernel`), in XLA and in tests.

Why a hash of our own. The TPU's hardware generator (`pltpu.prng_seed`/`prng_random_bits`,
`stateful_bits`) is the cheapest, but its bits exist only on a TPU: Pallas's TPU
interpreter returns zeros for them (jax 0.10.2, `interpret_pallas_call.py`, "TODO:
Implement this properly"), no XLA program can draw the same ones, and they depend on how
the kernel walks its blocks, so no test here could check the mask or that the backward
pass regenerates the forward's. `jax.random` inside a kernel matches the same calls
outside bit for bit (Pallas docs, "Pseudo-Random Number Generation", threefry2x32 keys
only), but threefry's 20 rounds per two words would cost more vector work per score than
the softmax itself, and its bits follow the block shape they are drawn in. A hash of each
score's coordinates is free of both: the bits of score (b, n, i, j) are a pure function of
the call's seed and those four numbers, whatever the block sizes, the device the row lands
on, or the pass (forward, backward) that draws them.

The hash. A score's stream is its (global) row and head, `stream = b * heads + n`; its
counter is its position in the [L, S] matrix, `i * S + j`. The stream and the two seed
words give two 32-bit keys (scalar work, once per block); a score's bits are Chris
Wellons' `lowbias32` integer finaliser (two multiply-xorshift rounds, chosen for its low
avalanche bias: github.com/skeeto/hash-prospector) of `counter ^ key0`, with `key1` xored
in between its two rounds so that two streams are not one another's permutation. All in
int32 with logical shifts (two's-complement products wrap as uint32's do), which Mosaic
lowers on TPUs and XLA computes everywhere. A score is kept when the top 31 bits, as a
non-negative int32, are at least `rate * 2**31`: dropped with probability `rate` to within
2**-31.

Shape suffixes: B batch, N heads, L query length, S key length.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

_M1 = 0x7FEB352D              # lowbias32's multipliers (as int32)
_M2 = 0x846CA68B - (1 << 32)
_GOLDEN = 0x9E3779B9 - (1 << 32)


def _srl(x: jax.Array, n: int) -> jax.Array:
  return lax.shift_right_logical(x, jnp.asarray(n, x.dtype))


def mix(x: jax.Array) -> jax.Array:
  """lowbias32 of int32 `x` (scalar or array): a bijection of 32-bit words."""
  x = x ^ _srl(x, 16)
  x = x * jnp.int32(_M1)
  x = x ^ _srl(x, 15)
  x = x * jnp.int32(_M2)
  return x ^ _srl(x, 16)


def stream_keys(seed0: jax.Array, seed1: jax.Array,
                stream: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The two int32 keys of one (row, head) stream, from the call's two seed words."""
  k0 = mix(seed0 ^ mix(stream * jnp.int32(_GOLDEN) + seed1))
  return k0, mix(k0 + seed1)


def bits(k0: jax.Array, k1: jax.Array, counter: jax.Array) -> jax.Array:
  """31 random bits (a non-negative int32) per `counter` of one stream."""
  x = counter ^ k0
  x = x ^ _srl(x, 16)
  x = x * jnp.int32(_M1)
  x = x ^ k1
  x = x ^ _srl(x, 15)
  x = x * jnp.int32(_M2)
  return _srl(x ^ _srl(x, 16), 1)


def threshold(rate: float) -> int:
  """The bits below which a score is dropped: `rate * 2**31`, rounded."""
  return min(int(round(rate * (1 << 31))), (1 << 31) - 1)


def keep(k0: jax.Array, k1: jax.Array, rows: jax.Array, cols: jax.Array, kv_len: int,
         rate: float) -> jax.Array:
  """True where the scores at (`rows`, `cols`) of one stream are kept."""
  return bits(k0, k1, rows * jnp.int32(kv_len) + cols) >= jnp.int32(threshold(rate))


def seeds(key: jax.Array) -> jax.Array:
  """int32[2] seed words from a layer's dropout key for this step (`make_rng`: its step's,
  layer's and module's)."""
  return lax.bitcast_convert_type(jax.random.bits(key, (2,), jnp.uint32), jnp.int32)


def keep_mask(seed: jax.Array, batch: int, heads: int, q_len: int, kv_len: int,
              rate: float) -> jax.Array:
  """[B, N, L, S] booleans, True where the kernel keeps a score: the XLA reference of the
  kernel's mask for `seed` (int32[2], from `seeds`), rows and heads numbered globally."""
  stream_BN = (jnp.arange(batch, dtype=jnp.int32)[:, None] * heads
               + jnp.arange(heads, dtype=jnp.int32)[None, :])
  k0_BN, k1_BN = stream_keys(seed[0], seed[1], stream_BN)
  rows_LS = lax.broadcasted_iota(jnp.int32, (q_len, kv_len), 0)
  cols_LS = lax.broadcasted_iota(jnp.int32, (q_len, kv_len), 1)
  return keep(k0_BN[:, :, None, None], k1_BN[:, :, None, None], rows_LS, cols_LS, kv_len,
              rate)


def apply(seed: jax.Array, rate: float, probs_BNLS: jax.Array) -> jax.Array:
  """Dropout of [B, N, L, S] probabilities with the kernel's mask (kept ones scaled by
  1 / (1 - rate)): what XLA computes for a `Dropout` without an `apply` of its own."""
  b, n, length, kv_len = probs_BNLS.shape
  mask = keep_mask(seed, b, n, length, kv_len, rate)
  return jnp.where(mask, probs_BNLS / jnp.asarray(1.0 - rate, probs_BNLS.dtype), 0)
