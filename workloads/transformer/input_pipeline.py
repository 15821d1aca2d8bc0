"""MLPerf WMT en-de TFRecords: `inputs` and `targets` as variable-length token ids,
packed (with `*_segmentation`, `*_position`) or not.

Schema (tensor2tensor's translate_ende_wmt32k, as the MLPerf reference writes
it): `inputs`, `targets` int64 lists, each ending in EOS (1). Training files
match `*train*-of-*`, in one folder with the subword vocabulary (`vocab.ende.32768`,
or the mini config's `tokenizer.json`) and, for WMT, the raw newstest2014.en/.de that
`newstest.py` turns into the evaluation records (`*dev*-of-*`). Training pairs longer
than `max_length` tokens are left out (`keep`), shorter ones padded with 0; an
evaluation sentence longer than that would be cut.
"""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from mlbench.storage import paths
from mlbench.errors import UserError
from mlbench.train import data
from mlbench.workload import DataCheck, Split
from workloads.transformer import newstest, vocab
from workloads.transformer.config import Source, TransformerConfig

CLDR_DIR = "transformer-cldr"
# Shards only: the reference's processed_data/ also holds its compiled text,
# wmt32k-compiled-train.lang1/.lang2 (process_data.py L236-238).
_GLOBS = {Split.TRAIN: "*train*-of-*", Split.EVAL: "*dev*-of-*"}
_VOCAB_GLOBS = (vocab.TOKENIZER_FILE, "vocab.ende.*", "vocab.*")
FEATURES = ("inputs", "targets")
PACKING = ("inputs_segmentation", "targets_segmentation", "inputs_position", "targets_position")
"""Training batches carry these too: read from packed records, derived for unpacked
ones (segment 1 on real tokens, positions 0, 1, ...), so one model path serves both."""
PACKED, UNPACKED = "packed", "unpacked"
"""The two forms of training records: Google's packed translate_ende_wmt32k_packed
(training_results_v0.7 Google transformer-research-JAX-tpu-v3-8192
mlperf_input_pipeline.py L21-25) and the reference's one pair per record (mlcommons/training
aa344c7f retired_benchmarks/transformer/tensorflow/process_data.py L296-298)."""


def dataset_dir(cfg: TransformerConfig, data_dir: Path) -> Path:
  return data_dir / CLDR_DIR if cfg.data.source is Source.CLDR else data_dir


def files(cfg: TransformerConfig, data_dir: Path, split: Split) -> list[str]:
  """Training records `*train*`; evaluation records `*dev*`, for WMT the newstest2014
  records `prepare` writes (`newstest.py`)."""
  folder = dataset_dir(cfg, paths.path(data_dir))
  if split is Split.EVAL and cfg.data.source is Source.WMT:
    folder = newstest.records_dir(folder, paths.path(find_vocab(cfg, folder)), cfg.data.eval_examples)
  return data.find_files(
      folder, (_GLOBS[split],), generated=cfg.data.source is Source.CLDR,
      supplied="point --data-dir at the MLPerf WMT en-de TFRecords (*train*), their "
               "vocabulary and newstest2014.en/.de")


def record_format(path: str) -> str | None:
  """PACKED or UNPACKED by the first record of a TFRecord file (None: no record; a
  record with some of the packing features but not all: "partial")."""
  from mlbench.train.data import tf

  t = tf()
  for raw in t.data.TFRecordDataset(path).take(1):
    found = [k in t.train.Example.FromString(raw.numpy()).features.feature for k in PACKING]
    return PACKED if all(found) else UNPACKED if not any(found) else "partial"
  return None


def verify(cfg: TransformerConfig, folder: Path, full: bool) -> list[DataCheck]:
  """`InputSpec.verify` (`mlbench data verify wmt`): which form the training records are
  (packed or one pair each, never both: the epoch is their count), and the raw
  newstest2014 the reference scores BLEU on (`newstest.checks`)."""
  train = sorted(p for p in folder.glob(_GLOBS[Split.TRAIN])
                 if not p.name.startswith(".") and (paths.is_remote(p) or p.is_file()))
  forms = collections.Counter(_readable_format(p) for p in train)
  forms.pop(None, None)  # empty files
  forms.pop("unreadable", None)  # the schema row of `mlbench data verify` names the file
  found = ", ".join(f"{k} ({v} files)" for k, v in sorted(forms.items())) or "no records"
  form = ("train form", "packed or unpacked, not both", found,
          (len(forms) == 1 and "partial" not in forms) if forms else None)
  return [form, *newstest.checks(folder, cfg.data.eval_examples, full)]


def _readable_format(path: Path) -> str | None:
  """`record_format`, or "unreadable" for a file that is no TFRecord file."""
  from google.protobuf.message import DecodeError

  try:
    return record_format(str(path))
  except (data.tf().errors.OpError, DecodeError):
    return "unreadable"


