"""COCO TFRecords, decoded with the MLPerf SSD reference's preprocessing.

Schema (the TensorFlow object detection API's create_coco_tf_record.py):
`image/encoded` (JPEG), `image/height`, `image/width`, `image/source_id` (the
COCO image id, as text), `image/object/bbox/{xmin,ymin,xmax,ymax}` (normalised),
`image/object/class/label` (COCO category ids), `image/object/is_crowd`,
`image/object/area`; files `coco_train.record-*` / `train-*` and
`coco_val.record-*` / `val-*`. The mini config's digit scenes use this schema
and this code.

Images without annotations are not part of either set (`keep`), as in the
reference. Training (the reference's `SSDTransformer`): crowd boxes kept; the SSD
random crop; random horizontal flip; resize to the input size; colour jitter;
ImageNet mean and stddev. Evaluation: resize only, and every ground-truth box
(crowd ones too) with its area, the image id and the original size, so that
the COCO evaluation can be built from the evaluation batches on any number of
hosts. Default-box matching happens on the device (`boxes.match_batch`). All
randomness is stateless, seeded per example by the harness.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mlbench.storage import paths
from mlbench.train import data
from mlbench.workload import Split
from workloads.common import conv
from workloads.ssd.config import SSDConfig, Source

DIGITS_DIR = "ssd-digit-scenes"
GLOBS = {Split.TRAIN: ("coco_train.record-*", "train-*"),
         Split.EVAL: ("coco_val.record-*", "val-*")}
_BOX_KEYS = ("image/object/bbox/xmin", "image/object/bbox/ymin",
             "image/object/bbox/xmax", "image/object/bbox/ymax")
# The reference's crop modes: None (keep the image), then minimum IoUs; -inf: no constraint.
_CROP_MIN_IOU = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, -np.inf)
_CROP_PASSES = 50  # Bounds the reference's `while True` over modes; P(no decision) < 1e-3.


def dataset_dir(cfg: SSDConfig, data_dir: Path) -> Path:
  return data_dir / DIGITS_DIR if cfg.data.source is Source.DIGITS else data_dir


def files(cfg: SSDConfig, data_dir: Path, split: Split) -> list[str]:
  return data.find_files(
      dataset_dir(cfg, paths.path(data_dir)), GLOBS[split],
      generated=cfg.data.source is Source.DIGITS,
      supplied="point --data-dir at COCO 2017 TFRecords written by create_coco_tf_record.py")


def _parse(record: Any) -> dict[str, Any]:
  tf = data.tf()
  spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
          "image/source_id": tf.io.FixedLenFeature([], tf.string, default_value="0"),
          "image/object/class/label": tf.io.VarLenFeature(tf.int64),
          "image/object/is_crowd": tf.io.VarLenFeature(tf.int64),
          "image/object/area": tf.io.VarLenFeature(tf.float32)}
  spec.update({k: tf.io.VarLenFeature(tf.float32) for k in _BOX_KEYS})
  f = tf.io.parse_single_example(record, spec)
  return {k: v.values if isinstance(v, tf.sparse.SparseTensor) else v for k, v in f.items()}


def keep(cfg: SSDConfig, split: Split):
  """Images with at least one annotation, crowd ones included: the reference's
  COCODetection drops the others from both sets (retired_benchmarks/ssd-v1/ssd/
  utils.py L545-555), leaving 117,266 of train2017's 118,287 images and 4,952 of
  val2017's 5,000, the sizes it logs (train.py L239-240)."""
  del cfg, split
  tf = data.tf()

  def has_boxes(record: Any) -> Any:
    labels = tf.io.parse_single_example(
        record, {"image/object/class/label": tf.io.VarLenFeature(tf.int64)})
    return tf.size(labels["image/object/class/label"].values) > 0

  return has_boxes


def _objects(cfg: SSDConfig, f: dict[str, Any], hw: Any) -> dict[str, Any]:
  """Boxes [N, 4] (ltrb), classes 1..K-1 (0: a category the config does not know),
  crowd flags and areas (in pixels; the box area where the record has none)."""
  tf = data.tf()
  boxes = tf.stack([f[k] for k in _BOX_KEYS], axis=-1)
  ids = f["image/object/class/label"]
  table = np.zeros(max(cfg.data.category_ids) + 1, np.int32)
  table[list(cfg.data.category_ids)] = np.arange(1, len(cfg.data.category_ids) + 1)
  known = (ids >= 0) & (ids < len(table))
  classes = tf.where(known, tf.gather(table, tf.clip_by_value(ids, 0, len(table) - 1)), 0)
  n = tf.shape(ids)[0]
  crowd = tf.cast(f["image/object/is_crowd"], tf.int32)
  crowd = tf.cond(tf.shape(crowd)[0] == n, lambda: crowd, lambda: tf.zeros([n], tf.int32))
  size = tf.cast(tf.stack([hw[1], hw[0]]), tf.float32)
  box_area = tf.reduce_prod((boxes[:, 2:] - boxes[:, :2]) * size, axis=-1)
  area = f["image/object/area"]
  area = tf.cond(tf.shape(area)[0] == n, lambda: area, lambda: box_area)
  return {"boxes": boxes, "classes": classes, "crowd": crowd, "area": area}


