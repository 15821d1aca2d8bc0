"""SSD configs: `full` (SSD-ResNet-34 at 300x300 on COCO, MLPerf 0.7.0) and `mini` (digit scenes, CPU).

Run either with `mlbench run ssd --config full|mini`; edit any field with
`--set optimizer.base_learning_rate=0.2`. This module imports nothing heavy.

Sources for the full config: the MLPerf training reference
(mlcommons/training single_stage_detector/ssd: `ssd300.py`, `base_model.py`,
`utils.py`, `train.py`, the 0.6/0.7 version kept under retired_benchmarks/) and
Google's v0.7 JAX submission (training_results_v0.7 Google/benchmarks/ssd:
`ssd_constants.py`, `tpu-v3-4096-JAX/run_and_time.sh`).
"""

from __future__ import annotations

import dataclasses
import enum

from mlbench.fields import DType, EpochConfig, at_least, fraction, positive, require, same_length
# The ResNet stem: IMAGENET (7x7/2 convolution, 3x3/2 max pool, torchvision's ResNet-34 here),
# SPACE_TO_DEPTH (the same over 2x2 blocks of pixels folded into channels) or SMALL (3x3/1
# convolution, no pool, for tiny images); workloads.common.blocks builds it.
from workloads.common.conv import Stem, check_stem_input


class Source(enum.Enum):
  """Where the TFRecords come from."""

  COCO = "coco"      # COCO 2017 via create_coco_tf_record.py (supplied by you).
  DIGITS = "digits"  # Scenes of scikit-learn's handwritten digits, written by mlbench.


SCENE_SIZE = 32
"""Side of the digit scenes the mini config reads (`scenes.py`)."""


# COCO 2017's 80 category ids in the order of the reference's contiguous labels 1..80
# (Google's ssd_constants.CLASS_INV_MAP without its leading background 0).
COCO_CATEGORY_IDS = (
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 27,
    28, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 46, 47, 48, 49, 50, 51, 52, 53,
    54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 67, 70, 72, 73, 74, 75, 76, 77, 78, 79, 80,
    81, 82, 84, 85, 86, 87, 88, 89, 90)


