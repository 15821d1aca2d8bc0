"""EfficientNet configs: `full` (B5 at batch 65,536, as Wongpanich et al. train it on a
TPU-v3 pod) and `mini` (a narrow B0 on the digits, CPU).

Variants B0-B7 by compound scaling: `--set model.variant=b2` changes width, depth,
resolution and dropout together, as tensorflow/tpu models/official/efficientnet
(efficientnet_builder.py, `efficientnet_params`) scales them. This module imports
nothing heavy.
"""

from __future__ import annotations

import dataclasses
import enum

from mlbench.fields import (DType, EpochConfig, LrScaling, at_least, fraction, positive,
                            provisional, require)
from workloads.common.imagenet import Source, image_records


class Variant(enum.Enum):
  B0 = "b0"
  B1 = "b1"
  B2 = "b2"
  B3 = "b3"
  B4 = "b4"
  B5 = "b5"
  B6 = "b6"
  B7 = "b7"


# (width coefficient, depth coefficient, resolution, dropout rate) per variant:
# efficientnet_builder.py `efficientnet_params`.
SCALING = {
    Variant.B0: (1.0, 1.0, 224, 0.2), Variant.B1: (1.0, 1.1, 240, 0.2),
    Variant.B2: (1.1, 1.2, 260, 0.3), Variant.B3: (1.2, 1.4, 300, 0.3),
    Variant.B4: (1.4, 1.8, 380, 0.4), Variant.B5: (1.6, 2.2, 456, 0.4),
    Variant.B6: (1.8, 2.6, 528, 0.5), Variant.B7: (2.0, 3.1, 600, 0.5),
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """EfficientNet: MBConv blocks with squeeze-excite and swish (efficientnet_model.py).

  The coefficients and the dropout rate default to the variant's (None); the
  drop-connect survival probability is 0.8 for every variant (efficientnet_builder.py
  `efficientnet`), falling linearly with the block index to 0.8 at the last block.
  """

  variant: Variant = Variant.B5
  width_coefficient: float | None = None
  depth_coefficient: float | None = None
  dropout_rate: float | None = None
  survival_prob: float = 0.8
  num_classes: int = 1000
  bn_momentum: float = 0.99    # efficientnet_builder.py: batch_norm_momentum
  bn_epsilon: float = 1e-3     # ... batch_norm_epsilon
  # Batch statistics over groups of this many examples (main.py --batch_norm_batch_size,
  # the reference's DistributedBatchNormalization with LARS); 0: over the whole batch.
  bn_group_examples: int = 128
  dtype: DType = DType.FLOAT32  # activations and convolutions; parameters stay float32

  def __post_init__(self):
    require(0 < self.survival_prob <= 1, "survival_prob", f"{self.survival_prob} is not in (0, 1]")
    at_least(self, 2, "num_classes")
    at_least(self, 0, "bn_group_examples")
    fraction(self, "bn_momentum")
    positive(self, "bn_epsilon", *(name for name in ("width_coefficient", "depth_coefficient")
                                   if getattr(self, name) is not None))
    require(self.dropout_rate is None or 0 <= self.dropout_rate < 1, "dropout_rate",
            f"{self.dropout_rate} is not in [0, 1)")

  @property
  def width(self) -> float:
    return self.width_coefficient or SCALING[self.variant][0]

  @property
  def depth(self) -> float:
    return self.depth_coefficient or SCALING[self.variant][1]

  @property
  def dropout(self) -> float:
    return SCALING[self.variant][3] if self.dropout_rate is None else self.dropout_rate


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """ImageNet TFRecords (workloads.common.imagenet) with EfficientNet's preprocessing
  (preprocessing.py): an Inception-style crop of the whole image, bicubic resize and
  flip for training; a central crop of 87.5% of the shorter side for evaluation."""

  source: Source = Source.IMAGENET
  image_size: int | None = None  # None: the variant's resolution
  train_examples: int = 1_281_167
  eval_examples: int = 50_000
  label_offset: int = 1
  crop_area: tuple[float, float] = (0.08, 1.0)
  crop_aspect: tuple[float, float] = (0.75, 4 / 3)
  crop_attempts: int = 10
  crop_fraction: float = 0.875
  flip: bool = True
  mean_rgb: tuple[float, float, float] = (0.485 * 255, 0.456 * 255, 0.406 * 255)
  stddev_rgb: tuple[float, float, float] = (0.229 * 255, 0.224 * 255, 0.225 * 255)

  def __post_init__(self):
    image_records(self)
    at_least(self, 1, "crop_attempts", *(["image_size"] if self.image_size is not None else []))
    require(0 < self.crop_fraction <= 1, "crop_fraction", f"{self.crop_fraction} is not in (0, 1]")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """LARS with linear warmup and polynomial decay (the reference's `--optimizer=lars
  --lr_schedule=poly`: lars_optimizer.py, utils.build_learning_rate), an L2 term in
  the loss on every non-batch-norm weight (main.py), label smoothing, and evaluation
  of an exponential moving average of the weights (main.py, utils.get_ema_vars)."""

  base_learning_rate: float = provisional(
      15.0, "no source at batch 65,536: the paper's value could not be read, and the "
      "reference has no LARS default (main.py's 0.016 per 256 images is RMSProp's)")
  base_batch_size: int = 65536   # the batch base_learning_rate and warmup_epochs are for
  lr_scaling: LrScaling = LrScaling.LINEAR
  warmup_epochs: float = provisional(
      50.0, "no source at batch 65,536: the paper's value could not be read (the "
      "reference's --lr_warmup_epochs defaults to 5)")
  end_learning_rate: float = 0.1  # utils.build_learning_rate 'poly'
  poly_power: float = 2.0
  momentum: float = 0.9
  weight_decay: float = 1e-5      # LARS weight decay (main.py --lars_weight_decay)
  l2: float = 1e-5                # the loss's L2 term (main.py --weight_decay)
  lars_eta: float = 1e-3
  lars_epsilon: float = 0.0       # used as is (lars_optimizer.py guards zero norms)
  label_smoothing: float = 0.1
  ema_decay: float = 0.9999       # 0: evaluate the trained weights themselves

  def __post_init__(self):
    positive(self, "base_learning_rate")
    at_least(self, 1, "base_batch_size")
    at_least(self, 0, "warmup_epochs", "end_learning_rate", "weight_decay", "l2")
    fraction(self, "momentum", "label_smoothing", "ema_decay")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EfficientNetConfig(EpochConfig[ModelConfig, DataConfig, OptimizerConfig]):
  train_epochs: float = provisional(
      350.0, "the reference's default budget (218,949 steps of 2,048, about 350 epochs); "
      "the paper's epochs at batch 65,536 could not be read")

  @property
  def image_size(self) -> int:
    return self.data.image_size or SCALING[self.model.variant][2]


def full() -> EfficientNetConfig:
  """EfficientNet-B5 at 456x456, global batch 65,536 (64 per core on a v3-1024, 32 on a
  v3-2048), trained as Wongpanich et al. 2020 ("Training EfficientNets at
  Supercomputer Scale: 83% ImageNet Top-1 Accuracy in One Hour", arXiv:2011.00071)
  did with the reference's LARS path (tensorflow/tpu models/official/efficientnet,
  README.md of this package): LARS (eta 1e-3, momentum 0.9, weight decay 1e-5, batch
  norm and biases excluded), linear warmup, then polynomial decay (power 2) to 0.1,
  label smoothing 0.1, batch statistics over groups of 128 examples (the harness groups
  the data-parallel devices from the per-device batch: 2 a group on a v3-1024, 4 on a
  v3-2048; `--bn-group-size` overrides), bfloat16 activations and convolutions with
  float32 weights and batch-norm statistics. Target: 82.6% top-1
  (rules/mlbench/efficientnet.yaml).

  Provisional (`mlbench describe` and `check`'s time to train say so): the peak learning
  rate (15), the warmup (50 epochs) and the budget (350 epochs) at this batch have no
  source; the paper's values could not be read, and the reference's defaults are for
  RMSProp at batch 2,048. Confirm them (`--set optimizer.base_learning_rate=...`) before
  quoting a time to train.
  """
  return EfficientNetConfig(model=ModelConfig(dtype=DType.BFLOAT16), data=DataConfig(),
                            optimizer=OptimizerConfig(), global_batch_size=65536,
                            eval_batch_size=16384)


def mini() -> EfficientNetConfig:
  """A quarter-width, quarter-depth B0 (one MBConv per stage, 7 in all) on the
  digits (workloads.common.digits: 1,257 train, 540 held out, stored at
  32x32), read through the same EfficientNet preprocessing at 32x32: crops keep at
  least half of the digit and are not flipped (a flipped 2 is no 2). Faster-moving
  batch-norm statistics (momentum 0.9) and no drop-connect suit its 200 steps; no
  moving average of the weights.
  """
  return EfficientNetConfig(
      model=ModelConfig(variant=Variant.B0, width_coefficient=0.25, depth_coefficient=0.25,
                        dropout_rate=0.0, survival_prob=1.0, num_classes=10, bn_momentum=0.9,
                        bn_group_examples=0),
      data=DataConfig(source=Source.DIGITS, image_size=32, train_examples=1257,
                      eval_examples=540, crop_area=(0.5, 1.0), flip=False),
      optimizer=OptimizerConfig(base_learning_rate=2.0, base_batch_size=64, warmup_epochs=2.0,
                                end_learning_rate=1e-4, weight_decay=1e-4, ema_decay=0.0),
      global_batch_size=64,
      eval_batch_size=128,
      train_epochs=12.0,
  )
