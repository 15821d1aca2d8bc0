"""MLPerf WMT en-de TFRecords: `inputs` and `targets` as variable-length token ids,
packed (with `*_segmentation`, `*_position`) or not.

Schema (tensor2tensor's translate_ende_wmt32k, as the MLPerf reference writes
it): `inputs`, `targets` int64 lists, each ending in EOS (1). Training files
match `*train*`, the evaluation set (newstest2014) `*dev*`, in one folder with
the subword vocabulary (`vocab.ende.32768`, or the mini config's
`tokenizer.json`). Examples longer than `max_length` tokens are truncated and
shorter ones padded with 0.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from mlbench import paths
from mlbench.errors import UserError
from mlbench.workload import Split
from workloads.transformer import vocab
from workloads.transformer.config import Source, TransformerConfig

CLDR_DIR = "transformer-cldr"
_GLOBS = {Split.TRAIN: "*train*", Split.EVAL: "*dev*"}
_VOCAB_GLOBS = (vocab.TOKENIZER_FILE, "vocab.ende.*", "vocab.*")
FEATURES = ("inputs", "targets")
PACKING = ("inputs_segmentation", "targets_segmentation", "inputs_position", "targets_position")
"""Training batches carry these too: read from packed records, derived for unpacked
ones (segment 1 on real tokens, positions 0, 1, ...), so one model path serves both."""


def dataset_dir(cfg: TransformerConfig, data_dir: Path) -> Path:
  return data_dir / CLDR_DIR if cfg.data.source is Source.CLDR else data_dir


def files(cfg: TransformerConfig, data_dir: Path, split: Split) -> list[str]:
  folder = dataset_dir(cfg, paths.path(data_dir))
  found = sorted(str(p) for p in folder.glob(_GLOBS[split]) if p.is_file())
  if not found:
    hint = ("run without --data-dir to generate it" if cfg.data.source is Source.CLDR else
            "point --data-dir at the MLPerf WMT en-de TFRecords (*train*, *dev*)")
    raise UserError(f"no {_GLOBS[split]} TFRecord files in {folder}; {hint}")
  return found


def bind(cfg: TransformerConfig, data_dir: Path) -> TransformerConfig:
  """The config with `data.vocab_file` set to the vocabulary beside the data (kept
  if already set)."""
  if cfg.data.vocab_file:
    return cfg
  folder = dataset_dir(cfg, paths.path(data_dir))
  for pattern in _VOCAB_GLOBS:
    found = sorted(folder.glob(pattern))
    if found:
      return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data,
                                                               vocab_file=str(found[0])))
  raise UserError(f"no subword vocabulary ({', '.join(_VOCAB_GLOBS)}) in {folder}; put the "
                  "MLPerf vocab.ende.32768 there or pass --set data.vocab_file=PATH")


def feature_shapes(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
  return {k: (cfg.data.max_length,) for k in FEATURES}


def decode(cfg: TransformerConfig, split: Split):
  """The `DecodeFn`: parse one record, truncate or pad every feature to `max_length`;
  training examples also get `PACKING` (from packed records, or derived)."""
  from mlbench.train.data import tf

  t = tf()
  n = cfg.data.max_length
  packed = cfg.data.packed and split is Split.TRAIN
  keys = FEATURES + (PACKING if packed else ())
  spec = {k: t.io.VarLenFeature(t.int64) for k in keys}

  def parse(record: Any, seed: Any) -> dict[str, Any]:
    del seed
    example = t.io.parse_single_example(record, spec)
    out = {}
    for k in keys:
      ids = t.cast(t.sparse.to_dense(example[k])[:n], t.int32)
      out[k] = t.reshape(t.pad(ids, [[0, n - t.shape(ids)[0]]]), [n])
    if split is Split.TRAIN and not packed:
      for side in FEATURES:
        real = t.cast(out[side] > 0, t.int32)
        out[f"{side}_segmentation"] = real
        out[f"{side}_position"] = t.range(n, dtype=t.int32) * real
    return out

  return parse


def synthetic_batch(cfg: TransformerConfig, split: Split, batch_size: int,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
  """Random sentences with `decode`'s keys, shapes and dtypes; the target is the
  source reversed, so there is something to learn. Training rows of packed data are
  packed as Google's records are (several pairs to a row, every position used), so a
  step on them does the work of a real one; other rows hold one padded pair."""
  n = cfg.data.max_length
  rows = [_packed_row(cfg, rng) if split is Split.TRAIN and cfg.data.packed
          else _one_pair_row(cfg, rng) for _ in range(batch_size)]
  out = {k: np.stack([row[k] for row in rows]).astype(np.int32).reshape(batch_size, n)
         for k in (FEATURES + PACKING if split is Split.TRAIN else FEATURES)}
  return out


def _pair(cfg: TransformerConfig, length: int, rng: np.random.Generator):
  words = rng.integers(vocab.UNK + 1, cfg.model.vocab_size, length - 1)
  return [*words, vocab.EOS], [*words[::-1], vocab.EOS]


def _one_pair_row(cfg: TransformerConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
  n = cfg.data.max_length
  length = int(rng.integers(max(2, n // 4), n))
  row = {k: np.zeros(n, np.int32) for k in FEATURES + PACKING}
  row["inputs"][:length], row["targets"][:length] = _pair(cfg, length, rng)
  for side in FEATURES:
    row[f"{side}_segmentation"][:length] = 1
    row[f"{side}_position"][:length] = np.arange(length)
  return row


def _packed_row(cfg: TransformerConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
  """Pairs of 2 to n/2 tokens, segments 1, 2, ..., until all n positions are used."""
  n = cfg.data.max_length
  row = {k: np.zeros(n, np.int32) for k in FEATURES + PACKING}
  start, segment = 0, 1
  while start < n:
    length = min(n - start, int(rng.integers(2, max(3, n // 2 + 1))))
    if n - start - length == 1:  # a 1-token pair would be EOS alone
      length += 1
    end = start + length
    row["inputs"][start:end], row["targets"][start:end] = _pair(cfg, length, rng)
    for side in FEATURES:
      row[f"{side}_segmentation"][start:end] = segment
      row[f"{side}_position"][start:end] = np.arange(length)
    start, segment = end, segment + 1
  return row
