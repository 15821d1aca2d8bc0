"""The Transformer's pure functions for the harness: init, loss, beam-search eval, BLEU,
optimizer, logged keys."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mlbench.train import attention, optim
from mlbench.workload import Batch, EvalPart, Schedule, StepContext, WithMetadata
from workloads.common import transformer as blocks
from workloads.transformer import beam_search, bleu, newstest, vocab
from workloads.transformer.config import PACKED_RECORDS, TransformerConfig
from workloads.transformer.input_pipeline import PACKING
from workloads.transformer.model import Transformer


def schedule(cfg: TransformerConfig) -> Schedule:
  """An epoch is the training set's record count: 566,340 packed records, or, for
  unpacked data, the count you give as data.train_examples."""
  d = cfg.data
  examples = d.train_examples or PACKED_RECORDS  # unpacked data names its count (DataConfig)
  return Schedule(global_batch_size=cfg.global_batch_size, eval_batch_size=cfg.eval_batch_size,
                  train_examples=examples, eval_examples=d.eval_examples,
                  max_train_samples=round(cfg.train_epochs * examples))


def init(cfg: TransformerConfig, rng: jax.Array) -> tuple[Any, Any]:
  ids = jnp.zeros((1, cfg.data.max_length), jnp.int32)
  return Transformer(cfg.model).init(rng, ids, ids)["params"], {}


def smoothed_cross_entropy(logits_BLV: jax.Array, targets_BL: jax.Array,
                           smoothing: float) -> jax.Array:
  """Label-smoothed cross-entropy per target token (float32), in closed form.

  As the reference (training_results_v0.7 Google transformer train.py L316-327, and
  tensor2tensor's padded_cross_entropy_loss): the target gets c = 1 - a, every other
  token l = a / (V - 1) (optax.smooth_labels would give a / V to all), and the soft
  targets' own entropy is subtracted, so a perfect prediction scores 0. Since the
  soft targets sum to 1, -sum(soft * log_softmax(z)) = logsumexp(z) - (c - l) z_t -
  l sum(z): three reductions over the vocabulary that XLA fuses with the float32
  conversion, instead of a one-hot [B, L, V] target and a float32 log-softmax copy.
  """
  v = logits_BLV.shape[-1]
  confidence, low = 1.0 - smoothing, smoothing / (v - 1)
  entropy = -(confidence * np.log(confidence) + (v - 1) * low * np.log(low + 1e-20))
  z_BLV = logits_BLV.astype(jnp.float32)
  # A compare-and-select rather than a gather: it fuses into the reduction, and so
  # does its gradient (a gather's is a scatter into a fresh [B, L, V] buffer).
  is_target_BLV = jnp.arange(v, dtype=jnp.int32) == targets_BL[..., None]
  target_BL = jnp.where(is_target_BLV, z_BLV, 0.0).sum(-1)
  nll_BL = (jax.nn.logsumexp(z_BLV, axis=-1) - (confidence - low) * target_BL
            - low * z_BLV.sum(-1))
  return nll_BL - entropy


LOSS_BYTES = 2 << 30
"""The float32 logits of one slice of the loss, per device. Transformer-big's logits of
all 256 positions are 8.2 GiB at 256 rows a device and 1.1 GiB at its full config's 32
(2,048 rows on 64 chips); autodiff would keep them, their gradient and softmax's
temporaries alive together, so the loss runs over slices of positions, recomputed for the
backward pass: the most positions whose logits fit this budget (no slices at all where
a device's rows fit, as the full config's on v4-128). Each slice reads the [V, H] output
embedding (and again in its remat and its backward pass) and adds into its float32
gradient: on a 2+2-layer Transformer-big at 64 rows a device (v4-8, batch 256), 2 slices
instead of 32 positions' 8 move 1.3 GB less a step, 66.3 GB instead of 67.6 (mlbench
check's HBM breakdown, with the loop's repeats XLA does not count)."""


def loss_chunk(rows: int, length: int, vocab: int) -> int:
  """Positions a slice of the loss holds (`LOSS_BYTES`): the largest divisor of `length`
  whose float32 logits over `rows` rows (a device's) fit the budget; at least 1."""
  fits = [d for d in range(1, length + 1)
          if length % d == 0 and rows * d * vocab * 4 <= LOSS_BYTES]
  return max(fits, default=1)


def token_losses(cfg: TransformerConfig, params: Any, features_BLH: jax.Array,
                 targets_BL: jax.Array, smoothing: float,
                 shards: int = 1) -> tuple[jax.Array, jax.Array]:
  """(label-smoothed NLL, 1.0 where argmax is the target) per target token, [B, L].

  The output projection and the loss run over `loss_chunk` positions at a time
  (`lax.map` over slices of the sequence, where a device's logits of the whole row
  exceed `LOSS_BYTES`), under `jax.checkpoint`, so those [B, L, V] logits never exist
  whole, not even in the backward pass. `shards`: the devices the rows are split over.
  """
  b, n, _ = features_BLH.shape
  chunk = loss_chunk(-(-b // shards), n, cfg.model.vocab_size)
  model = Transformer(cfg.model)

  @jax.checkpoint
  def one(x_BCH: jax.Array, t_BC: jax.Array) -> tuple[jax.Array, jax.Array]:
    logits_BCV = model.apply({"params": params}, x_BCH, method=Transformer.project)
    hits_BC = (jnp.argmax(logits_BCV, -1) == t_BC).astype(jnp.float32)
    return smoothed_cross_entropy(logits_BCV, t_BC, smoothing), hits_BC

  slices = lambda x: x.reshape(b, n // chunk, chunk, *x.shape[2:]).swapaxes(0, 1)
  nll_KBC, hits_KBC = jax.lax.map(lambda xs: one(*xs), (slices(features_BLH),
                                                        slices(targets_BL)))
  whole = lambda x: x.swapaxes(0, 1).reshape(b, n)
  return whole(nll_KBC), whole(hits_KBC)


def loss(cfg: TransformerConfig, ctx: StepContext, params: Any, state: Any, batch: Batch,
         rng: jax.Array) -> tuple[jax.Array, tuple[Any, dict[str, jax.Array]]]:
  """Label-smoothed cross-entropy, averaged over the real target tokens of the batch."""
  packing = {k: batch[k] for k in PACKING if k in batch}
  features_BLH = Transformer(cfg.model, mesh=ctx.mesh).apply(
      {"params": params}, batch["inputs"], batch["targets"], deterministic=False,
      packing=packing, rngs={"dropout": rng}, method=Transformer.features)
  shards = int(ctx.mesh.shape.get("data", 1)) if ctx.mesh is not None else 1
  nll_BL, hits_BL = token_losses(cfg, params, features_BLH, batch["targets"],
                                 cfg.optimizer.label_smoothing, shards)
  w_BL = (batch["targets"] > 0).astype(jnp.float32)
  tokens = w_BL.sum()
  return (nll_BL * w_BL).sum() / tokens, (state, {"token_accuracy": (hits_BL * w_BL).sum()
                                                  / tokens, "target_tokens": tokens})


def translate(cfg: TransformerConfig, params: Any, inputs_BS: jax.Array,
              mesh: Any = None) -> jax.Array:
  """Beam-search translations [B, decode.max_length] (EOS, then 0s)."""
  d, b = cfg.decode, inputs_BS.shape[0]
  model = Transformer(cfg.model, mesh=mesh)
  encoded_BSH = model.apply({"params": params}, inputs_BS, method=Transformer.encode)
  encoded_NSH, inputs_NS = beam_search.tile_beams((encoded_BSH, inputs_BS), d.beam_size)
  decoder = Transformer(cfg.model, decode=True, mesh=mesh)
  with attention.unrecorded():  # shapes only: no forward pass is run
    shapes = jax.eval_shape(lambda: decoder.init(
        jax.random.key(0), inputs_NS[:, :1], jnp.zeros((inputs_NS.shape[0], d.max_length),
                                                       jnp.int32))["cache"])
  cache = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)

  def logits_fn(last_N: jax.Array, cache: Any) -> tuple[jax.Array, Any]:
    logits_N1V, updated = decoder.apply(
        {"params": params, "cache": cache}, encoded_NSH, inputs_NS, last_N[:, None],
        method=Transformer.decode_logits, mutable=["cache"])
    return logits_N1V[:, 0], updated["cache"]

  tokens_BL, _ = beam_search.beam_search(
      logits_fn, cache, batch=b, beam=d.beam_size, max_length=d.max_length,
      eos_id=vocab.EOS, alpha=d.length_penalty)
  return tokens_BL


def eval_step(cfg: TransformerConfig, ctx: StepContext, params: Any, state: Any,
              batch: Batch) -> dict[str, jax.Array]:
  """Per sentence: the beam-search translation, and the teacher-forced NLL sums."""
  del state
  features_BLH = Transformer(cfg.model, mesh=ctx.mesh).apply({"params": params}, batch["inputs"],
                                              batch["targets"], method=Transformer.features)
  nll_BL, _ = token_losses(cfg, params, features_BLH, batch["targets"], 0.0)
  w_BL = (batch["targets"] > 0).astype(jnp.float32)
  return {"translation": translate(cfg, params, batch["inputs"], ctx.mesh),
          "nll": (nll_BL * w_BL).sum(-1), "target_tokens": w_BL.sum(-1)}


def host(cfg: TransformerConfig, outputs: dict[str, np.ndarray], batch: Batch) -> EvalPart:
  """BLEU statistics of this host's translations against the references: the raw
  sentences of `data.bleu_reference` (WMT), else the decoded targets (the mini's own)."""
  words = vocab.load(cfg.data.vocab_file)
  hyps = [words.decode(row) for row in outputs["translation"]]
  refs = (newstest.raw_references(cfg, batch["targets"]) if cfg.data.bleu_reference else
          [words.decode(row) for row in np.asarray(batch["targets"])])
  sums = bleu.statistics(hyps, refs)
  sums["nll"] = np.asarray(outputs["nll"], np.float64).sum()
  sums["target_tokens"] = np.asarray(outputs["target_tokens"], np.float64).sum()
  return EvalPart(sums=sums)


def compute(cfg: TransformerConfig, part: EvalPart) -> dict[str, float]:
  """Uncased corpus BLEU as a fraction (MLPerf logs 25.0 BLEU as 0.25)."""
  del cfg
  return {"bleu": bleu.score(part.sums) / 100.0,
          "loss": float(part.sums["nll"]) / float(part.sums["target_tokens"])}


def optimizer(cfg: TransformerConfig, sched: Schedule) -> optax.GradientTransformation:
  del sched
  o = cfg.optimizer
  lr = optim.rsqrt_schedule(o.base_learning_rate, warmup_steps=o.warmup_steps,
                            width=cfg.model.width)
  return optax.adam(lr, b1=o.beta_1, b2=o.beta_2, eps=o.epsilon)


def hparams(cfg: TransformerConfig, sched: Schedule, ctx: StepContext) -> dict[str, Any]:
  """The keys closed_transformer.yaml (0.7.0) requires, as the reference logs them."""
  del sched, ctx
  o = cfg.optimizer
  return {"opt_name": "adam",
          "opt_base_learning_rate": o.base_learning_rate,
          "opt_learning_rate_warmup_steps": o.warmup_steps,
          "opt_adam_beta_1": o.beta_1,
          "opt_adam_beta_2": o.beta_2,
          "opt_adam_epsilon": o.epsilon,
          "max_sequence_length": WithMetadata(cfg.data.max_length,
                                              {"method": cfg.data.length_method})}


def partition_rules(cfg: TransformerConfig) -> list[tuple[str, Any]]:
  """Model parallelism by annotation: the shared blocks' rules (heads and MLP hidden
  units over `model`) and the shared embedding's vocabulary over `model`."""
  from jax.sharding import PartitionSpec as P

  del cfg
  return [*blocks.partition_rules(), (r"embed/embedding$", P("vocab", "embed"))]


def flops_per_example(cfg: TransformerConfig) -> float:
  """Model FLOPs of one training example at full length: 3x (forward + backward) the
  encoder (self-attention, MLP), the decoder (self- and cross-attention, MLP) and
  the output projection 2*L*H*V."""
  m, n = cfg.model, cfg.data.max_length
  h = m.width
  encoder = blocks.attention_flops(n, n, h) + blocks.mlp_flops(n, h, m.mlp_width)
  decoder = (2 * blocks.attention_flops(n, n, h) + blocks.mlp_flops(n, h, m.mlp_width))
  head = 2 * n * h * m.vocab_size
  return 3.0 * (m.encoder_layers * encoder + m.decoder_layers * decoder + head)
