"""SSD's quality metric (COCO mAP) through the harness's whole eval path against
pycocotools on the same detections; see test_metrics.py for how every metric test works."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np

from mlbench.workload import Split
from eval_harness import (  # tests/workloads/eval_harness.py
    BATCH, REAL, assert_same, compile_eval, harness_eval)


# --------------------------------------------------------------------------------------- SSD


def _ssd_ground_truth(boxes, classes, rng, max_boxes, exact):
  """Ground truth made from an image's detections: its 1-3 best, moved a little
  (exactly, if `exact`), and on some images a box nothing detects (a miss)."""
  n = 3 if exact else int(rng.integers(1, 4))
  gt_boxes = np.zeros((max_boxes, 4), np.float32)
  gt_classes = np.zeros(max_boxes, np.int32)
  gt_boxes[:n] = np.clip(boxes[:n] + (0 if exact else rng.normal(0, 0.02, (n, 4))), 0, 1)
  gt_classes[:n] = classes[:n]
  if not exact and rng.random() < 0.5:
    lt = rng.uniform(0, 0.5, 2)
    gt_boxes[n] = [*lt, *(lt + 0.4)]
    gt_classes[n] = classes[0] % (max_boxes - 1) + 1
  return gt_boxes, gt_classes


def _coco_the_usual_way(tmp_path, rows, num_classes):
  """pycocotools as its users call it: an annotation file, a result list, in pixels."""
  from pycocotools.coco import COCO
  from pycocotools.cocoeval import COCOeval

  images, anns, results = [], [], []
  for i, (image_id, (h, w)) in enumerate(zip(rows["image_id"], rows["image_hw"])):
    images.append({"id": int(image_id), "height": int(h), "width": int(w)})
    scale = np.array([w, h, w, h], np.float64)
    for box, cls in zip(rows["gt_boxes"][i] * scale, rows["gt_classes"][i]):
      if cls:
        x, y, bw, bh = box[0], box[1], box[2] - box[0], box[3] - box[1]
        anns.append({"id": len(anns) + 1, "image_id": int(image_id), "category_id": int(cls),
                     "bbox": [x, y, bw, bh], "area": bw * bh, "iscrowd": 0})
    for box, score, cls in zip(rows["det_boxes"][i] * scale, rows["det_scores"][i],
                               rows["det_classes"][i]):
      if score > 0:
        results.append({"image_id": int(image_id), "category_id": int(cls), "score": float(score),
                        "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]]})
  path = tmp_path / "instances.json"
  path.write_text(json.dumps({"images": images, "annotations": anns,
                              "categories": [{"id": k} for k in range(1, num_classes)]}))
  gt = COCO(str(path))
  e = COCOeval(gt, gt.loadRes(results), iouType="bbox")
  e.evaluate()
  e.accumulate()
  e.summarize()
  # COCOeval's -1 (no ground truth in a size range) is reported as 0.
  names = ("mAP", "AP50", "AP75", "AP_small", "AP_medium", "AP_large")
  return {k: max(float(v), 0.0) for k, v in zip(names, e.stats)}


def test_ssd_coco_map_is_pycocotools_on_the_detections(tmp_path):
  from workloads.ssd import nms, train

  # 10 detections per image, not 50: an untrained model fills every slot, and
  # pycocotools' time grows with the detections.
  c = compile_eval("ssd", lambda cfg: dataclasses.replace(
      cfg, eval=dataclasses.replace(cfg.eval, max_detections=10)))
  cfg = c.cfg
  rng = np.random.default_rng(4)
  n = REAL + BATCH
  batch = c.workload.synthetic_batch(cfg, Split.EVAL, n, rng)
  variables = {"params": c.params, **c.model_state}
  anchors = train.anchors(cfg.anchors, cfg.data.image_size)

  @jax.jit
  def detect(images):
    loc, logits = train._model(cfg).apply(variables, images, train=False)
    return nms.detect(loc, logits, anchors, cfg.anchors, cfg.eval)

  det = jax.device_get(detect(batch["image"]))
  assert (det["scores"] > 0).sum(1).min() >= 3
  max_boxes = cfg.data.max_boxes
  gt = [_ssd_ground_truth(det["boxes"][i], det["classes"][i], rng, max_boxes, i >= REAL)
        for i in range(n)]
  hw = np.stack([rng.integers(200, 641, n), rng.integers(200, 641, n)], 1).astype(np.float32)
  boxes = np.stack([g[0] for g in gt])
  wh = (boxes[..., 2:] - boxes[..., :2]) * hw[:, None, ::-1]
  batch = {**batch, "boxes": boxes, "classes": np.stack([g[1] for g in gt]),
           "area": (wh[..., 0] * wh[..., 1]).astype(np.float32),
           "image_id": rng.permutation(np.arange(1, 10 * n))[:n].astype(np.int32),
           "image_hw": hw}
  metrics, count = harness_eval(c, {k: v[:REAL] for k, v in batch.items()},
                                 {k: v[REAL:] for k, v in batch.items()})

  rows = {**{f"gt_{k}": batch[k][:REAL] for k in ("boxes", "classes")},
          **{f"det_{k}": v[:REAL] for k, v in det.items()},
          "image_id": batch["image_id"][:REAL], "image_hw": hw[:REAL]}
  expected = _coco_the_usual_way(tmp_path, rows, cfg.model.num_classes)
  assert count == REAL and 0.05 < expected["mAP"] < 0.8
  assert_same(metrics, expected)
