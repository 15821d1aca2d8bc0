"""What the convolutional workloads share that needs no Flax: the kinds of ResNet stem their
configs choose from (`Stem`, built by `blocks.resnet_stem`), the image layout each kind
reads (`stem_input_shape`, and `to_stem_input`, the host pipeline's transform), and forward
FLOP counts of convolutions, which their `flops_per_example` add up.

Model FLOPs count the multiply-adds of convolutions and dense layers (2 FLOPs each);
batch norm, activations, pooling and biases are left out, as in the published
counts of these networks (ResNet-50 v1.5: 4.1 GMAC per 224x224 image).
"""

from __future__ import annotations

import enum
from typing import Any

BLOCK = 2
"""Side of the pixel blocks a space-to-depth image folds into channels: the stem's stride."""


class Stem(enum.Enum):
  """The layers before the first residual stage."""

  IMAGENET = "imagenet"  # 7x7/2 convolution, 3x3/2 max pool (ResNet-50 v1.5).
  # The same function, computed as Google's TPU submissions do: the host folds each 2x2
  # block of pixels into 12 channels, and the step runs the 7x7/2 kernel (kept 7x7x3)
  # rearranged into a 4x4/1 convolution over them, 12 input channels instead of 3.
  SPACE_TO_DEPTH = "space_to_depth"
  SMALL = "small"        # 3x3/1 convolution, no pool, for tiny images.

  @property
  def strides(self) -> tuple[int, ...]:
    """The strides the stem divides the image by, in order (convolution, max pool)."""
    return () if self is Stem.SMALL else (2, 2)


def stem_input_shape(stem: Stem, height: int, width: int) -> tuple[int, int, int]:
  """(H, W, C) of the images a model with `stem` reads for `height` x `width` RGB images."""
  if stem is Stem.SPACE_TO_DEPTH:
    return height // BLOCK, width // BLOCK, 3 * BLOCK * BLOCK
  return height, width, 3


def space_to_depth(x_BHWC: Any) -> Any:
  """A numpy or JAX batch [B, H, W, C] -> [B, H/2, W/2, 4C], laid out as
  `tf.nn.space_to_depth(x, 2)`: channel (dy * 2 + dx) * C + c holds pixel (2i + dy, 2j + dx)."""
  b, h, w, c = x_BHWC.shape
  x = x_BHWC.reshape(b, h // BLOCK, BLOCK, w // BLOCK, BLOCK, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(b, h // BLOCK, w // BLOCK, BLOCK * BLOCK * c)


def to_stem_input(stem: Stem, image_HWC: Any) -> Any:
  """What a host input pipeline hands the model for `stem`: the decoded image (a
  TensorFlow [H, W, 3] tensor), space-to-depth where the stem reads it so (as Google's
  MLPerf ResNet-50 does on the host: training_results_v1.0 Google/benchmarks/resnet/
  implementations/resnet-preview-TF-tpu-v4-128/imagenet_input.py L181-183)."""
  if stem is not Stem.SPACE_TO_DEPTH:
    return image_HWC
  from mlbench.train import data

  tf = data.tf()
  return tf.nn.space_to_depth(image_HWC[tf.newaxis], BLOCK)[0]


def check_stem_input(stem: Stem, image_size: int) -> None:
  """The check of a model config's `stem` against the data's `image_size` (its whole
  config's `__post_init__` runs it): space-to-depth folds 2x2 blocks, so the size is even."""
  from mlbench.fields import require

  require(stem is not Stem.SPACE_TO_DEPTH or image_size % BLOCK == 0, "data.image_size",
          f"{image_size} is odd, but model.stem=space_to_depth folds 2x2 blocks of pixels into "
          "channels; set an even size or model.stem=imagenet", "model.stem")


def out_size(size: int, kernel: int, stride: int = 1, pad: int | None = None) -> int:
  """Output length along one axis; `pad=None` is 'same' padding (ceil(size / stride))."""
  if pad is None:
    return -(-size // stride)
  return (size + pad - kernel) // stride + 1


def conv_flops(size: int, kernel: int, c_in: int, c_out: int) -> float:
  """Forward FLOPs of a square convolution with `size` x `size` outputs."""
  return float(2 * size * size * kernel * kernel * c_in * c_out)
