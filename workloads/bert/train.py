"""BERT's pure functions for the harness: init, loss, eval, optimizer, logged keys."""

from __future__ import annotations

import math
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from mlbench.train import optim
from mlbench.workload import EvalPart, LayerStack, Packing, Schedule, StepContext, WithMetadata
from workloads.bert import checkpoint
from workloads.bert.config import BertConfig
from workloads.bert.input_pipeline import feature_shapes
from workloads.bert.model import Bert
from workloads.common import transformer as blocks


EXCLUDE = ("LayerNorm", "layer_norm", "bias")
"""The reference's exclude_from_weight_decay: no weight decay, no trust ratio."""


def schedule(cfg: BertConfig) -> Schedule:
  """The step budget is `opt_learning_rate_training_steps`. BERT has no epochs; its
  logged train_samples is the samples trained to the target (the rules'
  `train_samples: converged`), so `train_examples` only sizes the schedule."""
  budget = cfg.optimizer.train_steps * cfg.global_batch_size
  d = cfg.data
  return Schedule(global_batch_size=cfg.global_batch_size, eval_batch_size=cfg.eval_batch_size,
                  train_examples=d.train_examples or budget,
                  eval_examples=d.eval_examples, max_train_samples=budget,
                  **({"packing": Packing(d.packing_factor, d.max_sequences_per_row),
                      "train_rows": math.ceil(cfg.global_batch_size / d.packing_factor)}
                     if d.packed else {}))


def init(cfg: BertConfig, rng: jax.Array) -> tuple[Any, Any]:
  """Random weights, or those of `cfg.init_checkpoint` (the reference's phase-1
  checkpoint, run_pretraining.py L166-184)."""
  batch = {k: jnp.zeros((1, *shape), jnp.int32) for k, shape in feature_shapes(cfg).items()}
  model = Bert(cfg.model)
  if not cfg.init_checkpoint:
    return model.init(rng, batch)["params"], {}
  shapes = flax.traverse_util.flatten_dict(jax.eval_shape(model.init, rng, batch)["params"],
                                           sep="/")
  checkpoint.check(cfg.model, cfg.init_checkpoint)  # a bad file fails here, before any work

  def load() -> list[np.ndarray]:
    arrays = checkpoint.read(cfg.model, cfg.init_checkpoint,
                             {k: v.shape for k, v in shapes.items()})
    return [arrays[k] for k in shapes]

  # A host callback, so that the harness's jit of `init` reads the file into the
  # sharded parameters instead of baking 1.3 GB of constants into the program.
  leaves = jax.pure_callback(load, [jax.ShapeDtypeStruct(v.shape, v.dtype)
                                    for v in shapes.values()])
  return flax.traverse_util.unflatten_dict(dict(zip(shapes, leaves)), sep="/"), {}


