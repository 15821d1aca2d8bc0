"""SSD data: the digit scenes in the COCO TFRecord schema, read back through the real
tf.data pipeline, the reference augmentation (crops, torchvision's colour jitter) and COCO
records without annotations or with crowd boxes.

Split from test_ssd.py, which keeps the model, boxes, loss, NMS and schedule.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from mlbench.datasets import records
from mlbench.train import data
from mlbench.workload import Split
from workloads.ssd import WORKLOAD, config, input_pipeline, scenes

DATA = Path(__file__).parents[1] / "data" / "mlperf-results"


# ------------------------------------------------------------------- data: scenes and pipeline


def test_scenes_are_written_in_the_coco_tfrecord_schema(ssd_data_dir):
  cfg = config.mini()
  train_files = input_pipeline.files(cfg, ssd_data_dir, Split.TRAIN)
  eval_files = input_pipeline.files(cfg, ssd_data_dir, Split.EVAL)
  assert len(train_files) == 8 and len(eval_files) == 4
  assert train_files[0].endswith("train-00000-of-00008")
  assert sum(len(records.examples(p)) for p in train_files) == 6000
  assert sum(len(records.examples(p)) for p in eval_files) == 500
  f = records.examples(eval_files[0])[0].features.feature
  assert {"image/encoded", "image/height", "image/width", "image/source_id", "image/format",
          "image/object/bbox/xmin", "image/object/bbox/ymin", "image/object/bbox/xmax",
          "image/object/bbox/ymax", "image/object/class/label", "image/object/class/text",
          "image/object/is_crowd", "image/object/area", "image/key/sha256"} <= set(f)
  image = data.tf().io.decode_jpeg(f["image/encoded"].bytes_list.value[0]).numpy()
  assert image.shape == (32, 32, 3) and f["image/height"].int64_list.value[0] == 32
  labels = list(f["image/object/class/label"].int64_list.value)
  assert 1 <= len(labels) <= 3 and all(1 <= x <= 10 for x in labels)


def test_eval_glyphs_are_disjoint_from_train_glyphs():
  x_tr, y_tr, x_ev, y_ev = scenes.glyphs()
  assert (len(x_tr), len(x_ev)) == (1257, 540)
  train_set = {g.tobytes() for g in x_tr}
  assert not any(g.tobytes() in train_set for g in x_ev)
  assert np.bincount(y_ev).min() >= 52  # stratified: every digit in the evaluation scenes


def test_scene_boxes_are_exact():
  x_tr, y_tr, _, _ = scenes.glyphs()
  rng = np.random.default_rng(0)
  for _ in range(50):
    pixels, bxs, labels = scenes.compose(x_tr, y_tr, rng)
    assert 1 <= len(bxs) <= 3 and pixels.shape == (32, 32)
    assert (bxs[:, 2:] - bxs[:, :2] >= 2).all() and (bxs >= 0).all() and (bxs <= 32).all()
    inside = np.zeros((32, 32), bool)
    for left, top, right, bottom in bxs:
      inside[int(np.floor(top)):int(np.ceil(bottom)), int(np.floor(left)):int(np.ceil(right))] = True
      # The ink reaches each box's edges (within the bilinear blur of one source pixel).
      glyph = pixels[int(top):int(np.ceil(bottom)), int(left):int(np.ceil(right))]
      assert glyph.max() > 128
    # No ink outside the boxes beyond the bilinear fringe of faint source pixels.
    assert pixels[~inside].max(initial=0) < 0.5 * 255


def test_the_pipeline_reads_the_scenes_back(ssd_data_dir):
  cfg = config.mini()
  eval_files = input_pipeline.files(cfg, ssd_data_dir, Split.EVAL)
  ds = data.eval_dataset(eval_files, input_pipeline.decode(cfg, Split.EVAL), num_examples=500,
                         per_host_batch=500, host=0, hosts=1)
  batch = next(data.numpy_batches(ds))
  first = records.examples(eval_files[0])[0].features.feature
  n = len(first["image/object/class/label"].int64_list.value)
  assert batch["image_id"][0] == int(first["image/source_id"].bytes_list.value[0])
  np.testing.assert_allclose(batch["boxes"][0, :n, 0], first["image/object/bbox/xmin"].float_list.value)
  np.testing.assert_allclose(batch["boxes"][0, :n, 3], first["image/object/bbox/ymax"].float_list.value)
  np.testing.assert_array_equal(batch["classes"][0, :n], first["image/object/class/label"].int64_list.value)
  assert (batch["classes"][0, n:] == 0).all()
  np.testing.assert_allclose(batch["area"][0, :n], first["image/object/area"].float_list.value)
  np.testing.assert_array_equal(batch["image_hw"][0], [32, 32])
  np.testing.assert_array_equal(np.sort(batch["image_id"]), np.arange(1, 501))
  # Ink inside the boxes: the normalised image is bright where the boxes say.
  pixel = batch["image"][..., 0] * cfg.data.stddev_rgb[0] + cfg.data.mean_rgb[0]
  b = (batch["boxes"][0, 0] * 32).round().astype(int)
  assert pixel[0, b[1]:b[3], b[0]:b[2]].max() > 0.5
  # Training batches match the synthetic batch's keys, shapes and dtypes (the harness checks).
  tb = next(data.numpy_batches(data.train_dataset(
      input_pipeline.files(cfg, ssd_data_dir, Split.TRAIN), input_pipeline.decode(cfg, Split.TRAIN),
      per_host_batch=8, seed=0, host=0, hosts=1)))
  syn = WORKLOAD.synthetic_batch(cfg, Split.TRAIN, 8, np.random.default_rng(0))
  assert {k: (v.shape, v.dtype) for k, v in tb.items()} == {
      k: (v.shape, v.dtype) for k, v in syn.items()}


def test_full_augmentation_on_real_records(ssd_data_dir):
  """The reference's crop, flip and colour jitter (full config) on the scene records."""
  tf = data.tf()
  cfg = config.full()
  cfg = dataclasses.replace(  # the digits' 10 classes and the background
      cfg, model=dataclasses.replace(cfg.model, num_classes=11),
      data=dataclasses.replace(cfg.data, category_ids=tuple(range(1, 11)), crop_tries=50))
  record = next(iter(tf.data.TFRecordDataset(
      input_pipeline.files(cfg, ssd_data_dir / input_pipeline.DIGITS_DIR, Split.TRAIN)[0])))
  decode = input_pipeline.decode(cfg, Split.TRAIN)
  a = decode(record, tf.constant([1, 2], tf.int64))
  b = decode(record, tf.constant([1, 2], tf.int64))
  np.testing.assert_array_equal(a["image"].numpy(), b["image"].numpy())
  assert a["image"].shape == (300, 300, 3) and a["boxes"].shape == (100, 4)
  cropped = 0
  for s in range(40):
    out = decode(record, tf.constant([s, 7], tf.int64))
    real = out["classes"].numpy() > 0
    bx = out["boxes"].numpy()[real]
    assert real.sum() >= 1 and (bx >= 0).all() and (bx <= 1).all()
    assert (bx[:, 2:] > bx[:, :2]).all()
    cropped += not np.isclose(np.prod(bx[:, 2:] - bx[:, :2], -1).sum(),
                              _box_area(record), rtol=1e-3)
  assert 5 <= cropped <= 38  # most passes crop; 1 in 7 keeps the image (boxes only flip)
  # Windows the crop picks obey the reference's constraints.
  bxs = tf.constant([[0.2, 0.2, 0.5, 0.6], [0.6, 0.1, 0.9, 0.4]], tf.float32)
  for s in range(20):
    do, win = input_pipeline.choose_crop(bxs, tf.constant([s, 3], tf.int64), 50)
    w = win.numpy()
    if do:
      side = w[2:] - w[:2]
      assert (side >= 0.3 - 1e-6).all() and 0.5 <= side[0] / side[1] <= 2.0
      centres = (bxs.numpy()[:, :2] + bxs.numpy()[:, 2:]) / 2
      assert ((centres > w[:2]) & (centres < w[2:])).all(-1).any()


