"""BERT specifics: BERT-large's size, the MLPerf TFRecord schema, the pydoc mini data."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json

import jax
import numpy as np

from mlbench.datasets import records
from mlbench.train import data, sharding, steps
from mlbench.workload import Split
from workloads.bert import WORKLOAD, config, input_pipeline, model, pretraining_data, pydoc

HEADS = ("mlm_transform", "mlm_layer_norm", "mlm_output_bias", "next_sentence")


def test_full_model_has_the_published_bert_large_parameter_count():
  # 335,141,888: BERT-large (uncased_L-24_H-1024_A-16, vocab 30522, 512 positions)
  # as google-research/bert's BertModel builds it, embeddings + 24 layers + pooler;
  # the count Hugging Face reports for bert-large-uncased's BertModel. The
  # pretraining heads add the masked-LM transform (1,049,600), its LayerNorm
  # (2,048), the output bias (30,522; the decoder is the tied word embedding)
  # and the next-sentence classifier (2,050): 336,226,108.
  cfg = config.full()
  shapes = jax.eval_shape(lambda: WORKLOAD.init(cfg, jax.random.key(0)))[0]
  sizes = {sharding.path_str(p): int(np.prod(x.shape))
           for p, x in jax.tree_util.tree_flatten_with_path(shapes)[0]}
  encoder = sum(n for k, n in sizes.items() if not k.startswith(HEADS))
  assert encoder == 335_141_888
  assert steps.count_params(WORKLOAD, cfg) == 336_226_108


def _decoded(cfg, files):
  ds = data.eval_dataset(files, input_pipeline.decode(cfg, Split.EVAL), num_examples=10 ** 9,
                         per_host_batch=1, host=0, hosts=1)
  out = []
  for batch in data.numpy_batches(ds.take_while(lambda b: b[data.MASK][0] > 0)):
    out.append({k: v[0] for k, v in batch.items() if k != data.MASK})
  return out


def test_pretraining_examples_round_trip_through_tfrecords(tmp_path):
  rng = np.random.default_rng(0)
  docs = [[list(rng.integers(5, 50, rng.integers(3, 12))) for _ in range(8)] for _ in range(4)]
  special = {t: i for i, t in enumerate(pretraining_data.SPECIAL)}
  masking = pretraining_data.Masking(max_seq_length=32, max_predictions_per_seq=5)
  written = pretraining_data.examples(docs, special, 50, masking, dupe_factor=2, seed=1)
  files = records.write_shards(str(tmp_path / "part-{index:05d}-of-{count:05d}"),
                               iter(written), num_shards=1)
  cfg = dataclasses.replace(config.mini(), data=dataclasses.replace(
      config.mini().data, max_seq_length=32, max_predictions_per_seq=5))
  read = _decoded(cfg, files)
  assert len(read) == len(written) > 10
  for ours, theirs in zip(read, written):
    assert set(ours) == set(theirs)
    for key in theirs:
      np.testing.assert_array_equal(ours[key], theirs[key].reshape(ours[key].shape), err_msg=key)
      assert ours[key].dtype == (np.float32 if key == "masked_lm_weights" else np.int32)


def test_masking_follows_the_80_10_10_rule():
  special = {t: i for i, t in enumerate(pretraining_data.SPECIAL)}
  masking = pretraining_data.Masking(max_seq_length=128, max_predictions_per_seq=20)
  rng = np.random.default_rng(3)
  kinds = collections.Counter()
  for _ in range(400):
    tokens = [2, *rng.integers(5, 1000, 100).tolist(), 3]
    masked, positions, labels = pretraining_data.mask_tokens(tokens, special, 1000, masking, rng)
    assert len(positions) == 15 and positions == sorted(positions)  # round(0.15 * 102)
    assert 0 not in positions and 101 not in positions  # never [CLS] or [SEP]
    assert labels == [tokens[i] for i in positions]
    for i in positions:
      kinds["mask" if masked[i] == special["[MASK]"] else
            "kept" if masked[i] == tokens[i] else "random"] += 1
  total = sum(kinds.values())
  assert 0.78 < kinds["mask"] / total < 0.82
  assert 0.08 < kinds["kept"] / total < 0.12 and 0.08 < kinds["random"] / total < 0.12


def test_the_mini_data_is_real_text_in_the_mlperf_schema(bert_data_dir):
  cfg = config.mini()
  train = input_pipeline.files(cfg, bert_data_dir, Split.TRAIN)
  evals = input_pipeline.files(cfg, bert_data_dir, Split.EVAL)
  assert len(train) == 8 and len(evals) == 1
  vocab = (bert_data_dir / input_pipeline.PYDOC_DIR / "vocab.txt").read_text().split("\n")
  assert vocab[:5] == list(pretraining_data.SPECIAL) and len(vocab) - 1 == cfg.model.vocab_size
  examples = _decoded(cfg, evals)
  assert len(examples) == cfg.data.eval_examples
  nsp = []
  for ex in examples:
    n = int(ex["input_mask"].sum())
    ids = ex["input_ids"][:n]
    assert ids[0] == 2 and ids[-1] == 3 and (ids == 3).sum() == 2  # [CLS] A [SEP] B [SEP]
    weights = ex["masked_lm_weights"]
    predicted = ex["masked_lm_positions"][weights > 0]
    assert len(predicted) == min(cfg.data.max_predictions_per_seq, max(1, round(0.15 * n)))
    assert ((predicted > 0) & (predicted < n - 1)).all()
    nsp.append(int(ex["next_sentence_labels"]))
  assert 0.4 < np.mean(nsp) < 0.6
  # Real English: "the" is among the most frequent tokens of the unmasked input.
  tokens = collections.Counter(int(i) for ex in examples[:200] for i in ex["input_ids"] if i > 4)
  top = [vocab[i] for i, _ in tokens.most_common(10)]
  assert "the" in top, top


HELD_OUT_SHA = {"c3591dfe9e80b969": "9cf54800b7a56e99"}
"""sha256 (16 digits) of the pydoc corpus -> of its held-out blocks. pydoc_data changes
with Python releases; this is the corpus of CPython 3.11.7."""


def test_the_held_out_blocks_are_a_tenth_and_fixed():
  from pydoc_data.topics import topics as corpus

  train, held_out = pydoc.topics()
  lines = (sum(map(len, train)), sum(map(len, held_out)))
  assert 0.08 < lines[1] / sum(lines) < 0.12
  # Fixed by rule, derived here: each topic (in name order) cut into blocks of
  # BLOCK_LINES non-empty lines, and every EVAL_EVERY-th block over all topics held out.
  blocks = []
  for name in sorted(corpus):
    text = [line for line in corpus[name].splitlines() if line.strip()]
    blocks += [text[i:i + pydoc.BLOCK_LINES] for i in range(0, len(text), pydoc.BLOCK_LINES)]
  assert held_out == blocks[pydoc.EVAL_EVERY - 1::pydoc.EVAL_EVERY]
  # Every line once: the training documents are the rest, in order.
  kept = [b for i, b in enumerate(blocks, 1) if i % pydoc.EVAL_EVERY]
  assert [line for doc in train for line in doc] == [line for b in kept for line in b]
  # And pinned by content for the corpus this interpreter ships.
  sha = lambda obj: hashlib.sha256(json.dumps(obj).encode()).hexdigest()[:16]
  pinned = HELD_OUT_SHA.get(sha(sorted(corpus.items())))
  assert pinned in (None, sha(held_out))


def _reference_gelu(x):
  # mlcommons/training retired_benchmarks/bert/modeling.py L274-276 (gelu):
  # cdf = 0.5 * (1.0 + tf.tanh((np.sqrt(2 / np.pi) * (x + 0.044715 * tf.pow(x, 3)))))
  cdf = 0.5 * (1.0 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
  return x * cdf


def test_the_mlp_uses_the_reference_tanh_gelu():
  # The MLP's output kernel picks the first H hidden units, so its output is the
  # activation itself; a scaled input kernel spreads them over [-4, 4], where the exact
  # (erf) GELU differs from the reference's by up to 3e-4.
  cfg = config.mini()
  params, _ = WORKLOAD.init(cfg, jax.random.key(0))
  mlp_p = params["layer_0"]["mlp"]
  width, hidden = mlp_p["output"]["kernel"].shape[1], mlp_p["output"]["kernel"].shape[0]
  mlp_p["intermediate"]["kernel"] = mlp_p["intermediate"]["kernel"] * 300.0
  mlp_p["output"] = {"kernel": np.eye(hidden, width, dtype=np.float32),
                     "bias": np.zeros(width, np.float32)}
  batch = WORKLOAD.synthetic_batch(cfg, Split.TRAIN, 2, np.random.default_rng(0))
  _, inter = model.Bert(cfg.model).apply({"params": params}, batch, capture_intermediates=True)
  mlp = inter["intermediates"]["layer_0"]["mlp"]
  pre = np.asarray(mlp["intermediate"]["__call__"][0], np.float64)[..., :width]
  assert np.abs(pre).max() > 2.0
  np.testing.assert_allclose(np.asarray(mlp["__call__"][0]), _reference_gelu(pre), atol=2e-5)