def _pad(x: Any, size: int) -> Any:
  tf = data.tf()
  x = x[:size]
  pad = [[0, size - tf.shape(x)[0]]] + [[0, 0]] * (len(x.shape) - 1)
  return tf.pad(x, pad)


def _normalize(cfg: SSDConfig, image: Any) -> Any:
  """uint8 or 0..255 float image -> resized, scaled to 0..1, mean and stddev removed."""
  tf = data.tf()
  size = cfg.data.image_size
  image = tf.image.resize(tf.cast(image, tf.float32), [size, size], method="bilinear")
  return _standardize(cfg, image / 255.0)


def _standardize(cfg: SSDConfig, image: Any) -> Any:
  """The model's input: mean and stddev removed, in the stem's layout (2x2 blocks of pixels
  folded into channels for model.stem=space_to_depth, [150, 150, 12] at 300)."""
  tf = data.tf()
  image = tf.reshape(image, [cfg.data.image_size, cfg.data.image_size, 3])
  image = (image - tf.constant(cfg.data.mean_rgb)) / tf.constant(cfg.data.stddev_rgb)
  return conv.to_stem_input(cfg.model.stem, image)


def _pairwise_iou(a_N4: Any, b_M4: Any) -> Any:
  tf = data.tf()
  lt = tf.maximum(a_N4[:, None, :2], b_M4[None, :, :2])
  rb = tf.minimum(a_N4[:, None, 2:], b_M4[None, :, 2:])
  inter = tf.reduce_prod(tf.maximum(rb - lt, 0.0), axis=-1)
  area_a = tf.reduce_prod(a_N4[:, 2:] - a_N4[:, :2], axis=-1)
  area_b = tf.reduce_prod(b_M4[:, 2:] - b_M4[:, :2], axis=-1)
  return inter / tf.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-12)


def choose_crop(boxes_N4: Any, seed: Any, tries: int) -> tuple[Any, Any]:
  """The reference's SSD crop decision (`SSDCropping`), vectorised and stateless.

  A pass picks a mode uniformly: keep the image, or crop with every box's IoU
  above 0.1, 0.3, 0.5, 0.7 or 0.9, or crop without an IoU constraint. A crop
  mode samples up to `tries` windows (sides 0.3..1 of the image, aspect
  0.5..2) and takes the first whose IoU with every box passes and that holds
  at least one box centre. The first pass that keeps the image or finds a
  window decides; `_CROP_PASSES` passes bound the reference's endless loop.

  Returns:
    (do_crop, window): a bool, and (left, top, right, bottom) normalised.
  """
  tf = data.tf()
  shape = [_CROP_PASSES, tries]
  s = tf.unstack(tf.random.experimental.stateless_split(seed, 5))
  mode_P = tf.random.stateless_uniform([_CROP_PASSES], s[0], 0, len(_CROP_MIN_IOU), tf.int32)
  w = tf.random.stateless_uniform(shape, s[1], 0.3, 1.0)
  h = tf.random.stateless_uniform(shape, s[2], 0.3, 1.0)
  left = tf.random.stateless_uniform(shape, s[3]) * (1.0 - w)
  top = tf.random.stateless_uniform(shape, s[4]) * (1.0 - h)
  window_Q4 = tf.reshape(tf.stack([left, top, left + w, top + h], axis=-1), [-1, 4])
  min_iou_P = tf.gather(tf.constant(_CROP_MIN_IOU, tf.float32), mode_P)
  iou_PTN = tf.reshape(_pairwise_iou(window_Q4, boxes_N4), shape + [-1])
  iou_ok = tf.reduce_all(iou_PTN > min_iou_P[:, None, None], axis=-1)
  centre_N2 = (boxes_N4[:, :2] + boxes_N4[:, 2:]) / 2
  lt, rb = window_Q4[:, None, :2], window_Q4[:, None, 2:]
  inside = tf.reduce_all((centre_N2[None] > lt) & (centre_N2[None] < rb), axis=-1)
  any_inside = tf.reshape(tf.reduce_any(inside, axis=-1), shape)
  ratio = w / h
  ok_PT = iou_ok & any_inside & (ratio >= 0.5) & (ratio <= 2.0) & (mode_P[:, None] > 0)
  found_P = tf.reduce_any(ok_PT, axis=-1)
  decided_P = found_P | tf.equal(mode_P, 0)
  first_pass = tf.argmax(tf.cast(decided_P, tf.int32), output_type=tf.int32)
  first_try = tf.argmax(tf.cast(ok_PT[first_pass], tf.int32), output_type=tf.int32)
  do_crop = tf.reduce_any(decided_P) & found_P[first_pass]
  return do_crop, tf.reshape(window_Q4, shape + [4])[first_pass, first_try]


