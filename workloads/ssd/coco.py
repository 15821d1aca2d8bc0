"""COCO mAP of gathered detections, scored once with pycocotools.

Every host turns its share of the evaluation set into rows (`host`): per image
its id and size, its fixed-size detections and its padded ground truth (boxes,
classes, crowd flags, areas). The harness concatenates the rows of every batch
and host; `compute` checks that no image is missing or repeated, builds the
ground truth and the detections in COCO's format, and runs COCOeval once, as
the reference's `coco_eval` does with instances_val2017.json (carrying the
ground truth with the images makes it work on any number of hosts without a
shared annotation file).
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

import numpy as np

from mlbench.workload import EvalPart
from workloads.ssd.config import SSDConfig

METRICS = ("mAP", "AP50", "AP75", "AP_small", "AP_medium", "AP_large")
"""COCOeval.stats[0:6] under their usual names; mAP is AP@[.5:.95], the MLPerf metric."""


def host(cfg: SSDConfig, outputs: dict[str, np.ndarray], batch: dict[str, Any]) -> EvalPart:
  """One batch's real images as rows (numpy); nothing is reduced here."""
  del cfg
  rows = {k: np.asarray(v) for k, v in outputs.items()}
  rows.update({f"gt_{k}": np.asarray(batch[k]) for k in ("boxes", "classes", "crowd", "area")})
  rows["image_id"] = np.asarray(batch["image_id"])
  rows["image_hw"] = np.asarray(batch["image_hw"])
  return EvalPart(rows=rows)


def _pixels(boxes_N4: np.ndarray, hw_2: np.ndarray) -> np.ndarray:
  """Normalised ltrb -> COCO's [x, y, width, height] in pixels of the original image."""
  h, w = hw_2
  ltrb = boxes_N4.astype(np.float64) * np.array([w, h, w, h])
  return np.concatenate([ltrb[:, :2], ltrb[:, 2:] - ltrb[:, :2]], axis=1)


def ground_truth(rows: dict[str, np.ndarray], num_classes: int) -> dict[str, Any]:
  """The COCO dataset dict (images, annotations, categories) of the gathered rows."""
  images, annotations = [], []
  for i, (image_id, hw) in enumerate(zip(rows["image_id"], rows["image_hw"])):
    images.append({"id": int(image_id), "height": float(hw[0]), "width": float(hw[1])})
    real = rows["gt_classes"][i] > 0
    for box, cls, crowd, area in zip(_pixels(rows["gt_boxes"][i][real], hw),
                                     rows["gt_classes"][i][real], rows["gt_crowd"][i][real],
                                     rows["gt_area"][i][real]):
      annotations.append({"id": len(annotations) + 1, "image_id": int(image_id),
                          "category_id": int(cls), "bbox": [float(v) for v in box],
                          "area": float(area), "iscrowd": int(crowd)})
  return {"images": images, "annotations": annotations,
          "categories": [{"id": c} for c in range(1, num_classes)]}


def detections(rows: dict[str, np.ndarray]) -> np.ndarray:
  """[N, 7] rows of (image_id, x, y, width, height, score, category), as COCO.loadRes takes."""
  out = []
  for i, (image_id, hw) in enumerate(zip(rows["image_id"], rows["image_hw"])):
    real = rows["det_scores"][i] > 0
    n = int(real.sum())
    out.append(np.concatenate([np.full((n, 1), float(image_id)),
                               _pixels(rows["det_boxes"][i][real], hw),
                               rows["det_scores"][i][real, None].astype(np.float64),
                               rows["det_classes"][i][real, None].astype(np.float64)], axis=1))
  return np.concatenate(out) if out else np.zeros((0, 7))


def check_images(image_ids: np.ndarray, expected: int) -> None:
  """Every evaluation image exactly once."""
  unique, counts = np.unique(image_ids, return_counts=True)
  if (counts > 1).any():
    raise ValueError(f"images {unique[counts > 1][:10].tolist()} were evaluated more than once")
  if len(unique) != expected:
    raise ValueError(f"{len(unique)} images were evaluated; the evaluation set has {expected}")


def score(gt: dict[str, Any], dets: np.ndarray) -> dict[str, float]:
  """COCOeval (bbox) of `dets` against `gt`; pycocotools' chatter kept off stdout."""
  from pycocotools.coco import COCO
  from pycocotools.cocoeval import COCOeval

  if len(dets) == 0:
    return {k: 0.0 for k in METRICS}
  with contextlib.redirect_stdout(io.StringIO()):
    coco_gt = COCO()
    coco_gt.dataset = gt
    coco_gt.createIndex()
    coco_dt = coco_gt.loadRes(dets)
    evaluator = COCOeval(coco_gt, coco_dt, iouType="bbox")
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
  # COCOeval reports -1 where a category range has no ground truth; that counts as 0 here.
  return {k: max(float(v), 0.0) for k, v in zip(METRICS, evaluator.stats)}


def compute(cfg: SSDConfig, part: EvalPart) -> dict[str, float]:
  """COCO mAP@[.5:.95] (and friends) over the whole evaluation set, once."""
  rows = part.rows
  check_images(rows["image_id"], part.count)
  return score(ground_truth(rows, cfg.model.num_classes), detections(rows))
