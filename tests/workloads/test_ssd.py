"""SSD specifics: the reference model and boxes, matching, NMS, COCO mAP, distributed
evaluation and the digit scenes, through the real TFRecords and tf.data pipeline.

The one-step train and eval on the synthetic batch runs for SSD in
test_every_workload.py; the mini run to its target is in tests/e2e/test_ssd_mini.py.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlbench.datasets import records
from mlbench.train import data, evaluate, mesh as mesh_lib, sharding, steps
from mlbench import rules
from mlbench.train.plan import harness_hparams
from mlbench.workload import EvalPart, Split, StepContext
from workloads.ssd import WORKLOAD, boxes, coco, config, input_pipeline, nms, scenes, train

DATA = Path(__file__).parents[1] / "data" / "mlperf-results"


# ----------------------------------------------------------------------------- the full model


def _conv(k: int, c_in: int, c_out: int, bias: bool) -> int:
  return k * k * c_in * c_out + (c_out if bias else 0)


def test_full_model_has_the_reference_ssd300_resnet34_parameter_count():
  # torchvision's ResNet-34 has 21,797,672 parameters (ResNet34_Weights.IMAGENET1K_V1,
  # "num_params": 21797672). The reference SSD300 (mlcommons/training
  # single_stage_detector/ssd/base_model.py, ssd300.py) drops conv5_x ("layer4") and
  # the classifier, and adds five extra layers and 3x3 heads, all with biases.
  block = lambda c_in, c_out: _conv(3, c_in, c_out, False) + _conv(3, c_out, c_out, False) + 4 * c_out
  layer4 = (block(256, 512) + _conv(1, 256, 512, False) + 2 * 512) + 2 * block(512, 512)
  backbone = 21_797_672 - layer4 - (512 * 1000 + 1000)
  extras = sum(_conv(1, c_in, mid, True) + _conv(3, mid, c_out, True) for c_in, mid, c_out in
               [(256, 256, 512), (512, 256, 512), (512, 128, 256), (256, 128, 256),
                (256, 128, 256)])
  heads = sum(_conv(3, c, n * 4, True) + _conv(3, c, n * 81, True)
              for c, n in zip((256, 512, 512, 256, 256, 256), (4, 6, 6, 6, 4, 4)))
  assert backbone == 8_170_304 and extras == 3_574_400 and heads == 8_227_830
  assert steps.count_params(WORKLOAD, config.full()) == backbone + extras + heads == 19_972_534


def test_full_model_outputs_8732_boxes_of_81_classes_from_shapes():
  cfg = config.full()
  batch = WORKLOAD.synthetic_batch(cfg, Split.EVAL, 2, np.random.default_rng(0))
  params, state = jax.eval_shape(lambda k: WORKLOAD.init(cfg, k), jax.random.key(0))
  spec = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}
  ctx = StepContext(mesh=None)
  loss, (_, metrics) = jax.eval_shape(
      lambda p, s, b: WORKLOAD.loss(cfg, ctx, p, s, b, jax.random.key(0)), params, state, spec)
  assert loss.shape == () and set(metrics) == {"loc_loss", "conf_loss", "positives"}
  out = jax.eval_shape(lambda p, s, b: WORKLOAD.eval.step(cfg, ctx, p, s, b), params, state, spec)
  assert out["det_boxes"].shape == (2, 200, 4) and out["det_classes"].dtype == jnp.int32
  loc, logits = jax.eval_shape(
      lambda p, s, x: train._model(cfg).apply({"params": p, **s}, x, train=False),
      params, state, spec["image"])
  assert loc.shape == (2, 8732, 4) and logits.shape == (2, 8732, 81)


def test_default_boxes_are_the_references():
  a = boxes.default_boxes(config.AnchorConfig(), 300)
  assert a.shape == (8732, 4)  # 38^2*4 + 19^2*6 + 10^2*6 + 5^2*6 + 3^2*4 + 1*4
  # The first box: the 38x38 map's top-left cell, side 21/300.
  np.testing.assert_allclose(a[0], [0.5 / 37.5, 0.5 / 37.5, 0.07, 0.07], rtol=1e-6)
  # The 38x38 map's second shape is sqrt(21 * 45) / 300, from box 1444 on.
  np.testing.assert_allclose(a[38 * 38, 2:], [np.sqrt(21 * 45) / 300] * 2, rtol=1e-6)
  # The last four boxes: the 1x1 map, centred, clipped to the image (315 > 300).
  np.testing.assert_allclose(a[-4:, :2], 0.5)
  np.testing.assert_allclose(a[-4, 2:], [261 / 300] * 2, rtol=1e-6)
  np.testing.assert_allclose(a[-3, 2:], [np.sqrt(261 * 315) / 300] * 2, rtol=1e-6)
  np.testing.assert_allclose(a[-2, 2:], [1.0, 261 / 300 / np.sqrt(2)], rtol=1e-6)
  np.testing.assert_allclose(a[-1, 2:], [261 / 300 / np.sqrt(2), 1.0], rtol=1e-6)


# ------------------------------------------------------------------- matching and box coding


def _tiny_anchors() -> tuple[config.AnchorConfig, np.ndarray]:
  cfg = config.AnchorConfig(feature_sizes=(4, 2), steps=(8, 16), scales=(8, 16, 24),
                            aspect_ratios=((2,), (2,)))
  return cfg, boxes.default_boxes(cfg, 32)


def test_matching_and_encoding_round_trip_on_hand_made_boxes():
  cfg, anchors = _tiny_anchors()
  assert anchors.shape == (4 * 16 + 4 * 4, 4)
  ltrb = np.asarray(boxes.xywh_to_ltrb(anchors))
  gt = np.array([
      ltrb[5],                      # exactly default box 5 (IoU 1)
      [0.02, 0.02, 0.10, 0.30],     # a thin box that overlaps every default box < 0.5
      [0.55, 0.55, 0.95, 0.95],     # a big box in the bottom right
      [0.0, 0.0, 0.0, 0.0],         # padding
  ], np.float32)
  classes = np.array([3, 7, 2, 0], np.int32)
  iou_GA = np.asarray(boxes.iou(gt, ltrb))
  assert iou_GA[1].max() < 0.5 and iou_GA[2].max() > 0.5
  matched, labels = jax.jit(boxes.match, static_argnums=3)(gt, classes, anchors,
                                                            cfg.match_threshold)
  matched, labels = np.asarray(matched), np.asarray(labels)
  # Every default box over the threshold takes its best box; each box its best default box.
  expect = np.where(iou_GA[:3].max(0) > 0.5, classes[np.argmax(iou_GA[:3], 0)], 0)
  expect[np.argmax(iou_GA[:3], axis=1)] = classes[:3]
  np.testing.assert_array_equal(labels, expect)
  assert labels[5] == 3 and labels[np.argmax(iou_GA[1])] == 7 and (labels == 2).sum() >= 1
  assert set(np.unique(labels)) == {0, 2, 3, 7}  # padding never matches
  np.testing.assert_allclose(matched[labels == 0], ltrb[labels == 0], atol=1e-6)
  # Encoding then decoding gives the boxes back; a box equal to its default box encodes as 0.
  targets, _ = boxes.match_batch(gt[None], classes[None], anchors, cfg)
  targets = np.asarray(targets[0])
  np.testing.assert_allclose(targets[5], 0.0, atol=1e-5)
  decoded = np.asarray(boxes.decode(targets, anchors, cfg))
  np.testing.assert_allclose(decoded[labels > 0], matched[labels > 0], atol=1e-5)
  # The reference coder: centre offsets / (0.1 * default size), log sizes / 0.2.
  i = int(np.argmax(iou_GA[2]))
  g = np.asarray(boxes.ltrb_to_xywh(gt[2]))
  np.testing.assert_allclose(targets[i], np.concatenate([
      (g[:2] - anchors[i, :2]) / anchors[i, 2:] / 0.1, np.log(g[2:] / anchors[i, 2:]) / 0.2]),
      rtol=1e-5)


def test_the_loss_mines_three_negatives_per_positive():
  # One image, 10 default boxes: 2 positives, so the 6 hardest negatives count.
  labels = np.array([[1, 2, 0, 0, 0, 0, 0, 0, 0, 0]], np.int32)
  logits = np.zeros((1, 10, 3), np.float32)
  logits[0, 2:, 1] = np.arange(8)  # negatives ever more confidently class 1
  loc = np.zeros((1, 10, 4), np.float32)
  targets = np.zeros((1, 10, 4), np.float32)
  targets[0, 0] = [0.5, 0.0, 2.0, 0.0]  # smooth L1: 0.125 + 1.5
  total, m = train.multibox_loss(loc, logits, targets, labels)
  xent = np.log(np.exp(logits[0]).sum(-1)) - logits[0, np.arange(10), labels[0]]
  expected_conf = xent[:2].sum() + np.sort(xent[2:])[-6:].sum()
  np.testing.assert_allclose(float(m["conf_loss"]), expected_conf / 2, rtol=1e-5)
  np.testing.assert_allclose(float(m["loc_loss"]), 1.625 / 2, rtol=1e-5)
  np.testing.assert_allclose(float(total), (expected_conf + 1.625) / 2, rtol=1e-5)
  # An image without positives contributes nothing (but counts in the batch mean).
  empty, _ = train.multibox_loss(loc, logits, targets, np.zeros_like(labels))
  assert float(empty) == 0.0


def test_batch_norm_groups_normalise_each_group_by_itself(initial_state):
  # With --bn-group-size, statistics come from each group of the batch alone (the
  # reference submissions' distributed batch norm): the training forward pass over two
  # groups is the forward pass of each half with ordinary batch norm.
  cfg = config.mini()
  images = WORKLOAD.synthetic_batch(cfg, Split.TRAIN, 8, np.random.default_rng(0))["image"]
  variables = {"params": initial_state.params, **initial_state.model_state}

  @functools.partial(jax.jit, static_argnums=0)
  def forward(groups, x):
    return train._model(cfg, groups).apply(variables, x, train=True,
                                           mutable=["batch_stats"])[0][1]

  grouped = np.asarray(forward(2, images))
  halves = np.concatenate([forward(1, images[:4]), forward(1, images[4:])])
  np.testing.assert_allclose(grouped, halves, rtol=1e-4, atol=1e-4)
  assert np.abs(grouped - np.asarray(forward(1, images))).max() > 1e-3


# ------------------------------------------------------------------------------------ NMS


def _iou1(a: np.ndarray, b: np.ndarray) -> float:
  w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
  h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
  union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
  return w * h / union


def _reference_detections(loc, logits, anchors, acfg, ecfg):
  """The reference's decode_single, one image, loops and all: (class, score, box) list."""
  xy = loc[:, :2] * acfg.scale_xy * anchors[:, 2:] + anchors[:, :2]
  wh = np.exp(loc[:, 2:] * acfg.scale_wh) * anchors[:, 2:]
  bxs = np.concatenate([xy - wh / 2, xy + wh / 2], axis=1)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  out = []
  for c in range(1, probs.shape[1]):
    idx = np.flatnonzero(probs[:, c] > ecfg.score_threshold)
    order = list(idx[np.argsort(-probs[idx, c], kind="stable")][:ecfg.candidates_per_class])
    while order:
      i = order.pop(0)
      out.append((c, probs[i, c], bxs[i]))
      order = [j for j in order if _iou1(bxs[i], bxs[j]) < ecfg.nms_iou]
  out.sort(key=lambda t: -t[1])
  return out[:ecfg.max_detections]