def _box_area(record) -> float:
  f = data.tf().train.Example.FromString(record.numpy()).features.feature
  xs = [f[f"image/object/bbox/{k}"].float_list.value for k in ("xmin", "ymin", "xmax", "ymax")]
  return float(sum((x1 - x0) * (y1 - y0) for x0, y0, x1, y1 in zip(*xs)))



# ------------------------------------------------------------------------- colour jitter


def _pil_enhance(degenerate, image, factor):
  # PIL ImageEnhance._Enhance.enhance: Image.blend(self.degenerate, self.image, factor).
  return np.clip(degenerate + factor * (image - degenerate), 0.0, 1.0)


def test_color_jitter_adjustments_are_torchvisions_pil_ones():
  # torchvision F.adjust_brightness/contrast/saturation are PIL ImageEnhance.Brightness
  # (degenerate: black), Contrast (degenerate: the mean of convert("L"), rounded to an
  # 8-bit level) and Color (degenerate: convert("L")); L = .299 R + .587 G + .114 B.
  image = np.random.default_rng(0).uniform(0, 1, (6, 5, 3)).astype(np.float32)
  luma = image @ np.array([0.299, 0.587, 0.114], np.float32)
  mean = np.floor(luma.mean() * 255 + 0.5) / 255
  brightness, contrast, saturation, _ = input_pipeline.jitter_ops()
  for f in (0.6, 1.4):
    np.testing.assert_allclose(brightness(image, f).numpy(), _pil_enhance(0 * image, image, f),
                               atol=1e-6)
    np.testing.assert_allclose(contrast(image, f).numpy(),
                               _pil_enhance(np.full_like(image, mean), image, f), atol=1e-6)
    np.testing.assert_allclose(saturation(image, f).numpy(),
                               _pil_enhance(np.repeat(luma[..., None], 3, -1), image, f),
                               atol=1e-6)


