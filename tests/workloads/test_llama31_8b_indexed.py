"""Llama 3.1's data: the Megatron indexed-dataset reader against files written here byte by
byte, Megatron's sample order and shuffles, and the harness reading the examples over hosts.

Split from test_llama31_8b.py, which keeps the model, gradient accumulation and the schedule."""

from __future__ import annotations


import numpy as np
import pytest

from workloads.llama31_8b import config


# --- Megatron indexed datasets -------------------------------------------------------

DOCS = [[100 + j for j in range(5)], [200, 201, 202], [300 + j for j in range(7)], [],
        [400, 401], [500 + j for j in range(6)]]


def _write_by_hand(prefix, docs):
  """The MMIDIDX format as Megatron's _IndexWriter writes it, with struct and numpy only."""
  import struct

  lengths = np.array([len(d) for d in docs], np.int32)
  with open(f"{prefix}.bin", "wb") as f:
    for d in docs:
      f.write(np.array(d, np.uint16).tobytes())
  pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) * 2
  with open(f"{prefix}.idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8))  # 8: uint16
    f.write(struct.pack("<Q", len(docs)) + struct.pack("<Q", len(docs) + 1))
    f.write(lengths.tobytes() + pointers.tobytes() + np.arange(len(docs) + 1).tobytes())


def _megatron_sample_idx(sizes, doc_idx, seq_length, num_samples):
  """megatron/core/datasets/helpers.cpp build_sample_idx (add_extra_token 1), transcribed."""
  out = [(0, 0)]
  d, offset = 0, 0
  while len(out) <= num_samples:
    remaining = seq_length + 1
    while remaining != 0:
      doc_len = sizes[doc_idx[d]] - offset
      remaining -= doc_len
      if remaining <= 0:
        offset += remaining + doc_len - 1
        remaining = 0
      else:
        d += 1
        offset = 0
    out.append((d, offset))
  return np.array(out)


def test_reader_reads_files_written_by_hand(tmp_path):
  from mlbench.datasets import indexed

  _write_by_hand(tmp_path / "docs", DOCS)
  ds = indexed.IndexedDataset(tmp_path / "docs")
  assert len(ds) == 6 and ds.dtype == np.uint16
  assert [list(ds.get(i)) for i in range(6)] == DOCS
  assert list(ds.get(2, offset=3, length=2)) == [303, 304]
  # Our writer writes the same bytes.
  indexed.write(tmp_path / "ours", (np.array(d) for d in DOCS))
  for ext in (".bin", ".idx"):
    assert (tmp_path / f"ours{ext}").read_bytes() == (tmp_path / f"docs{ext}").read_bytes()


def test_evaluation_samples_are_the_documents_in_order_with_one_token_overlap(tmp_path):
  from mlbench.datasets import indexed
  from workloads.common import gpt_samples as gpt

  _write_by_hand(tmp_path / "docs", DOCS)
  ds = indexed.IndexedDataset(tmp_path / "docs")
  samples = gpt.evaluation_samples(ds, seq_length=4, num_samples=5)  # 23 tokens: 5 fit
  np.testing.assert_array_equal(
      samples.sample_idx, [[0, 0], [0, 4], [2, 0], [2, 4], [4, 1], [5, 3]])
  np.testing.assert_array_equal(samples.sample_idx,
                                _megatron_sample_idx([len(d) for d in DOCS], range(6), 4, 5))
  got = [list(samples[i]) for i in range(5)]
  assert got == [[100, 101, 102, 103, 104], [104, 200, 201, 202, 300],
                 [300, 301, 302, 303, 304], [304, 305, 306, 400, 401],
                 [401, 500, 501, 502, 503]]
  with pytest.raises(ValueError, match="need more than"):
    gpt.evaluation_samples(ds, seq_length=4, num_samples=6)


def test_training_samples_follow_megatrons_shuffles(tmp_path):
  from mlbench.datasets import indexed
  from workloads.common import gpt_samples as gpt

  _write_by_hand(tmp_path / "docs", DOCS)
  ds = indexed.IndexedDataset(tmp_path / "docs")
  sizes = [len(d) for d in DOCS]
  for num_samples, separate in ((9, False), (12, True)):  # 2 and 3 epochs of 23 tokens
    samples = gpt.training_samples(ds, seq_length=4, num_samples=num_samples, seed=1234)
    epochs = 2 if num_samples == 9 else 3
    rng = np.random.RandomState(1234)
    if separate:  # the last epoch's documents shuffled on their own
      first = np.tile(np.arange(6, dtype=np.int32), epochs - 1)
      rng.shuffle(first)
      last = np.arange(6, dtype=np.int32)
      rng.shuffle(last)
      doc_idx = np.concatenate([first, last])
    else:
      doc_idx = np.tile(np.arange(6, dtype=np.int32), epochs)
      rng.shuffle(doc_idx)
    total = (epochs * 23 - 1) // 4
    sans_final = ((epochs - 1) * 23 - 1) // 4
    assert (num_samples - sans_final < int(0.8 * 5)) == separate
    np.testing.assert_array_equal(samples.doc_index, doc_idx)
    np.testing.assert_array_equal(samples.sample_idx,
                                  _megatron_sample_idx(sizes, doc_idx, 4, total))
    head = sans_final if separate else total
    shuffle = np.arange(head, dtype=np.uint32)
    rng.shuffle(shuffle)
    if separate:
      tail = np.arange(head, total, dtype=np.uint32)
      rng.shuffle(tail)
      shuffle = np.concatenate([shuffle, tail])
    np.testing.assert_array_equal(samples.shuffle, shuffle)
    stream = np.concatenate([DOCS[d] for d in doc_idx])
    for i in range(len(samples)):
      j = shuffle[i]
      np.testing.assert_array_equal(samples[i], stream[4 * j:4 * j + 5])


def test_bad_index_is_a_one_line_user_error(tmp_path):
  from mlbench.errors import UserError
  from mlbench.workload import Split
  from workloads.llama31_8b import input_pipeline

  cfg = config.full()
  with pytest.raises(UserError, match="missing Megatron dataset file .*c4-train.en_6"):
    input_pipeline.files(cfg, tmp_path, Split.TRAIN)
  for ext in (".bin", ".idx"):
    (tmp_path / f"{cfg.data.train_prefix}{ext}").write_bytes(b"not a megatron index, just some bytes" * 2)
  with pytest.raises(UserError, match="not a Megatron MMIDIDX index"):
    input_pipeline.examples(cfg, tmp_path, Split.TRAIN, seed=0)


def test_harness_reads_examples_in_index_order_split_over_hosts():
  from mlbench.train import data

  examples = [{"tokens": np.full(3, i, np.int32)} for i in range(10)]
  per_host = {h: data.example_batches(examples, per_host_batch=2, host=h, hosts=2)
              for h in range(2)}
  steps = [[next(per_host[h])["tokens"][:, 0].tolist() for h in range(2)] for _ in range(3)]
  assert steps == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], [0, 1]]]
  evals = [list(data.EvalBatches(examples, num_examples=5, per_host_batch=2, host=h, hosts=2))
           for h in range(2)]
  assert [len(e) for e in evals] == [2, 2]  # ceil(ceil(5 / 2) / 2) steps on every host
  rows = [(int(t), int(m)) for e in evals for b in e for t, m in zip(b["tokens"][:, 0], b["mask"])]
  assert sorted(t for t, m in rows if m) == [0, 1, 2, 3, 4]
  assert all(t == 0 for t, m in rows if not m) and sum(1 - m for _, m in rows) == 3




