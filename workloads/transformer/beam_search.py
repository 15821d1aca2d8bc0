"""Beam search with GNMT's length penalty, as one jittable `lax.while_loop`.

Each step extends every live hypothesis by every token, keeps the best
`2 * beam` extensions, moves those that end in EOS to the finished set (scored
by log-probability / ((5 + length) / 6) ** alpha) and keeps the best `beam`
others alive. The search stops when no live hypothesis can beat the worst
finished one, or at `max_length`. The model is a function of the last tokens
and a cache whose leaves have `batch * beam` rows, reordered as beams move.

Shape suffixes: B batch, K beam, L length, V vocabulary, N = B * K.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

NEG_INF = -1.0e7

LogitsFn = Callable[[jax.Array, Any], tuple[jax.Array, Any]]
"""`logits_fn(last_tokens_N, cache) -> (logits_NV, new_cache)`."""


def length_penalty(length: jax.Array, alpha: float) -> jax.Array:
  """GNMT (Wu et al. 2016): ((5 + length) / 6) ** alpha."""
  return ((5.0 + length) / 6.0) ** alpha


def _gather_rows(tree: Any, beam_BK: jax.Array, old_beam: int) -> Any:
  """For every [B * old_beam, ...] leaf (the cache), the rows of beams `beam_BK`
  of each example, as [B * K, ...]; scalars (cache positions) unchanged."""
  flat_N = (jnp.arange(beam_BK.shape[0])[:, None] * old_beam + beam_BK).reshape(-1)
  return jax.tree.map(lambda x: x if x.ndim == 0 else x[flat_N], tree)


def _gather_beams(x_BK: jax.Array, beam_BK: jax.Array) -> jax.Array:
  """[B, old_beam, ...] -> [B, K, ...]: beams `beam_BK` of each example."""
  index = beam_BK.reshape(beam_BK.shape + (1,) * (x_BK.ndim - 2))
  return jnp.take_along_axis(x_BK, index, axis=1)


def tile_beams(tree: Any, beam: int) -> Any:
  """[B, ...] leaves -> [B * beam, ...], each row repeated `beam` times."""
  return jax.tree.map(lambda x: x if x.ndim == 0 else jnp.repeat(x, beam, axis=0), tree)


def beam_search(logits_fn: LogitsFn, cache: Any, *, batch: int, beam: int, max_length: int,
                eos_id: int, alpha: float, start_id: int = 0) -> tuple[jax.Array, jax.Array]:
  """The best finished hypothesis per example.

  Args:
    logits_fn: see `LogitsFn`; called with `batch * beam` rows.
    cache: the model's decoding state with `batch * beam` rows (`tile_beams`).
    max_length: longest output, EOS included.
    eos_id: the end-of-sequence token.
    alpha: length-penalty exponent (0: plain log-probability).
    start_id: the token fed at the first step.

  Returns:
    (tokens [B, max_length] ending in EOS then 0, scores [B]); an example with no
    finished hypothesis by `max_length` returns its best live one.
  """
  live_BKL = jnp.zeros((batch, beam, max_length), jnp.int32)
  live_logp_BK = jnp.tile(jnp.asarray([0.0] + [NEG_INF] * (beam - 1)), (batch, 1))
  done_BKL = jnp.zeros((batch, beam, max_length), jnp.int32)
  done_score_BK = jnp.full((batch, beam), NEG_INF)
  state = (jnp.asarray(0), live_BKL, live_logp_BK, done_BKL, done_score_BK, cache)

  def not_over(state) -> jax.Array:
    i, _, live_logp_BK, _, done_score_BK, _ = state
    best_possible_B = live_logp_BK.max(-1) / length_penalty(max_length, alpha)
    return (i < max_length) & jnp.any(best_possible_B > done_score_BK.min(-1))

  def step(state):
    i, live_BKL, live_logp_BK, done_BKL, done_score_BK, cache = state
    last_N = jnp.where(i == 0, start_id,
                       jax.lax.dynamic_index_in_dim(live_BKL, jnp.maximum(i - 1, 0), 2,
                                                    keepdims=False)).reshape(-1)
    logits_NV, cache = logits_fn(last_N, cache)
    vocab = logits_NV.shape[-1]
    logp_BKV = jax.nn.log_softmax(logits_NV.astype(jnp.float32)).reshape(batch, beam, vocab)
    cand_BX = (live_logp_BK[..., None] + logp_BKV).reshape(batch, beam * vocab)
    top_logp_B2, top_idx_B2 = jax.lax.top_k(cand_BX, 2 * beam)
    top_beam_B2, top_tok_B2 = top_idx_B2 // vocab, (top_idx_B2 % vocab).astype(jnp.int32)
    seqs_B2L = _gather_beams(live_BKL, top_beam_B2)
    seqs_B2L = jax.lax.dynamic_update_index_in_dim(seqs_B2L, top_tok_B2, i, 2)
    ends_B2 = top_tok_B2 == eos_id

    # Live: the best `beam` extensions that do not end here.
    keep_logp_BK, keep_B2K = jax.lax.top_k(jnp.where(ends_B2, NEG_INF, top_logp_B2), beam)
    live_BKL = jnp.take_along_axis(seqs_B2L, keep_B2K[..., None], axis=1)
    cache = _gather_rows(cache, jnp.take_along_axis(top_beam_B2, keep_B2K, 1), beam)
    # Finished: merge the extensions that end here with those finished before.
    new_score_B2 = jnp.where(ends_B2, top_logp_B2 / length_penalty(i + 1.0, alpha), NEG_INF)
    all_score_BX = jnp.concatenate([done_score_BK, new_score_B2], axis=1)
    all_BXL = jnp.concatenate([done_BKL, seqs_B2L], axis=1)
    done_score_BK, pick_BK = jax.lax.top_k(all_score_BX, beam)
    done_BKL = jnp.take_along_axis(all_BXL, pick_BK[..., None], axis=1)
    return i + 1, live_BKL, keep_logp_BK, done_BKL, done_score_BK, cache

  _, live_BKL, live_logp_BK, done_BKL, done_score_BK, _ = jax.lax.while_loop(
      not_over, step, state)
  any_done_B = done_score_BK[:, 0] > NEG_INF / 2
  live_score_B = live_logp_BK[:, 0] / length_penalty(max_length, alpha)
  tokens_BL = jnp.where(any_done_B[:, None], done_BKL[:, 0], live_BKL[:, 0])
  return tokens_BL, jnp.where(any_done_B, done_score_BK[:, 0], live_score_B)
