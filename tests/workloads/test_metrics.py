"""Every workload's quality metric, through the harness's whole eval path, against an
independent computation from the model's outputs.

Each test compiles the workload's eval step as `steps.compile_programs` does (its
`eval_fn`, the state's partition-rule shardings, batches split over the 8-device
mesh), feeds a small evaluation set in three batches through `evaluate.evaluate`
(the compiled eval step, the padding mask, the workload's host part, the merge
across batches and its final `compute`), and compares every reported metric with
the same metric computed here from the model's outputs, run unsharded on one
device: in NumPy, or with the reference library (pycocotools, sacreBLEU), to 1e-6
relative.

The sets are built to expose the usual metric bugs: the last batch is padded
with copies of real examples chosen so that counting them changes the answer;
the labels are set from the model's own predictions so that the metric is far
from 0 and 1; and where a metric has a per-token denominator the token counts
differ per example, so that averaging per example gives another number.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from mlbench.workload import Split
from eval_harness import (  # tests/workloads/eval_harness.py
    BATCH, REAL, add_to_fc_bias, assert_same, compile_eval, harness_eval, hits_and_misses, log_softmax, with_params)


# --------------------------------------------------------------------------------- ResNet-50


def test_resnet50_top1_accuracy_and_loss_are_numpys_from_the_logits():
  from workloads.resnet50.model import ResNet

  c = compile_eval("resnet50")
  rng = np.random.default_rng(0)
  batch = c.workload.synthetic_batch(c.cfg, Split.EVAL, REAL + BATCH, rng)
  forward = jax.jit(lambda v, x: ResNet(c.cfg.model).apply(v, x, train=False))
  logits = np.asarray(forward({"params": c.params, **c.model_state}, batch["image"]))
  # A freshly initialised ResNet (the reference's init: fan-in he_normal, every BN
  # gamma 1) adds the same large component to every example's logits, so all answer
  # one class. Shift the classifier's bias by that mean: the answers then follow
  # each example's own features, and the accuracy can tell them apart.
  c = with_params(c, add_to_fc_bias(c.params, -logits.mean(0)))
  logits = np.asarray(forward({"params": c.params, **c.model_state}, batch["image"]))
  pred = logits.argmax(-1)
  assert len(np.unique(pred)) > 1  # the model does not answer one class for everything
  labels = hits_and_misses(pred, c.cfg.model.num_classes, rng, 0.4)
  labels[REAL:] = pred[REAL:]  # every padded row a hit: counting them raises the accuracy
  real = {"image": batch["image"][:REAL], "label": labels[:REAL]}
  padding = {"image": batch["image"][REAL:], "label": labels[REAL:]}
  metrics, count = harness_eval(c, real, padding)

  hits = pred[:REAL] == labels[:REAL]
  assert count == REAL and 0.2 < hits.mean() < 0.6
  nll = -log_softmax(logits[:REAL])[np.arange(REAL), labels[:REAL]]
  assert_same(metrics, {"accuracy": hits.mean(), "loss": nll.mean()})


# -------------------------------------------------------------------------------------- BERT


def test_bert_masked_lm_accuracy_is_over_all_masked_tokens_not_per_example():
  from workloads.bert.model import Bert

  c = compile_eval("bert")
  rng = np.random.default_rng(1)
  batch = c.workload.synthetic_batch(c.cfg, Split.EVAL, REAL + BATCH, rng)
  mlm, nsp = jax.jit(lambda b: Bert(c.cfg.model).apply({"params": c.params}, b,
                                                       deterministic=True))(batch)
  mlm, nsp = np.asarray(mlm), np.asarray(nsp)
  n, preds = batch["masked_lm_ids"].shape
  # 1 to all predictions real per example; the rest are the schema's padding (weight
  # 0), with ids the model gets right, so counting them would raise the accuracy.
  real_preds = rng.integers(1, preds + 1, n)
  weights = (np.arange(preds)[None] < real_preds[:, None]).astype(np.float32)
  pred = mlm.argmax(-1)
  ids = np.where(weights > 0, hits_and_misses(pred, c.cfg.model.vocab_size, rng, 0.5), pred)
  nsp_labels = hits_and_misses(nsp.argmax(-1), 2, rng, 0.5)
  ids[REAL:], nsp_labels[REAL:] = pred[REAL:], nsp.argmax(-1)[REAL:]  # padded rows: all hits
  batch = {**batch, "masked_lm_ids": ids.astype(np.int32), "masked_lm_weights": weights,
           "next_sentence_labels": nsp_labels}
  metrics, count = harness_eval(c, {k: v[:REAL] for k, v in batch.items()},
                                 {k: v[REAL:] for k, v in batch.items()})

  w, hits = weights[:REAL], (pred == ids)[:REAL] * weights[:REAL]
  nll = -np.take_along_axis(log_softmax(mlm[:REAL]), ids[:REAL, :, None], -1)[..., 0]
  accuracy = hits.sum() / w.sum()
  per_example = (hits.sum(1) / w.sum(1)).mean()
  assert count == REAL and abs(accuracy - per_example) > 1e-3
  assert_same(metrics, {
      "accuracy": accuracy,
      "mlm_loss": (nll * w).sum() / w.sum(),
      "nsp_accuracy": (nsp.argmax(-1) == nsp_labels)[:REAL].mean()})


# --------------------------------------------------------------------------------------- MoE


def test_moe_log_perplexity_is_numpys_mean_nll_per_token():
  # The MoE data are fixed-length packed sequences (no padding tokens: the schema has
  # none), so every example predicts seq_length tokens; what can go wrong is the
  # token count, the reduction axis and padded sequences.
  from workloads.moe.input_pipeline import TOKENS
  from workloads.moe.model import MoeLM

  c = compile_eval("moe")
  batch = c.workload.synthetic_batch(c.cfg, Split.EVAL, REAL + BATCH, np.random.default_rng(2))
  tokens = batch[TOKENS]
  model = MoeLM(c.cfg.model, c.cfg.model.moe.eval_capacity_factor)
  logits, _ = jax.jit(lambda t: model.apply({"params": c.params}, t, deterministic=True))(
      tokens[:, :-1])
  nll = -np.take_along_axis(log_softmax(logits), tokens[:, 1:, None], -1)[..., 0]
  # Padded rows: the sequences the model finds easiest, so counting them lowers the NLL.
  order = np.argsort(nll.sum(1))
  real, pad = order[BATCH:], order[:BATCH]
  metrics, count = harness_eval(c, {TOKENS: tokens[real]}, {TOKENS: tokens[pad]})

  log_ppl = nll[real].sum() / nll[real].size
  assert count == REAL and nll.mean() < log_ppl - 1e-3
  assert_same(metrics, {"log_perplexity": log_ppl, "perplexity": np.exp(log_ppl)})


# ------------------------------------------------------------------------------- Transformer


def _words(ids: np.ndarray) -> str:
  """A sentence of token ids up to EOS (1), padding (0) dropped; each id one word."""
  out = []
  for i in ids:
    if i == 1:
      break
    if i:
      out.append(str(i))
  return " ".join(out)


def test_transformer_bleu_is_sacrebleus_and_loss_is_per_target_token():
  import sacrebleu

  from workloads.transformer import train
  from workloads.transformer.model import Transformer

  c = compile_eval("transformer")  # no vocabulary file: every token id is a word
  rng = np.random.default_rng(3)
  batch = c.workload.synthetic_batch(c.cfg, Split.EVAL, REAL + BATCH, rng)
  hyps = np.asarray(jax.jit(lambda x: train.translate(c.cfg, c.params, x))(batch["inputs"]))
  # References: damaged copies of the model's translations (a word dropped, a word
  # replaced), so BLEU is neither 0 nor 1; the padded rows' references are their
  # translations exactly, so counting them raises BLEU.
  length = c.cfg.data.max_length
  targets = np.zeros((len(hyps), length), np.int32)
  for i, h in enumerate(hyps):
    words = [int(t) for t in _words(h).split()][:length - 1] or [3]
    if i < REAL and len(words) > 2 and rng.random() < 0.7:
      del words[rng.integers(len(words))]
    if i < REAL and rng.random() < 0.5:
      words[rng.integers(len(words))] = int(rng.integers(3, c.cfg.model.vocab_size))
    targets[i, :len(words) + 1] = [*words, 1]
  batch = {**batch, "targets": targets}
  # BLEU is scored on the translations the harness's sharded step produced (beam
  # search on another compilation may break a near tie otherwise), each looked up
  # by its source sentence, so padded or repeated rows still change the answer.
  translated = {}
  real_host = c.workload.eval.host

  def host(cfg, outputs, rows):
    translated.update({x.tobytes(): y for x, y in zip(rows["inputs"], outputs["translation"])})
    return real_host(cfg, outputs, rows)

  c = dataclasses.replace(c, workload=dataclasses.replace(
      c.workload, eval=dataclasses.replace(c.workload.eval, host=host)))
  metrics, count = harness_eval(c, {k: v[:REAL] for k, v in batch.items()},
                                 {k: v[REAL:] for k, v in batch.items()})

  got = [_words(translated[x.tobytes()]) for x in batch["inputs"][:REAL]]
  assert sum(g == _words(h) for g, h in zip(got, hyps)) >= REAL - 2  # the same model
  refs = [_words(t) for t in targets[:REAL]]
  bleu = sacrebleu.corpus_bleu(got, [refs], lowercase=True).score / 100
  logits = jax.jit(lambda x, y: Transformer(c.cfg.model).apply({"params": c.params}, x, y))(
      batch["inputs"][:REAL], targets[:REAL])
  nll = -np.take_along_axis(log_softmax(logits), targets[:REAL, :, None], -1)[..., 0]
  w = targets[:REAL] > 0
  per_example = ((nll * w).sum(1) / w.sum(1)).mean()
  assert count == REAL and 0.1 < bleu < 0.9
  assert abs(per_example - (nll * w).sum() / w.sum()) > 1e-4
  assert_same(metrics, {"bleu": bleu, "loss": (nll * w).sum() / w.sum()})


# ---------------------------------------------------------------------------------- Llama 3.1


def test_llama_log_perplexity_is_numpys_mean_nll_per_token():
  # Llama's samples are fixed-length windows of seq_length + 1 tokens over concatenated
  # documents, scored on every position (the reference's eod_mask_loss is off, so there
  # is no loss mask): every example predicts seq_length tokens and no per-example token
  # count can differ. What can go wrong is the token count, the reduction axis and
  # padded sequences.
  from workloads.llama31_8b.input_pipeline import TOKENS
  from workloads.llama31_8b.model import Llama

  c = compile_eval("llama31_8b")
  batch = c.workload.synthetic_batch(c.cfg, Split.EVAL, REAL + BATCH, np.random.default_rng(5))
  tokens = batch[TOKENS]
  logits = jax.jit(lambda t: Llama(c.cfg.model).apply({"params": c.params}, t))(tokens[:, :-1])
  nll = -np.take_along_axis(log_softmax(logits), tokens[:, 1:, None], -1)[..., 0]
  # Padded rows: the sequences the model finds easiest, so counting them lowers the NLL.
  order = np.argsort(nll.sum(1))
  real, pad = order[BATCH:], order[:BATCH]
  metrics, count = harness_eval(c, {TOKENS: tokens[real]}, {TOKENS: tokens[pad]})

  log_ppl = nll[real].sum() / nll[real].size
  assert nll.shape[1] == c.cfg.data.seq_length
  assert count == REAL and nll.mean() < log_ppl - 1e-4
  assert_same(metrics, {"log_perplexity": log_ppl, "perplexity": np.exp(log_ppl)})
