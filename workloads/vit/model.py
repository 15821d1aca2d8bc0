"""The plain Vision Transformer in Flax, as big_vision builds it (models/vit.py).

Patches embedded by a PxP convolution of stride P; a fixed 2-D sin-cos position
embedding (MoCo v3's) or a learned one; pre-LayerNorm encoder blocks of multi-head
self-attention and a GELU MLP (workloads/common/transformer.py's `Attention` and
`Mlp`, Xavier-uniform kernels); a final LayerNorm; the mean over patches (or a class
token); a tanh pre-logits layer; a zero-initialised classifier. ViT-S/16 has
22,122,472 trainable parameters, ViT-B/16 87,006,184 (no position-embedding
parameters: they are fixed; the pre-logits layer adds width x (width + 1)).

Shape legend: B batch, H/W patch grid, L tokens, D width, K classes.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mlbench.fields import AttentionImpl
from workloads.common.transformer import Attention, Mlp
from workloads.vit.config import ModelConfig, Pool, Posemb


def posemb_sincos_2d(h: int, w: int, width: int, temperature: float = 10_000.0) -> np.ndarray:
  """[1, h * w, width]: sin and cos of x, then of y, over width / 4 frequencies each
  (big_vision `posemb_sincos_2d`)."""
  if width % 4:
    raise ValueError(f"the sin-cos position embedding needs a width divisible by 4, not {width}")
  y, x = np.mgrid[:h, :w]
  omega = 1.0 / temperature ** (np.arange(width // 4) / (width // 4 - 1))
  y_ = y.reshape(-1)[:, None] * omega[None]
  x_ = x.reshape(-1)[:, None] * omega[None]
  return np.concatenate([np.sin(x_), np.cos(x_), np.sin(y_), np.cos(y_)], axis=1)[None].astype(
      np.float32)


class EncoderBlock(nn.Module):
  num_heads: int
  mlp_dim: int
  dtype: jnp.dtype
  implementation: AttentionImpl = AttentionImpl.AUTO
  mesh: Any = None

  @nn.compact
  def __call__(self, x_BLD: jax.Array) -> jax.Array:
    width = x_BLD.shape[-1]
    y = nn.LayerNorm(dtype=self.dtype, name="norm1")(x_BLD)
    x_BLD = x_BLD + Attention(self.num_heads, width // self.num_heads, dtype=self.dtype,
                              implementation=self.implementation, mesh=self.mesh,
                              name="attention")(y)
    y = nn.LayerNorm(dtype=self.dtype, name="norm2")(x_BLD)
    return x_BLD + Mlp(self.mlp_dim, activation=nn.gelu, dtype=self.dtype, name="mlp")(y)


class ViT(nn.Module):
  cfg: ModelConfig
  mesh: Any = None  # StepContext.mesh: where the attention kernels run

  @nn.compact
  def __call__(self, image_BHWC: jax.Array, train: bool = False) -> jax.Array:
    del train  # No dropout in the plain-ViT recipe.
    cfg, dtype = self.cfg, jnp.dtype(self.cfg.dtype.value)
    width, depth, mlp_dim, heads = cfg.sizes()
    p = cfg.patch_size
    x = nn.Conv(width, (p, p), strides=p, padding="VALID", dtype=dtype,
                name="embedding")(image_BHWC.astype(dtype))
    b, h, w, _ = x.shape
    x_BLD = x.reshape(b, h * w, width)
    if cfg.posemb is Posemb.SINCOS2D:
      pos = jnp.asarray(posemb_sincos_2d(h, w, width))
    else:
      pos = self.param("pos_embedding", nn.initializers.normal(1 / np.sqrt(width)),
                       (1, h * w, width))
    x_BLD = x_BLD + pos.astype(x_BLD.dtype)
    if cfg.pool is Pool.TOK:
      cls = self.param("cls", nn.initializers.zeros, (1, 1, width))
      x_BLD = jnp.concatenate([jnp.tile(cls.astype(x_BLD.dtype), (b, 1, 1)), x_BLD], axis=1)
    for i in range(depth):
      x_BLD = EncoderBlock(heads, mlp_dim, dtype, cfg.attention, self.mesh,
                           name=f"block{i}")(x_BLD)
    x_BLD = nn.LayerNorm(dtype=dtype, name="encoder_norm")(x_BLD)
    x_BD = x_BLD[:, 0] if cfg.pool is Pool.TOK else jnp.mean(x_BLD, axis=1)
    x_BD = x_BD.astype(jnp.float32)
    if cfg.pre_logits:
      x_BD = jnp.tanh(nn.Dense(width, name="pre_logits")(x_BD))
    return nn.Dense(cfg.num_classes, kernel_init=nn.initializers.zeros, name="head")(x_BD)