def test_nms_matches_a_brute_force_reference():
  cfg = config.mini()
  anchors = train.anchors(cfg.anchors, cfg.data.image_size)
  rng = np.random.default_rng(0)
  a = len(anchors)
  loc = rng.normal(0, 1.0, (3, a, 4)).astype(np.float32)
  logits = rng.normal(0, 2.0, (3, a, 11)).astype(np.float32)
  logits[:, :, 0] += 2.0  # mostly background, as a trained model says
  ecfg = dataclasses.replace(cfg.eval, candidates_per_class=40, max_detections=400)
  out = jax.device_get(jax.jit(lambda l, g: nms.detect(l, g, anchors, cfg.anchors, ecfg))(
      loc, logits))
  no_nms = dataclasses.replace(ecfg, nms_iou=1.01)
  for b in range(3):
    ref = _reference_detections(loc[b], logits[b], anchors, cfg.anchors, ecfg)
    real = out["scores"][b] > 0
    assert real.sum() == len(ref) > 20
    np.testing.assert_allclose(out["scores"][b][real], [r[1] for r in ref], rtol=1e-5)
    np.testing.assert_array_equal(out["classes"][b][real], [r[0] for r in ref])
    np.testing.assert_allclose(out["boxes"][b][real], np.stack([r[2] for r in ref]), atol=1e-5)
    assert (out["classes"][b][~real] == 0).all()
    # NMS did remove boxes: without it, more candidates survive.
    assert len(_reference_detections(loc[b], logits[b], anchors, cfg.anchors, no_nms)) > len(ref)


