"""Transformer specifics: Transformer-big's size, beam search, vocabularies, the cached
decoder, the CLDR mini data in the MLPerf WMT schema (BLEU: test_transformer_bleu.py)."""

from __future__ import annotations

import dataclasses
import itertools
import unicodedata

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlbench.train import data, steps
from mlbench.workload import Split
from workloads.transformer import (WORKLOAD, beam_search, cldr, config, input_pipeline,
                                   model, train, vocab)


def test_full_model_is_transformer_big():
  # Transformer-big ("Attention Is All You Need", table 3: width 1024, MLP 4096, 16
  # heads, 6 + 6 layers) with one embedding shared by source, target and output. Per
  # encoder layer: 4 attention projections without biases, the MLP with biases and
  # 2 LayerNorms; per decoder layer a second attention and a third LayerNorm; a final
  # LayerNorm after each stack.
  cfg = config.full()
  m = cfg.model
  assert (m.width, m.mlp_width, m.num_heads, m.encoder_layers, m.decoder_layers) == (
      1024, 4096, 16, 6, 6)
  assert m.vocab_size == 33_708  # the MLPerf WMT subword vocabulary

  def formula(vocab):
    h, f = m.width, m.mlp_width
    attention, mlp, norm = 4 * h * h, 2 * h * f + f + h, 2 * h
    encoder, decoder = attention + mlp + 2 * norm, 2 * attention + mlp + 3 * norm
    return vocab * h + m.encoder_layers * encoder + m.decoder_layers * decoder + 2 * norm

  assert steps.count_params(WORKLOAD, cfg) == formula(33_708) == 210_804_736
  # With the paper's own 37,000-token vocabulary the model has 214.2 M parameters,
  # within 1 % of the paper's "213 M".
  paper = dataclasses.replace(cfg, model=dataclasses.replace(m, vocab_size=37_000))
  assert steps.count_params(WORKLOAD, paper) == formula(37_000)
  assert steps.count_params(WORKLOAD, paper) == pytest.approx(213e6, rel=0.01)


# --- beam search -----------------------------------------------------------------------

V, EOS, MAX_LEN = 4, 1, 4


def _markov(seed):
  """A toy model: next-token logits depend on the last token only."""
  table_VV = jax.random.normal(jax.random.key(seed), (V, V)) * 2.0

  def logits_fn(last_N, cache):
    return table_VV[last_N], cache

  return table_VV, logits_fn


def _exhaustive(table_VV, alpha):
  """Best EOS-terminated sequence of length <= MAX_LEN by length-penalised log-prob."""
  logp_VV = np.asarray(jax.nn.log_softmax(table_VV))
  best, best_score = None, -np.inf
  for n in range(1, MAX_LEN + 1):
    for body in itertools.product([t for t in range(V) if t != EOS], repeat=n - 1):
      seq = [*body, EOS]
      prev, total = 0, 0.0
      for t in seq:
        total, prev = total + logp_VV[prev, t], t
      score = total / ((5.0 + n) / 6.0) ** alpha
      if score > best_score:
        best, best_score = seq, score
  return best, best_score


@pytest.mark.parametrize("seed,alpha", [(0, 0.6), (1, 0.0), (2, 1.0), (3, 0.6)])
def test_beam_search_with_a_wide_beam_finds_the_exhaustive_optimum(seed, alpha):
  table_VV, logits_fn = _markov(seed)
  tokens, score = beam_search.beam_search(
      logits_fn, jnp.zeros((27, 1)), batch=1, beam=27, max_length=MAX_LEN, eos_id=EOS,
      alpha=alpha)
  best, best_score = _exhaustive(table_VV, alpha)
  assert list(np.asarray(tokens[0, :len(best)])) == best
  assert np.all(np.asarray(tokens[0, len(best):]) == 0)
  assert float(score[0]) == pytest.approx(best_score, rel=1e-5)


def test_cached_decoding_gives_the_teacher_forced_logits():
  cfg = config.mini()
  params, _ = WORKLOAD.init(cfg, jax.random.key(0))
  batch = WORKLOAD.synthetic_batch(cfg, Split.EVAL, 3, np.random.default_rng(0))
  inputs, targets = jnp.asarray(batch["inputs"]), jnp.asarray(batch["targets"])
  full_BLV = model.Transformer(cfg.model).apply({"params": params}, inputs, targets)
  decoder = model.Transformer(cfg.model, decode=True)
  cache = decoder.init(jax.random.key(0), inputs, targets)["cache"]
  cache = jax.tree.map(jnp.zeros_like, cache)
  encoded = model.Transformer(cfg.model).apply({"params": params}, inputs,
                                               method=model.Transformer.encode)
  shifted = model.shift_right(targets)
  for i in range(8):
    step_B1V, mutated = decoder.apply({"params": params, "cache": cache}, encoded, inputs,
                                      shifted[:, i:i + 1], method=model.Transformer.decode_logits,
                                      mutable=["cache"])
    cache = mutated["cache"]
    np.testing.assert_allclose(step_B1V[:, 0], full_BLV[:, i], atol=2e-4, rtol=2e-4)


