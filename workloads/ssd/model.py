"""SSD in Flax: a truncated ResNet (BasicBlocks), extra feature layers, 3x3 heads.

The full config is the MLPerf reference's SSD300 (mlcommons/training
single_stage_detector/ssd/ssd300.py and base_model.py): torchvision's
ResNet-34 up to conv4_x with conv4_x's first block at stride 1, then
[1x1 conv, ReLU, 3x3 conv, ReLU] x 5 (biases, no batch norm; the first three
3x3 at stride 2 and padded, the last two unpadded), and on each of the six
feature maps (38, 19, 10, 5, 3, 1) a 3x3 location head (4 per default box) and
a 3x3 class head (81 per default box). Xavier-uniform initialisation for the
added layers, as the reference's `_init_weights`.

Shape legend: B batch, H/W spatial, C channels, A default boxes, K classes.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax.numpy as jnp

from workloads.common.blocks import ResidualBlock, resnet_stem, shortcut
from workloads.ssd.config import AnchorConfig, ModelConfig

# He initialisation over fan-out for the backbone, as torchvision does.
_conv_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")
_xavier = nn.initializers.xavier_uniform()


class BasicBlock(ResidualBlock):
  """3x3 -> 3x3 with a shortcut (a 1x1 projection when the shape changes)."""

  @nn.compact
  def __call__(self, x_BHWC: jnp.ndarray, train: bool) -> jnp.ndarray:
    conv, norm = self.conv_and_norm(train, _conv_init)
    y = conv(self.width, (3, 3), strides=self.strides, padding=((1, 1), (1, 1)), name="conv1")(
        x_BHWC)
    y = nn.relu(norm(name="bn1")(y))
    y = conv(self.width, (3, 3), padding=((1, 1), (1, 1)), name="conv2")(y)
    y = norm(name="bn2")(y)
    return nn.relu(y + shortcut(x_BHWC, self.width, self.strides, conv, norm))


class Backbone(nn.Module):
  """Stem and residual stages; returns the last stage's features (the first SSD map)."""

  cfg: ModelConfig
  bn_groups: int = 1

  @nn.compact
  def __call__(self, x_BHWC: jnp.ndarray, train: bool) -> jnp.ndarray:
    cfg = self.cfg
    # torchvision pads its max pool by 1 on every side (TF's 'same' pads 0 before, 1 after).
    x = resnet_stem(x_BHWC, cfg, width=cfg.stage_widths[0], train=train, groups=self.bn_groups,
                    kernel_init=_conv_init, pool_padding=lambda x: ((1, 1), (1, 1)))
    for stage, (blocks, width, stride) in enumerate(
        zip(cfg.stage_sizes, cfg.stage_widths, cfg.stage_strides)):
      for block in range(blocks):
        x = BasicBlock(width, stride if block == 0 else 1, cfg, self.bn_groups,
                       name=f"stage{stage + 1}_block{block + 1}")(x, train)
    return x


class SSD(nn.Module):
  """Returns (loc_BA4, logits_BAK) over all default boxes, in `boxes.default_boxes` order."""

  cfg: ModelConfig
  anchors: AnchorConfig
  bn_groups: int = 1

  @nn.compact
  def __call__(self, x_BHWC: jnp.ndarray, train: bool) -> tuple[jnp.ndarray, jnp.ndarray]:
    cfg = self.cfg
    dtype = jnp.dtype(cfg.dtype.value)
    x = Backbone(cfg, self.bn_groups, name="backbone")(x_BHWC.astype(dtype), train)
    features = [x]
    for i, (width, channels, stride) in enumerate(
        zip(cfg.extra_widths, cfg.extra_channels, cfg.extra_strides)):
      x = nn.relu(nn.Conv(width, (1, 1), kernel_init=_xavier, dtype=dtype,
                          name=f"extra{i + 1}_conv1")(x))
      pad = ((1, 1), (1, 1)) if stride > 1 else "VALID"
      x = nn.relu(nn.Conv(channels, (3, 3), strides=stride, padding=pad, kernel_init=_xavier,
                          dtype=dtype, name=f"extra{i + 1}_conv2")(x))
      features.append(x)
    sizes = tuple(f.shape[1] for f in features)
    if sizes != tuple(self.anchors.feature_sizes):
      raise ValueError(f"the model's feature maps are {sizes} but the default boxes are laid "
                       f"out for {self.anchors.feature_sizes}; make the configs agree")
    locs, logits = [], []
    for i, (f, per_cell) in enumerate(zip(features, self.anchors.boxes_per_cell)):
      head = functools.partial(nn.Conv, kernel_size=(3, 3), padding=((1, 1), (1, 1)),
                               kernel_init=_xavier, dtype=dtype)
      locs.append(_per_box(head(per_cell * 4, name=f"loc{i + 1}")(f), per_cell, 4))
      logits.append(_per_box(head(per_cell * cfg.num_classes, name=f"cls{i + 1}")(f), per_cell,
                             cfg.num_classes))
    return (jnp.concatenate(locs, axis=1).astype(jnp.float32),
            jnp.concatenate(logits, axis=1).astype(jnp.float32))


def _per_box(y_BHWC: jnp.ndarray, per_cell: int, size: int) -> jnp.ndarray:
  """[B, H, W, per_cell * size] -> [B, per_cell * H * W, size], box shape outermost."""
  b, h, w, _ = y_BHWC.shape
  y = y_BHWC.reshape(b, h, w, per_cell, size).transpose(0, 3, 1, 2, 4)
  return y.reshape(b, per_cell * h * w, size)
