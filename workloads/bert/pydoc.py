"""The mini dataset: CPython's `pydoc_data.topics` as MLPerf BERT TFRecords.

`pydoc_data/topics.py` holds the help texts of the Python language reference
(79 topics, about 0.46 M characters of English) and ships with every CPython.
Every 10th block of 20 lines (of the topics in name order) is held out for evaluation. A lower-cased
WordPiece vocabulary is trained on the training topics with Hugging Face
`tokenizers` (the fast, well-kept implementation of BERT's tokenizer); each
non-empty line is a sentence. Examples are built by
`pretraining_data` (several passes with new segments and masks, as the
reference's dupe_factor) until the config's example counts are reached, then
written as `part-0000i-of-00008` and `eval-00000-of-00001` with `vocab.txt`.
The folder is written once, atomically; later runs reuse it.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

from mlbench.storage import paths
from mlbench.datasets import records
from mlbench.train import data
from workloads.bert import pretraining_data as ptd
from workloads.bert.config import BertConfig, Source
from workloads.bert.input_pipeline import dataset_dir

BLOCK_LINES = 20
EVAL_EVERY = 10
SEEDS = {"train": 12345, "eval": 54321}


def topics() -> tuple[list[list[str]], list[list[str]]]:
  """(train documents, eval documents), each a list of lines.

  Every topic's non-empty lines are cut into blocks of `BLOCK_LINES`; every
  `EVAL_EVERY`-th block (counted over all topics) is an evaluation document, and
  the runs of blocks between them are training documents, so no sentence pair
  spans the two sets.
  """
  from pydoc_data.topics import topics as all_topics

  train: list[list[str]] = []
  held_out: list[list[str]] = []
  blocks = 0  # counted across topics, so short topics hold out their share too
  for name in sorted(all_topics):
    lines = [line for line in all_topics[name].splitlines() if line.strip()]
    current: list[str] = []
    for start in range(0, len(lines), BLOCK_LINES):
      block = lines[start:start + BLOCK_LINES]
      blocks += 1
      if blocks % EVAL_EVERY == 0:
        held_out.append(block)
        train.append(current)
        current = []
      else:
        current.extend(block)
    train.append(current)
  return [d for d in train if d], held_out


def train_tokenizer(texts: list[str], vocab_size: int):
  """A lower-casing WordPiece tokenizer with BERT's special tokens."""
  from tokenizers import BertWordPieceTokenizer

  tokenizer = BertWordPieceTokenizer(lowercase=True)
  tokenizer.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2,
                                special_tokens=list(ptd.SPECIAL), show_progress=False)
  return tokenizer


def documents(tokenizer, docs_lines: list[list[str]]) -> list[list[list[int]]]:
  """Each document as sentences (its lines) of token ids."""
  docs = []
  for lines in docs_lines:
    ids = [e.ids for e in tokenizer.encode_batch(lines, add_special_tokens=False)]
    docs.append([s for s in ids if s])
  return [d for d in docs if d]


def build(docs, special: dict[str, int], vocab_size: int, masking: ptd.Masking, count: int,
          seed: int) -> list[dict]:
  """Exactly `count` examples: as many passes over `docs` as it takes."""
  per_pass = len(ptd.examples(docs, special, vocab_size, masking, 1, seed))
  passes = -(-count // max(per_pass, 1)) + 1
  out = ptd.examples(docs, special, vocab_size, masking, passes, seed)
  if len(out) < count:
    raise ValueError(f"only {len(out)} examples from {passes} passes; wanted {count}")
  return out[:count]


def prepare(cfg: BertConfig, data_dir: Path) -> None:
  """Writes the pydoc TFRecords under `data_dir` unless they are already there.

  Does nothing for configs that read the MLPerf Wikipedia data, which must be supplied.
  """
  if cfg.data.source is not Source.PYDOC:
    return
  data.write_dataset(dataset_dir(cfg, paths.path(data_dir)), functools.partial(_write, cfg))


def _write(cfg: BertConfig, folder: Path) -> dict[str, object]:
  train_texts, eval_texts = topics()
  tokenizer = train_tokenizer(["\n".join(d) for d in train_texts], cfg.model.vocab_size)
  vocab = tokenizer.get_vocab()
  special = {t: vocab[t] for t in ptd.SPECIAL}
  masking = ptd.Masking(cfg.data.max_seq_length, cfg.data.max_predictions_per_seq)
  sets = {"train": (train_texts, cfg.data.train_examples),
          "eval": (eval_texts, cfg.data.eval_examples)}
  for name, (texts, count) in sets.items():
    rows = build(documents(tokenizer, texts), special, len(vocab), masking, count, SEEDS[name])
    prefix, shards = ("part", 8) if name == "train" else ("eval", 1)
    records.write_shards(str(folder / (prefix + "-{index:05d}-of-{count:05d}")), iter(rows),
                         num_shards=shards)
  tokenizer.save_model(str(folder))  # vocab.txt
  return {"source": f"pydoc_data.topics of CPython {platform.python_version()}",
          "train_documents": len(train_texts), "eval_documents": len(eval_texts),
          "vocab_size": len(vocab), "train_examples": cfg.data.train_examples,
          "eval_examples": cfg.data.eval_examples, "max_seq_length": masking.max_seq_length,
          "max_predictions_per_seq": masking.max_predictions_per_seq, "seeds": SEEDS}
