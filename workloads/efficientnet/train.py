"""EfficientNet's pure functions for the harness: init, loss, eval, optimizer, logged keys.

The model state holds the batch-norm statistics and, with `optimizer.ema_decay`, the
exponential moving average of the weights and statistics that the reference evaluates
(main.py: tf.train.ExponentialMovingAverage(decay, num_updates=global_step) over
utils.get_ema_vars). The loss updates the average from the weights it is given, i.e.
after each step's update is applied the average is one step behind the reference's
(which averages right after the update); at 0.9999 that is immaterial.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from mlbench.train import optim
from mlbench.workload import EvalPart, Schedule, StepContext
from workloads.common import conv
from workloads.efficientnet.config import EfficientNetConfig
from workloads.efficientnet.model import HEAD, STEM, EfficientNet, blocks, round_filters


def schedule(cfg: EfficientNetConfig) -> Schedule:
  return Schedule(global_batch_size=cfg.global_batch_size, eval_batch_size=cfg.eval_batch_size,
                  train_examples=cfg.data.train_examples, eval_examples=cfg.data.eval_examples,
                  max_train_samples=int(round(cfg.train_epochs * cfg.data.train_examples)))


def init(cfg: EfficientNetConfig, rng: jax.Array) -> tuple[Any, Any]:
  size = cfg.image_size
  variables = EfficientNet(cfg.model).init(rng, jnp.zeros((1, size, size, 3), jnp.float32),
                                           train=False)
  state = {"batch_stats": variables["batch_stats"]}
  if cfg.optimizer.ema_decay:
    state["ema"] = {"params": variables["params"], "batch_stats": variables["batch_stats"],
                    "count": jnp.zeros((), jnp.int32)}
  return variables["params"], state


def _l2(params: Any) -> jax.Array:
  """sum(w^2) / 2 over every weight but batch norm's (main.py: tf.nn.l2_loss of the
  trainable variables without 'batch_normalization' in their names)."""
  leaves = jax.tree_util.tree_leaves_with_path(params)
  return sum(0.5 * jnp.sum(jnp.square(w)) for path, w in leaves
             if not any("_bn" in str(getattr(k, "key", "")) for k in path))


def _ema(decay: float, ema: Any, params: Any, batch_stats: Any) -> Any:
  """One update of the average with TF's num_updates warm-up: min(decay, (1+n)/(10+n))."""
  n = ema["count"].astype(jnp.float32)
  d = jnp.minimum(decay, (1.0 + n) / (10.0 + n))
  mix = lambda old, new: d * old + (1.0 - d) * new  # noqa: E731
  return {"params": jax.tree.map(mix, ema["params"], params),
          "batch_stats": jax.tree.map(mix, ema["batch_stats"], batch_stats),
          "count": ema["count"] + 1}


def loss(cfg: EfficientNetConfig, ctx: StepContext, params: Any, state: Any, batch: Any,
         rng: jax.Array) -> tuple[jax.Array, tuple[Any, dict[str, jax.Array]]]:
  """Label-smoothed cross-entropy plus the L2 term; dropout and drop-connect from `rng`."""
  o = cfg.optimizer
  logits_BK, updates = EfficientNet(cfg.model, ctx.bn_groups).apply(
      {"params": params, "batch_stats": state["batch_stats"]}, batch["image"], train=True,
      mutable=["batch_stats"], rngs={"dropout": rng})
  labels_BK = optax.smooth_labels(jax.nn.one_hot(batch["label"], cfg.model.num_classes),
                                  o.label_smoothing)
  xent = optax.softmax_cross_entropy(logits_BK, labels_BK).mean()
  new_state = {"batch_stats": updates["batch_stats"]}
  if "ema" in state:
    new_state["ema"] = _ema(o.ema_decay, state["ema"], params, state["batch_stats"])
  accuracy = (jnp.argmax(logits_BK, -1) == batch["label"]).mean()
  return xent + o.l2 * _l2(params), (new_state, {"accuracy": accuracy, "xent": xent})