def _crop(image: Any, objects: dict[str, Any], window: Any) -> tuple[Any, dict[str, Any]]:
  """Crops to `window` (pixel edges truncated, as the reference's PIL crop), keeps the
  boxes whose centre is inside, clips them to the window and renormalises them."""
  tf = data.tf()
  hw = tf.cast(tf.shape(image)[:2], tf.float32)
  left, top, right, bottom = tf.unstack(window)
  x0, x1 = tf.cast(left * hw[1], tf.int32), tf.cast(right * hw[1], tf.int32)
  y0, y1 = tf.cast(top * hw[0], tf.int32), tf.cast(bottom * hw[0], tf.int32)
  image = tf.image.crop_to_bounding_box(image, y0, x0, tf.maximum(y1 - y0, 1),
                                        tf.maximum(x1 - x0, 1))
  boxes = objects["boxes"]
  centre = (boxes[:, :2] + boxes[:, 2:]) / 2
  keep = tf.reduce_all((centre > window[:2]) & (centre < window[2:]), axis=-1)
  boxes = tf.clip_by_value(tf.boolean_mask(boxes, keep), tf.tile(window[:2], [2]),
                           tf.tile(window[2:], [2]))
  boxes = (boxes - tf.tile(window[:2], [2])) / tf.tile(window[2:] - window[:2], [2])
  return image, {"boxes": boxes, "classes": tf.boolean_mask(objects["classes"], keep)}


_LUMA = (0.299, 0.587, 0.114)  # PIL's convert("L"), ITU-R 601-2


def _blend(degenerate: Any, image: Any, factor: Any) -> Any:
  """PIL's Image.blend(degenerate, image, factor), clipped to the 0..1 range."""
  tf = data.tf()
  return tf.clip_by_value(degenerate + factor * (image - degenerate), 0.0, 1.0)


def _luma(image: Any) -> Any:
  tf = data.tf()
  return tf.reduce_sum(image * tf.constant(_LUMA), axis=-1, keepdims=True)


def jitter_ops() -> list:
  """torchvision's adjust_brightness, _contrast, _saturation and _hue on a 0..1 image
  (each `(image, factor) -> image`), as the reference's PIL images get them:
  ImageEnhance.Brightness blends with black, Contrast with the image's mean grey
  level (a single value, rounded to a whole 8-bit level), Color with the image's
  own grey version; hue shifts the HSV hue by a fraction of the circle."""
  tf = data.tf()

  def contrast(image, f):
    mean = tf.floor(tf.reduce_mean(_luma(image)) * 255.0 + 0.5) / 255.0
    return _blend(tf.fill(tf.shape(image), mean), image, f)

  return [lambda image, f: _blend(tf.zeros_like(image), image, f),
          contrast,
          lambda image, f: _blend(tf.broadcast_to(_luma(image), tf.shape(image)), image, f),
          lambda image, f: tf.clip_by_value(tf.image.adjust_hue(image, f), 0.0, 1.0)]


def jitter_order(seed: Any) -> Any:
  """A uniformly random order of the four adjustments: torchvision's ColorJitter
  shuffles them on every call (`random.shuffle(transforms)` in get_params)."""
  tf = data.tf()
  return tf.argsort(tf.random.stateless_uniform([4], seed))


def _jitter(image: Any, seed: Any) -> Any:
  """torchvision ColorJitter(brightness=0.125, contrast=0.5, saturation=0.5, hue=0.05)
  (retired_benchmarks/ssd-v1/ssd/utils.py L461-463) on a 0..1 image: the factors
  drawn from [1 - x, 1 + x] (hue: [-0.05, 0.05]), applied in a random order."""
  tf = data.tf()
  s = tf.unstack(tf.random.experimental.stateless_split(seed, 5))
  factors = tf.stack([tf.random.stateless_uniform([], s[0], 0.875, 1.125),
                      tf.random.stateless_uniform([], s[1], 0.5, 1.5),
                      tf.random.stateless_uniform([], s[2], 0.5, 1.5),
                      tf.random.stateless_uniform([], s[3], -0.05, 0.05)])
  ops, order = jitter_ops(), jitter_order(s[4])
  for i in range(4):
    k = order[i]
    image = tf.switch_case(k, [lambda op=op, x=image, f=factors[k]: op(x, f) for op in ops])
  return image