def _check_format(cfg: TransformerConfig, data_dir: Path) -> None:
  """The training records are the form `data.packed` says, or its epoch size is wrong."""
  first = files(cfg, data_dir, Split.TRAIN)[0]
  want = PACKED if cfg.data.packed else UNPACKED
  found = record_format(first)
  if found not in (want, None):
    fix = ("--set data.packed=false --set data.train_examples=N (their record count, which "
           "`mlbench data verify wmt --full` gives)" if found == UNPACKED else
           "--set data.packed=true" if found == PACKED else "rewrite them")
    raise UserError(f"the training records ({first}, ...) are {found}, the config expects "
                    f"{want} ones; {fix}")


def _vocab(cfg: TransformerConfig, folder: Path) -> str | None:
  found = (sorted(paths.path(folder).glob(pattern)) for pattern in _VOCAB_GLOBS)
  return cfg.data.vocab_file or next((str(f[0]) for f in found if f), None)


def find_vocab(cfg: TransformerConfig, folder: Path) -> str:
  """`data.vocab_file`, else the vocabulary beside the records."""
  if found := _vocab(cfg, folder):
    return found
  raise UserError(f"no subword vocabulary ({', '.join(_VOCAB_GLOBS)}) in {folder}; put the "
                  "MLPerf vocab.ende.32768 there or pass --set data.vocab_file=PATH")


def prepare(cfg: TransformerConfig, data_dir: Path) -> None:
  """The mini config's CLDR records; for WMT, newstest2014 as evaluation records."""
  if cfg.data.source is Source.CLDR:
    from workloads.transformer import cldr

    cldr.prepare(cfg, dataset_dir(cfg, paths.path(data_dir)))
    return
  folder = paths.path(data_dir)
  have = [(folder / n).is_file() for n in (newstest.SOURCE, newstest.REFERENCE)]
  if all(have) and (vocabulary := _vocab(cfg, folder)):  # else `files` says what is missing
    newstest.prepare(cfg, folder, paths.path(vocabulary))


def bind(cfg: TransformerConfig, data_dir: Path) -> TransformerConfig:
  """The config with `data.vocab_file` (the vocabulary beside the data) and, for WMT,
  `data.bleu_reference` (newstest2014.de) set where empty, once the training records are
  known to be the form it expects and the reference sentences to be all there."""
  folder = dataset_dir(cfg, paths.path(data_dir))
  d = dataclasses.replace(cfg.data, vocab_file=find_vocab(cfg, folder))
  if cfg.data.source is Source.WMT:
    _check_format(cfg, folder)
    d = dataclasses.replace(d, bleu_reference=d.bleu_reference or str(
        newstest.raw_files(folder, d.eval_examples)[1]))
    if len(newstest.reference_lines(paths.path(d.bleu_reference))) != d.eval_examples:
      raise UserError(f"{d.bleu_reference} does not hold the {d.eval_examples:,} reference "
                      "sentences of the evaluation set, one per line")
  return dataclasses.replace(cfg, data=d)


def keep(cfg: TransformerConfig, split: Split):
  """Training pairs with either side over `max_length` tokens are left out, as both
  references do (mlcommons/training aa344c7f retired_benchmarks/transformer/tensorflow/
  transformer/utils/dataset.py L89-92 and L229; Google's mlperf_input_pipeline.py L62-67
  and L103-105): logged as max_sequence_length method `discard`. Every evaluation
  sentence is translated."""
  from mlbench.train.data import tf

  t = tf()
  n = cfg.data.max_length
  spec = {k: t.io.VarLenFeature(t.int64) for k in FEATURES}

  def short_enough(record: Any) -> Any:
    if split is not Split.TRAIN:
      return t.constant(True)
    example = t.io.parse_single_example(record, spec)
    return t.reduce_all([t.size(example[k].values) <= n for k in FEATURES])

  return short_enough


def feature_shapes(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
  return {k: (cfg.data.max_length,) for k in FEATURES}


def decode(cfg: TransformerConfig, split: Split):
  """The `DecodeFn`: parse one record, truncate or pad every feature to `max_length`;
  training examples also get `PACKING`: a packed record's own, and for a record without
  them (one pair) segment 1 on its tokens and positions 0, 1, ..., whatever `data.packed`
  says (it sizes the epoch; `bind` checks it against the records)."""
  from mlbench.train.data import tf

  t = tf()
  n = cfg.data.max_length
  keys = FEATURES + (PACKING if split is Split.TRAIN else ())
  spec = {k: t.io.VarLenFeature(t.int64) for k in keys}

  def parse(record: Any, seed: Any) -> dict[str, Any]:
    del seed
    example = t.io.parse_single_example(record, spec)
    out = {}
    for k in keys:
      ids = t.cast(t.sparse.to_dense(example[k])[:n], t.int32)
      out[k] = t.reshape(t.pad(ids, [[0, n - t.shape(ids)[0]]]), [n])
    if split is Split.TRAIN:
      packed = t.size(example["inputs_segmentation"].values) > 0
      for side in FEATURES:
        real = t.cast(out[side] > 0, t.int32)
        out[f"{side}_segmentation"] = t.where(packed, out[f"{side}_segmentation"], real)
        out[f"{side}_position"] = t.where(packed, out[f"{side}_position"],
                                          t.range(n, dtype=t.int32) * real)
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