def test_suppress_keeps_a_box_only_if_no_kept_better_box_overlaps_it():
  # Three boxes in score order: B overlaps A (suppressed); C overlaps only B, so it stays
  # (B was suppressed, so it suppresses nothing). Greedy, not "any better box".
  bx = np.array([[[[0, 0, 10, 10], [0, 3, 10, 13], [0, 9, 10, 19], [50, 50, 60, 60]]]],
                np.float32)
  valid = np.array([[[True, True, True, False]]])
  keep = np.asarray(nms.suppress(bx, valid, 0.5))
  np.testing.assert_array_equal(keep, [[[True, False, True, False]]])


# ------------------------------------------------------------------------------- COCO mAP


def _rows(gt_boxes, gt_classes, det_boxes, det_scores, det_classes, size=100.0):
  """An evaluation's gathered rows (as coco.host makes them) for images of size x size."""
  gt = np.asarray(gt_boxes, np.float32)
  n = len(gt)
  return EvalPart(rows={
      "image_id": np.arange(1, n + 1, dtype=np.int32),
      "image_hw": np.full((n, 2), size, np.float32),
      "gt_boxes": gt, "gt_classes": np.asarray(gt_classes, np.int32),
      "gt_crowd": np.zeros(np.shape(gt_classes), np.int32),
      "gt_area": np.prod(gt[..., 2:] - gt[..., :2], axis=-1) * size * size,
      "det_boxes": np.asarray(det_boxes, np.float32), "det_scores": np.asarray(det_scores),
      "det_classes": np.asarray(det_classes, np.int32)}, count=n)