def decode_train(cfg: SSDConfig):
  d = cfg.data

  def decode(record: Any, seed: Any) -> dict[str, Any]:
    tf = data.tf()
    f = _parse(record)
    image = tf.io.decode_jpeg(f["image/encoded"], channels=3)
    objects = _objects(cfg, f, tf.shape(image)[:2])
    # Crowd boxes train like any other: the reference's COCODetection reads every
    # annotation without looking at iscrowd (utils.py L547-551).
    known = objects["classes"] > 0
    objects = {"boxes": tf.boolean_mask(objects["boxes"], known),
               "classes": tf.boolean_mask(objects["classes"], known)}
    crop_seed, flip_seed, jitter_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, 3))
    if d.crop:
      do_crop, window = choose_crop(objects["boxes"], crop_seed, d.crop_tries)
      image, objects = tf.cond(do_crop, lambda: _crop(image, objects, window),
                               lambda: (image, objects))
    boxes = objects["boxes"]
    if d.flip:
      flip = tf.random.stateless_uniform([], flip_seed) < 0.5
      image = tf.cond(flip, lambda: tf.image.flip_left_right(image), lambda: image)
      boxes = tf.cond(flip, lambda: tf.stack([1 - boxes[:, 2], boxes[:, 1], 1 - boxes[:, 0],
                                              boxes[:, 3]], axis=-1), lambda: boxes)
    size = d.image_size
    image = tf.image.resize(tf.cast(image, tf.float32), [size, size], method="bilinear") / 255.0
    if d.color_jitter:
      image = _jitter(image, jitter_seed)
    return {"image": _standardize(cfg, image),
            "boxes": tf.reshape(_pad(boxes, d.max_boxes), [d.max_boxes, 4]),
            "classes": tf.reshape(_pad(objects["classes"], d.max_boxes), [d.max_boxes])}

  return decode


def decode_eval(cfg: SSDConfig):
  d = cfg.data

  def decode(record: Any, seed: Any) -> dict[str, Any]:
    del seed  # Evaluation is deterministic.
    tf = data.tf()
    f = _parse(record)
    image = tf.io.decode_jpeg(f["image/encoded"], channels=3)
    hw = tf.shape(image)[:2]
    objects = _objects(cfg, f, hw)
    n = tf.shape(objects["classes"])[0]
    check = tf.debugging.assert_less_equal(
        n, d.max_boxes, message=f"an evaluation image has more than data.max_boxes="
                                f"{d.max_boxes} boxes; raise it")
    with tf.control_dependencies([check]):
      out = {k: _pad(v, d.max_boxes) for k, v in objects.items()}
    return {"image": _normalize(cfg, image),
            "boxes": tf.reshape(out["boxes"], [d.max_boxes, 4]),
            "classes": tf.reshape(out["classes"], [d.max_boxes]),
            "crowd": tf.reshape(out["crowd"], [d.max_boxes]),
            "area": tf.reshape(out["area"], [d.max_boxes]),
            "image_id": tf.cast(tf.strings.to_number(f["image/source_id"], tf.int64), tf.int32),
            "image_hw": tf.cast(hw, tf.float32)}

  return decode


def decode(cfg: SSDConfig, split: Split):
  return decode_train(cfg) if split is Split.TRAIN else decode_eval(cfg)


def synthetic_batch(cfg: SSDConfig, split: Split, batch_size: int,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
  """Random images (in the stem's layout) with 1..max_boxes random boxes each, shaped like
  `decode`'s output; evaluation batches carry unique image ids 1..batch_size."""
  d, size = cfg.data, cfg.data.image_size
  n_B = rng.integers(1, d.max_boxes + 1, batch_size)
  real_BG = np.arange(d.max_boxes)[None] < n_B[:, None]
  lt = rng.uniform(0.0, 0.7, (batch_size, d.max_boxes, 2))
  wh = rng.uniform(0.1, 0.3, (batch_size, d.max_boxes, 2))
  boxes = (np.concatenate([lt, lt + wh], -1) * real_BG[..., None]).astype(np.float32)
  classes = (rng.integers(1, cfg.model.num_classes, (batch_size, d.max_boxes)) * real_BG)
  image = rng.standard_normal((batch_size, size, size, 3)).astype(np.float32)
  if cfg.model.stem is conv.Stem.SPACE_TO_DEPTH:
    image = conv.space_to_depth(image)
  out = {"image": image, "boxes": boxes, "classes": classes.astype(np.int32)}
  if split is Split.EVAL:
    out["crowd"] = np.zeros((batch_size, d.max_boxes), np.int32)
    out["area"] = (np.prod(wh, -1) * size * size * real_BG).astype(np.float32)
    out["image_id"] = np.arange(1, batch_size + 1, dtype=np.int32)
    out["image_hw"] = np.full((batch_size, 2), size, np.float32)
  return out
