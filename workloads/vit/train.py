"""ViT's pure functions for the harness: init, loss (with Mixup), eval, optimizer, keys."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from mlbench.train import optim
from mlbench.workload import Schedule, StepContext
from workloads.common import classify
from workloads.common import transformer
from workloads.vit.config import Pool, ViTConfig
from workloads.vit.model import ViT


def schedule(cfg: ViTConfig) -> Schedule:
  return Schedule(global_batch_size=cfg.global_batch_size, eval_batch_size=cfg.eval_batch_size,
                  train_examples=cfg.data.train_examples, eval_examples=cfg.data.eval_examples,
                  max_train_samples=int(round(cfg.train_epochs * cfg.data.train_examples)))


def init(cfg: ViTConfig, rng: jax.Array) -> tuple[Any, Any]:
  size = cfg.data.image_size
  params = ViT(cfg.model).init(rng, jnp.zeros((1, size, size, 3), jnp.float32))["params"]
  return params, {}


def mixup(rng: jax.Array, alpha: float, *arrays_B: jax.Array) -> list[jax.Array]:
  """big_vision's `get_mixup`: one a ~ Beta(alpha, alpha) per batch, a = max(a, 1 - a)."""
  a = jax.random.beta(rng, alpha, alpha)
  return mix(jnp.maximum(a, 1.0 - a), *arrays_B)


def mix(a: jax.Array | float, *arrays_B: jax.Array) -> list[jax.Array]:
  """Each array mixed with itself rolled by one example: a * x + (1 - a) * roll(x, 1)."""
  return [a * x + (1.0 - a) * jnp.roll(x, 1, axis=0) for x in arrays_B]


def loss(cfg: ViTConfig, ctx: StepContext, params: Any, state: Any, batch: Any,
         rng: jax.Array) -> tuple[jax.Array, tuple[Any, dict[str, jax.Array]]]:
  """Softmax cross-entropy against the (mixed) one-hot labels (big_vision softmax_xent)."""
  labels_BK = jax.nn.one_hot(batch["label"], cfg.model.num_classes)
  images = batch["image"]
  if cfg.optimizer.mixup_alpha:
    images, labels_BK = mixup(rng, cfg.optimizer.mixup_alpha, images, labels_BK)
  logits_BK = ViT(cfg.model, ctx.mesh).apply({"params": params}, images, train=True)
  xent = optax.softmax_cross_entropy(logits_BK, labels_BK).mean()
  accuracy = (jnp.argmax(logits_BK, -1) == batch["label"]).mean()
  return xent, (state, {"accuracy": accuracy})


def eval_step(cfg: ViTConfig, ctx: StepContext, params: Any, state: Any,
              batch: Any) -> dict[str, jax.Array]:
  """Per image: top-1 hit and cross-entropy."""
  del state
  logits_BK = ViT(cfg.model, ctx.mesh).apply({"params": params}, batch["image"])
  return classify.eval_outputs(logits_BK, batch["label"])


def learning_rate(cfg: ViTConfig, sched: Schedule) -> tuple[float, int]:
  """(learning rate, warmup steps) at the global batch, by `optimizer.lr_scaling` from the
  values tuned at `base_batch_size` (LEGW keeps the warmup's step count: k times the
  epochs at k times the batch)."""
  o = cfg.optimizer
  epochs0 = o.warmup_steps * o.base_batch_size / sched.train_examples
  lr, epochs = optim.scale_for_batch(o.lr_scaling.value, o.learning_rate, epochs0,
                                     base_batch_size=o.base_batch_size,
                                     global_batch_size=sched.global_batch_size)
  return lr, int(round(epochs * sched.train_examples / sched.global_batch_size))


def warmup_cosine(warmup_steps: int, total_steps: int) -> optax.Schedule:
  """big_vision `create_learning_rate_schedule(decay_type='cosine')` at base 1:
  0.5 (1 + cos(pi p)) x min(1, t / warmup), p = clip((t - warmup) / (total - warmup))."""

  def rate(count: jax.Array) -> jax.Array:
    t = jnp.asarray(count, jnp.float32)
    progress = jnp.clip((t - warmup_steps) / max(total_steps - warmup_steps, 1), 0.0, 1.0)
    return 0.5 * (1.0 + jnp.cos(jnp.pi * progress)) * jnp.minimum(1.0, t / max(warmup_steps, 1))

  return rate


def _kernels(params: Any) -> Any:
  """big_vision's default wd_mults `.*/kernel$`: weight decay on kernels only."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: str(getattr(path[-1], "key", "")) == "kernel", params)


def optimizer(cfg: ViTConfig, sched: Schedule) -> optax.GradientTransformation:
  """big_vision/optax.py `make`: clip, Adam, x lr, + decoupled wd, x schedule, x -1."""
  o = cfg.optimizer
  lr, warmup = learning_rate(cfg, sched)
  return optax.chain(
      optax.clip_by_global_norm(o.grad_clip_norm),
      optax.scale_by_adam(b1=o.b1, b2=o.b2, eps=o.eps,
                          mu_dtype=jnp.bfloat16 if o.mu_bfloat16 else None),
      optax.scale(lr),
      optax.add_decayed_weights(o.weight_decay, _kernels),
      optax.scale_by_schedule(warmup_cosine(warmup, sched.max_steps)),
      optax.scale(-1.0))


def hparams(cfg: ViTConfig, sched: Schedule, ctx: StepContext) -> dict[str, Any]:
  """The keys of rules/mlbench/vit.yaml."""
  del ctx
  o, d = cfg.optimizer, cfg.data
  lr, warmup = learning_rate(cfg, sched)
  return {"opt_name": "adam",
          "model_variant": cfg.model.variant.value,
          "opt_base_learning_rate": lr,
          "opt_learning_rate_warmup_steps": warmup,
          "opt_learning_rate_decay_schedule": "cosine with linear warmup",
          "opt_learning_rate_scaling": o.lr_scaling.value,
          "opt_adam_beta_1": o.b1,
          "opt_adam_beta_2": o.b2,
          "opt_adam_epsilon": o.eps,
          "opt_weight_decay": o.weight_decay,
          "opt_gradient_clip_norm": o.grad_clip_norm,
          "mixup_alpha": o.mixup_alpha,
          "randaug_layers": d.randaug_layers,
          "randaug_magnitude": d.randaug_magnitude}


def partition_rules(cfg: ViTConfig) -> list[tuple[str, Any]]:
  """Megatron-style model parallelism of the attention and MLP blocks by annotation."""
  del cfg
  return transformer.partition_rules()


def flops_per_example(cfg: ViTConfig) -> float:
  """Model FLOPs of one training image: 3x the forward patch embedding, every block's
  attention (projections, scores, weighted values) and MLP, pre-logits and head."""
  m = cfg.model
  width, depth, mlp_dim, _ = m.sizes()
  patches = (cfg.data.image_size // m.patch_size) ** 2
  tokens = patches + (1 if m.pool is Pool.TOK else 0)
  forward = 2.0 * patches * m.patch_size ** 2 * 3 * width
  forward += depth * (transformer.attention_flops(tokens, tokens, width)
                      + transformer.mlp_flops(tokens, width, mlp_dim))
  forward += (2 * width * width if m.pre_logits else 0) + 2 * width * m.num_classes
  return 3.0 * forward
