"""What the convolutional models build their blocks from: a bias-free convolution with the
batch norm that follows it, both as the model config sets them (resnet50's bottlenecks and
BoT blocks, SSD's backbone, EfficientNet's MBConv), and the ResNet stem that resnet50 and
SSD's ResNet-34 backbone share.

Called inside a Flax module's `@nn.compact` method: the layers they create are that
module's, under the names given, so the parameter trees are those of the models that
built them inline. Stem.SPACE_TO_DEPTH keeps the 7x7 kernel of stem_conv as it is (the
parameter tree and checkpoints are the plain stem's) and rearranges it inside the step
(`SpaceToDepthConv`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from mlbench.train.layers import BatchNorm, batch_norm
from workloads.common.conv import BLOCK, Stem


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


def space_to_depth_kernel(kernel_HWIO: jax.Array) -> jax.Array:
  """A k x k stride-2 kernel [k, k, C, O] -> the [k', k', 4C, O] kernel (k' = ceil(k / 2))
  of the stride-1 convolution over the space-to-depth image (`conv.space_to_depth`'s
  channel order) that computes the same outputs.

  An odd kernel gets one zero tap in front (7 -> 8), so that tap 2K + d of the padded
  kernel falls on pixel d of block K: output i of the plain convolution, padded k // 2,
  reads pixels 2i - k // 2 + t for taps t, that is 2(i - 2) + (t + 1) for k = 7.
  Google's v0.7 JAX ResNet-50 and TF SSD pad in front the same way (training_results_v0.7
  Google/benchmarks/resnet/implementations/resnet-research-JAX-tpu-v3-8192/models.py
  L80-104; ssd/implementations/ssd-research-TF-tpu-v4-128/ssd_architecture.py L575-586);
  their v1.0 TF ResNet-50 zeroes the last tap of an 8x8 variable instead
  (training_results_v1.0 .../resnet-preview-TF-tpu-v4-128/resnet_model.py L66), which
  shifts the image by a pixel against the plain convolution.
  """
  k, _, c, o = kernel_HWIO.shape
  front = -k % BLOCK
  taps = (k + front) // BLOCK
  kernel = jnp.pad(kernel_HWIO, ((front, 0), (front, 0), (0, 0), (0, 0)))
  kernel = kernel.reshape(taps, BLOCK, taps, BLOCK, c, o).transpose(0, 2, 1, 3, 4, 5)
  return kernel.reshape(taps, taps, BLOCK * BLOCK * c, o)


def space_to_depth_padding(kernel: int) -> tuple[int, int]:
  """(before, after) padding, in blocks, of the stride-1 convolution of
  `space_to_depth_kernel` that equals the stride-2 one padded kernel // 2 on even images:
  (2, 1) for the 7x7 stem (Google's v0.7 SSD and ResNet-50 pad the same; the plain
  convolution's last pad pixel is never read)."""
  front = -kernel % BLOCK
  before = (kernel // 2 + front) // BLOCK
  return before, (kernel + front) // BLOCK - 1 - before


class SpaceToDepthConv(nn.Module):
  """The stem's `kernel` x `kernel` stride-2 convolution without bias, padded kernel // 2,
  over an image the host folded into 2x2 blocks ([B, H/2, W/2, 4C]); the outputs are the
  plain convolution's over [B, H, W, C]. Its one parameter, `kernel`, has the plain
  convolution's shape [kernel, kernel, C, features] and initialiser, and is rearranged
  into the 4x4 kernel over 4C channels in the step (`space_to_depth_kernel`)."""

  features: int
  kernel: int
  kernel_init: Callable[..., Any]
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x_BhwD: jax.Array) -> jax.Array:
    channels = x_BhwD.shape[-1] // (BLOCK * BLOCK)
    kernel = self.param("kernel", self.kernel_init,
                        (self.kernel, self.kernel, channels, self.features), jnp.float32)
    pad = space_to_depth_padding(self.kernel)
    return jax.lax.conv_general_dilated(
        x_BhwD.astype(self.dtype), space_to_depth_kernel(kernel).astype(self.dtype), (1, 1),
        (pad, pad), dimension_numbers=("NHWC", "HWIO", "NHWC"))


def resnet_stem(x_BHWC: jax.Array, cfg: Any, *, width: int, train: bool, groups: int,
                kernel_init: Callable[..., Any],
                pool_padding: Callable[[jax.Array], Any]) -> jax.Array:
  """`cfg.stem`: 7x7/2 convolution, batch norm, ReLU and a 3x3/2 max pool padded by
  `pool_padding(x)` (Stem.IMAGENET; Stem.SPACE_TO_DEPTH the same over a space-to-depth
  image, `SpaceToDepthConv`), or a 3x3/1 convolution, batch norm and ReLU for tiny
  images (Stem.SMALL); the layers are named stem_conv and stem_bn."""
  conv, norm = conv_and_norm(cfg, train=train, groups=groups, kernel_init=kernel_init)
  if cfg.stem is Stem.IMAGENET:
    x = conv(width, (7, 7), strides=2, padding=((3, 3), (3, 3)), name="stem_conv")(x_BHWC)
  elif cfg.stem is Stem.SPACE_TO_DEPTH:
    x = SpaceToDepthConv(width, 7, kernel_init, jnp.dtype(cfg.dtype.value),
                         name="stem_conv")(x_BHWC)
  else:
    x = conv(width, (3, 3), padding=((1, 1), (1, 1)), name="stem_conv")(x_BHWC)
  x = nn.relu(norm(name="stem_bn")(x))
  if cfg.stem is not Stem.SMALL:
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=pool_padding(x))
  return x


def shortcut(x_BHWC: jax.Array, channels: int, strides: int, conv: Callable[..., nn.Conv],
             norm: Callable[..., BatchNorm]) -> jax.Array:
  """A residual block's shortcut: its input, or a 1x1 projection (proj_conv, proj_bn) where
  the block changes the channels or the resolution."""
  if x_BHWC.shape[-1] == channels and strides == 1:
    return x_BHWC
  return norm(name="proj_bn")(conv(channels, (1, 1), strides=strides, name="proj_conv")(x_BHWC))
