"""What the convolutional models build their blocks from: a bias-free convolution with the
batch norm that follows it, both as the model config sets them (resnet50's bottlenecks and
BoT blocks, SSD's backbone, EfficientNet's MBConv), and the ResNet stem that resnet50 and
SSD's ResNet-34 backbone share.

Called inside a Flax module's `@nn.compact` method: the layers they create are that
module's, under the names given, so the parameter trees are those of the models that
built them inline.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from mlbench.train.layers import BatchNorm, batch_norm
from workloads.common.conv import Stem


he_normal = nn.initializers.variance_scaling(2.0, "fan_in", "truncated_normal")
"""Keras' 'he_normal': a normal truncated at two standard deviations, scaled to variance
2 / fan_in (the ResNet-50 reference's kernel initializer, for its blocks and BoT50's)."""


def conv_and_norm(cfg: Any, *, train: bool, groups: int, kernel_init: Callable[..., Any],
                  **conv: Any) -> tuple[Callable[..., nn.Conv], Callable[..., BatchNorm]]:
  """(conv, norm): `nn.Conv` without bias in the compute dtype `cfg.dtype`, initialised
  by `kernel_init` (plus any other defaults in `conv`, such as `padding`), and
  `mlbench.train.layers.batch_norm(cfg, train=train, groups=groups)`."""
  conv_BHWC = functools.partial(nn.Conv, use_bias=False, kernel_init=kernel_init,
                                dtype=jnp.dtype(cfg.dtype.value), **conv)
  return conv_BHWC, batch_norm(cfg, train=train, groups=groups)


class ResidualBlock(nn.Module):
  """What a block of a ResNet stage is made with, whatever its kind (resnet50's Bottleneck
  and BoTBlock, which its stages build alike, SSD's BasicBlock): its width, its stride,
  the model config and the batch-norm groups (`StepContext.bn_groups`)."""

  width: int
  strides: int
  cfg: Any
  bn_groups: int = 1

  def conv_and_norm(self, train: bool, kernel_init: Callable[..., Any]
                    ) -> tuple[Callable[..., nn.Conv], Callable[..., BatchNorm]]:
    """`conv_and_norm` for this block's config and groups."""
    return conv_and_norm(self.cfg, train=train, groups=self.bn_groups, kernel_init=kernel_init)


def resnet_stem(x_BHWC: jax.Array, cfg: Any, *, width: int, train: bool, groups: int,
                kernel_init: Callable[..., Any],
                pool_padding: Callable[[jax.Array], Any]) -> jax.Array:
  """`cfg.stem`: 7x7/2 convolution, batch norm, ReLU and a 3x3/2 max pool padded by
  `pool_padding(x)` (Stem.IMAGENET), or a 3x3/1 convolution, batch norm and ReLU for tiny
  images (Stem.SMALL); the layers are named stem_conv and stem_bn."""
  conv, norm = conv_and_norm(cfg, train=train, groups=groups, kernel_init=kernel_init)
  if cfg.stem is Stem.IMAGENET:
    x = conv(width, (7, 7), strides=2, padding=((3, 3), (3, 3)), name="stem_conv")(x_BHWC)
  else:
    x = conv(width, (3, 3), padding=((1, 1), (1, 1)), name="stem_conv")(x_BHWC)
  x = nn.relu(norm(name="stem_bn")(x))
  if cfg.stem is Stem.IMAGENET:
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=pool_padding(x))
  return x


def shortcut(x_BHWC: jax.Array, channels: int, strides: int, conv: Callable[..., nn.Conv],
             norm: Callable[..., BatchNorm]) -> jax.Array:
  """A residual block's shortcut: its input, or a 1x1 projection (proj_conv, proj_bn) where
  the block changes the channels or the resolution."""
  if x_BHWC.shape[-1] == channels and strides == 1:
    return x_BHWC
  return norm(name="proj_bn")(conv(channels, (1, 1), strides=strides, name="proj_conv")(x_BHWC))
