"""GPT-OSS 20B's pure functions for the harness: init, loss, eval, optimizer, logged keys,
sharding, FLOPs and the parameter count."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import optax

from mlbench.workload import EvalPart, LayerStack, Schedule, StepContext
from workloads.common import llm
from workloads.common.megatron_data import TOKENS
from workloads.gpt_oss_20b.config import GptOssConfig
from workloads.gpt_oss_20b.model import GptOss


def schedule(cfg: GptOssConfig) -> Schedule:
  """The budget is `train_budget_steps` (or the schedule's `max_steps`). `train_samples`
  is logged as the reference's primus_mllog logs it, max_steps x global_batch_size (the
  samples its dataset is built for), before run_start."""
  budget = (cfg.train_budget_steps or cfg.optimizer.max_steps) * cfg.global_batch_size
  return Schedule(global_batch_size=cfg.global_batch_size, eval_batch_size=cfg.eval_batch_size,
                  train_examples=cfg.optimizer.max_steps * cfg.global_batch_size,
                  eval_examples=cfg.data.eval_examples, max_train_samples=budget,
                  gradient_accumulation_steps=cfg.gradient_accumulation_steps)


def init(cfg: GptOssConfig, rng: jax.Array) -> tuple[Any, Any]:
  tokens = jnp.zeros((1, cfg.data.seq_length), jnp.int32)
  return GptOss(cfg.model).init(rng, tokens)["params"], {}


def _nll(cfg: GptOssConfig, ctx: StepContext, params: Any,
         batch: Any) -> tuple[jax.Array, jax.Array]:
  """Per position: the next-token NLL and the loss mask, [B, L] each. Megatron's
  eod_mask_loss leaves out positions whose input token is the end of a document (the
  reference's GPTDataset: loss_mask[tokens == eod] = 0)."""
  tokens = batch[TOKENS]
  inputs, targets = tokens[:, :-1], tokens[:, 1:]
  logits = GptOss(cfg.model, ctx.mesh, ctx.microbatches).apply({"params": params}, inputs)
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  return nll, (inputs != cfg.data.eod_token).astype(jnp.float32)


def loss(cfg: GptOssConfig, ctx: StepContext, params: Any, state: Any, batch: Any,
         rng: jax.Array) -> tuple[jax.Array, tuple[Any, dict[str, jax.Array]]]:
  """Mean next-token cross-entropy over the positions the loss mask keeps; no auxiliary
  or z-loss (the reference's moe_aux_loss_coeff 0, load balancing none, z-loss null)."""
  del rng
  nll, mask = _nll(cfg, ctx, params, batch)
  return (nll * mask).sum() / jnp.maximum(mask.sum(), 1.0), (state, {})


def eval_step(cfg: GptOssConfig, ctx: StepContext, params: Any, state: Any,
              batch: Any) -> dict[str, jax.Array]:
  """Per sequence: the summed masked next-token NLL and the number of tokens it counts."""
  del state
  nll, mask = _nll(cfg, ctx, params, batch)
  return {"nll": (nll * mask).sum(-1), "tokens": mask.sum(-1)}


def compute(cfg: GptOssConfig, part: EvalPart) -> dict[str, float]:
  """Validation log perplexity: NLL per counted token over the whole set, in nats
  (Megatron's evaluate sums the loss and the tokens over every batch; the reference logs
  that `lm loss` as eval_accuracy)."""
  del cfg
  log_ppl = float(part.sums["nll"]) / max(float(part.sums["tokens"]), 1.0)
  return {"log_perplexity": log_ppl, "perplexity": math.exp(min(log_ppl, 700.0))}


def learning_rate(cfg: GptOssConfig) -> optax.Schedule:
  """Megatron's OptimizerParamScheduler, t the number of updates already applied: base *
  t / W up to t = W (the first update at 0), then a half cosine from base to end over
  t - W in [0, D - W] with D = lr_decay_iters = max_steps - W (the reference's
  PRIMUS_LR_DECAY_ITERS), then end."""
  o = cfg.optimizer
  w, d = o.warmup_steps, o.max_steps - o.warmup_steps

  def lr(count: jax.Array) -> jax.Array:
    t = jnp.asarray(count, jnp.float32)
    warm = o.base_learning_rate * t / max(w, 1)
    progress = jnp.clip((t - w) / max(d - w, 1), 0.0, 1.0)
    cosine = (o.end_learning_rate + (o.base_learning_rate - o.end_learning_rate)
              * 0.5 * (1 + jnp.cos(jnp.pi * progress)))
    return jnp.where(t <= w, warm, cosine) if w else cosine

  return lr


UNDECAYED = ("scale", "bias")
"""Parameter names that get no weight decay: norm scales (Megatron exempts biases and
1-D parameters, megatron/core/optimizer/__init__.py; the model has no bias)."""


def decay_mask(params: Any) -> Any:
  """True for the parameters AdamW decays: every kernel, embedding, router and expert;
  none of the RMSNorm scales (stacked on a layer axis when scanned, so by name)."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: getattr(path[-1], "key", None) not in UNDECAYED, params)


def optimizer(cfg: GptOssConfig, sched: Schedule) -> optax.GradientTransformation:
  """Clip by global norm, then AdamW (Megatron's `adam` is decoupled weight decay)."""
  del sched
  o = cfg.optimizer
  return optax.chain(optax.clip_by_global_norm(o.clip_norm),
                     optax.adamw(learning_rate(cfg), b1=o.beta_1, b2=o.beta_2, eps=o.epsilon,
                                 weight_decay=o.weight_decay, mask=decay_mask))


def hparams(cfg: GptOssConfig, sched: Schedule, ctx: StepContext) -> dict[str, Any]:
  """The keys of closed_gpt_oss_20b.yaml and 6.1.0's precision and parallelism disclosure
  (common.yaml): expert parallelism is the `expert` axis, and the tokens split over both
  `data` and `expert`, so a micro batch is per device of the two."""
  experts = llm.mesh_size(ctx, "expert")
  return llm.hparams(cfg.optimizer, sched, ctx, dtype=cfg.model.dtype,
                     seq_length=cfg.data.seq_length, name=cfg.name,
                     replicas=llm.mesh_size(ctx, "data") * experts, experts=experts)


def partition_rules(cfg: GptOssConfig) -> list[tuple[str, Any]]:
  """FSDP (every matrix's width axis over `data`), experts over `expert` (their leading
  axis), attention heads and the vocabulary over `model` (tensor parallelism) where the
  mesh has one. Norm scales are replicated. The rules describe one layer: the harness
  adds the scanned stack's layer axis (see `layer_stack`)."""
  from jax.sharding import PartitionSpec as P

  del cfg
  return [(r"attention/(query|key|value)/kernel$", P("fsdp", "heads", "kv")),
          (r"attention/output/kernel$", P("heads", "kv", "fsdp")),
          (r"moe/router$", P("fsdp")),
          (r"moe/(wi_gate|wi_up)$", P("expert", "fsdp")),
          (r"moe/wo$", P("expert", None, "fsdp")),
          (r"embedding/embedding$", P("vocab", "fsdp")),
          (r"output/kernel$", P("fsdp", "vocab"))]


def layer_stack(cfg: GptOssConfig) -> LayerStack | None:
  """Scanned groups of `window_skip_freq` layers (`model.scan_layers`, as the full config
  has them): what a `stage` mesh axis splits into pipeline stages."""
  m = cfg.model
  return LayerStack("layers", m.num_layers // m.window_skip_freq) if m.scan_layers else None


def flops_per_example(cfg: GptOssConfig) -> float:
  """Model FLOPs of one training sequence: 3x (forward + backward) the forward matmuls:
  the query, key, value and output projections; attention scores and values over the
  keys each query sees (the causal triangle counted in full as the MLPerf LLM convention
  does, a sliding layer's window + 1 keys a query); per token the router and top_k
  experts' SwiGLU (active parameters only: dispatch is routing, not model FLOPs); the
  output projection onto the vocabulary."""
  m, seq = cfg.model, cfg.data.seq_length
  q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
  projections = 2 * seq * m.width * (2 * q + 2 * kv)
  moe = 2 * seq * m.width * m.num_experts + m.top_k * 2 * seq * 3 * m.width * m.expert_size
  forward = 2 * seq * m.width * m.vocab_size
  for layer in range(m.num_layers):
    keys = min(m.window + 1, seq) if m.sliding(layer) else seq
    forward += projections + 4 * seq * keys * q + moe
  return 3.0 * forward


def count_parameters(cfg: GptOssConfig) -> dict[str, int]:
  """Parameters from shapes alone: in total, and active for a token: all but the experts
  a token does not reach (num_experts - top_k a layer) and the input embedding (a lookup,
  not a matmul)."""
  params = jax.eval_shape(lambda k: init(cfg, k)[0], jax.random.key(0))
  total = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
  m = cfg.model
  idle = m.num_layers * (m.num_experts - m.top_k) * 3 * m.width * m.expert_size
  return {"total": int(total), "active": int(total - idle - m.vocab_size * m.width)}
