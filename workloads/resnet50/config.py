"""ResNet-50 configs: `full` (the MLPerf reference on ImageNet) and `mini` (digits, CPU).

Run either with `mlbench run resnet50 --config full|mini`; edit any field with
`--set optimizer.base_learning_rate=8.0`. This module imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
import enum

from mlbench.fields import (AttentionImpl, DType, EpochConfig, LrScaling, at_least, fraction,
                            positive, require, switch)
from workloads.common.conv import Stem, check_stem_input
from workloads.common.imagenet import Source, image_records


class Block(enum.Enum):
  """The residual block of the last stage."""

  BOTTLENECK = "bottleneck"                          # ResNet-50
  BOTTLENECK_TRANSFORMER = "bottleneck_transformer"  # BoT50: MHSA for the 3x3 (bot.py)


class Optimizer(enum.Enum):
  LARS = "lars"
  SGD = "sgd"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """ResNet v1.5: bottleneck blocks, stride in the 3x3 convolution."""

  stage_sizes: tuple[int, ...] = (3, 4, 6, 3)
  width: int = 64              # bottleneck channels of stage 1 (doubles per stage, x4 out)
  num_classes: int = 1000
  # space_to_depth: the same stem as Google's TPU submissions compute it (issue 47); not the
  # default: XLA's v4-128 estimate of the step is the same (benchmarks/space_to_depth.py).
  stem: Stem = Stem.IMAGENET
  bn_momentum: float = 0.9
  bn_epsilon: float = 1e-5
  zero_init_last_bn: bool = False  # True: last BN scale of a block starts at 0 (not reference)
  block: Block = switch(Block.BOTTLENECK)  # of the last stage; BoT50: open division only
  attention_heads: int = 4         # of its MHSA, with block=bottleneck_transformer
  # Which implementation computes that MHSA (mlbench.train.attention): auto, xla, ...
  attention: AttentionImpl = AttentionImpl.AUTO
  dtype: DType = DType.FLOAT32    # activations and convolutions; parameters stay float32

  def __post_init__(self):
    require(len(self.stage_sizes) > 0, "stage_sizes", "is empty; give the blocks of each stage")
    at_least(self, 1, "width")
    at_least(self, 2, "num_classes")
    fraction(self, "bn_momentum")
    positive(self, "bn_epsilon")
    require(min(self.stage_sizes) >= 1, "stage_sizes",
            f"{self.stage_sizes} has a stage without blocks; give each stage 1 or more")
    last = self.width * 2 ** (len(self.stage_sizes) - 1)  # the last stage's 3x3 channels
    require(self.block is Block.BOTTLENECK or (self.attention_heads >= 1
                                               and last % self.attention_heads == 0),
            "attention_heads", f"{self.attention_heads} does not divide the last stage's "
            f"{last} channels (width x 2^(stages - 1)); set a divisor of {last}")


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """The ImageNet TFRecord schema and the MLPerf reference preprocessing."""

  source: Source = Source.IMAGENET
  image_size: int = 224
  train_examples: int = 1_281_167
  eval_examples: int = 50_000
  label_offset: int = 1         # ImageNet TFRecords store labels 1..1000
  crop_area: tuple[float, float] = (0.05, 1.0)   # sample_distorted_bounding_box area range
  crop_aspect: tuple[float, float] = (0.75, 1.33)
  flip: bool = True
  eval_resize: int = 256        # shorter side before the central crop
  mean_rgb: tuple[float, float, float] = (123.68, 116.78, 103.94)
  stddev_rgb: tuple[float, float, float] = (1.0, 1.0, 1.0)  # the reference only subtracts

  def __post_init__(self):
    image_records(self)
    at_least(self, 1, "image_size")
    require(self.eval_resize >= self.image_size, "eval_resize",
            f"{self.eval_resize} is below image_size ({self.image_size}), which evaluation "
            "crops from it; set image_size or more", "image_size")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """LARS (or SGD with momentum) with warmup and polynomial decay, as MLPerf logs them.

  `lr_scaling` moves base_learning_rate and warmup_epochs, given for `base_batch_size`, to
  the global batch (`mlbench.train.optim.scale_for_batch`): none (the reference's values
  are tuned per batch), linear, or legw (You et al. 2019, whose CNN case is ResNet-50 at
  batch 32K): a batch k times larger gets sqrt(k) times the rate and k times the warmup
  epochs. The values logged are the ones trained with.
  """

  name: Optimizer = Optimizer.LARS
  base_learning_rate: float = 10.0
  base_batch_size: int = 4096  # the batch base_learning_rate and warmup_epochs are for
  lr_scaling: LrScaling = LrScaling.NONE
  end_learning_rate: float = 1e-4
  warmup_epochs: float = 5.0
  poly_power: float = 2.0
  momentum: float = 0.9
  weight_decay: float = 2e-4
  lars_eta: float = 1e-3
  lars_epsilon: float = 0.0
  label_smoothing: float = 0.1

  def __post_init__(self):
    at_least(self, 0, "warmup_epochs", "weight_decay", "end_learning_rate")
    at_least(self, 1, "base_batch_size")
    fraction(self, "momentum", "label_smoothing")


@dataclasses.dataclass(frozen=True)
class ResNetConfig(EpochConfig[ModelConfig, DataConfig, OptimizerConfig]):
  # Evaluations this many epochs before the rules' every-4 cadence: the reference runs
  # with --eval_offset_epochs=2 (resnet-tf2 README L110-112; resnet_ctl_imagenet_main.py
  # L184-188), evaluating at epochs 2, 6, 10, ...; the rules allow up to 3.
  eval_offset_epochs: float = 2.0

  def __post_init__(self):
    super().__post_init__()
    at_least(self, 0, "eval_offset_epochs")
    check_stem_input(self.model.stem, self.data.image_size)


def full() -> ResNetConfig:
  """The MLPerf reference for batch 4096 (mlcommons/training image_classification,
  README_tensorflow2 "On TPU-V3-64"): LARS, base LR 10, 5 warmup epochs, 42
  epochs, weight decay 2e-4, momentum 0.9, label smoothing 0.1. Activations and
  convolutions in bfloat16 (parameters, optimizer and batch-norm statistics float32),
  as the TPU and GPU submissions train; float32 measured 1.8x slower on an H100.
  """
  return ResNetConfig(model=ModelConfig(dtype=DType.BFLOAT16), data=DataConfig(),
                      optimizer=OptimizerConfig(), global_batch_size=4096, eval_batch_size=4096,
                      train_epochs=42.0)


def mini() -> ResNetConfig:
  """A narrow ResNet v1.5 on scikit-learn's 1,797 handwritten digits (1,257 train,
  540 held out), written once as ImageNet-schema JPEG TFRecords at 32x32 and read
  through the same pipeline; reaches the mini target in 8-12 epochs (25-40 s on a
  2-core CPU). The evaluation set is large enough that a perfect score, which the
  official checker rejects (accuracy < 1.0), does not happen at the target.
  """
  return ResNetConfig(
      model=ModelConfig(stage_sizes=(1, 1, 1, 1), width=16, num_classes=10, stem=Stem.SMALL),
      # Train crops keep >= half of the digit and are not flipped (a flipped 2 is
      # no 2); evaluation resizes to 27 and crops the central 24, as 256 -> 224.
      data=DataConfig(source=Source.DIGITS, image_size=24, train_examples=1257,
                      eval_examples=540, crop_area=(0.5, 1.0), flip=False, eval_resize=27,
                      stddev_rgb=(64.0, 64.0, 64.0)),
      optimizer=OptimizerConfig(base_learning_rate=4.0, base_batch_size=64, warmup_epochs=2.0,
                                weight_decay=1e-4),
      global_batch_size=64,
      eval_batch_size=128,
      train_epochs=16.0,
      eval_offset_epochs=0.0,
  )
