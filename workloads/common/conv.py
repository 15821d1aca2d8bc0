"""What the convolutional workloads share that needs no Flax: the kinds of ResNet stem their
configs choose from (`Stem`, built by `blocks.resnet_stem`), and forward FLOP counts of
convolutions, which their `flops_per_example` add up.

Model FLOPs count the multiply-adds of convolutions and dense layers (2 FLOPs each);
batch norm, activations, pooling and biases are left out, as in the published
counts of these networks (ResNet-50 v1.5: 4.1 GMAC per 224x224 image).
"""

from __future__ import annotations

import enum


class Stem(enum.Enum):
  """The layers before the first residual stage."""

  IMAGENET = "imagenet"  # 7x7/2 convolution, 3x3/2 max pool (ResNet-50 v1.5).
  SMALL = "small"        # 3x3/1 convolution, no pool, for tiny images.


def out_size(size: int, kernel: int, stride: int = 1, pad: int | None = None) -> int:
  """Output length along one axis; `pad=None` is 'same' padding (ceil(size / stride))."""
  if pad is None:
    return -(-size // stride)
  return (size + pad - kernel) // stride + 1


def conv_flops(size: int, kernel: int, c_in: int, c_out: int) -> float:
  """Forward FLOPs of a square convolution with `size` x `size` outputs."""
  return float(2 * size * size * kernel * kernel * c_in * c_out)
