"""ImageNet TFRecords (`workloads.common.imagenet`: the schema, the files, the digits of
the mini config), decoded with the MLPerf reference preprocessing. Training: a crop
sampled around the record's boxes (`image/object/bbox/*`; `sample_distorted_bounding_box`,
min. 10% of the box covered), fused decode-and-crop, random flip, bilinear resize;
evaluation: aspect-preserving resize of the shorter side, central crop. Then the mean
(and stddev) per channel, and, for `model.stem=space_to_depth`, 2x2 blocks of pixels folded
into channels ([112, 112, 12] at 224), as Google's TPU submissions do on the host. The mini
config's digits use exactly this code with other values. All randomness is stateless,
seeded per example by the harness.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mlbench.train import data
from mlbench.workload import Split
from workloads.common import conv
from workloads.resnet50.config import ResNetConfig

_BOX_KEYS = ("image/object/bbox/ymin", "image/object/bbox/xmin",
             "image/object/bbox/ymax", "image/object/bbox/xmax")


def _parse(record: Any) -> dict[str, Any]:
  tf = data.tf()
  spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
          "image/class/label": tf.io.FixedLenFeature([], tf.int64)}
  spec.update({k: tf.io.VarLenFeature(tf.float32) for k in _BOX_KEYS})
  return tf.io.parse_single_example(record, spec)


def _normalize(cfg: ResNetConfig, image: Any) -> Any:
  """The model's input: the mean (and stddev) per channel, in the stem's layout."""
  tf = data.tf()
  size = cfg.data.image_size
  image = tf.reshape(tf.cast(image, tf.float32), [size, size, 3])
  image = (image - tf.constant(cfg.data.mean_rgb)) / tf.constant(cfg.data.stddev_rgb)
  return conv.to_stem_input(cfg.model.stem, image)


def _resize(image: Any, height: Any, width: Any) -> Any:
  # The reference's resize: bilinear, align_corners=False, TF1 pixel centers.
  tf = data.tf()
  return tf.compat.v1.image.resize(image, [height, width],
                                   method=tf.image.ResizeMethod.BILINEAR, align_corners=False)


def _label(cfg: ResNetConfig, features: dict[str, Any]) -> Any:
  tf = data.tf()
  return tf.cast(features["image/class/label"], tf.int32) - cfg.data.label_offset


def decode_train(cfg: ResNetConfig):
  def decode(record: Any, seed: Any) -> dict[str, Any]:
    tf = data.tf()
    f = _parse(record)
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    boxes = tf.stack([f[k].values for k in _BOX_KEYS], axis=-1)[tf.newaxis]  # [1, N, 4]
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.image.extract_jpeg_shape(f["image/encoded"]), boxes, seed=crop_seed,
        min_object_covered=0.1, aspect_ratio_range=list(cfg.data.crop_aspect),
        area_range=list(cfg.data.crop_area), max_attempts=100,
        use_image_if_no_bounding_boxes=True)
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    image = tf.image.decode_and_crop_jpeg(f["image/encoded"], window, channels=3)
    if cfg.data.flip:
      image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
    image = _resize(image, cfg.data.image_size, cfg.data.image_size)
    return {"image": _normalize(cfg, image), "label": _label(cfg, f)}

  return decode


def decode_eval(cfg: ResNetConfig):
  def decode(record: Any, seed: Any) -> dict[str, Any]:
    del seed  # Evaluation is deterministic.
    tf = data.tf()
    f = _parse(record)
    image = tf.io.decode_jpeg(f["image/encoded"], channels=3)
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    scale = cfg.data.eval_resize / tf.reduce_min(shape)
    hw = tf.cast(shape * scale, tf.int32)
    image = _resize(image, hw[0], hw[1])
    size = cfg.data.image_size
    top, left = (hw[0] - size) // 2, (hw[1] - size) // 2
    image = tf.slice(image, [top, left, 0], [size, size, 3])
    return {"image": _normalize(cfg, image), "label": _label(cfg, f)}

  return decode


def decode(cfg: ResNetConfig, split: Split):
  return decode_train(cfg) if split is Split.TRAIN else decode_eval(cfg)


def synthetic_batch(cfg: ResNetConfig, split: Split, batch_size: int,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
  """Normalised-looking random images (in the stem's layout) and uniform labels, shaped
  like `decode`'s output."""
  del split
  size = cfg.data.image_size
  image = rng.standard_normal((batch_size, size, size, 3)).astype(np.float32)
  if cfg.model.stem is conv.Stem.SPACE_TO_DEPTH:
    image = conv.space_to_depth(image)
  return {"image": image,
          "label": rng.integers(0, cfg.model.num_classes, (batch_size,)).astype(np.int32)}
