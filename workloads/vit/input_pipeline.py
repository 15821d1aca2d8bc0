"""ImageNet TFRecords (`workloads.common.imagenet`: the files, and the digits of the mini
config) with big_vision's ViT preprocessing (big_vision/pp/ops_image.py).

Training, `decode_jpeg_and_inception_crop(224)|flip_lr|randaug(2,10)`: a crop of 5-100%
of the image with aspect 3/4-4/3 (`sample_distorted_bounding_box` without boxes or a
minimum coverage), fused decode-and-crop, bilinear resize (TF2 pixel centres, no
antialiasing) back to uint8, random flip, RandAugment. Evaluation,
`decode|resize_small(256)|central_crop(224)`: the shorter side to 256 by area
resampling, the central 224x224. Both end with `value_range(-1, 1)`. Mixup is applied
to whole batches in the train step. All randomness is stateless, seeded per example.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mlbench.train import data
from mlbench.workload import Split
from workloads.common import imagenet
from workloads.common.randaugment import randaugment
from workloads.vit.config import ViTConfig


def _to_uint8(image: Any) -> Any:
  tf = data.tf()
  return tf.cast(tf.clip_by_value(image, 0.0, 255.0), tf.uint8)


def _finish(cfg: ViTConfig, image: Any, features: dict[str, Any]) -> dict[str, Any]:
  """value_range(-1, 1) and the 0-based label."""
  tf = data.tf()
  size = cfg.data.image_size
  image = tf.reshape(tf.cast(image, tf.float32), [size, size, 3]) / 127.5 - 1.0
  label = tf.cast(features["image/class/label"], tf.int32) - cfg.data.label_offset
  return {"image": image, "label": label}


def decode(cfg: ViTConfig, split: Split):
  d = cfg.data

  def train(record: Any, seed: Any) -> dict[str, Any]:
    tf = data.tf()
    f = imagenet.parse_image(record)
    crop_seed, flip_seed, aug_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
    begin, crop, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.image.extract_jpeg_shape(f["image/encoded"]), tf.zeros([0, 0, 4], tf.float32),
        seed=crop_seed, min_object_covered=0.0, aspect_ratio_range=list(d.crop_aspect),
        area_range=list(d.crop_area), use_image_if_no_bounding_boxes=True)
    window = tf.stack([begin[0], begin[1], crop[0], crop[1]])
    image = tf.image.decode_and_crop_jpeg(f["image/encoded"], window, channels=3)
    image = _to_uint8(tf.image.resize(image, [d.image_size, d.image_size], method="bilinear"))
    if d.flip:
      image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
    if d.randaug_layers:
      image = randaugment(image, aug_seed, num_layers=d.randaug_layers,
                          magnitude=d.randaug_magnitude)
    return _finish(cfg, image, f)

  def evaluate(record: Any, seed: Any) -> dict[str, Any]:
    del seed  # Evaluation is deterministic.
    tf = data.tf()
    f = imagenet.parse_image(record)
    image = tf.io.decode_jpeg(f["image/encoded"], channels=3)
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    hw = tf.cast(tf.round(shape * d.eval_resize / tf.reduce_min(shape)), tf.int32)
    image = _to_uint8(tf.image.resize(image, hw, method="area"))
    top, left = (hw[0] - d.image_size) // 2, (hw[1] - d.image_size) // 2
    image = tf.image.crop_to_bounding_box(image, top, left, d.image_size, d.image_size)
    return _finish(cfg, image, f)

  return train if split is Split.TRAIN else evaluate


def synthetic_batch(cfg: ViTConfig, split: Split, batch_size: int,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
  """Images in [-1, 1] and uniform labels, shaped like `decode`'s output."""
  del split
  size = cfg.data.image_size
  return {"image": rng.uniform(-1, 1, (batch_size, size, size, 3)).astype(np.float32),
          "label": rng.integers(0, cfg.model.num_classes, (batch_size,)).astype(np.int32)}
