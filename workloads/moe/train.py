"""The MoE LM's pure functions for the harness: init, loss, eval, optimizer, logged keys."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import optax

from mlbench.train import optim
from mlbench.workload import EvalPart, LayerStack, Schedule, StepContext
from workloads.common import llm, transformer as blocks
from workloads.moe.config import MoeLMConfig
from workloads.moe.input_pipeline import TOKENS
from workloads.moe.model import MoeLM, is_moe_layer


def schedule(cfg: MoeLMConfig) -> Schedule:
  """The step budget is `max_steps`. Without epochs (train_examples 0) train_samples is
  logged as that budget, as the MLPerf LLM benchmarks do."""
  budget = cfg.optimizer.max_steps * cfg.global_batch_size
  return Schedule(global_batch_size=cfg.global_batch_size, eval_batch_size=cfg.eval_batch_size,
                  train_examples=cfg.data.train_examples or budget,
                  eval_examples=cfg.data.eval_examples, max_train_samples=budget)


def num_moe_layers(cfg: MoeLMConfig) -> int:
  return sum(is_moe_layer(cfg.model, i) for i in range(cfg.model.num_layers))


def init(cfg: MoeLMConfig, rng: jax.Array) -> tuple[Any, Any]:
  tokens = jnp.zeros((1, cfg.data.seq_length), jnp.int32)
  model = MoeLM(cfg.model, cfg.model.moe.capacity_factor)
  return model.init(rng, tokens)["params"], {}


def _split(batch: Any) -> tuple[jax.Array, jax.Array]:
  """(inputs, next-token targets) of a batch of sequences."""
  tokens = batch[TOKENS]
  return tokens[:, :-1], tokens[:, 1:]


def loss(cfg: MoeLMConfig, ctx: StepContext, params: Any, state: Any, batch: Any,
         rng: jax.Array) -> tuple[jax.Array, tuple[Any, dict[str, jax.Array]]]:
  """Mean next-token cross-entropy plus, per MoE layer, the weighted load-balancing
  and router z-losses. Reports the routing statistics as train metrics."""
  m = cfg.model.moe
  inputs, targets = _split(batch)
  model = MoeLM(cfg.model, m.capacity_factor, ctx.mesh, ctx.microbatches)
  dropout, gating = jax.random.split(rng)
  logits, stats = model.apply({"params": params}, inputs, deterministic=False,
                              rngs={"dropout": dropout, "gating": gating})
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
  total = nll
  if stats:  # summed over the MoE layers, as Switch and ST-MoE add them per router
    total += num_moe_layers(cfg) * (m.aux_loss_coeff * stats["aux_loss"]
                                    + m.z_loss_coeff * stats["z_loss"])
  return total, (state, {"log_perplexity": nll, **{f"moe_{k}": v for k, v in stats.items()}})


def eval_step(cfg: MoeLMConfig, ctx: StepContext, params: Any, state: Any,
              batch: Any) -> dict[str, jax.Array]:
  """Per sequence: the summed next-token NLL and the number of predicted tokens."""
  del state
  inputs, targets = _split(batch)
  model = MoeLM(cfg.model, cfg.model.moe.eval_capacity_factor, ctx.mesh, ctx.microbatches)
  logits, _ = model.apply({"params": params}, inputs, deterministic=True)
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets).sum(-1)
  return {"nll": nll, "tokens": jnp.full(nll.shape, targets.shape[1], jnp.float32)}


def compute(cfg: MoeLMConfig, part: EvalPart) -> dict[str, float]:
  """Held-out log perplexity (mean NLL per token, nats; the MLPerf MoE metric)."""
  del cfg
  log_ppl = float(part.sums["nll"]) / float(part.sums["tokens"])
  return {"log_perplexity": log_ppl, "perplexity": math.exp(min(log_ppl, 700.0))}


def optimizer(cfg: MoeLMConfig, sched: Schedule) -> optax.GradientTransformation:
  """AdamW (no decay on biases and LayerNorm), cosine decay after a linear warmup,
  global-norm clipping."""
  del sched
  o = cfg.optimizer
  lr = optax.warmup_cosine_decay_schedule(0.0, o.base_learning_rate, o.warmup_steps,
                                          o.max_steps, end_value=o.end_learning_rate)
  return optax.chain(optax.clip_by_global_norm(o.clip_norm),
                     optax.adamw(lr, b1=o.beta_1, b2=o.beta_2, eps=o.epsilon,
                                 weight_decay=o.weight_decay, mask=optim.kernel_mask))


def hparams(cfg: MoeLMConfig, sched: Schedule, ctx: StepContext) -> dict[str, Any]:
  """The keys of the MLPerf 6.1 MoE rules (closed_gpt_oss_20b.yaml, moe_aux_loss_coeff
  of closed_deepseekv3_671b.yaml, and the 6.1 precision and parallelism disclosure)."""
  experts = llm.mesh_size(ctx, "expert")
  return {**llm.hparams(cfg.optimizer, sched, ctx, dtype=cfg.model.dtype,
                        seq_length=cfg.data.seq_length, name=cfg.name,
                        replicas=llm.mesh_size(ctx, "data") * experts, experts=experts),
          "moe_aux_loss_coeff": cfg.model.moe.aux_loss_coeff}


def partition_rules(cfg: MoeLMConfig) -> list[tuple[str, Any]]:
  """Experts over `expert` (their kernels' leading axis); attention heads and the dense
  MLPs over `model` (the shared blocks' rules); the tied embedding's vocabulary
  over `model`. The router is replicated."""
  from jax.sharding import PartitionSpec as P

  del cfg
  return [*blocks.partition_rules(),
          (r"moe/(intermediate|output)$", P("expert")),
          (r"token_embeddings/embedding$", P("vocab", "embed"))]


def layer_stack(cfg: MoeLMConfig) -> LayerStack | None:
  """Scanned groups of `moe.every` layers (`model.scan_layers`): what stages split."""
  m = cfg.model
  if not m.scan_layers:
    return None
  return LayerStack("layers", m.num_layers // m.moe.every)


def flops_per_example(cfg: MoeLMConfig) -> float:
  """Model FLOPs of one training sequence: 3x (forward + backward) the forward matmuls:
  attention in every layer, the dense MLP in dense layers, the router and top_k
  experts' MLPs per token in MoE layers (active parameters only; the dispatch and
  combine einsums are routing overhead, not model FLOPs), and the output
  projection onto the vocabulary."""
  m, seq = cfg.model, cfg.data.seq_length
  moe_layers = num_moe_layers(cfg)
  dense = blocks.mlp_flops(seq, m.width, m.mlp_size)
  moe = (m.moe.top_k * blocks.mlp_flops(seq, m.width, m.moe.expert_size)
         + 2 * seq * m.width * m.moe.num_experts)
  forward = (m.num_layers * blocks.attention_flops(seq, seq, m.width)
             + (m.num_layers - moe_layers) * dense + moe_layers * moe
             + 2 * seq * m.width * m.vocab_size)
  return 3.0 * forward


def count_parameters(cfg: MoeLMConfig) -> dict[str, int]:
  """Parameters in total and active per token (top_k of the experts of each MoE layer)."""
  params = jax.eval_shape(lambda k: init(cfg, k)[0], jax.random.key(0))
  total = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
  m = cfg.model.moe
  inactive = num_moe_layers(cfg) * (m.num_experts - m.top_k) * 2 * cfg.model.width * m.expert_size
  return {"total": int(total), "active": int(total - inactive)}