# --- vocabularies and data -------------------------------------------------------------

def test_a_tensor2tensor_subword_vocabulary_decodes_as_tensor2tensor(tmp_path):
  # Subtokens end in "_" at word ends; "\u" escapes an underscore; neighbouring
  # alphanumeric words get a space, punctuation does not.
  lines = ["'<pad>_'", "'<EOS>_'", "'Hal'", "'lo_'", "'Welt_'", "'!_'", "'snake\\u'",
           "'case_'", "', _'", "'3_'"]
  path = tmp_path / "vocab.ende.32768"
  path.write_text("\n".join(lines) + "\n")
  v = vocab.load(str(path))
  assert v.decode([2, 3, 4, 5, 1, 4]) == "Hallo Welt!"
  assert v.decode([6, 7, 8, 9, 1]) == "snake_case, 3"
  assert v.decode([9, 0, 0]) == "3"


def test_the_mini_data_is_cldr_text_in_the_wmt_schema(transformer_data_dir):
  cfg = input_pipeline.bind(config.mini(), transformer_data_dir)
  assert cfg.data.vocab_file.endswith(vocab.TOKENIZER_FILE)
  words = vocab.load(cfg.data.vocab_file)
  evals = input_pipeline.files(cfg, transformer_data_dir, Split.EVAL)
  ds = data.eval_dataset(evals, input_pipeline.decode(cfg, Split.EVAL),
                         num_examples=cfg.data.eval_examples, per_host_batch=100, host=0, hosts=1)
  rows = [b for b in data.numpy_batches(ds)]
  inputs = np.concatenate([b["inputs"] for b in rows])[:cfg.data.eval_examples]
  targets = np.concatenate([b["targets"] for b in rows])[:cfg.data.eval_examples]
  assert inputs.shape == targets.shape == (500, cfg.data.max_length)
  assert inputs.dtype == np.int32 and np.all((inputs == vocab.EOS).sum(1) == 1)
  english = [words.decode(r) for r in inputs]
  german = [words.decode(r) for r in targets]
  from tokenizers import Tokenizer

  _, held_out = cldr.split(cfg, Tokenizer.from_file(cfg.data.vocab_file))
  assert sorted(zip(english, german)) == sorted(held_out)
  # German, from CLDR: months, "und" in lists, umlauts.
  text = " ".join(german)
  assert " und " in text and "März" in text and any(unicodedata.category(c) == "Ll"
                                                     and ord(c) > 127 for c in text)
  trains = input_pipeline.files(cfg, transformer_data_dir, Split.TRAIN)
  seen = set()
  for f in trains:
    for record in data.tf().data.TFRecordDataset(f).as_numpy_iterator():
      ex = data.tf().train.Example.FromString(record)
      seen.add(words.decode(ex.features.feature["inputs"].int64_list.value))
  assert len(seen) == cfg.data.train_examples and not seen & set(english)


def test_bleu_of_the_references_themselves_is_100(transformer_data_dir):
  cfg = input_pipeline.bind(config.mini(), transformer_data_dir)
  batch = WORKLOAD.synthetic_batch(cfg, Split.EVAL, 16, np.random.default_rng(1))
  part = train.host(cfg, {"translation": batch["targets"], "nll": np.zeros(16),
                          "target_tokens": np.ones(16)}, batch)
  assert train.compute(cfg, part)["bleu"] == pytest.approx(1.0)


def test_label_smoothing_is_the_references():
  # training_results_v0.7 Google transformer-research-JAX train.py L316-327
  # (compute_weighted_cross_entropy): on = 1 - a, off = a / (V - 1), minus the
  # soft targets' entropy.
  from workloads.transformer import train

  cfg = config.mini()
  v, a = cfg.model.vocab_size, 0.1
  rng = np.random.default_rng(0)
  logits = rng.standard_normal((2, 3, v)).astype(np.float32) * 3
  targets = np.array([[5, 9, 0], [7, 1, 2]], np.int32)
  confidence, low = 1.0 - a, a / (v - 1)
  constant = -(confidence * np.log(confidence) + (v - 1) * low * np.log(low + 1e-20))
  soft = np.where(np.arange(v) == targets[..., None], confidence, low)
  log_probs = logits - np.log(np.exp(logits.astype(np.float64)).sum(-1, keepdims=True))
  want = -(soft * log_probs).sum(-1) - constant
  got = train.smoothed_cross_entropy(jnp.asarray(logits), jnp.asarray(targets), a)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def _one_hot_loss(logits, targets, a):
  """The formula the closed form replaced: a one-hot [B, L, V] of soft targets."""
  import optax

  v = logits.shape[-1]
  confidence, low = 1.0 - a, a / (v - 1)
  entropy = -(confidence * np.log(confidence) + (v - 1) * low * np.log(low + 1e-20))
  soft = jax.nn.one_hot(targets, v) * (confidence - low) + low
  return optax.softmax_cross_entropy(logits.astype(jnp.float32), soft) - entropy