def _gt_scenes():
  rng = np.random.default_rng(0)
  lt = rng.uniform(0, 0.6, (20, 3, 2))
  gt = np.concatenate([lt, lt + rng.uniform(0.1, 0.35, (20, 3, 2))], -1)
  classes = rng.integers(1, 4, (20, 3))
  classes[::4, 2] = 0  # some images have two boxes only
  return gt, classes


def test_perfect_detections_score_1():
  gt, classes = _gt_scenes()
  real = classes > 0
  part = _rows(gt, classes, np.concatenate([gt, np.zeros_like(gt)], 1),
               np.concatenate([real * 0.9, np.zeros(real.shape)], 1),
               np.concatenate([classes, np.zeros_like(classes)], 1))
  metrics = coco.compute(config.mini(), part)
  assert metrics["mAP"] == pytest.approx(1.0) and metrics["AP50"] == pytest.approx(1.0)


def test_shifted_boxes_score_what_pycocotools_says(tmp_path):
  from pycocotools.coco import COCO
  from pycocotools.cocoeval import COCOeval

  gt, classes = _gt_scenes()
  rng = np.random.default_rng(1)
  shift = rng.uniform(-0.06, 0.06, gt.shape)
  dets = np.clip(gt + shift, 0, 1)
  scores = rng.uniform(0.1, 1.0, classes.shape) * (classes > 0)
  metrics = coco.compute(config.mini(), _rows(gt, classes, dets, scores, classes))

  # pycocotools the usual way: an annotation file and a result list, in pixels (100x100).
  images, anns, results = [], [], []
  for i in range(len(gt)):
    images.append({"id": i + 1, "height": 100, "width": 100})
    for g, d, s, c in zip(gt[i] * 100, dets[i] * 100, scores[i], classes[i]):
      if c == 0:
        continue
      anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": int(c), "iscrowd": 0,
                   "bbox": [g[0], g[1], g[2] - g[0], g[3] - g[1]],
                   "area": (g[2] - g[0]) * (g[3] - g[1])})
      results.append({"image_id": i + 1, "category_id": int(c), "score": float(s),
                      "bbox": [d[0], d[1], d[2] - d[0], d[3] - d[1]]})
  (tmp_path / "gt.json").write_text(json.dumps(
      {"images": images, "annotations": anns, "categories": [{"id": c} for c in range(1, 11)]}))
  coco_gt = COCO(str(tmp_path / "gt.json"))
  e = COCOeval(coco_gt, coco_gt.loadRes(results), iouType="bbox")
  e.evaluate()
  e.accumulate()
  e.summarize()
  assert 0.1 < e.stats[0] < 0.9
  assert metrics["mAP"] == pytest.approx(e.stats[0], abs=1e-12)
  assert metrics["AP50"] == pytest.approx(e.stats[1], abs=1e-12)


