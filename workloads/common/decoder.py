"""What the Megatron-style decoder LMs (llama31_8b, gpt_oss_20b) share in their models:
rotary position embeddings in Megatron's non-interleaved layout, the remat policies of
`model.remat`, and the constraint that keeps the residual stream split by batch.

Rotary embeddings rotate the two halves of each head (channels i and i + D/2 by the angle
position x freq_i: Megatron and NeMo's `rotary_interleaved: false`; Meta's interleaved
pairs are the same up to a fixed permutation of the query and key columns).

Shape suffixes: B batch, L length, N heads, D head size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mlbench.fields import Remat


def inverse_frequencies(theta: float, head_dim: int) -> np.ndarray:
  """[D/2] rotation frequencies (radians per position): theta^(-2i/D), float64."""
  return 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def rope_tables(freq: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
  """(cos_LD, sin_LD), float32, D/2 wide: the angle of position l in pair i is l * freq_i."""
  angle = np.arange(length, dtype=np.float64)[:, None] * freq[None]
  return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def apply_rope(x_BLND: jax.Array, cos_LD: jax.Array, sin_LD: jax.Array) -> jax.Array:
  """Rotates channel pairs (i, i + D/2) of every head by their position's angle."""
  x = x_BLND.astype(jnp.float32)
  half = x.shape[-1] // 2
  x1, x2 = x[..., :half], x[..., half:]
  cos, sin = cos_LD[None, :, None, :], sin_LD[None, :, None, :]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BLND.dtype)


def remat_policy(remat: Remat) -> Any:
  """The `jax.checkpoint` policy of `model.remat` (None: no rematerialisation)."""
  return {Remat.NONE: None,
          Remat.DOTS: jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
          Remat.FULL: jax.checkpoint_policies.nothing_saveable}[remat]


def by_batch(mesh: Any, x_BLH: jax.Array, axes: Sequence[str] = ("data",)) -> jax.Array:
  """Keeps the residual stream split by batch over the mesh axes `axes` it has (so
  parameters split over them, FSDP, are gathered rather than the activations re-split)."""
  present = tuple(a for a in axes if mesh is not None and int(mesh.shape.get(a, 1)) > 1)
  if not present:
    return x_BLH
  from jax.sharding import NamedSharding, PartitionSpec

  return jax.lax.with_sharding_constraint(x_BLH, NamedSharding(mesh, PartitionSpec(present)))
