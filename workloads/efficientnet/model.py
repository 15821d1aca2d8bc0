"""EfficientNet B0-B7 in Flax, as tensorflow/tpu models/official/efficientnet builds it.

Stem (3x3/2 convolution), the seven MBConv stages of B0 scaled in width and depth,
head (1x1 convolution to 1280 scaled channels), global average pool, dropout,
classifier. An MBConv block: 1x1 expansion (skipped at expand ratio 1), depthwise
kxk convolution (carries the stride), squeeze-excite on the block's input width /
4, 1x1 projection; identity shortcut with drop-connect where shapes allow. Swish
everywhere; batch norm is `mlbench.train.layers.BatchNorm` over `bn_groups` groups.
B0 has 5,288,548 trainable parameters, B5 30,389,784 (as the reference).

Shape legend: B batch, H/W spatial, C channels, K classes.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mlbench.train.layers import BatchNorm
from workloads.efficientnet.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Block:
  """One MBConv block after scaling."""

  kernel: int
  stride: int
  expand: int
  c_in: int
  c_out: int
  se_ratio: float = 0.25


# B0's stages (efficientnet_builder.py _DEFAULT_BLOCKS_ARGS):
# (repeats, kernel, stride, expand ratio, input filters, output filters).
B0_STAGES = ((1, 3, 1, 1, 32, 16), (2, 3, 2, 6, 16, 24), (2, 5, 2, 6, 24, 40),
             (3, 3, 2, 6, 40, 80), (3, 5, 1, 6, 80, 112), (4, 5, 2, 6, 112, 192),
             (1, 3, 1, 6, 192, 320))
STEM, HEAD, DIVISOR = 32, 1280, 8


def round_filters(filters: int, width: float) -> int:
  """Channels scaled by `width`, to a multiple of 8, never 10% below the exact value
  (efficientnet_model.py `round_filters`)."""
  scaled = filters * width
  out = max(DIVISOR, int(scaled + DIVISOR / 2) // DIVISOR * DIVISOR)
  return int(out + DIVISOR if out < 0.9 * scaled else out)


def blocks(cfg: ModelConfig) -> list[Block]:
  """Every block of the scaled network, in order (repeats rounded up: `round_repeats`)."""
  out = []
  for repeats, kernel, stride, expand, c_in, c_out in B0_STAGES:
    c_in, c_out = round_filters(c_in, cfg.width), round_filters(c_out, cfg.width)
    for i in range(int(math.ceil(cfg.depth * repeats))):
      out.append(Block(kernel, stride if i == 0 else 1, expand, c_in if i == 0 else c_out, c_out))
  return out


def _conv_init(key, shape, dtype=jnp.float32):
  """The reference's `conv_kernel_initializer`: normal with variance 2 / fan_out, where
  fan_out = kh * kw * output channels."""
  kh, kw, _, c_out = shape
  return jax.random.normal(key, shape, dtype) * np.sqrt(2.0 / (kh * kw * c_out))


def _depthwise_init(key, shape, dtype=jnp.float32):
  """The same for a depthwise kernel, whose TF shape [kh, kw, C, 1] has one output
  channel per input (fan_out = kh * kw); Flax stores it as [kh, kw, 1, C]."""
  kh, kw, _, _ = shape
  return jax.random.normal(key, shape, dtype) * np.sqrt(2.0 / (kh * kw))


def _dense_init(key, shape, dtype=jnp.float32):
  """`dense_kernel_initializer`: uniform in +-1/sqrt(output units)."""
  limit = 1.0 / np.sqrt(shape[1])
  return jax.random.uniform(key, shape, dtype, -limit, limit)


class MBConv(nn.Module):
  block: Block
  cfg: ModelConfig
  survival_prob: float
  bn_groups: int = 1

  @nn.compact
  def __call__(self, x_BHWC: jax.Array, train: bool) -> jax.Array:
    b, dtype = self.block, jnp.dtype(self.cfg.dtype.value)
    conv = functools.partial(nn.Conv, use_bias=False, padding="SAME", kernel_init=_conv_init,
                             dtype=dtype)
    norm = functools.partial(BatchNorm, use_running_average=not train, num_groups=self.bn_groups,
                             momentum=self.cfg.bn_momentum, epsilon=self.cfg.bn_epsilon,
                             dtype=dtype)
    x = x_BHWC
    wide = b.c_in * b.expand
    if b.expand != 1:
      x = nn.swish(norm(name="expand_bn")(conv(wide, (1, 1), name="expand_conv")(x)))
    x = conv(wide, (b.kernel, b.kernel), strides=b.stride, feature_group_count=wide,
             kernel_init=_depthwise_init, name="depthwise_conv")(x)
    x = nn.swish(norm(name="depthwise_bn")(x))
    x = self._squeeze_excite(x, dtype)
    x = norm(name="project_bn")(conv(b.c_out, (1, 1), name="project_conv")(x))
    if b.stride == 1 and b.c_in == b.c_out:
      x = self._drop_connect(x, train) + x_BHWC
    return x

  def _squeeze_excite(self, x_BHWC: jax.Array, dtype) -> jax.Array:
    reduced = max(1, int(self.block.c_in * self.block.se_ratio))
    conv = functools.partial(nn.Conv, kernel_size=(1, 1), use_bias=True, kernel_init=_conv_init,
                             dtype=dtype)
    s = jnp.mean(x_BHWC, axis=(1, 2), keepdims=True)
    s = conv(x_BHWC.shape[-1], name="se_expand")(nn.swish(conv(reduced, name="se_reduce")(s)))
    return nn.sigmoid(s) * x_BHWC

  def _drop_connect(self, x_BHWC: jax.Array, train: bool) -> jax.Array:
    """Stochastic depth per example (utils.drop_connect): keep with `survival_prob`,
    divided by it at training time so evaluation needs nothing."""
    p = self.survival_prob
    if not train or p >= 1.0:
      return x_BHWC
    u_B = jax.random.uniform(self.make_rng("dropout"), (x_BHWC.shape[0], 1, 1, 1))
    keep = jnp.floor(p + u_B).astype(x_BHWC.dtype)
    return x_BHWC / jnp.asarray(p, x_BHWC.dtype) * keep


class EfficientNet(nn.Module):
  """EfficientNet; batch-norm statistics over `bn_groups` groups of the batch."""

  cfg: ModelConfig
  bn_groups: int = 1

  @nn.compact
  def __call__(self, x_BHWC: jax.Array, train: bool) -> jax.Array:
    cfg, dtype = self.cfg, jnp.dtype(self.cfg.dtype.value)
    norm = functools.partial(BatchNorm, use_running_average=not train, num_groups=self.bn_groups,
                             momentum=cfg.bn_momentum, epsilon=cfg.bn_epsilon, dtype=dtype)
    x = nn.Conv(round_filters(STEM, cfg.width), (3, 3), strides=2, padding="SAME",
                use_bias=False, kernel_init=_conv_init, dtype=dtype,
                name="stem_conv")(x_BHWC.astype(dtype))
    x = nn.swish(norm(name="stem_bn")(x))
    every = blocks(cfg)
    drop = 1.0 - cfg.survival_prob
    for i, b in enumerate(every):
      x = MBConv(b, cfg, 1.0 - drop * i / len(every), self.bn_groups, name=f"block{i}")(x, train)
    x = nn.Conv(round_filters(HEAD, cfg.width), (1, 1), use_bias=False, kernel_init=_conv_init,
                dtype=dtype, name="head_conv")(x)
    x_BC = jnp.mean(nn.swish(norm(name="head_bn")(x)), axis=(1, 2))
    x_BC = nn.Dropout(cfg.dropout, deterministic=not train)(x_BC)
    return nn.Dense(cfg.num_classes, kernel_init=_dense_init, dtype=jnp.float32,
                    name="fc")(x_BC.astype(jnp.float32))
