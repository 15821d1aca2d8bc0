"""ResNet-50's pure functions for the harness: init, loss, eval, optimizer, logged keys."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from mlbench.train import optim
from mlbench.workload import Schedule, StepContext
from workloads.common import classify, conv
from workloads.resnet50.bot import mhsa_flops
from workloads.resnet50.config import Block, Optimizer, ResNetConfig, Stem
from workloads.resnet50.model import ResNet


def schedule(cfg: ResNetConfig) -> Schedule:
  """Epochs of whole steps, the remainder batch dropped, as the reference counts them:
  per_epoch_steps = 1,281,167 // 4,096 = 312 (mlcommons/training aa344c7f
  retired_benchmarks/resnet-tf2/tensorflow2/common.py L635-639, drop_train_remainder),
  evaluations every epochs_between_evals * per_epoch_steps steps from eval_offset_epochs
  * per_epoch_steps (resnet_ctl_imagenet_main.py L165 and L181-188: steps 624, 1,872,
  ...), and train_steps = per_epoch_steps * train_epochs (L212: 13,104), not the
  fractional epochs' 626 and 13,137."""
  per_epoch = cfg.data.train_examples // cfg.global_batch_size
  return Schedule(global_batch_size=cfg.global_batch_size, eval_batch_size=cfg.eval_batch_size,
                  train_examples=cfg.data.train_examples, eval_examples=cfg.data.eval_examples,
                  max_train_samples=_steps(cfg, per_epoch)[1] * cfg.global_batch_size,
                  eval_offset=cfg.eval_offset_epochs, epoch_steps=per_epoch)


def init(cfg: ResNetConfig, rng: jax.Array) -> tuple[Any, Any]:
  """The parameters and batch-norm statistics; the same tree with either ImageNet stem
  (the space-to-depth one keeps the 7x7x3 kernel)."""
  size = cfg.data.image_size
  image = conv.stem_input_shape(cfg.model.stem, size, size)
  variables = ResNet(cfg.model).init(rng, jnp.zeros((1, *image), jnp.float32), train=False)
  return variables["params"], {"batch_stats": variables["batch_stats"]}


def loss(cfg: ResNetConfig, ctx: StepContext, params: Any, state: Any, batch: Any,
         rng: jax.Array) -> tuple[jax.Array, tuple[Any, dict[str, jax.Array]]]:
  """Label-smoothed cross-entropy; batch-norm statistics over ctx.bn_groups groups."""
  del rng  # No dropout.
  logits_BK, updates = ResNet(cfg.model, ctx.bn_groups).apply(
      {"params": params, **state}, batch["image"], train=True, mutable=["batch_stats"])
  labels_BK = jax.nn.one_hot(batch["label"], cfg.model.num_classes)
  smoothed = optax.smooth_labels(labels_BK, cfg.optimizer.label_smoothing)
  xent = optax.softmax_cross_entropy(logits_BK, smoothed).mean()
  accuracy = (jnp.argmax(logits_BK, -1) == batch["label"]).mean()
  return xent, ({"batch_stats": updates["batch_stats"]}, {"accuracy": accuracy})


def eval_step(cfg: ResNetConfig, ctx: StepContext, params: Any, state: Any,
              batch: Any) -> dict[str, jax.Array]:
  """Per image: top-1 hit and (unsmoothed) cross-entropy."""
  del ctx
  logits_BK = ResNet(cfg.model).apply({"params": params, **state}, batch["image"], train=False)
  return classify.eval_outputs(logits_BK, batch["label"])


def _per_epoch(sched: Schedule) -> int:
  return sched.epoch_steps or sched.train_examples // sched.global_batch_size


def _rate(cfg: ResNetConfig) -> tuple[float, float]:
  """(peak learning rate, warmup epochs) at the global batch, by `optimizer.lr_scaling`."""
  o = cfg.optimizer
  return optim.scale_for_batch(o.lr_scaling.value, o.base_learning_rate, o.warmup_epochs,
                               base_batch_size=o.base_batch_size,
                               global_batch_size=cfg.global_batch_size)


def _steps(cfg: ResNetConfig, per_epoch: int) -> tuple[float, int]:
  """(warmup steps, train steps) of the learning-rate schedule, from a whole number
  of steps per epoch as the reference counts them (the remainder batch dropped:
  1,281,167 // 4,096 = 312; resnet-tf2 common.py L637-639, lars_util.py L112-114,
  resnet_runnable.py L114)."""
  return _rate(cfg)[1] * per_epoch, int(round(per_epoch * cfg.train_epochs))


# The reference LARSOptimizer replaces an epsilon of 0 (the logged value)
# by Keras' backend epsilon, 1e-7 (lars_optimizer.py L109: `epsilon or
# backend_config.epsilon()`).
LARS_EPSILON_FLOOR = 1e-7


