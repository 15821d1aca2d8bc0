"""newstest2014, the set the reference scores BLEU on, as the full config's evaluation set.

The reference translates the raw `newstest2014.en`, every line stripped, encoded with the
subword vocabulary and ended by EOS (mlcommons/training aa344c7f
retired_benchmarks/transformer/tensorflow/transformer/translate.py L39-67), and scores
the translations against the raw `newstest2014.de`, read as `read().strip().splitlines()`
(compute_bleu.py L83-96; run_training.sh L14 `--bleu_source=newstest2014.en
--bleu_ref=newstest2014.de`): 3,003 sentences, which its download_data.sh L3-4 fetches
and verify_dataset.sh checks by md5. Its own `dev` TFRecords are newstest2013
(process_data.py L64-69) and serve only its loss; Google's v0.7 JAX submission also
evaluates the 3,003 sentences of newstest2014 (mlperf_input_pipeline.py L26-28).

`prepare` writes the two raw files, encoded so, as one TFRecord file in a folder under
--data-dir named after the vocabulary and the texts it was made from; the evaluation
reads it as any other records. `references` maps a record's target ids back to its raw
sentence: BLEU is scored against the text itself, not against decoded (and possibly
truncated) token ids.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import numpy as np
from etils import epath

from mlbench.datasets import records
from mlbench.errors import UserError
from mlbench.workload import DataCheck
from workloads.transformer import vocab
from workloads.transformer.config import TransformerConfig

SOURCE, REFERENCE = "newstest2014.en", "newstest2014.de"
MD5 = {SOURCE: "dabf51a9c02b2235632f3cee75c72d49", REFERENCE: "f6c3818b477e4a25cad68b61cc883c17"}
"""verify_dataset.sh L5 and L14: the md5 of the files download_data.sh fetches."""
RECORDS = "newstest2014-dev-00000-of-00001"


def source_lines(path: Path) -> list[str]:
  """The sentences to translate, as translate.py L48-52 reads them."""
  lines = [line.strip() for line in epath.Path(path).read_text(encoding="utf-8").split("\n")]
  return lines[:-1] if lines and not lines[-1] else lines


def reference_lines(path: Path) -> list[str]:
  """The reference translations, as compute_bleu.py L85 reads them."""
  return epath.Path(path).read_text(encoding="utf-8").strip().splitlines()


def checks(folder: Path, eval_examples: int, full: bool) -> list[DataCheck]:
  """The raw newstest2014.en and .de in a prepared WMT folder hold `eval_examples`
  sentences each; with `full`, the md5 that verify_dataset.sh checks too."""
  rows = []
  for name, read in ((SOURCE, source_lines), (REFERENCE, reference_lines)):
    path = folder / name
    lines = len(read(path)) if path.is_file() else None
    rows.append((name, f"{eval_examples:,} sentences", "missing" if lines is None else
                 f"{lines:,}", lines == eval_examples))
    if full and lines is not None:
      digest = hashlib.md5(path.read_bytes()).hexdigest()
      rows.append((f"{name} md5", MD5[name], digest, digest == MD5[name]))
  return rows


def raw_files(data_dir: Path, eval_examples: int) -> tuple[Path, Path]:
  """newstest2014.en and .de in `data_dir`, with `eval_examples` sentences each."""
  paths = (epath.Path(data_dir) / SOURCE, epath.Path(data_dir) / REFERENCE)
  missing = [p.name for p in paths if not p.is_file()]
  if missing:
    raise UserError(f"no {' or '.join(missing)} in {data_dir}: the reference scores BLEU on the "
                    "raw newstest2014 sentences (its download_data.sh fetches both files); put "
                    "them beside the training records")
  counts = (len(source_lines(paths[0])), len(reference_lines(paths[1])))
  if counts != (eval_examples, eval_examples):
    raise UserError(f"{SOURCE} has {counts[0]:,} sentences and {REFERENCE} {counts[1]:,}; the "
                    f"reference scores BLEU on all {eval_examples:,} of newstest2014 (check them "
                    "with `mlbench data verify wmt`)")
  return paths


def records_dir(data_dir: Path, vocab_file: Path, eval_examples: int) -> Path:
  """Where `prepare` writes the evaluation records: named after what they are made of."""
  digest = hashlib.sha256()
  for path in (vocab_file, *raw_files(data_dir, eval_examples)):
    digest.update(epath.Path(path).read_bytes())
  return epath.Path(data_dir) / f"mlbench-newstest2014-{digest.hexdigest()[:12]}"


def prepare(cfg: TransformerConfig, data_dir: Path, vocab_file: Path) -> Path:
  """Writes newstest2014 as evaluation records (once); returns their folder."""
  from mlbench.train import data

  folder = records_dir(data_dir, vocab_file, cfg.data.eval_examples)
  source, reference = raw_files(data_dir, cfg.data.eval_examples)
  words = vocab.load(str(vocab_file))

  def write(tmp: Path) -> dict[str, object]:
    rows = ({"inputs": np.asarray([*words.encode(en), vocab.EOS], np.int64),
             "targets": np.asarray([*words.encode(de), vocab.EOS], np.int64)}
            for en, de in zip(source_lines(source), reference_lines(reference), strict=True))
    records.write_shards(str(tmp / RECORDS), rows, num_shards=1)
    return {"source": "newstest2014.en / .de, encoded as the reference's translate.py does",
            "vocabulary": str(vocab_file), "sentences": cfg.data.eval_examples}

  data.write_dataset(folder, write)
  return folder


@functools.cache
def references(reference: str, vocab_file: str, max_length: int) -> dict[tuple[int, ...], str]:
  """Target ids as an evaluation record holds them (EOS ended, cut at `max_length`) ->
  the raw sentence they were encoded from."""
  words = vocab.load(vocab_file)
  return {tuple([*words.encode(line), vocab.EOS][:max_length]): line
          for line in reference_lines(epath.Path(reference))}


def raw_references(cfg: TransformerConfig, targets: np.ndarray) -> list[str]:
  """The raw reference sentence of every row of `targets` [B, L]."""
  table = references(cfg.data.bleu_reference, cfg.data.vocab_file, cfg.data.max_length)
  out = []
  for row in np.asarray(targets):
    key = tuple(int(i) for i in row if i != vocab.PAD)
    if key not in table:
      raise UserError(f"an evaluation record's targets are none of {cfg.data.bleu_reference}'s "
                      "sentences; the records and the BLEU reference must be newstest2014 "
                      "encoded with the same vocabulary")
    out.append(table[key])
  return out
