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


def synthetic_batch(cfg: BertConfig, split: Split, batch_size: int,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
  """Random examples with `decode`'s keys, shapes and dtypes, and a learnable signal:
  the masked tokens are copies of their left neighbours."""
  del split
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