def test_examples_read_the_configs_files(tmp_path):
  from mlbench.workload import Split
  from mlbench.datasets import indexed
  from workloads.llama31_8b import input_pipeline

  cfg = config.mini()
  folder = input_pipeline.dataset_dir(cfg, tmp_path)
  folder.mkdir(parents=True)
  rng = np.random.default_rng(5)
  docs = [rng.integers(0, 1024, n) for n in rng.integers(50, 900, 40)]
  for prefix in (cfg.data.train_prefix, cfg.data.eval_prefix):
    indexed.write(folder / prefix, docs)
  stream = np.concatenate(docs)
  evals = input_pipeline.examples(cfg, tmp_path, Split.EVAL, seed=0)
  assert len(evals) == cfg.data.eval_examples
  np.testing.assert_array_equal(evals[3]["tokens"], stream[3 * 256:4 * 256 + 1])
  train_a = input_pipeline.examples(cfg, tmp_path, Split.TRAIN, seed=1)
  train_b = input_pipeline.examples(cfg, tmp_path, Split.TRAIN, seed=2)
  assert len(train_a) >= cfg.optimizer.max_steps * cfg.global_batch_size
  assert train_a[0]["tokens"].dtype == np.int32 and train_a[0]["tokens"].shape == (257,)
  assert not np.array_equal(train_a[0]["tokens"], train_b[0]["tokens"])  # the run's seed
