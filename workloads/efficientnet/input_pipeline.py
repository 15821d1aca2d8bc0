"""ImageNet TFRecords (`workloads.common.imagenet`: the files, and the digits of the mini
config) with EfficientNet's preprocessing (tensorflow/tpu models/official/efficientnet
preprocessing.py).

Training: `sample_distorted_bounding_box` over the whole image (the record's boxes
are not used; at least 10% of it, area 8-100%, aspect 3/4-4/3, 10 attempts), fused
decode-and-crop, falling back to the evaluation crop when no attempt succeeded;
bicubic resize to the variant's resolution; random flip. Evaluation: the central
square of `crop_fraction` of the shorter side (224 of 256), bicubic resize. Then the
ImageNet mean and standard deviation per channel (the model's input normalisation).
All randomness is stateless, seeded per example by the harness.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mlbench.train import data
from mlbench.workload import Split
from workloads.common import imagenet
from workloads.efficientnet.config import EfficientNetConfig


def _resize(image: Any, size: int) -> Any:
  # The reference's tf.image.resize_bicubic: TF1 pixel centers, no antialiasing.
  tf = data.tf()
  return tf.compat.v1.image.resize(image, [size, size], method=tf.image.ResizeMethod.BICUBIC,
                                   align_corners=False)


def _center_crop(cfg: EfficientNetConfig, encoded: Any) -> Any:
  """`_decode_and_center_crop`: a square of size / (size + padding) of the shorter side,
  padding = round(size * (1 / crop_fraction - 1)), decoded and resized."""
  tf = data.tf()
  size = cfg.image_size
  shape = tf.image.extract_jpeg_shape(encoded)
  padding = round(size * (1 / cfg.data.crop_fraction - 1))
  side = tf.cast(size / (size + padding) * tf.cast(tf.minimum(shape[0], shape[1]), tf.float32),
                 tf.int32)
  window = tf.stack([(shape[0] - side + 1) // 2, (shape[1] - side + 1) // 2, side, side])
  return _resize(tf.image.decode_and_crop_jpeg(encoded, window, channels=3), size)


def _random_crop(cfg: EfficientNetConfig, encoded: Any, seed: Any) -> Any:
  """`_decode_and_random_crop`: the Inception crop, or the central crop where every
  attempt failed (the sampled box is then the whole image)."""
  tf = data.tf()
  shape = tf.image.extract_jpeg_shape(encoded)
  begin, crop, _ = tf.image.stateless_sample_distorted_bounding_box(
      shape, tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=seed, min_object_covered=0.1,
      aspect_ratio_range=list(cfg.data.crop_aspect), area_range=list(cfg.data.crop_area),
      max_attempts=cfg.data.crop_attempts, use_image_if_no_bounding_boxes=True)
  window = tf.stack([begin[0], begin[1], crop[0], crop[1]])
  image = tf.image.decode_and_crop_jpeg(encoded, window, channels=3)
  whole = tf.reduce_sum(tf.cast(tf.equal(shape, tf.shape(image)), tf.int32)) >= 3
  return tf.cond(whole, lambda: _center_crop(cfg, encoded),
                 lambda: _resize(image, cfg.image_size))


def _finish(cfg: EfficientNetConfig, image: Any, features: dict[str, Any]) -> dict[str, Any]:
  tf = data.tf()
  size = cfg.image_size
  image = tf.reshape(tf.cast(image, tf.float32), [size, size, 3])
  image = (image - tf.constant(cfg.data.mean_rgb)) / tf.constant(cfg.data.stddev_rgb)
  label = tf.cast(features["image/class/label"], tf.int32) - cfg.data.label_offset
  return {"image": image, "label": label}


def decode(cfg: EfficientNetConfig, split: Split):
  def train(record: Any, seed: Any) -> dict[str, Any]:
    tf = data.tf()
    f = imagenet.parse_image(record)
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    image = _random_crop(cfg, f["image/encoded"], crop_seed)
    if cfg.data.flip:
      image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
    return _finish(cfg, image, f)

  def evaluate(record: Any, seed: Any) -> dict[str, Any]:
    del seed  # Evaluation is deterministic.
    f = imagenet.parse_image(record)
    return _finish(cfg, _center_crop(cfg, f["image/encoded"]), f)

  return train if split is Split.TRAIN else evaluate


def synthetic_batch(cfg: EfficientNetConfig, split: Split, batch_size: int,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
  """Normalised-looking random images and uniform labels, shaped like `decode`'s output."""
  del split
  size = cfg.image_size
  return {"image": rng.standard_normal((batch_size, size, size, 3)).astype(np.float32),
          "label": rng.integers(0, cfg.model.num_classes, (batch_size,)).astype(np.int32)}
