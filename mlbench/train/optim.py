"""Large-batch optimizers with the MLPerf reference math, as optax transforms.

`optax.lars` computes the trust ratio as eta*||w|| / ||g + wd*w||; the MLPerf
reference (mlcommons/training image_classification/tensorflow2/
lars_optimizer.py, and Google's JAX submissions) uses
eta*||w|| / (||g|| + wd*||w|| + eps) and applies momentum to the learning-rate
scaled update. `mlperf_lars` reproduces the reference exactly; batch-norm and
bias parameters skip both weight decay and the trust ratio (plain momentum).

`optax.lamb(mask=)` masks only the weight decay and still applies the trust
ratio to LayerNorm and bias parameters; the MLPerf BERT reference
(language_model/tensorflow/bert optimization.py and lamb_optimizer_v1.py)
excludes them from both. `mlperf_lamb` reproduces the reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

Mask = Callable[[Any], Any]
"""params -> pytree of bools: True where weight decay and the trust ratio apply."""


def poly_warmup_schedule(base_lr: float, *, warmup_steps: float, train_steps: int,
                         end_lr: float = 1e-4, power: float = 2.0) -> optax.Schedule:
  """The MLPerf ResNet schedule: linear warmup, then polynomial decay to `end_lr`.

  lr(t) = base * t / warmup                        for t <= warmup
        = (base - end) * (1 - min(t - warmup, D) / D)^power + end   otherwise,
  with D = train_steps - warmup + 1 (`lars_opt_learning_rate_decay_steps`) and
  t the number of updates already applied (0 for the first).
  """
  decay_steps = train_steps - warmup_steps + 1

  def schedule(count: jax.Array) -> jax.Array:
    t = jnp.asarray(count, jnp.float32)
    warm = base_lr * t / max(warmup_steps, 1e-12)
    frac = jnp.minimum(t - warmup_steps, decay_steps) / decay_steps
    poly = (base_lr - end_lr) * (1.0 - frac) ** power + end_lr
    return jnp.where(t <= warmup_steps, warm, poly)

  return schedule


LR_SCALING = ("none", "linear", "legw")
"""How a learning rate tuned at one batch size moves to another (`scale_for_batch`)."""


def scale_for_batch(rule: str, base_lr: float, base_warmup_epochs: float, *,
                    base_batch_size: int, global_batch_size: int) -> tuple[float, float]:
  """(peak learning rate, warmup epochs) at `global_batch_size` from values tuned at
  `base_batch_size`, with k = global_batch_size / base_batch_size:

  none:   (base_lr, w0)
  linear: (base_lr * k, w0)          Goyal et al. 2017, the linear scaling rule
  legw:   (base_lr * sqrt(k), w0 * k)
      LEGW, You et al. 2019 ("Large-Batch Training for LSTM and Beyond", SC'19,
      arXiv:1901.08256): Sqrt Scaling of the learning rate with Linear-Epoch Gradual
      Warmup: when the batch grows k times, the warmup lasts k times as many epochs
      (the same number of steps) and the peak learning rate grows sqrt(k) times; the
      decay after the warmup is the schedule's own.
  """
  if rule not in LR_SCALING:
    from mlbench.errors import UserError, choices

    raise UserError(f"unknown learning-rate scaling '{rule}'; choose one of: "
                    f"{choices(LR_SCALING)}")
  k = global_batch_size / base_batch_size
  if rule == "linear":
    return base_lr * k, base_warmup_epochs
  if rule == "legw":
    return base_lr * math.sqrt(k), base_warmup_epochs * k
  return base_lr, base_warmup_epochs


class _TrustState(NamedTuple):
  pass


def scale_by_mlperf_lars_trust(*, weight_decay: float, eta: float = 1e-3,
                               eps: float = 0.0) -> optax.GradientTransformation:
  """g -> trust * (g + wd*w), trust = eta*||w|| / (||g|| + wd*||w|| + eps).

  The trust ratio is 1 where ||w|| or ||g|| is zero, as in the reference.
  """

  def update(updates, state, params):
    def one(g, w):
      w_norm = jnp.linalg.norm(w.astype(jnp.float32))
      g_norm = jnp.linalg.norm(g.astype(jnp.float32))
      trust = jnp.where((w_norm > 0) & (g_norm > 0),
                        eta * w_norm / (g_norm + weight_decay * w_norm + eps), 1.0)
      return (trust * (g + weight_decay * w)).astype(g.dtype)

    return jax.tree.map(one, updates, params), state

  return optax.GradientTransformation(lambda params: _TrustState(), update)


def mlperf_lars(learning_rate: optax.ScalarOrSchedule, *, momentum: float, weight_decay: float,
                mask: Mask, eta: float = 1e-3, eps: float = 0.0) -> optax.GradientTransformation:
  """LARS exactly as the MLPerf reference computes it.

  v <- momentum * v + lr * trust * (g + wd * w);  w <- w - v
  (for masked-out parameters: v <- momentum * v + lr * g).
  """
  return optax.chain(
      optax.masked(scale_by_mlperf_lars_trust(weight_decay=weight_decay, eta=eta, eps=eps), mask),
      optax.scale_by_learning_rate(learning_rate),
      optax.trace(decay=momentum, nesterov=False),
  )


def sgd_momentum(learning_rate: optax.ScalarOrSchedule, *, momentum: float, weight_decay: float,
                 mask: Mask) -> optax.GradientTransformation:
  """SGD with momentum and L2 weight decay on the masked parameters (the MLPerf SGD option)."""
  return optax.chain(
      optax.add_decayed_weights(weight_decay, mask),
      optax.scale_by_learning_rate(learning_rate),
      optax.trace(decay=momentum, nesterov=False),
  )


def torch_sgd(learning_rate: optax.ScalarOrSchedule, *, momentum: float, weight_decay: float,
              mask: Mask) -> optax.GradientTransformation:
  """torch.optim.SGD (dampening 0, no Nesterov): the learning rate multiplies the
  momentum buffer instead of entering it, which differs from `sgd_momentum` as soon
  as the rate changes (warmup, step decay).

  b <- momentum * b + (g + wd * w)   (wd only where `mask`);   w <- w - lr * b
  """
  return optax.chain(
      optax.add_decayed_weights(weight_decay, mask),
      optax.trace(decay=momentum, nesterov=False),
      optax.scale_by_learning_rate(learning_rate),
  )


def name_mask(exclude: tuple[str, ...]) -> Mask:
  """A mask that is False for parameters whose path contains any of `exclude`.

  The MLPerf BERT reference's `exclude_from_weight_decay` (and layer adaptation):
  ("LayerNorm", "layer_norm", "bias"), matched against parameter names.
  """
  from mlbench.train.sharding import path_str

  def mask(params: Any) -> Any:
    return jax.tree_util.tree_map_with_path(
        lambda path, _: not any(x in path_str(path) for x in exclude), params)

  return mask


def kernel_mask(params: Any) -> Any:
  """True for weight matrices and conv kernels (ndim > 1), False for biases and norms."""
  return jax.tree.map(lambda p: p.ndim > 1, params)


def bert_lr_schedule(base_lr: float, *, warmup_steps: int, start_warmup_step: int,
                     train_steps: int, power: float = 1.0, end_lr: float = 0.0) -> optax.Schedule:
  """The MLPerf BERT schedule: polynomial decay with a linear warmup that may start early.

  lr(t) = base * (t - start_warmup_step) / warmup_steps   while t - start_warmup_step < warmup
        = (base - end) * (1 - min(t, train_steps) / train_steps)^power + end   otherwise,
  with t the number of updates already applied (0 for the first). A negative
  `start_warmup_step` means the warmup began before step 0 (Google's pod runs).
  """

  def schedule(count: jax.Array) -> jax.Array:
    t = jnp.asarray(count, jnp.float32)
    frac = jnp.minimum(t, train_steps) / train_steps
    decayed = (base_lr - end_lr) * (1.0 - frac) ** power + end_lr
    if not warmup_steps:
      return decayed
    since = t - start_warmup_step
    return jnp.where(since < warmup_steps, base_lr * since / warmup_steps, decayed)

  return schedule


def rsqrt_schedule(base_lr: float, *, warmup_steps: int, width: int) -> optax.Schedule:
  """The Transformer schedule (tensor2tensor's constant * linear_warmup * rsqrt_decay *
  rsqrt_hidden_size): lr(step) = base * min(1, step / warmup) / sqrt(max(step, warmup))
  / sqrt(width), with step = updates already applied + 1."""

  def schedule(count: jax.Array) -> jax.Array:
    step = jnp.asarray(count, jnp.float32) + 1.0
    warm = jnp.minimum(1.0, step / warmup_steps)
    return base_lr * warm * jax.lax.rsqrt(jnp.maximum(step, float(warmup_steps))) * width ** -0.5

  return schedule


def mlperf_lamb(learning_rate: optax.ScalarOrSchedule, *, b1: float, b2: float, eps: float,
                weight_decay: float, mask: Mask, clip_norm: float = 1.0
                ) -> optax.GradientTransformation:
  """LAMB exactly as the MLPerf BERT reference computes it.

  g <- g * min(1, clip / ||g||_global);  m, v <- Adam moments of g
  u <- m_hat / (sqrt(v_hat) + eps) + wd * w               (wd only where `mask`)
  w <- w - lr * (||w|| / ||u||) * u                        (trust ratio only where `mask`;
                                                            1 where either norm is 0)
  """
  return optax.chain(
      optax.clip_by_global_norm(clip_norm),
      optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
      optax.add_decayed_weights(weight_decay, mask),
      optax.masked(optax.scale_by_trust_ratio(), mask),
      optax.scale_by_learning_rate(learning_rate),
  )


def adamw_cosine_hparams(o: Any) -> dict[str, Any]:
  """The MLPerf 6.x keys of AdamW with linear warmup and cosine decay (the LLM and
  MoE rules): `o` has base/end learning rate, warmup and max steps, the betas,
  epsilon, weight decay and clip norm. The decay runs from warmup to max_steps."""
  return {"opt_name": "adamw",
          "opt_base_learning_rate": o.base_learning_rate,
          "opt_end_learning_rate": o.end_learning_rate,
          "opt_learning_rate_warmup_steps": o.warmup_steps,
          "opt_learning_rate_decay_steps": o.max_steps - o.warmup_steps,
          "opt_learning_rate_decay_schedule": "cosine with linear warmup",
          "opt_adamw_beta_1": o.beta_1,
          "opt_adamw_beta_2": o.beta_2,
          "opt_adamw_epsilon": o.epsilon,
          "opt_adamw_weight_decay": o.weight_decay,
          "opt_gradient_clip_norm": o.clip_norm,
          "max_steps": o.max_steps}
