"""Detections from SSD outputs: decode, per-class greedy NMS, top-k; fixed shapes, on device.

The reference's `Encoder.decode_single` (mlcommons/training
single_stage_detector/ssd/utils.py), batched so that it compiles to one
program: per image and class, the `candidates_per_class` highest softmax
scores above `score_threshold` enter greedy non-maximum suppression (a kept box
removes the lower-scored boxes of its class that overlap it at IoU >=
`nms_iou`); of all survivors, the `max_detections` highest-scored are kept.
Slots without a detection have score 0.

Shape legend: B batch, A default boxes, K classes without background, C
candidates per class, D detections.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from workloads.ssd import boxes
from workloads.ssd.config import AnchorConfig, EvalConfig


def suppress(boxes_BKC4, valid_BKC, iou_threshold: float):
  """Greedy NMS over candidates sorted by descending score (last axis).

  Candidate i stays if it is valid and no kept candidate before it overlaps it
  at IoU >= `iou_threshold`. One loop over the candidates; each step compares
  one candidate with all others, so memory stays O(B*K*C).

  Returns:
    keep_BKC: bool.
  """
  c = boxes_BKC4.shape[-2]
  later_C = jnp.arange(c)

  def step(i, keep_BKC):
    box_BK14 = jax.lax.dynamic_slice_in_dim(boxes_BKC4, i, 1, axis=-2)
    overlap_BKC = boxes.iou(box_BK14, boxes_BKC4)[..., 0, :] >= iou_threshold
    kept_i_BK1 = jax.lax.dynamic_slice_in_dim(keep_BKC, i, 1, axis=-1)
    return keep_BKC & ~(kept_i_BK1 & overlap_BKC & (later_C > i))

  return jax.lax.fori_loop(0, c, step, valid_BKC)


def detect(loc_BA4, logits_BAK, anchors_A4, anchor_cfg: AnchorConfig, cfg: EvalConfig):
  """Per-image detections from the model's outputs.

  Args:
    loc_BA4: box regression outputs.
    logits_BAK: class logits, background first (K + 1 classes).
    anchors_A4: default boxes, xywh.

  Returns:
    {"boxes": [B, D, 4] ltrb (normalised), "scores": [B, D] (0: empty slot),
     "classes": [B, D] int32 (1..K)}.
  """
  boxes_BA4 = boxes.decode(loc_BA4.astype(jnp.float32), jnp.asarray(anchors_A4), anchor_cfg)
  probs_BKA = jnp.swapaxes(jax.nn.softmax(logits_BAK.astype(jnp.float32), axis=-1)[..., 1:], 1, 2)
  b, k, a = probs_BKA.shape
  c = min(cfg.candidates_per_class, a)
  scores_BKC, index_BKC = jax.lax.top_k(probs_BKA, c)
  cand_BKC4 = jnp.take_along_axis(boxes_BA4[:, None], index_BKC[..., None], axis=2)
  valid_BKC = scores_BKC > cfg.score_threshold
  keep_BKC = suppress(cand_BKC4, valid_BKC, cfg.nms_iou)
  scores_BN = jnp.where(keep_BKC, scores_BKC, 0.0).reshape(b, k * c)
  d = min(cfg.max_detections, k * c)
  top_BD, pick_BD = jax.lax.top_k(scores_BN, d)
  classes_BN = jnp.broadcast_to(jnp.arange(1, k + 1, dtype=jnp.int32)[:, None], (k, c))
  return {"boxes": jnp.take_along_axis(cand_BKC4.reshape(b, k * c, 4), pick_BD[..., None], 1),
          "scores": top_BD,
          "classes": jnp.where(top_BD > 0, classes_BN.reshape(-1)[pick_BD], 0)}