def test_one_box_at_iou_0_74_is_right_at_half_the_thresholds():
  # A 10x10 box found 1.5 px to the right: IoU 85/115 = 0.739, a hit at IoU
  # thresholds 0.50 ... 0.70 (5 of 10): AP@[.5:.95] = 0.5.
  part = _rows([[[0.1, 0.1, 0.2, 0.2]]], [[1]], [[[0.115, 0.1, 0.215, 0.2]]], [[0.9]], [[1]])
  assert coco.compute(config.mini(), part)["mAP"] == pytest.approx(0.5)


def test_an_image_evaluated_twice_is_refused():
  gt, classes = _gt_scenes()
  part = _rows(gt, classes, gt, np.ones(classes.shape), classes)
  part.rows["image_id"][3] = part.rows["image_id"][4]
  with pytest.raises(ValueError, match=r"images \[5\] were evaluated more than once"):
    coco.compute(config.mini(), part)


# ----------------------------------------------------------------- distributed evaluation


def _eval_config():
  """The mini config keeping 10 detections per image: an untrained model fills every
  slot, and pycocotools' time grows with the detections."""
  cfg = config.mini()
  return dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, max_detections=10))


@pytest.fixture(scope="module")
def initial_state():
  """A fixed random train state of the mini model, on the host (He-scaled kernels,
  zero biases, unit batch-norm statistics), built in numpy from the state's shapes:
  the same state goes onto every mesh."""
  cfg = _eval_config()
  init = steps.init_fn(WORKLOAD, cfg, WORKLOAD.optimizer(cfg, WORKLOAD.schedule(cfg)))
  shapes = jax.eval_shape(init, jax.ShapeDtypeStruct((), jnp.uint32))
  rng = np.random.default_rng(3)

  def leaf(path, x):
    name = sharding.path_str(path)
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      return jax.random.key(0)
    if len(x.shape) == 4:  # HWIO kernel
      fan_in = np.prod(x.shape[:3])
      return (rng.standard_normal(x.shape) * np.sqrt(2.0 / fan_in)).astype(x.dtype)
    fill = 1 if name.endswith(("scale", "var")) else 0
    return np.full(x.shape, fill, x.dtype)

  return jax.tree_util.tree_map_with_path(leaf, shapes)


def _eval_program(cfg, devices, host_state):
  """The eval step compiled for a mesh over `devices` with the shardings
  steps.compile_programs gives it, and the state placed on that mesh."""
  mesh = mesh_lib.make_mesh({"data": len(devices)}, devices=devices)
  state_sh = sharding.tree_shardings(host_state, WORKLOAD.partition_rules(cfg), mesh)
  batch_sh = mesh_lib.batch_sharding(mesh)
  ev = jax.jit(steps.eval_fn(WORKLOAD, cfg, StepContext(mesh=mesh)),
               in_shardings=(state_sh, batch_sh), out_shardings=batch_sh)
  return ev, jax.device_put(host_state, state_sh), batch_sh


def _evaluate(ssd_data_dir, host_state, devices, host=0, hosts=1):
  cfg = _eval_config()
  sched = WORKLOAD.schedule(cfg)
  step, state, batch_sh = _eval_program(cfg, devices, host_state)
  per_host = sched.eval_batch_size // hosts
  ds = data.eval_dataset(input_pipeline.files(cfg, ssd_data_dir, Split.EVAL),
                         input_pipeline.decode(cfg, Split.EVAL),
                         num_examples=sched.eval_examples, per_host_batch=per_host, host=host,
                         hosts=hosts)
  put = lambda b: mesh_lib.to_global(b, batch_sh, per_host)
  mine = len(range(host, sched.eval_examples, hosts))
  return evaluate.evaluate(WORKLOAD, cfg, step, state, data.prefetch(data.numpy_batches(ds), put),
                           mine)


def _sorted_rows(part):
  order = np.argsort(part.rows["image_id"])
  return {k: v[order] for k, v in part.rows.items()}