def eval_step(cfg: EfficientNetConfig, ctx: StepContext, params: Any, state: Any,
              batch: Any) -> dict[str, jax.Array]:
  """Per image: top-1 hit and cross-entropy, with the averaged weights where kept."""
  del ctx
  variables = ({"params": state["ema"]["params"], "batch_stats": state["ema"]["batch_stats"]}
               if "ema" in state else {"params": params, "batch_stats": state["batch_stats"]})
  logits_BK = EfficientNet(cfg.model).apply(variables, batch["image"], train=False)
  return {"correct": (jnp.argmax(logits_BK, -1) == batch["label"]).astype(jnp.float32),
          "loss": optax.softmax_cross_entropy_with_integer_labels(logits_BK, batch["label"])}


def compute(cfg: EfficientNetConfig, part: EvalPart) -> dict[str, float]:
  del cfg
  return {"accuracy": float(part.sums["correct"] / part.count),
          "loss": float(part.sums["loss"] / part.count)}


def learning_rate(cfg: EfficientNetConfig, sched: Schedule) -> tuple[float, float, int]:
  """(peak learning rate, warmup steps, train steps): the configured rate moved to the
  global batch by `optimizer.lr_scaling`; the reference counts int(warmup epochs x
  examples / batch) warmup steps (utils.build_learning_rate)."""
  o = cfg.optimizer
  lr, warmup_epochs = optim.scale_for_batch(o.lr_scaling.value, o.base_learning_rate,
                                            o.warmup_epochs, base_batch_size=o.base_batch_size,
                                            global_batch_size=sched.global_batch_size)
  return lr, float(int(warmup_epochs * sched.steps_per_epoch)), sched.max_steps


def optimizer(cfg: EfficientNetConfig, sched: Schedule) -> optax.GradientTransformation:
  o = cfg.optimizer
  lr, warmup, train_steps = learning_rate(cfg, sched)
  rate = optim.poly_warmup_schedule(lr, warmup_steps=warmup, train_steps=train_steps,
                                    end_lr=o.end_learning_rate, power=o.poly_power)
  return optim.mlperf_lars(rate, momentum=o.momentum, weight_decay=o.weight_decay,
                           mask=optim.kernel_mask, eta=o.lars_eta, eps=o.lars_epsilon)


def hparams(cfg: EfficientNetConfig, sched: Schedule, ctx: StepContext) -> dict[str, Any]:
  """ResNet's LARS keys (rules/mlbench/efficientnet.yaml), named as MLPerf logs them."""
  o = cfg.optimizer
  lr, warmup, train_steps = learning_rate(cfg, sched)
  return {"opt_name": "lars",
          "model_variant": cfg.model.variant.value,
          "model_bn_span": sched.global_batch_size // ctx.bn_groups,
          "lars_opt_base_learning_rate": lr,
          "lars_opt_end_learning_rate": o.end_learning_rate,
          "lars_opt_learning_rate_decay_poly_power": o.poly_power,
          "lars_opt_learning_rate_decay_steps": int(train_steps - warmup + 1),
          "lars_opt_learning_rate_warmup_epochs": warmup / sched.steps_per_epoch,
          "lars_opt_momentum": o.momentum,
          "lars_opt_weight_decay": o.weight_decay,
          "lars_epsilon": o.lars_epsilon,
          "opt_learning_rate_scaling": o.lr_scaling.value,
          "label_smoothing": o.label_smoothing}


def flops_per_example(cfg: EfficientNetConfig) -> float:
  """Model FLOPs of one training image: 3x the forward convolutions (stem, each block's
  expansion, depthwise, squeeze-excite and projection, head) and the classifier."""
  m, size = cfg.model, conv.out_size(cfg.image_size, 3, 2)
  channels = round_filters(STEM, m.width)
  forward = conv.conv_flops(size, 3, 3, channels)
  for b in blocks(m):
    wide = b.c_in * b.expand
    if b.expand != 1:
      forward += conv.conv_flops(size, 1, b.c_in, wide)
    size = conv.out_size(size, b.kernel, b.stride)
    reduced = max(1, int(b.c_in * b.se_ratio))
    forward += (conv.conv_flops(size, b.kernel, 1, wide) + 2 * conv.conv_flops(1, 1, wide, reduced)
                + conv.conv_flops(size, 1, wide, b.c_out))
    channels = b.c_out
  head = round_filters(HEAD, m.width)
  forward += conv.conv_flops(size, 1, channels, head) + 2 * head * m.num_classes
  return 3.0 * forward
