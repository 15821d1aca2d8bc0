"""Default boxes, matching and the box coder of the MLPerf SSD reference.

Boxes are normalised to the image (0..1). `ltrb` is (left, top, right, bottom);
`xywh` is (centre x, centre y, width, height). Sources: the reference's
`DefaultBoxes`, `Encoder.encode` and `Encoder.scale_back_batch`
(mlcommons/training single_stage_detector/ssd/utils.py) and its `Loss._loc_vec`
(base_model.py).

Shape legend: B batch, A default boxes, G ground-truth boxes (padded; class 0
marks padding), N and M any box counts.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from workloads.ssd.config import AnchorConfig


def default_boxes(cfg: AnchorConfig, image_size: int) -> np.ndarray:
  """The default boxes [A, 4] in xywh, in the reference's order.

  Per feature map: per box shape (scale k, the geometric mean of scales k and
  k+1, then scale k with each aspect ratio r as r and 1/r), per cell row, per
  cell column. Like the reference, the xywh values are clipped to [0, 1].
  """
  out = []
  for k, size in enumerate(cfg.feature_sizes):
    cells_per_unit = image_size / cfg.steps[k]
    s1 = cfg.scales[k] / image_size
    s2 = np.sqrt(cfg.scales[k] * cfg.scales[k + 1]) / image_size
    shapes = [(s1, s1), (s2, s2)]
    for r in cfg.aspect_ratios[k]:
      w, h = s1 * np.sqrt(r), s1 / np.sqrt(r)
      shapes += [(w, h), (h, w)]
    for w, h in shapes:
      for i, j in itertools.product(range(size), repeat=2):
        out.append(((j + 0.5) / cells_per_unit, (i + 0.5) / cells_per_unit, w, h))
  return np.clip(np.asarray(out, np.float32), 0.0, 1.0)


def xywh_to_ltrb(b_N4):
  xy, wh = b_N4[..., :2], b_N4[..., 2:]
  return jnp.concatenate([xy - wh / 2, xy + wh / 2], axis=-1)


def ltrb_to_xywh(b_N4):
  lt, rb = b_N4[..., :2], b_N4[..., 2:]
  return jnp.concatenate([(lt + rb) / 2, rb - lt], axis=-1)


def iou(a_N4, b_M4):
  """Pairwise IoU [..., N, M] of ltrb boxes; 0 where both are empty."""
  lt = jnp.maximum(a_N4[..., :, None, :2], b_M4[..., None, :, :2])
  rb = jnp.minimum(a_N4[..., :, None, 2:], b_M4[..., None, :, 2:])
  inter = jnp.prod(jnp.clip(rb - lt, 0.0), axis=-1)
  area_a = jnp.prod(jnp.clip(a_N4[..., 2:] - a_N4[..., :2], 0.0), axis=-1)
  area_b = jnp.prod(jnp.clip(b_M4[..., 2:] - b_M4[..., :2], 0.0), axis=-1)
  union = area_a[..., :, None] + area_b[..., None, :] - inter
  return jnp.where(union > 0, inter / jnp.where(union > 0, union, 1.0), 0.0)


def encode(boxes_A4, anchors_A4, cfg: AnchorConfig):
  """ltrb boxes -> regression targets against xywh default boxes (`Loss._loc_vec`)."""
  b = ltrb_to_xywh(boxes_A4)
  xy = (b[..., :2] - anchors_A4[..., :2]) / anchors_A4[..., 2:] / cfg.scale_xy
  # Padded or degenerate boxes never reach the loss; keep their log finite anyway.
  wh = jnp.log(jnp.maximum(b[..., 2:], 1e-8) / anchors_A4[..., 2:]) / cfg.scale_wh
  return jnp.concatenate([xy, wh], axis=-1)


def decode(loc_A4, anchors_A4, cfg: AnchorConfig):
  """Regression outputs -> ltrb boxes (`Encoder.scale_back_batch`)."""
  xy = loc_A4[..., :2] * cfg.scale_xy * anchors_A4[..., 2:] + anchors_A4[..., :2]
  wh = jnp.exp(loc_A4[..., 2:] * cfg.scale_wh) * anchors_A4[..., 2:]
  return xywh_to_ltrb(jnp.concatenate([xy, wh], axis=-1))


def match(boxes_G4, classes_G, anchors_A4, threshold: float):
  """Assigns ground-truth boxes to default boxes, as `Encoder.encode` does (one image).

  Each default box takes the ground-truth box it overlaps most if the IoU
  exceeds `threshold`; besides, every ground-truth box takes the default box it
  overlaps most, whatever the IoU (a later box wins a default box two share).

  Args:
    boxes_G4: ground-truth boxes, ltrb.
    classes_G: their classes; 0 marks padding.
    anchors_A4: default boxes, xywh.
    threshold: the IoU criterion.

  Returns:
    (boxes_A4, classes_A): the matched ground-truth box (ltrb; the default box
    itself where unmatched) and class (0: background) per default box.
  """
  valid_G = classes_G > 0
  anchors_ltrb = xywh_to_ltrb(anchors_A4)
  iou_GA = jnp.where(valid_G[:, None], iou(boxes_G4, anchors_ltrb), -1.0)
  best_gt_A = jnp.argmax(iou_GA, axis=0)
  best_iou_A = jnp.max(iou_GA, axis=0)
  best_anchor_G = jnp.argmax(iou_GA, axis=1)
  g = jnp.arange(boxes_G4.shape[0])
  forced_GA = (best_anchor_G[:, None] == jnp.arange(anchors_A4.shape[0])[None]) & valid_G[:, None]
  forced_A = forced_GA.any(axis=0)
  forced_gt_A = jnp.max(jnp.where(forced_GA, g[:, None], -1), axis=0)
  gt_A = jnp.where(forced_A, forced_gt_A, best_gt_A)
  matched_A = forced_A | (best_iou_A > threshold)
  classes_A = jnp.where(matched_A, classes_G[gt_A], 0)
  boxes_A4 = jnp.where(matched_A[:, None], boxes_G4[gt_A], anchors_ltrb)
  return boxes_A4, classes_A


def match_batch(boxes_BG4, classes_BG, anchors_A4, cfg: AnchorConfig):
  """`match` then `encode` per image: (targets_BA4, classes_BA)."""
  anchors = jnp.asarray(anchors_A4)

  def one(boxes_G4, classes_G):
    boxes_A4, classes_A = match(boxes_G4, classes_G, anchors, cfg.match_threshold)
    return encode(boxes_A4, anchors, cfg), classes_A

  return jax.vmap(one)(boxes_BG4, classes_BG)
