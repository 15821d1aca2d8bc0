"""SSD's pure functions for the harness: init, loss, eval step, optimizer, logged keys.

Shape legend: B batch, A default boxes, K classes (with background).
"""

from __future__ import annotations

import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from mlbench.train import optim
from mlbench.workload import Schedule, StepContext, WithMetadata
from workloads.common import conv
from workloads.ssd import backbone, boxes, nms
from workloads.ssd.config import AnchorConfig, SSDConfig, Stem
from workloads.ssd.model import SSD

NEGATIVES_PER_POSITIVE = 3  # hard-negative mining ratio of the reference's Loss


def schedule(cfg: SSDConfig) -> Schedule:
  return Schedule(global_batch_size=cfg.global_batch_size, eval_batch_size=cfg.eval_batch_size,
                  train_examples=cfg.data.train_examples, eval_examples=cfg.data.eval_examples,
                  max_train_samples=int(round(cfg.train_epochs * cfg.data.train_examples)))


@functools.cache
def anchors(cfg: AnchorConfig, image_size: int) -> np.ndarray:
  """The default boxes [A, 4] (xywh), computed once per config."""
  return boxes.default_boxes(cfg, image_size)


def _model(cfg: SSDConfig, bn_groups: int = 1) -> SSD:
  return SSD(cfg.model, cfg.anchors, bn_groups)


def init(cfg: SSDConfig, rng: jax.Array) -> tuple[Any, Any]:
  """Random weights; the backbone's from `cfg.backbone_weights` where given."""
  size = cfg.data.image_size
  image = conv.stem_input_shape(cfg.model.stem, size, size)  # the same tree with either stem
  variables = _model(cfg).init(rng, jnp.zeros((1, *image), jnp.float32), train=False)
  if cfg.backbone_weights:
    variables = _with_backbone(cfg, dict(variables))
  return variables["params"], {"batch_stats": variables["batch_stats"]}


def _with_backbone(cfg: SSDConfig, variables: dict[str, Any]) -> dict[str, Any]:
  """Replaces the backbone's parameters and batch-norm statistics by the file's,
  read on the host (a callback, so the harness's jitted init fills sharded arrays)."""
  flat = flax.traverse_util.flatten_dict(variables, sep="/")
  paths = list(backbone.torchvision_names(cfg.model))
  shapes = {p: tuple(flat[p].shape) for p in paths}
  backbone.read(cfg.model, cfg.backbone_weights, shapes)  # a bad file fails here, at trace

  def load() -> list[np.ndarray]:
    arrays = backbone.read(cfg.model, cfg.backbone_weights, shapes)
    return [arrays[p] for p in paths]

  loaded = jax.pure_callback(load, [jax.ShapeDtypeStruct(shapes[p], jnp.float32)
                                    for p in paths])
  flat.update(zip(paths, loaded))
  return flax.traverse_util.unflatten_dict(flat, sep="/")


