"""ResNet-50 configs: `full` (the MLPerf reference on ImageNet) and `mini` (digits, CPU).

Run either with `mlbench run resnet50 --config full|mini`; edit any field with
`--set optimizer.base_learning_rate=8.0`. This module imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
import enum


class Stem(enum.Enum):
  """The layers before the first residual stage."""

  IMAGENET = "imagenet"  # 7x7/2 convolution, 3x3/2 max pool (ResNet-50 v1.5).
  SMALL = "small"        # 3x3/1 convolution, no pool, for tiny images.


class Block(enum.Enum):
  """The residual block of the last stage."""

  BOTTLENECK = "bottleneck"                          # ResNet-50
  BOTTLENECK_TRANSFORMER = "bottleneck_transformer"  # BoT50: MHSA for the 3x3 (bot.py)


class Optimizer(enum.Enum):
  LARS = "lars"
  SGD = "sgd"


class Source(enum.Enum):
  """Where the TFRecords come from."""

  IMAGENET = "imagenet"  # ILSVRC-2012 converted by imagenet_to_gcs.py (supplied by you).
  DIGITS = "digits"      # scikit-learn's handwritten digits, written by mlbench.


class DType(enum.Enum):
  FLOAT32 = "float32"
  BFLOAT16 = "bfloat16"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """ResNet v1.5: bottleneck blocks, stride in the 3x3 convolution."""

  stage_sizes: tuple[int, ...] = (3, 4, 6, 3)
  width: int = 64              # bottleneck channels of stage 1 (doubles per stage, x4 out)
  num_classes: int = 1000
  stem: Stem = Stem.IMAGENET
  bn_momentum: float = 0.9
  bn_epsilon: float = 1e-5
  zero_init_last_bn: bool = False  # True: last BN scale of a block starts at 0 (not reference)
  block: Block = Block.BOTTLENECK  # of the last stage
  attention_heads: int = 4         # of its MHSA, with block=bottleneck_transformer
  dtype: DType = DType.FLOAT32    # activations and convolutions; parameters stay float32


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


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """LARS (or SGD with momentum) with warmup and polynomial decay, as MLPerf logs them."""

  name: Optimizer = Optimizer.LARS
  base_learning_rate: float = 10.0
  end_learning_rate: float = 1e-4
  warmup_epochs: float = 5.0
  poly_power: float = 2.0
  momentum: float = 0.9
  weight_decay: float = 2e-4
  lars_eta: float = 1e-3
  lars_epsilon: float = 0.0
  label_smoothing: float = 0.1


@dataclasses.dataclass(frozen=True)
class ResNetConfig:
  model: ModelConfig = ModelConfig()
  data: DataConfig = DataConfig()
  optimizer: OptimizerConfig = OptimizerConfig()
  global_batch_size: int = 4096
  eval_batch_size: int = 4096
  train_epochs: float = 42.0    # schedule length; the run aborts here without the target
  # Evaluations this many epochs before the rules' every-4 cadence: the reference runs
  # with --eval_offset_epochs=2 (resnet-tf2 README L110-112; resnet_ctl_imagenet_main.py
  # L184-188), evaluating at epochs 2, 6, 10, ...; the rules allow up to 3.
  eval_offset_epochs: float = 2.0


def full() -> ResNetConfig:
  """The MLPerf reference for batch 4096 (mlcommons/training image_classification,
  README_tensorflow2 "On TPU-V3-64"): LARS, base LR 10, 5 warmup epochs, 42
  epochs, weight decay 2e-4, momentum 0.9, label smoothing 0.1. Activations and
  convolutions in bfloat16 (parameters, optimizer and batch-norm statistics float32),
  as the TPU and GPU submissions train; float32 measured 1.8x slower on an H100.
  """
  return ResNetConfig(model=ModelConfig(dtype=DType.BFLOAT16))


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
      optimizer=OptimizerConfig(base_learning_rate=4.0, warmup_epochs=2.0, weight_decay=1e-4),
      global_batch_size=64,
      eval_batch_size=128,
      train_epochs=16.0,
      eval_offset_epochs=0.0,
  )
