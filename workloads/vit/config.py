"""ViT configs: `full` (ViT-S/16 as "Better plain ViT baselines for ImageNet-1k" trains
it) and `mini` (a 4-layer ViT on the digits, CPU).

The reference is big_vision's configs/vit_s16_i1k.py (Beyer, Zhai, Kolesnikov 2022,
arXiv:2205.01580): ViT-S/16 with a global-average-pool head, fixed 2-D sin-cos position
embedding, a tanh pre-logits layer, no dropout; batch 1024, Adam (first moment in
bfloat16) with decoupled weight decay 1e-4 and gradient clipping at 1, learning rate
1e-3 with 10,000 warmup steps and cosine decay, Inception crop + flip + RandAugment(2, 10)
+ Mixup(0.2), 90 epochs to 76.5% top-1. `--set model.variant=B/16` gives ViT-B/16.
This module imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
import enum

from mlbench.fields import AttentionImpl, DType, EpochConfig, LrScaling, at_least, fraction, positive, require
from workloads.common.imagenet import Source, image_records


class Variant(enum.Enum):
  TI16 = "Ti/16"
  S16 = "S/16"
  B16 = "B/16"
  L16 = "L/16"


# (width, depth, MLP width, heads): big_vision/models/vit.py `decode_variant`.
SIZES = {Variant.TI16: (192, 12, 768, 3), Variant.S16: (384, 12, 1536, 6),
         Variant.B16: (768, 12, 3072, 12), Variant.L16: (1024, 24, 4096, 16)}


class Pool(enum.Enum):
  GAP = "gap"  # the plain-ViT paper: mean over the patch tokens
  TOK = "tok"  # the original ViT: a class token


class Posemb(enum.Enum):
  SINCOS2D = "sincos2d"  # fixed, MoCo v3's 2-D sin-cos (the plain-ViT paper)
  LEARN = "learn"        # learned, normal(1/sqrt(width)) (the original ViT)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """big_vision's ViT (models/vit.py `_Model`); sizes default to the variant's (None)."""

  variant: Variant = Variant.S16
  width: int | None = None
  depth: int | None = None
  mlp_dim: int | None = None
  num_heads: int | None = None
  patch_size: int = 16
  num_classes: int = 1000
  pool: Pool = Pool.GAP
  posemb: Posemb = Posemb.SINCOS2D
  pre_logits: bool = True   # rep_size=True: Dense(width) + tanh before the head
  dtype: DType = DType.FLOAT32
  # Which implementation computes attention (mlbench.train.attention): auto picks the fused
  # kernel the platform has where it can serve the shape (cuDNN on GPUs, Pallas on TPUs).
  attention: AttentionImpl = AttentionImpl.AUTO

  def __post_init__(self):
    at_least(self, 1, "patch_size", *(name for name in ("width", "depth", "mlp_dim", "num_heads")
                                      if getattr(self, name) is not None))
    at_least(self, 2, "num_classes")
    width, _, _, heads = self.sizes()
    require(width % heads == 0, "num_heads", f"{heads} heads do not divide width ({width}); "
            f"set a divisor of {width}", "width")

  def sizes(self) -> tuple[int, int, int, int]:
    """(width, depth, MLP width, heads)."""
    w, d, m, h = SIZES[self.variant]
    return (self.width or w, self.depth or d, self.mlp_dim or m, self.num_heads or h)


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """ImageNet TFRecords (workloads.common.imagenet) with big_vision's preprocessing:
  `decode_jpeg_and_inception_crop(224)|flip_lr|randaug(2,10)|value_range(-1, 1)` for
  training, `decode|resize_small(256)|central_crop(224)|value_range(-1, 1)` for
  evaluation."""

  source: Source = Source.IMAGENET
  image_size: int = 224
  eval_resize: int = 256
  train_examples: int = 1_281_167
  eval_examples: int = 50_000
  label_offset: int = 1
  crop_area: tuple[float, float] = (0.05, 1.0)
  crop_aspect: tuple[float, float] = (0.75, 1.33)
  flip: bool = True
  randaug_layers: int = 2      # 0: no RandAugment
  randaug_magnitude: float = 10.0

  def __post_init__(self):
    image_records(self)
    at_least(self, 1, "image_size")
    at_least(self, 0, "randaug_layers", "randaug_magnitude")
    require(self.eval_resize >= self.image_size, "eval_resize",
            f"{self.eval_resize} is below image_size ({self.image_size}), which evaluation "
            "crops from it; set image_size or more", "image_size")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """big_vision/optax.py `make`: clip(1) -> scale_by_adam -> x lr -> + wd * w (kernels)
  -> x schedule (linear warmup, cosine to 0)."""

  learning_rate: float = 1e-3
  base_batch_size: int = 1024   # the batch learning_rate and warmup_steps are for
  lr_scaling: LrScaling = LrScaling.NONE
  warmup_steps: int = 10_000
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  mu_bfloat16: bool = True      # optax dict(mu_dtype='bfloat16')
  weight_decay: float = 1e-4    # decoupled: not multiplied by learning_rate
  grad_clip_norm: float = 1.0
  mixup_alpha: float = 0.2      # config.mixup p; 0: no Mixup

  def __post_init__(self):
    positive(self, "learning_rate", "eps", "grad_clip_norm")
    at_least(self, 1, "base_batch_size")
    at_least(self, 0, "warmup_steps", "weight_decay", "mixup_alpha")
    fraction(self, "b1", "b2")


@dataclasses.dataclass(frozen=True)
class ViTConfig(EpochConfig[ModelConfig, DataConfig, OptimizerConfig]):
  def __post_init__(self):
    super().__post_init__()
    size, patch = self.data.image_size, self.model.patch_size
    require(size % patch == 0, "model.patch_size", f"{patch} does not divide data.image_size "
            f"({size}) into a grid of patches; set a divisor of {size}")


def full() -> ViTConfig:
  """ViT-S/16, 90 epochs at batch 1024 (6-7 h on a TPU-v3-8, 76.5% top-1 per the config's
  docstring), bfloat16 activations and matmuls with float32 weights. big_vision trains on
  99% of the training split (the rest is its minival); here all of it is trained on and
  the 50,000 validation images are the evaluation set."""
  return ViTConfig(model=ModelConfig(dtype=DType.BFLOAT16), data=DataConfig(),
                   optimizer=OptimizerConfig(), global_batch_size=1024, eval_batch_size=1024,
                   train_epochs=90.0)


def mini() -> ViTConfig:
  """A 4-layer, 64-wide ViT with 8x8 patches (a 4x4 grid, each patch 2x2 of the
  original 8x8 pixels) on the digits (workloads.common.digits, stored at
  32x32): inception crops of at least 80% of the image resized to 32x32, no flip, Mixup
  0.2, Adam at 2e-3 after 40 warmup steps, cosine over 30 epochs. A ViT learns these
  1,257 images slowly; 4x4 patches (64 tokens) cost 12 times as much per epoch, and
  RandAugment, whose inversions and solarisations make one digit look like another at
  this size, holds it below 0.85 (tests/workloads/test_vit.py checks its operations)."""
  return ViTConfig(
      model=ModelConfig(width=64, depth=4, mlp_dim=128, num_heads=4, patch_size=8,
                        num_classes=10),
      data=DataConfig(source=Source.DIGITS, image_size=32, eval_resize=32, train_examples=1257,
                      eval_examples=540, crop_area=(0.8, 1.0), flip=False, randaug_layers=0),
      optimizer=OptimizerConfig(learning_rate=2e-3, base_batch_size=64, warmup_steps=40,
                                mu_bfloat16=False),
      global_batch_size=64,
      eval_batch_size=128,
      train_epochs=30.0,
  )