def multibox_loss(loc_BA4: jax.Array, logits_BAK: jax.Array, targets_BA4: jax.Array,
                  labels_BA: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The reference's `Loss` (base_model.py): smooth L1 on the positives' box offsets,
  cross-entropy on the positives and the 3x as many negatives with the highest
  cross-entropy, both summed per image and divided by its positives (images
  without any contribute 0), averaged over the batch."""
  pos_BA = labels_BA > 0
  n_pos_B = pos_BA.sum(axis=1)
  smooth_l1_BA = optax.huber_loss(loc_BA4, targets_BA4, delta=1.0).sum(axis=-1)
  loc_B = jnp.where(pos_BA, smooth_l1_BA, 0.0).sum(axis=1)
  xent_BA = optax.softmax_cross_entropy_with_integer_labels(logits_BAK, labels_BA)
  negatives_BA = jnp.where(pos_BA, 0.0, xent_BA)
  rank_BA = jnp.argsort(jnp.argsort(-negatives_BA, axis=1), axis=1)
  hard_BA = rank_BA < jnp.minimum(NEGATIVES_PER_POSITIVE * n_pos_B, pos_BA.shape[1])[:, None]
  conf_B = (xent_BA * (pos_BA.astype(jnp.float32) + hard_BA.astype(jnp.float32))).sum(axis=1)
  scale_B = jnp.where(n_pos_B > 0, 1.0 / jnp.maximum(n_pos_B, 1), 0.0)
  return ((loc_B + conf_B) * scale_B).mean(), {"loc_loss": (loc_B * scale_B).mean(),
                                               "conf_loss": (conf_B * scale_B).mean(),
                                               "positives": n_pos_B.mean()}


def loss(cfg: SSDConfig, ctx: StepContext, params: Any, state: Any, batch: Any,
         rng: jax.Array) -> tuple[jax.Array, tuple[Any, dict[str, jax.Array]]]:
  """Matches the padded ground truth to the default boxes on the device, then
  `multibox_loss`; batch-norm statistics over ctx.bn_groups groups."""
  del rng  # No dropout; augmentation happens in the input pipeline.
  (loc_BA4, logits_BAK), updates = _model(cfg, ctx.bn_groups).apply(
      {"params": params, **state}, batch["image"], train=True, mutable=["batch_stats"])
  targets_BA4, labels_BA = boxes.match_batch(
      batch["boxes"], batch["classes"], anchors(cfg.anchors, cfg.data.image_size), cfg.anchors)
  total, metrics = multibox_loss(loc_BA4, logits_BAK, targets_BA4, labels_BA)
  return total, ({"batch_stats": updates["batch_stats"]}, metrics)


def eval_step(cfg: SSDConfig, ctx: StepContext, params: Any, state: Any,
              batch: Any) -> dict[str, jax.Array]:
  """Per image: the top detections after per-class NMS (fixed size; score 0 = empty)."""
  del ctx
  loc_BA4, logits_BAK = _model(cfg).apply({"params": params, **state}, batch["image"],
                                          train=False)
  out = nms.detect(loc_BA4, logits_BAK, anchors(cfg.anchors, cfg.data.image_size), cfg.anchors,
                   cfg.eval)
  return {f"det_{k}": v for k, v in out.items()}


def _warmup_steps(cfg: SSDConfig, sched: Schedule) -> int:
  return max(1, int(round(cfg.optimizer.warmup_epochs * sched.steps_per_epoch)))


def _boundary_steps(cfg: SSDConfig, sched: Schedule) -> list[int]:
  return [int(round(e * sched.steps_per_epoch)) for e in cfg.optimizer.decay_boundary_epochs]


def learning_rate(cfg: SSDConfig, sched: Schedule) -> optax.Schedule:
  """The reference's schedule (train.py `lr_warmup` and the step decay).

  lr(t) = base - (W - t) * base / (W * 2^factor)   for t < W warmup steps
        = base * decay^(boundaries passed)         otherwise,
  with t the number of updates already applied.
  """
  o = cfg.optimizer
  warmup = _warmup_steps(cfg, sched)
  bounds = jnp.asarray(_boundary_steps(cfg, sched), jnp.float32)

  def lr(count: jax.Array) -> jax.Array:
    t = jnp.asarray(count, jnp.float32)
    warm = o.base_learning_rate - (warmup - t) * o.base_learning_rate / (
        warmup * 2.0 ** o.warmup_factor)
    decayed = o.base_learning_rate * o.decay_factor ** jnp.sum(t >= bounds)
    return jnp.where(t < warmup, warm, decayed)

  return lr


def optimizer(cfg: SSDConfig, sched: Schedule) -> optax.GradientTransformation:
  """torch.optim.SGD with momentum and weight decay on every parameter, as the
  reference (retired_benchmarks/ssd-v1/ssd/train.py L292-295), whose warmup sets the
  rate outside the momentum buffer (L176-183)."""
  o = cfg.optimizer
  return optim.torch_sgd(learning_rate(cfg, sched), momentum=o.momentum,
                         weight_decay=o.weight_decay,
                         mask=lambda params: jax.tree.map(lambda _: True, params))


def hparams(cfg: SSDConfig, sched: Schedule, ctx: StepContext) -> dict[str, Any]:
  """The keys closed_ssd.yaml (0.7.0) requires, named and valued as the reference logs them."""
  o = cfg.optimizer
  return {"model_bn_span": sched.global_batch_size // ctx.bn_groups,
          "mlbench_stem": cfg.model.stem.value,  # not an MLPerf key: how the stem ran
          "opt_base_learning_rate": o.base_learning_rate,
          "opt_weight_decay": o.weight_decay,
          "opt_learning_rate_warmup_factor": o.warmup_factor,
          "opt_learning_rate_warmup_steps": _warmup_steps(cfg, sched),
          "opt_learning_rate_decay_boundary_epochs": [_number(e) for e in
                                                      o.decay_boundary_epochs],
          "max_samples": cfg.data.crop_tries,
          **({"weights_initialization": WithMetadata(
              cfg.backbone_weights, {"source": "torchvision_resnet34", "tensors": len(
                  backbone.torchvision_names(cfg.model))})} if cfg.backbone_weights else {})}


def _number(x: float) -> int | float:
  return int(x) if float(x).is_integer() else float(x)


def partition_rules(cfg: SSDConfig) -> list[tuple[str, Any]]:
  """Model parallelism by annotation: the output channels of every backbone and extra
  convolution over `model` (the heads' box-times-class channels stay whole)."""
  from jax.sharding import PartitionSpec as P

  del cfg
  return [(r"conv[^/]*/kernel$", P(None, None, None, "channels"))]


def flops_per_example(cfg: SSDConfig) -> float:
  """Model FLOPs of one training image: 3x (forward + backward) the forward
  convolutions, walked through the architecture as model.py builds it: the
  truncated ResNet (BasicBlocks), the extra layers and the 3x3 location and class
  heads on every feature map (box matching, the loss and NMS are not model FLOPs)."""
  m, size = cfg.model, cfg.data.image_size
  channels = m.stage_widths[0]
  if m.stem is not Stem.SMALL:  # space-to-depth's zero taps are no model work (resnet50)
    size = conv.out_size(size, 7, 2, pad=6)
    forward = conv.conv_flops(size, 7, 3, channels)
    size = conv.out_size(size, 3, 2, pad=2)  # the max pool
  else:
    forward = conv.conv_flops(size, 3, 3, channels)
  for blocks, width, stride in zip(m.stage_sizes, m.stage_widths, m.stage_strides):
    for block in range(blocks):
      s = stride if block == 0 else 1
      out = conv.out_size(size, 3, s, pad=2)
      forward += conv.conv_flops(out, 3, channels, width) + conv.conv_flops(out, 3, width, width)
      if channels != width or s != 1:
        forward += conv.conv_flops(out, 1, channels, width)
      size, channels = out, width
  features = [(size, channels)]
  for width, out_channels, stride in zip(m.extra_widths, m.extra_channels, m.extra_strides):
    forward += conv.conv_flops(size, 1, channels, width)
    size = conv.out_size(size, 3, stride, pad=2 if stride > 1 else 0)
    forward += conv.conv_flops(size, 3, width, out_channels)
    features.append((size, out_channels))
    channels = out_channels
  for (size, channels), per_cell in zip(features, cfg.anchors.boxes_per_cell):
    forward += conv.conv_flops(size, 3, channels, per_cell * (4 + m.num_classes))
  return 3.0 * forward
