"""MLPerf BERT pretraining TFRecords: the reference's schema, decoded as is.

Schema (the reference's create_pretraining_data.py): `input_ids`, `input_mask`,
`segment_ids` [max_seq_length]; `masked_lm_positions`, `masked_lm_ids`
[max_predictions_per_seq] (int64); `masked_lm_weights` [max_predictions_per_seq]
(float, 0 on padding); `next_sentence_labels` [1]. Training files
`part-?????-of-00500`, the evaluation set `eval_10k` (or `eval-*`), all in one
folder. Masks are fixed in the data (static masking, as in MLPerf), so decoding
uses no randomness.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mlbench.storage import paths
from mlbench.train import data
from mlbench.workload import Split
from workloads.bert import packing
from workloads.bert.config import BertConfig, Source

PYDOC_DIR = "bert-pydoc"
_GLOBS = {Split.TRAIN: ("part-*",), Split.EVAL: ("eval_10k", "eval-*")}


def dataset_dir(cfg: BertConfig, data_dir: Path) -> Path:
  return data_dir / PYDOC_DIR if cfg.data.source is Source.PYDOC else data_dir


def files(cfg: BertConfig, data_dir: Path, split: Split) -> list[str]:
  return data.find_files(
      dataset_dir(cfg, paths.path(data_dir)), _GLOBS[split],
      generated=cfg.data.source is Source.PYDOC,
      supplied="point --data-dir at the MLPerf BERT TFRecords (part-*-of-00500 and eval_10k)")


def feature_shapes(cfg: BertConfig) -> dict[str, tuple[int, ...]]:
  seq, preds = cfg.data.max_seq_length, cfg.data.max_predictions_per_seq
  return {"input_ids": (seq,), "input_mask": (seq,), "segment_ids": (seq,),
          "masked_lm_positions": (preds,), "masked_lm_ids": (preds,),
          "masked_lm_weights": (preds,), "next_sentence_labels": (1,)}


def decode(cfg: BertConfig, split: Split):
  """The `DecodeFn`: parse one record; int64 features become int32 for the devices."""
  from mlbench.train.data import tf

  del split
  t = tf()
  spec = {k: t.io.FixedLenFeature(shape, t.float32 if k == "masked_lm_weights" else t.int64)
          for k, shape in feature_shapes(cfg).items()}

  def parse(record: Any, seed: Any) -> dict[str, Any]:
    del seed
    example = t.io.parse_single_example(record, spec)
    out = {k: (v if v.dtype == t.float32 else t.cast(v, t.int32)) for k, v in example.items()}
    out["next_sentence_labels"] = t.reshape(out["next_sentence_labels"], [])
    return out

  return parse


def row_shape(cfg: BertConfig) -> packing.RowShape:
  """What a packed training row holds under `cfg`."""
  d = cfg.data
  return packing.RowShape(d.max_seq_length, d.max_sequences_per_row, packing.row_predictions(
      d.max_predictions_per_seq, d.max_sequences_per_row, d.max_seq_length))


def pack(cfg: BertConfig, examples: int, rows: int) -> packing.Packer:
  """The `InputSpec.pack`: this host's `examples` sequences a step in `rows` rows. The
  look-ahead is the step's own sequences again (at least 256): the simulated Wikipedia
  steps never ran short with it (benchmarks/bert_packing.py)."""
  return packing.Packer(row_shape(cfg), examples=examples, rows=rows,
                        lookahead=max(examples, 256))


def synthetic_batch(cfg: BertConfig, split: Split, batch_size: int,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
  """Random examples with `decode`'s keys, shapes and dtypes (packed training: rows with
  `pack`'s), and a learnable signal: the masked tokens are copies of their left neighbours."""
  if split is Split.TRAIN and cfg.data.packed:
    return _packed_rows(cfg, batch_size, rng)
  seq, preds, vocab = (cfg.data.max_seq_length, cfg.data.max_predictions_per_seq,
                       cfg.model.vocab_size)
  # At least room for the masked positions between [CLS] and the last [SEP]: a config may
  # mask up to max_seq_length - 2 of them (a short length bucket's program).
  lengths = rng.integers(min(max(seq // 2, preds + 2), seq), seq + 1, batch_size)
  ids = rng.integers(5, vocab, (batch_size, seq)).astype(np.int32)
  mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
  positions = np.stack([np.sort(rng.choice(np.arange(1, n - 1), preds, replace=False))
                        for n in lengths]).astype(np.int32)
  rows = np.arange(batch_size)[:, None]
  ids[rows, positions] = ids[rows, positions - 1]
  labels = ids[rows, positions].copy()
  ids[rows, positions] = 4  # [MASK]
  return {
      "input_ids": ids * mask, "input_mask": mask,
      "segment_ids": (np.arange(seq)[None] >= lengths[:, None] // 2).astype(np.int32) * mask,
      "masked_lm_positions": positions, "masked_lm_ids": labels,
      "masked_lm_weights": np.ones((batch_size, preds), np.float32),
      "next_sentence_labels": rng.integers(0, 2, batch_size).astype(np.int32),
  }


def _examples(cfg: BertConfig, lengths: np.ndarray, predictions: np.ndarray,
              rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
  """One decoded record per length, with that many masked tokens (at most length - 2),
  as `synthetic_batch` makes them."""
  seq, preds, vocab = (cfg.data.max_seq_length, cfg.data.max_predictions_per_seq,
                       cfg.model.vocab_size)
  out = []
  for n, k in zip(lengths.tolist(), predictions.tolist()):
    ids = np.zeros(seq, np.int32)
    ids[:n] = rng.integers(5, vocab, n)
    k = min(k, n - 2)
    positions = np.sort(rng.choice(np.arange(1, n - 1), k, replace=False)).astype(np.int32)
    ids[positions] = ids[positions - 1]
    labels = ids[positions].copy()
    ids[positions] = 4  # [MASK]
    out.append({
        "input_ids": ids, "input_mask": (np.arange(seq) < n).astype(np.int32),
        "segment_ids": ((np.arange(seq) >= n // 2) & (np.arange(seq) < n)).astype(np.int32),
        "masked_lm_positions": np.pad(positions, (0, preds - k)),
        "masked_lm_ids": np.pad(labels, (0, preds - k)),
        "masked_lm_weights": np.pad(np.ones(k, np.float32), (0, preds - k)),
        "next_sentence_labels": np.int32(rng.integers(0, 2))})
  return out


def _packed_rows(cfg: BertConfig, rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
  """`rows` packed rows of 1 to 3 sequences each (at most max_sequences_per_row), filling
  60-100% of the row, each with 15% of its tokens masked (the reference's share)."""
  shape = row_shape(cfg)
  lengths, row = [], []
  for r in range(rows):
    count = int(rng.integers(1, min(3, shape.max_per_row) + 1))
    extra = int(shape.length * rng.uniform(0.6, 1.0)) - 4 * count  # 4 tokens at least each
    cuts = np.sort(rng.integers(0, extra + 1, count - 1))
    lengths += (4 + np.diff(np.concatenate([[0], cuts, [extra]]))).tolist()
    row += [r] * count
  lengths_a, row_a = np.array(lengths), np.array(row)
  slot = np.concatenate([np.arange(np.sum(row_a == r)) for r in range(rows)])
  predictions = np.minimum(cfg.data.max_predictions_per_seq,
                           np.maximum(1, np.round(0.15 * lengths_a))).astype(np.int64)
  return packing.build(_examples(cfg, lengths_a, predictions, rng), row_a, slot, rows, shape)
