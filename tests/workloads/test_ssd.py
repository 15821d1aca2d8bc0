"""SSD specifics: the reference model and boxes, matching, the loss, NMS, the schedule and
rules (COCO mAP and distributed evaluation: test_ssd_eval.py; the digit scenes through the
real TFRecords and tf.data pipeline: test_ssd_data.py).

The one-step train and eval on the synthetic batch runs for SSD in
test_every_workload.py; the mini run to its target is in tests/e2e/test_ssd_mini.py.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from mlbench.train import steps
from mlbench import rules
from mlbench.train.plan import harness_hparams
from mlbench.workload import Split, StepContext
from workloads.ssd import WORKLOAD, boxes, config, nms, train

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
