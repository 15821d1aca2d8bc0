"""Llama 3.1's pure functions for the harness: init, loss, eval, optimizer, logged keys."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import optax

from mlbench.workload import EvalPart, LayerStack, Schedule, StepContext
from workloads.common import llm
from workloads.llama31_8b.config import LlamaConfig
from workloads.llama31_8b.input_pipeline import TOKENS
from workloads.llama31_8b.model import Llama


def schedule(cfg: LlamaConfig) -> Schedule:
  """The budget is `train_budget_steps` (or the schedule's `max_steps`). The data has no
  epochs a run could finish (the reference samples 1.2 M steps' worth); the logged
  train_samples is the samples the run consumed, at its end (the rules'
  `train_samples: converged`, as the reference's callback logs it)."""
  budget = (cfg.train_budget_steps or cfg.optimizer.max_steps) * cfg.global_batch_size
  return Schedule(global_batch_size=cfg.global_batch_size, eval_batch_size=cfg.eval_batch_size,
                  train_examples=budget, eval_examples=cfg.data.eval_examples,
                  max_train_samples=budget,
                  gradient_accumulation_steps=cfg.gradient_accumulation_steps)


def init(cfg: LlamaConfig, rng: jax.Array) -> tuple[Any, Any]:
  tokens = jnp.zeros((1, cfg.data.seq_length), jnp.int32)
  return Llama(cfg.model).init(rng, tokens)["params"], {}


def _split(batch: Any) -> tuple[jax.Array, jax.Array]:
  """(inputs, next-token targets) of a batch of seq_length + 1 token samples."""
  tokens = batch[TOKENS]
  return tokens[:, :-1], tokens[:, 1:]


def loss(cfg: LlamaConfig, ctx: StepContext, params: Any, state: Any, batch: Any,
         rng: jax.Array) -> tuple[jax.Array, tuple[Any, dict[str, jax.Array]]]:
  """Mean next-token cross-entropy over every position (the reference masks nothing:
  eod_mask_loss off)."""
  del rng
  inputs, targets = _split(batch)
  logits = Llama(cfg.model, ctx.mesh, ctx.microbatches).apply({"params": params}, inputs)
  return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean(), (state, {})


def eval_step(cfg: LlamaConfig, ctx: StepContext, params: Any, state: Any,
              batch: Any) -> dict[str, jax.Array]:
  """Per sequence: the summed next-token NLL and the number of predicted tokens."""
  del state
  inputs, targets = _split(batch)
  logits = Llama(cfg.model, ctx.mesh, ctx.microbatches).apply({"params": params}, inputs)
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets).sum(-1)
  return {"nll": nll, "tokens": jnp.full(nll.shape, targets.shape[1], jnp.float32)}


def compute(cfg: LlamaConfig, part: EvalPart) -> dict[str, float]:
  """Validation log perplexity: mean NLL per token in nats (the reference's val_loss,
  logged as eval_accuracy)."""
  del cfg
  log_ppl = float(part.sums["nll"]) / float(part.sums["tokens"])
  return {"log_perplexity": log_ppl, "perplexity": math.exp(min(log_ppl, 700.0))}


def learning_rate(cfg: LlamaConfig) -> optax.Schedule:
  """NeMo's CosineAnnealing with warmup, t the number of updates already applied:
  base * (t + 1) / (W + 1) for t <= W, then end + (base - end) * (1 + cos(pi * (t - W) /
  (T - W))) / 2 up to T = max_steps, then end."""
  o = cfg.optimizer
  w, t_max = o.warmup_steps, o.max_steps

  def lr(count: jax.Array) -> jax.Array:
    t = jnp.asarray(count, jnp.float32)
    warm = o.base_learning_rate * (t + 1) / (w + 1)
    progress = jnp.clip((t - w) / max(t_max - w, 1), 0.0, 1.0)
    cosine = (o.end_learning_rate + (o.base_learning_rate - o.end_learning_rate)
              * 0.5 * (1 + jnp.cos(jnp.pi * progress)))
    return jnp.where(t <= w, warm, cosine)

  return lr


UNDECAYED = ("scale", "bias")
"""Parameter names that get no weight decay: norm scales and biases."""


def decay_mask(params: Any) -> Any:
  """True for the parameters AdamW decays, by their role, not their rank.

  Megatron's parameter groups, which NeMo's optimizer uses as they are, exempt norms
  and biases: `no_wd = name.endswith(".bias") or len(param.shape) == 1`
  (NVIDIA/Megatron-LM core_r0.11.0, 7c00175e, megatron/core/optimizer/__init__.py
  L90-94; NeMo v2.1.0, 633cb602, nemo/lightning/pytorch/optim/megatron.py L53 and L104
  pass no_weight_decay_cond=None). There every layer's tensors are separate, so rank 1
  means a norm or a bias; here `scan_layers` stacks them, so an RMSNorm scale is
  [layers, width] and only its name says what it is.
  """
  return jax.tree_util.tree_map_with_path(
      lambda path, _: getattr(path[-1], "key", None) not in UNDECAYED, params)


def optimizer(cfg: LlamaConfig, sched: Schedule) -> optax.GradientTransformation:
  """Clip by global norm, then AdamW with weight decay on every kernel and embedding,
  none on norm scales (`decay_mask`)."""
  del sched
  o = cfg.optimizer
  return optax.chain(optax.clip_by_global_norm(o.clip_norm),
                     optax.adamw(learning_rate(cfg), b1=o.beta_1, b2=o.beta_2, eps=o.epsilon,
                                 weight_decay=o.weight_decay, mask=decay_mask))


def hparams(cfg: LlamaConfig, sched: Schedule, ctx: StepContext) -> dict[str, Any]:
  """The keys of closed_llama31_8b.yaml (6.0.0) and its optional precision and
  parallelism disclosure (common.yaml)."""
  return llm.hparams(cfg.optimizer, sched, ctx, dtype=cfg.model.dtype,
                     seq_length=cfg.data.seq_length, name=cfg.name,
                     replicas=llm.mesh_size(ctx, "data"))


def partition_rules(cfg: LlamaConfig) -> list[tuple[str, Any]]:
  """Megatron-style tensor parallelism (query, key/value heads and MLP units over `model`,
  the vocabulary of both embeddings too) and FSDP: every matrix's width axis over `data`
  (`fsdp`), so parameters and the optimizer state that mirrors them are split over all
  devices. Norm scales are replicated. The rules describe one layer: the harness adds
  the scanned stack's layer axis (see `layer_stack`)."""
  from jax.sharding import PartitionSpec as P

  del cfg
  return [(r"attention/(query|key|value)/kernel$", P("fsdp", "heads", "kv")),
          (r"attention/output/kernel$", P("heads", "kv", "fsdp")),
          (r"mlp/(gate|up)/kernel$", P("fsdp", "mlp")),
          (r"mlp/down/kernel$", P("mlp", "fsdp")),
          (r"embedding/embedding$", P("vocab", "fsdp")),
          (r"output/kernel$", P("fsdp", "vocab"))]


def layer_stack(cfg: LlamaConfig) -> LayerStack | None:
  """Scanned decoder layers (`model.scan_layers`, as the full config has them) are the
  harness's layer stack, which a `stage` mesh axis splits into pipeline stages."""
  return LayerStack("layers", cfg.model.num_layers) if cfg.model.scan_layers else None


def flops_per_example(cfg: LlamaConfig) -> float:
  """Model FLOPs of one training sequence: 3x (forward + backward) the forward matmuls
  (projections, causal attention counted in full as MLPerf's 6 N D + attention
  convention does, SwiGLU, output projection)."""
  m, seq = cfg.model, cfg.data.seq_length
  kv = m.num_kv_heads * m.head_dim
  projections = 2 * seq * m.width * (2 * m.width + 2 * kv)
  attention = 4 * seq * seq * m.width
  mlp = 2 * seq * 3 * m.width * m.mlp_size
  forward = m.num_layers * (projections + attention + mlp) + 2 * seq * m.width * m.vocab_size
  return 3.0 * forward


def count_parameters(cfg: LlamaConfig) -> int:
  """Trainable parameters of a config, from shapes alone."""
  params = jax.eval_shape(lambda k: init(cfg, k)[0], jax.random.key(0))
  return int(sum(math.prod(x.shape) for x in jax.tree.leaves(params)))