@dataclasses.dataclass(frozen=True)
class AnchorConfig:
  """Default boxes, as the reference's `DefaultBoxes` builds them (pixels of the input).

  Feature map k has `feature_sizes[k]`^2 cells `steps[k]` pixels apart; each cell
  has boxes of side scales[k], sqrt(scales[k] * scales[k+1]), and scales[k] with
  every aspect ratio r and 1/r. The defaults give the reference's 8,732 boxes.
  """

  feature_sizes: tuple[int, ...] = (38, 19, 10, 5, 3, 1)
  steps: tuple[int, ...] = (8, 16, 32, 64, 100, 300)
  scales: tuple[int, ...] = (21, 45, 99, 153, 207, 261, 315)
  aspect_ratios: tuple[tuple[int, ...], ...] = ((2,), (2, 3), (2, 3), (2, 3), (2,), (2,))
  scale_xy: float = 0.1        # box coder: centre offsets are divided by this
  scale_wh: float = 0.2        # box coder: log size ratios are divided by this
  match_threshold: float = 0.5  # IoU above which a default box takes a ground-truth box

  def __post_init__(self):
    same_length(self, "feature_sizes", "steps", "aspect_ratios")
    require(len(self.scales) == len(self.feature_sizes) + 1, "scales",
            f"has {len(self.scales)} entries; give one per feature map and one more "
            f"({len(self.feature_sizes) + 1})", "feature_sizes")
    positive(self, "scale_xy", "scale_wh")
    require(0 < self.match_threshold <= 1, "match_threshold",
            f"{self.match_threshold} is not in (0, 1]")

  @property
  def boxes_per_cell(self) -> tuple[int, ...]:
    return tuple(2 + 2 * len(r) for r in self.aspect_ratios)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """SSD on a truncated ResNet (BasicBlocks), extra feature layers, 3x3 heads.

  The defaults are the reference's SSD300: ResNet-34 up to conv4_x, with the
  first block of conv4_x at stride 1 (38x38 features at 300x300), then five
  extra layers (1x1 conv, ReLU, 3x3 conv, ReLU; with biases and no batch norm),
  and 3x3 location and class heads on all six feature maps.
  """

  # space_to_depth (Google's v0.7 SSD: conv0_space_to_depth) is not the default: XLA's v4-128
  # estimate of the step is 0.1% slower at 300x300 (benchmarks/space_to_depth.py).
  stem: Stem = Stem.IMAGENET
  stage_sizes: tuple[int, ...] = (3, 4, 6)          # conv2_x .. conv4_x; conv5_x is dropped
  stage_widths: tuple[int, ...] = (64, 128, 256)
  stage_strides: tuple[int, ...] = (1, 2, 1)        # conv4_x's stride 2 becomes 1
  extra_widths: tuple[int, ...] = (256, 256, 128, 128, 128)   # the 1x1 convolutions
  extra_channels: tuple[int, ...] = (512, 512, 256, 256, 256)  # the 3x3 convolutions
  extra_strides: tuple[int, ...] = (2, 2, 2, 1, 1)  # stride 2: padded; stride 1: unpadded
  num_classes: int = 81                             # with background (class 0)
  bn_momentum: float = 0.9
  bn_epsilon: float = 1e-5
  dtype: DType = DType.FLOAT32  # activations and convolutions; parameters stay float32

  def __post_init__(self):
    same_length(self, "stage_sizes", "stage_widths", "stage_strides")
    same_length(self, "extra_widths", "extra_channels", "extra_strides")
    require(len(self.stage_sizes) > 0 and min(self.stage_sizes) >= 1, "stage_sizes",
            f"{self.stage_sizes}: give each stage 1 or more blocks")
    at_least(self, 2, "num_classes")
    fraction(self, "bn_momentum")

  def feature_sizes(self, image_size: int) -> tuple[int, ...]:
    """Sides of the feature maps the heads see, for square images of `image_size`."""
    size = image_size
    # The ImageNet stem's 7x7/2 convolution and 3x3/2 max pool, then each stage's first
    # block: padded, so each divides the size by its stride, rounding up.
    for stride in self.stem.strides + self.stage_strides:
      size = -(-size // stride)
    sizes = [size]
    for stride in self.extra_strides:  # stride 2: padded; stride 1: an unpadded 3x3
      sizes.append(-(-sizes[-1] // stride) if stride > 1 else sizes[-1] - 2)
    return tuple(sizes)


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """The COCO TFRecord schema and the reference's augmentation."""

  source: Source = Source.COCO
  image_size: int = 300
  train_examples: int = 117_266  # train2017 images with at least one annotation (reference)
  eval_examples: int = 4_952     # val2017 images with at least one annotation (reference)
  max_boxes: int = 100           # ground-truth boxes per image, padded (more is an error in eval)
  category_ids: tuple[int, ...] = COCO_CATEGORY_IDS  # `image/object/class/label` -> 1..K-1
  crop: bool = True              # the reference's SSD random crop
  crop_tries: int = 1            # windows tried per crop mode (`max_samples`; 1 or 50)
  flip: bool = True
  color_jitter: bool = True      # brightness 0.125, contrast 0.5, saturation 0.5, hue 0.05
  mean_rgb: tuple[float, float, float] = (0.485, 0.456, 0.406)  # on a 0..1 scale
  stddev_rgb: tuple[float, float, float] = (0.229, 0.224, 0.225)

  def __post_init__(self):
    at_least(self, 1, "image_size", "train_examples", "eval_examples", "max_boxes",
             "crop_tries")
    require(self.source is not Source.DIGITS or self.image_size == SCENE_SIZE, "image_size",
            f"{self.image_size}: the digit scenes are {SCENE_SIZE}x{SCENE_SIZE}; set "
            f"{SCENE_SIZE}")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """SGD with momentum and L2 weight decay on every parameter; the MLPerf warmup; step decay."""

  base_learning_rate: float = 0.1536  # logged peak rate: 1.2e-3 per 32 images x 4096 / 32
  momentum: float = 0.9
  weight_decay: float = 5e-4
  warmup_epochs: float = 26.0
  warmup_factor: int = 0              # lr starts at base * (1 - 2^-factor) (0: from zero)
  decay_boundary_epochs: tuple[float, ...] = (64.0, 80.0)
  decay_factor: float = 0.1

  def __post_init__(self):
    positive(self, "base_learning_rate")
    at_least(self, 0, "weight_decay", "warmup_epochs", "warmup_factor")
    fraction(self, "momentum")
    require(list(self.decay_boundary_epochs) == sorted(self.decay_boundary_epochs),
            "decay_boundary_epochs", f"{self.decay_boundary_epochs} is not in increasing order")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Box decoding and per-class non-maximum suppression (the reference's `decode_batch`)."""

  score_threshold: float = 0.05   # candidates must score above this
  nms_iou: float = 0.5            # a box suppresses lower-scored boxes of its class at IoU >= this
  candidates_per_class: int = 200  # highest-scored boxes per class that enter NMS
  max_detections: int = 200        # kept per image, highest scores over all classes

  def __post_init__(self):
    at_least(self, 1, "candidates_per_class", "max_detections")
    positive(self, "nms_iou")  # above 1: no suppression at all


@dataclasses.dataclass(frozen=True)
class SSDConfig(EpochConfig[ModelConfig, DataConfig, OptimizerConfig]):
  anchors: AnchorConfig = AnchorConfig()
  eval: EvalConfig = EvalConfig()
  # torchvision's ImageNet ResNet-34 as .npz (`python -m workloads.ssd.backbone`), which
  # the reference starts from (ssd-v1 base_model.py L58-61); "": random backbone.
  backbone_weights: str = ""

  def __post_init__(self):
    super().__post_init__()
    check_stem_input(self.model.stem, self.data.image_size)
    classes = len(self.data.category_ids) + 1
    require(self.model.num_classes == classes, "model.num_classes",
            f"{self.model.num_classes} is not data.category_ids and the background "
            f"({classes}); set {classes}")
    sizes = self.model.feature_sizes(self.data.image_size)
    require(sizes == tuple(self.anchors.feature_sizes), "anchors.feature_sizes",
            f"{self.anchors.feature_sizes} are not the model's feature maps for "
            f"data.image_size {self.data.image_size} ({sizes}); set {','.join(map(str, sizes))}")


def full() -> SSDConfig:
  """SSD-ResNet-34 at 300x300 on COCO 2017, MLPerf training 0.7.0 (target mAP 0.23).

  Model, default boxes, box coder, loss, augmentation and evaluation follow the
  reference; the batch and schedule are Google's v0.7 submission on a TPU-v3
  pod (tpu-v3-4096-JAX run_and_time.sh): global batch 4096, 1.2e-3 per 32
  images, 26 warmup epochs, decay at epochs 64 and 80, weight decay 5e-4,
  momentum 0.9, batch-norm groups of 16 devices
  (`--bn-group-size 16`), 120 epochs; the reference's single crop try per mode
  (`max_samples` 1). Activations and convolutions in bfloat16 (parameters, optimizer
  and batch-norm statistics float32), as that submission trains.
  """
  return SSDConfig(model=ModelConfig(dtype=DType.BFLOAT16), data=DataConfig(),
                   optimizer=OptimizerConfig(), global_batch_size=4096, eval_batch_size=1024,
                   train_epochs=120.0)


def mini() -> SSDConfig:
  """A small SSD on 32x32 scenes of 1-3 real handwritten digits (scikit-learn's),
  scaled to 8-16 px and placed at random, with exact boxes; 6,000 training scenes
  and 500 evaluation scenes built from disjoint glyphs, written as COCO-schema
  TFRecords and read by the same pipeline. A 3-stage ResNet (16-64 channels) with
  feature maps of 8x8, 4x4 and 2x2 and 336 default boxes sized to the digits; the
  reference's loss, matching, box coder and NMS; no crop (the scenes already vary
  scale and place), no flip (a mirrored 2 is no 2), no colour jitter (grey scenes).
  SGD at 0.1 (batch 64) decays 10x after 3 epochs; epoch 4 then scores COCO mAP
  0.69-0.70 (AP50 0.94) on seeds 0-2 and 1 or 8 devices, over the mini target of
  0.65, which no earlier epoch reaches (<= 0.55): 55-60 s to target on a 2-core
  CPU shared with other work, up to 100 s under heavy load.
  """
  return SSDConfig(
      model=ModelConfig(stem=Stem.SMALL, stage_sizes=(1, 1, 1), stage_widths=(16, 32, 64),
                        stage_strides=(2, 2, 1), extra_widths=(32, 32),
                        extra_channels=(64, 64), extra_strides=(2, 2), num_classes=11),
      anchors=AnchorConfig(feature_sizes=(8, 4, 2), steps=(4, 8, 16), scales=(8, 12, 18, 26),
                           aspect_ratios=((2,), (2,), (2,))),
      data=DataConfig(source=Source.DIGITS, image_size=32, train_examples=6000,
                      eval_examples=500, max_boxes=4, category_ids=tuple(range(1, 11)),
                      crop=False, flip=False, color_jitter=False),
      optimizer=OptimizerConfig(base_learning_rate=0.1, warmup_epochs=0.5,
                                decay_boundary_epochs=(3.0, 5.0)),
      eval=EvalConfig(candidates_per_class=20, max_detections=50),
      global_batch_size=64,
      eval_batch_size=256,
      train_epochs=10.0,
  )