def optimizer(cfg: ResNetConfig, sched: Schedule) -> optax.GradientTransformation:
  o = cfg.optimizer
  warmup, train_steps = _steps(cfg, _per_epoch(sched))
  lr = optim.poly_warmup_schedule(_rate(cfg)[0], warmup_steps=warmup,
                                  train_steps=train_steps, end_lr=o.end_learning_rate,
                                  power=o.poly_power)
  if o.name is Optimizer.LARS:
    return optim.mlperf_lars(lr, momentum=o.momentum, weight_decay=o.weight_decay,
                             mask=optim.kernel_mask, eta=o.lars_eta,
                             eps=o.lars_epsilon or LARS_EPSILON_FLOOR)
  # SGD: the reference adds weight_decay * 2 * sum(l2_loss(v)) = wd * sum(v^2) to the
  # loss for every variable whose name lacks 'bn' (the fc bias included), so the
  # gradient gains 2 * wd * w (resnet-tf2 resnet_runnable.py L287-294).
  return optim.sgd_momentum(lr, momentum=o.momentum, weight_decay=2 * o.weight_decay,
                            mask=optim.name_mask(("bn",)))


def hparams(cfg: ResNetConfig, sched: Schedule, ctx: StepContext) -> dict[str, Any]:
  """The keys closed_resnet{,_lars,_sgd}.yaml require, named as the reference logs them."""
  o = cfg.optimizer
  p = o.name.value
  warmup, train_steps = _steps(cfg, _per_epoch(sched))
  rate, warmup_epochs = _rate(cfg)
  out = {"opt_name": p,
         # Not an MLPerf key (the checker ignores it): how the stem was computed.
         "mlbench_stem": cfg.model.stem.value,
         "model_bn_span": sched.global_batch_size // ctx.bn_groups,
         f"{p}_opt_base_learning_rate": rate,
         f"{p}_opt_end_learning_rate": o.end_learning_rate,
         f"{p}_opt_learning_rate_decay_poly_power": o.poly_power,
         f"{p}_opt_learning_rate_decay_steps": int(train_steps - warmup + 1),
         f"{p}_opt_momentum": o.momentum,
         f"{p}_opt_weight_decay": o.weight_decay}
  if o.name is Optimizer.LARS:
    out["lars_epsilon"] = o.lars_epsilon
    out["lars_opt_learning_rate_warmup_epochs"] = warmup_epochs
  else:
    out["opt_learning_rate_warmup_epochs"] = warmup_epochs
  return out


def partition_rules(cfg: ResNetConfig) -> list[tuple[str, Any]]:
  """Model parallelism by annotation: every convolution's output channels over `model`.

  Kernels are HWIO. With a `model` axis, GSPMD splits the channels of every
  activation and inserts the collectives; on a data-only mesh nothing changes.
  """
  from jax.sharding import PartitionSpec as P

  del cfg
  return [(r"conv[^/]*/kernel$", P(None, None, None, "channels"))]


def flops_per_example(cfg: ResNetConfig) -> float:
  """Model FLOPs of one training image: 3x (forward + backward) the forward
  convolutions and the classifier, walked through the architecture as model.py
  builds it (stem, bottlenecks with the stride in the 3x3, 1x1 projections; BoT50's
  self-attention at the stride's input resolution)."""
  m, size = cfg.model, cfg.data.image_size
  # Space-to-depth runs the stem as a 4x4x12 kernel whose 15 zero taps of 64 are no model
  # work: the model's count is the 7x7x3 convolution's, whichever way it is computed.
  if m.stem is not Stem.SMALL:
    size = conv.out_size(size, 7, 2, pad=6)
    forward = conv.conv_flops(size, 7, 3, m.width)
    size = conv.out_size(size, 3, 2)  # the max pool
  else:
    forward = conv.conv_flops(size, 3, 3, m.width)
  channels = m.width
  for stage, blocks in enumerate(m.stage_sizes):
    width = m.width * 2 ** stage
    for block in range(blocks):
      stride = 2 if stage > 0 and block == 0 else 1
      out = conv.out_size(size, 3, stride)
      bot = m.block is Block.BOTTLENECK_TRANSFORMER and stage == len(m.stage_sizes) - 1
      middle = mhsa_flops(size, width) if bot else conv.conv_flops(out, 3, width, width)
      forward += (conv.conv_flops(size, 1, channels, width) + middle
                  + conv.conv_flops(out, 1, width, 4 * width))
      if channels != 4 * width or stride != 1:
        forward += conv.conv_flops(out, 1, channels, 4 * width)
      size, channels = out, 4 * width
  forward += 2 * channels * m.num_classes
  return 3.0 * forward
