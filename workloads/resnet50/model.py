"""ResNet v1.5 in Flax (bottleneck blocks, stride in the 3x3 convolution).

The full config is ResNet-50: stages (3, 4, 6, 3) of width 64..512, 1000
classes, 25,557,032 trainable parameters; `--set model.block=bottleneck_transformer`
makes it BoT50 (bot.py). Convolutions start from Keras' 'he_normal', the reference's
kernel_initializer (mlcommons/training retired_benchmarks/resnet-tf2/tensorflow2/
resnet_model.py L115, L132, L147, L307). Shape legend: B batch, H/W spatial,
C channels, K classes.
"""

from __future__ import annotations


import flax.linen as nn
import jax.numpy as jnp

from workloads.common.blocks import ResidualBlock, he_normal, resnet_stem, shortcut
from workloads.resnet50.bot import BoTBlock
from workloads.resnet50.config import Block, ModelConfig


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
  """TensorFlow's padding='same' along one axis: the total pad makes
  ceil(size / stride) outputs and the extra pixel goes after (so (0, 1) for a
  3x3 window at stride 2 on an even size). The reference's strided 3x3
  convolutions and its max pool use it (resnet_model.py L128-131, L213-216, L318)."""
  total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
  return total // 2, total - total // 2


class Bottleneck(ResidualBlock):
  """1x1 reduce -> 3x3 (carries the stride, v1.5) -> 1x1 expand x4, plus shortcut."""

  @nn.compact
  def __call__(self, x_BHWC: jnp.ndarray, train: bool) -> jnp.ndarray:
    conv, norm = self.conv_and_norm(train, he_normal)
    y = nn.relu(norm(name="bn1")(conv(self.width, (1, 1), name="conv1")(x_BHWC)))
    pad = (same_padding(y.shape[1], 3, self.strides), same_padding(y.shape[2], 3, self.strides))
    y = conv(self.width, (3, 3), strides=self.strides, padding=pad, name="conv2")(y)
    y = nn.relu(norm(name="bn2")(y))
    y = conv(4 * self.width, (1, 1), name="conv3")(y)
    # The reference's last BN starts at gamma 1 (Keras' default, resnet_model.py
    # L150-155); zero_init_last_bn is the open-division option of Goyal et al.
    last_init = nn.initializers.zeros if self.cfg.zero_init_last_bn else nn.initializers.ones
    y = norm(scale_init=last_init, name="bn3")(y)
    return nn.relu(y + shortcut(x_BHWC, 4 * self.width, self.strides, conv, norm))


class ResNet(nn.Module):
  """ResNet v1.5; batch norm statistics over `bn_groups` groups of the batch (harness-set)."""

  cfg: ModelConfig
  bn_groups: int = 1

  @nn.compact
  def __call__(self, x_BHWC: jnp.ndarray, train: bool) -> jnp.ndarray:
    cfg = self.cfg
    dtype = jnp.dtype(cfg.dtype.value)
    x = resnet_stem(
        x_BHWC.astype(dtype), cfg, width=cfg.width, train=train, groups=self.bn_groups,
        kernel_init=he_normal,
        pool_padding=lambda x: (same_padding(x.shape[1], 3, 2), same_padding(x.shape[2], 3, 2)))
    for stage, count in enumerate(cfg.stage_sizes):
      last = stage == len(cfg.stage_sizes) - 1
      kind = BoTBlock if last and cfg.block is Block.BOTTLENECK_TRANSFORMER else Bottleneck
      for block in range(count):
        strides = 2 if stage > 0 and block == 0 else 1
        x = kind(cfg.width * 2 ** stage, strides, cfg, self.bn_groups,
                 name=f"stage{stage + 1}_block{block + 1}")(x, train)
    x_BC = jnp.mean(x, axis=(1, 2))
    logits_BK = nn.Dense(cfg.num_classes, kernel_init=nn.initializers.normal(0.01),
                         dtype=jnp.float32, name="fc")(x_BC.astype(jnp.float32))
    return logits_BK