def test_color_jitter_order_is_shuffled_per_image():
  # torchvision ColorJitter.get_params shuffles the four adjustments on every call.
  tf = data.tf()
  orders = {tuple(input_pipeline.jitter_order(tf.constant([i, 7], tf.int64)).numpy())
            for i in range(400)}
  assert len(orders) == 24


def _coco_like(tmp_path):
  """Six images in the COCO TFRecord schema: two without annotations (as 1,021 of
  train2017's and 48 of val2017's are), one whose only box is a crowd box."""
  tf = data.tf()
  jpeg = tf.io.encode_jpeg(np.full((32, 32, 3), 128, np.uint8)).numpy()
  boxes_per_image = [[0], [], [0, 0], [1], [], [0]]  # 1: a crowd box
  examples = []
  for i, crowd in enumerate(boxes_per_image):
    n = len(crowd)
    examples.append({
        "image/height": 32, "image/width": 32, "image/source_id": str(i + 1),
        "image/encoded": jpeg, "image/format": "jpeg",
        **{k: np.full(n, v, np.float32) for k, v in (
            ("image/object/bbox/xmin", 0.1), ("image/object/bbox/ymin", 0.1),
            ("image/object/bbox/xmax", 0.6), ("image/object/bbox/ymax", 0.5))},
        "image/object/class/label": np.full(n, 3, np.int64),
        "image/object/is_crowd": np.asarray(crowd, np.int64),
        "image/object/area": np.full(n, 80.0, np.float32)})
  return records.write_shards(str(tmp_path / "val-{index:05d}-of-{count:05d}"), examples, 2)


def test_images_without_annotations_are_dropped_and_crowd_boxes_train(tmp_path):
  # The reference's COCODetection (retired_benchmarks/ssd-v1/ssd/utils.py L545-555)
  # keeps every annotation, crowd ones too, and drops images that have none;
  # train.py L239-240 logs the remaining counts: 117,266 train and 4,952 eval images.
  full = config.full()
  assert (full.data.train_examples, full.data.eval_examples) == (117_266, 4_952)
  cfg = config.mini()
  files = _coco_like(tmp_path)
  keep = WORKLOAD.input.keep(cfg, Split.EVAL)
  ds = data.eval_dataset(files, input_pipeline.decode(cfg, Split.EVAL), num_examples=4,
                         per_host_batch=8, host=0, hosts=1, keep=keep)
  batch = next(data.numpy_batches(ds))
  assert sorted(batch["image_id"][batch[data.MASK] > 0]) == [1, 3, 4, 6]
  ds = data.train_dataset(files, input_pipeline.decode(cfg, Split.TRAIN), per_host_batch=12,
                          seed=0, host=0, hosts=1, keep=WORKLOAD.input.keep(cfg, Split.TRAIN))
  boxes = next(data.numpy_batches(ds))["classes"]
  assert sorted({int((b > 0).sum()) for b in boxes}) == [1, 2]  # no image without a box