def test_distributed_evaluation_is_the_same_on_1_2_and_8_devices_and_2_hosts(ssd_data_dir,
                                                                           initial_state):
  # The same state on every mesh; 500 scenes in batches of 256, the last one padded
  # with 12 masked rows.
  single, part = _evaluate(ssd_data_dir, initial_state, jax.devices()[:1])
  assert part.count == 500
  ref = _sorted_rows(part)
  np.testing.assert_array_equal(ref["image_id"], np.arange(1, 501))
  assert (ref["det_scores"] > 0).sum() > 1000  # an untrained model detects plenty
  for n in (2, 8):
    metrics, part = _evaluate(ssd_data_dir, initial_state, jax.devices()[:n])
    rows = _sorted_rows(part)
    assert part.count == 500 and metrics["mAP"] == pytest.approx(single["mAP"], abs=1e-9)
    np.testing.assert_array_equal(rows["det_classes"], ref["det_classes"])
    np.testing.assert_allclose(rows["det_scores"], ref["det_scores"], rtol=1e-5, atol=1e-6)
  # Two hosts of 4 devices, each reading only its share of the files' examples; the
  # harness concatenates their rows (evaluate.across_processes does it across processes).
  parts = [_evaluate(ssd_data_dir, initial_state, jax.devices()[4 * h:4 * h + 4], host=h,
                     hosts=2)[1]
           for h in range(2)]
  assert [p.count for p in parts] == [250, 250]
  assert not set(parts[0].rows["image_id"]) & set(parts[1].rows["image_id"])
  merged = evaluate.merge(parts[0], parts[1])
  assert WORKLOAD.eval.compute(_eval_config(), merged)["mAP"] == pytest.approx(single["mAP"],
                                                                              abs=1e-9)


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


# ----------------------------------------------------------------- schedule, rules, hparams


def test_learning_rate_warms_up_as_the_reference_then_steps_down():
  cfg = config.mini()
  cfg = dataclasses.replace(cfg, optimizer=dataclasses.replace(
      cfg.optimizer, base_learning_rate=0.1, warmup_epochs=1.0, warmup_factor=1,
      decay_boundary_epochs=(2.0, 3.0)))
  sched = WORKLOAD.schedule(cfg)
  lr = train.learning_rate(cfg, sched)
  w = round(6000 / 64)  # 94 warmup steps
  # base - (W - t) * base / (W * 2^factor): from base/2 up to base.
  np.testing.assert_allclose(float(lr(0)), 0.05, rtol=1e-6)
  np.testing.assert_allclose(float(lr(w // 2)), 0.1 - (w - w // 2) * 0.1 / (2 * w), rtol=1e-6)
  np.testing.assert_allclose([float(lr(t)) for t in (w, 187, 188, 280, 281)],
                             [0.1, 0.1, 0.01, 0.01, 0.001], rtol=1e-5)
  logged = train.hparams(cfg, sched, StepContext(mesh=None, bn_groups=2))
  assert logged["opt_learning_rate_warmup_steps"] == w and logged["model_bn_span"] == 32
  assert logged["opt_learning_rate_decay_boundary_epochs"] == [2, 3]


def test_the_full_config_follows_the_0_7_0_rules_not_retinanet():
  # `ssd` is RetinaNet from 1.1 on (rules/training_4.0.0/ssd.yaml); this workload is 0.7.0's.
  assert rules.rulesets("ssd") == ["4.0.0", "0.7.0", "mini"]
  assert rules.rulesets("ssd", WORKLOAD.rulesets) == ["0.7.0", "mini"]
  assert rules.default_ruleset("ssd", "full", WORKLOAD.rulesets) == "0.7.0"
  cfg = config.full()
  sched = WORKLOAD.schedule(cfg)
  logged = {**harness_hparams(sched),
            **WORKLOAD.hparams(cfg, sched, StepContext(mesh=None, bn_groups=4096 // 16))}
  assert rules.load("ssd", "0.7.0").problems(logged, closed=True) == []
  # Warmup: 26 epochs (Google's v0.7 run_and_time.sh) of the reference's 117,266
  # training images (train2017 images with a box) at batch 4096: 26 * 117,266 / 4096
  # = 744.4 steps. Google's own v0.7 log, counting all 118,287 train2017 images,
  # logged floor(26 * 118,287 / 4096) = 750 by the same formula.
  google = {}
  for line in (DATA / "v0.7/Google/results/tpu-v3-4096-JAX/ssd/result_0.txt").open():
    if ":::MLLOG " in line:
      record = json.loads(line.split(":::MLLOG ", 1)[1])
      google.setdefault(record["key"], record["value"])
  assert google["opt_learning_rate_warmup_steps"] == int(
      26 * google["train_samples"] / google["global_batch_size"]) == 750
  assert (cfg.optimizer.warmup_epochs, cfg.data.train_examples) == (26, 117_266)
  assert logged["opt_learning_rate_warmup_steps"] == int(26 * 117_266 / 4096) == 744
  assert logged["model_bn_span"] == google["model_bn_span"] == 16
  assert logged["opt_learning_rate_decay_boundary_epochs"] == [64, 80]
  assert rules.load("ssd", "mini").quality.target == 0.65


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