def _masked_lm(logits_BPV: jax.Array, batch: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Per example: (weighted NLL sum, weighted hits, weight sum) over the masked positions."""
  ids_BP, w_BP = batch["masked_lm_ids"], batch["masked_lm_weights"]
  nll_BP = optax.softmax_cross_entropy_with_integer_labels(logits_BPV, ids_BP)
  hits_BP = (jnp.argmax(logits_BPV, -1) == ids_BP).astype(jnp.float32)
  return (nll_BP * w_BP).sum(-1), (hits_BP * w_BP).sum(-1), w_BP.sum(-1)


def loss(cfg: BertConfig, ctx: StepContext, params: Any, state: Any, batch: Any,
         rng: jax.Array) -> tuple[jax.Array, tuple[Any, dict[str, jax.Array]]]:
  """Masked-LM loss (mean over the batch's masked tokens) plus next-sentence cross-entropy
  (mean over its sequences): the same numbers for packed rows as for those sequences
  padded one a row."""
  mlm_BPV, nsp = Bert(cfg.model, ctx.mesh, ctx.microbatches).apply(
      {"params": params}, batch, deterministic=False, rngs={"dropout": rng})
  nll, hits, weights = _masked_lm(mlm_BPV, batch)
  mlm_loss = nll.sum() / (weights.sum() + 1e-5)
  nsp_ce = optax.softmax_cross_entropy_with_integer_labels(nsp, batch["next_sentence_labels"])
  if "next_sentence_weights" in batch:  # packed rows: a weight per slot, 0 for an empty one
    w = batch["next_sentence_weights"]
    nsp_loss = (nsp_ce * w).sum() / w.sum()
  else:
    nsp_loss = nsp_ce.mean()
  return mlm_loss + nsp_loss, (state, {"mlm_accuracy": hits.sum() / (weights.sum() + 1e-5),
                                       "nsp_loss": nsp_loss})


def eval_step(cfg: BertConfig, ctx: StepContext, params: Any, state: Any,
              batch: Any) -> dict[str, jax.Array]:
  """Per example: masked-LM hits, weights and NLL, next-sentence hit."""
  del state
  mlm_BPV, nsp_B2 = Bert(cfg.model, ctx.mesh, ctx.microbatches).apply(
      {"params": params}, batch, deterministic=True)
  nll, hits, weights = _masked_lm(mlm_BPV, batch)
  nsp_hit = (jnp.argmax(nsp_B2, -1) == batch["next_sentence_labels"]).astype(jnp.float32)
  return {"mlm_hits": hits, "mlm_weights": weights, "mlm_nll": nll, "nsp_hits": nsp_hit}


def compute(cfg: BertConfig, part: EvalPart) -> dict[str, float]:
  """Masked-LM accuracy over all masked tokens of the set (the MLPerf metric)."""
  del cfg
  weights = float(part.sums["mlm_weights"])
  return {"accuracy": float(part.sums["mlm_hits"]) / weights,
          "mlm_loss": float(part.sums["mlm_nll"]) / weights,
          "nsp_accuracy": float(part.sums["nsp_hits"]) / part.count}


def optimizer(cfg: BertConfig, sched: Schedule) -> optax.GradientTransformation:
  del sched
  o = cfg.optimizer
  lr = optim.bert_lr_schedule(o.base_learning_rate, warmup_steps=o.warmup_steps,
                              start_warmup_step=o.start_warmup_step, train_steps=o.train_steps,
                              power=o.poly_power, end_lr=o.end_learning_rate)
  return optim.mlperf_lamb(lr, b1=o.beta_1, b2=o.beta_2, eps=o.epsilon,
                           weight_decay=o.weight_decay, mask=optim.name_mask(EXCLUDE),
                           clip_norm=o.clip_norm)


def hparams(cfg: BertConfig, sched: Schedule, ctx: StepContext) -> dict[str, Any]:
  """The keys closed_bert.yaml requires, named as the reference logs them."""
  del sched, ctx
  o = cfg.optimizer
  return {"opt_name": "lamb",
          "opt_base_learning_rate": o.base_learning_rate,
          "opt_lamb_epsilon": o.epsilon,
          "opt_epsilon": o.epsilon,
          "opt_learning_rate_training_steps": o.train_steps,
          "opt_learning_rate_warmup_steps": o.warmup_steps,
          "num_warmup_steps": o.warmup_steps,
          "start_warmup_step": o.start_warmup_step,
          "opt_lamb_beta_1": o.beta_1,
          "opt_lamb_beta_2": o.beta_2,
          "opt_lamb_weight_decay_rate": o.weight_decay,
          "opt_lamb_learning_rate_decay_poly_power": o.poly_power,
          "max_sequence_length": cfg.data.max_seq_length,
          **_weights_initialization(cfg)}


def _weights_initialization(cfg: BertConfig) -> dict[str, Any]:
  """Where the weights come from, as NVIDIA's BERT logs it (`weights_initialization`;
  the rules name no key for the phase-1 checkpoint): the checkpoint and how many
  of its variables were loaded."""
  if not cfg.init_checkpoint:
    return {}
  loaded = len(checkpoint.reference_names(cfg.model))
  return {"weights_initialization": WithMetadata(
      cfg.init_checkpoint, {"source": "tf_checkpoint", "variables": loaded})}


def partition_rules(cfg: BertConfig) -> list[tuple[str, Any]]:
  """Model parallelism by annotation (Megatron-style): the shared blocks' rules
  (attention heads and MLP hidden units over `model`) and the vocabulary of the
  tied word embedding over `model`."""
  from jax.sharding import PartitionSpec as P

  del cfg
  return [*blocks.partition_rules(), (r"word_embeddings/embedding$", P("vocab", "embed"))]


def layer_stack(cfg: BertConfig) -> LayerStack | None:
  """Scanned encoder layers (`model.scan_layers`) are what pipeline stages split."""
  return LayerStack("layers", cfg.model.num_layers) if cfg.model.scan_layers else None


def flops_per_example(cfg: BertConfig) -> float:
  """Model FLOPs of one training sequence: 3x (forward + backward) the forward matmuls
  of every layer's attention and MLP over a row, of the masked-LM head on a row's
  P masked positions, 2*P*H*(H + V), and of the pooler and next-sentence head on its
  S sequences, 2*S*H*(H + 2); padded, a row is one sequence (P = max_predictions_per_seq,
  S = 1); packed, a row holds packing_factor sequences (P and S the row's capacities),
  so the FLOPs the devices spend on a sequence are the row's over the factor."""
  from workloads.bert.input_pipeline import row_shape

  m, d = cfg.model, cfg.data
  seq, hidden = d.max_seq_length, m.hidden_size
  predictions, slots, per_row = d.max_predictions_per_seq, 1, 1.0
  if d.packed:
    shape = row_shape(cfg)
    predictions, slots, per_row = shape.predictions, shape.max_per_row, d.packing_factor
  layer = (blocks.attention_flops(seq, seq, hidden)
           + blocks.mlp_flops(seq, hidden, m.intermediate_size))
  head = (2 * predictions * hidden * (hidden + m.vocab_size)
          + 2 * slots * hidden * (hidden + 2))
  return 3.0 * (m.num_layers * layer + head) / per_row