@pytest.mark.parametrize("a, dtype", [(0.1, jnp.float32), (0.0, jnp.float32),
                                      (0.3, jnp.float32), (0.1, jnp.bfloat16)])
def test_closed_form_label_smoothing_equals_the_one_hot_formula(a, dtype):
  from workloads.transformer import train

  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.standard_normal((3, 5, 97)) * 4, dtype)
  targets = jnp.asarray(rng.integers(0, 97, (3, 5)), jnp.int32)
  weights = rng.random((3, 5)).astype(np.float32)
  total = lambda f: lambda z: (f(z, targets, a) * weights).sum()
  want, want_grad = jax.value_and_grad(total(_one_hot_loss))(logits)
  got, got_grad = jax.value_and_grad(total(train.smoothed_cross_entropy))(logits)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, want, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(got_grad, np.float32), np.asarray(want_grad, np.float32),
                             atol=1e-6 if dtype == jnp.float32 else 1e-2)


def test_the_loss_slices_positions_by_the_bytes_of_a_devices_logits():
  from workloads.transformer import train

  v = config.full().model.vocab_size
  # 256 rows a device (one v3 core at batch 2,048 on v3-16): 32 positions a slice, as the
  # fixed slices were; the full config's 32 rows a device on v4-128 score whole rows.
  assert [train.loss_chunk(rows, 256, v) for rows in (256, 64, 32)] == [32, 128, 256]
  assert train.loss_chunk(10**6, 256, v) == 1 and train.loss_chunk(4, 24, 1000) == 24


def test_loss_over_slices_of_positions_equals_the_loss_over_whole_logits(monkeypatch):
  # The loss projects and scores slices of positions at a time (under remat); value,
  # accuracy and gradients must be those of the whole [B, L, V] logits.
  from workloads.transformer import train

  cfg = config.mini()
  params, _ = WORKLOAD.init(cfg, jax.random.key(0))
  batch = WORKLOAD.synthetic_batch(cfg, Split.TRAIN, 4, np.random.default_rng(0))
  inputs, targets = jnp.asarray(batch["inputs"]), jnp.asarray(batch["targets"])
  w = (targets > 0).astype(jnp.float32)

  def whole(p):
    logits = model.Transformer(cfg.model).apply({"params": p}, inputs, targets)
    nll = train.smoothed_cross_entropy(logits, targets, 0.1)
    return (nll * w).sum(), (jnp.argmax(logits, -1) == targets).astype(jnp.float32)

  def sliced(p):
    features = model.Transformer(cfg.model).apply({"params": p}, inputs, targets,
                                                  method=model.Transformer.features)
    nll, hits = train.token_losses(cfg, p, features, targets, 0.1)
    return (nll * w).sum(), hits

  # 4 rows of 24 positions over 1,000 words: 8 positions' float32 logits fit, 3 slices.
  monkeypatch.setattr(train, "LOSS_BYTES", 4 * 8 * cfg.model.vocab_size * 4)
  assert train.loss_chunk(4, 24, cfg.model.vocab_size) == 8
  (want, want_hits), want_grad = jax.value_and_grad(whole, has_aux=True)(params)
  (got, got_hits), got_grad = jax.value_and_grad(sliced, has_aux=True)(params)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  np.testing.assert_array_equal(got_hits, want_hits)
  jax.tree.map(lambda g, h: np.testing.assert_allclose(g, h, rtol=1e-4, atol=1e-5),
               got_grad, want_grad)


def test_synthetic_packed_training_rows_fill_every_position():
  # As Google's packed records (566,340 rows of 256 tokens): several pairs per row,
  # each with its own segment id and positions from 0, every position used, so a
  # synthetic step does a real step's work. Each pair ends in EOS; its target is its
  # source reversed (EOS kept last).
  cfg = config.full()
  assert cfg.data.packed
  batch = WORKLOAD.synthetic_batch(cfg, Split.TRAIN, 8, np.random.default_rng(0))
  assert set(batch) == {"inputs", "targets", *input_pipeline.PACKING}
  assert (batch["inputs"] > 0).all() and (batch["targets"] > 0).all()
  for side in ("inputs", "targets"):
    np.testing.assert_array_equal(batch[f"{side}_segmentation"], batch["inputs_segmentation"])
  for row in range(8):
    seg = batch["inputs_segmentation"][row]
    assert seg[0] == 1 and set(np.diff(seg)) <= {0, 1} and seg[-1] >= 2
    for s in np.unique(seg):
      at = seg == s
      np.testing.assert_array_equal(batch["inputs_position"][row][at], np.arange(at.sum()))
      src, tgt = batch["inputs"][row][at], batch["targets"][row][at]
      assert src[-1] == tgt[-1] == vocab.EOS and at.sum() >= 2
      np.testing.assert_array_equal(tgt[:-1], src[:-1][::-1])
  unpacked = WORKLOAD.synthetic_batch(config.mini(), Split.TRAIN, 8, np.random.default_rng(0))
  assert (unpacked["inputs"] == 0).any() and unpacked["inputs_segmentation"].max() == 1
