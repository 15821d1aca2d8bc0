"""The mini dataset: CPython's `pydoc_data.topics` as fixed-length causal-LM sequences.

The help texts of the Python language reference (79 topics, 0.47 M characters,
shipped with every CPython; the corpus of the BERT mini, tokenised and split
differently here). The topics, in name order, are cut at paragraph breaks into
blocks of at least `BLOCK_CHARS` characters, each paragraph kept only where it
first appears (topics repeat each other); every `EVAL_EVERY`-th block (counted
over all topics) is held out. A byte-level BPE vocabulary (Hugging
Face `tokenizers`; no unknown tokens, code and indentation survive) is trained
on the training blocks only. Each split's blocks, each followed by
`<|endoftext|>`, form one token stream. Evaluation sequences tile the held-out
stream (every held-out token after the first is predicted exactly once, up to
`eval_examples` sequences); training sequences start at uniformly random
offsets of the training stream (a fixed seed), `train_examples` of them.
Written once, atomically, with `tokenizer.json`; later runs reuse it.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

import numpy as np

from mlbench.storage import paths
from mlbench.datasets import records
from mlbench.train import data
from workloads.common import llm
from workloads.moe.config import MoeLMConfig, Source
from workloads.moe.input_pipeline import TOKENS, dataset_dir

BLOCK_CHARS = 2000
EVAL_EVERY = 10
SEED = 20200630  # GShard's arXiv date; any fixed number


def blocks() -> tuple[list[str], list[str]]:
  """(training blocks, held-out blocks) of the topics' text."""
  from pydoc_data.topics import topics as all_topics

  train: list[str] = []
  held_out: list[str] = []
  seen: set[str] = set()
  count = 0  # across topics, so short topics hold out their share too
  for name in sorted(all_topics):
    current = ""
    # A fifth of the text is paragraphs that several topics repeat; only the first
    # copy is kept, so no held-out paragraph is also a training one.
    paragraphs = [p for p in all_topics[name].split("\n\n") if p.strip() and p not in seen]
    seen.update(paragraphs)
    for i, paragraph in enumerate(paragraphs):
      current += paragraph + "\n\n"
      if len(current) >= BLOCK_CHARS or i == len(paragraphs) - 1:
        count += 1
        (held_out if count % EVAL_EVERY == 0 else train).append(current)
        current = ""
  return train, held_out


def stream(tokenizer, texts: list[str]) -> np.ndarray:
  """The token ids of `texts`, each followed by `<|endoftext|>`, as one array."""
  end = tokenizer.token_to_id(llm.END_OF_TEXT)
  return np.asarray([i for e in tokenizer.encode_batch(texts) for i in [*e.ids, end]], np.int64)


def tiled(ids: np.ndarray, length: int, count: int) -> np.ndarray:
  """`count` sequences of length + 1 at stride `length`: each id after the first is a
  target exactly once."""
  available = (len(ids) - 1) // length
  if available < count:
    raise ValueError(f"the held-out stream has {available} sequences of {length}; "
                     f"wanted {count}")
  return np.stack([ids[i * length:i * length + length + 1] for i in range(count)])


def sampled(ids: np.ndarray, length: int, count: int, seed: int) -> np.ndarray:
  """`count` sequences of length + 1 starting at uniformly random offsets."""
  starts = np.random.default_rng(seed).integers(0, len(ids) - length, count)
  return np.stack([ids[s:s + length + 1] for s in starts])


def prepare(cfg: MoeLMConfig, data_dir: Path) -> None:
  """Writes the pydoc sequences under `data_dir` unless they are already there.

  Does nothing for configs that read supplied TFRecords.
  """
  if cfg.data.source is not Source.PYDOC:
    return
  data.write_dataset(dataset_dir(cfg, paths.path(data_dir)), functools.partial(_write, cfg))


def _write(cfg: MoeLMConfig, folder: Path) -> dict[str, object]:
  train_texts, eval_texts = blocks()
  tokenizer = llm.train_tokenizer(train_texts, cfg.model.vocab_size)
  length = cfg.data.seq_length
  train_ids, eval_ids = stream(tokenizer, train_texts), stream(tokenizer, eval_texts)
  sets = {"train": (sampled(train_ids, length, cfg.data.train_examples, SEED), 8),
          "eval": (tiled(eval_ids, length, cfg.data.eval_examples), 1)}
  for name, (rows, shards) in sets.items():
    records.write_shards(str(folder / (name + "-{index:05d}-of-{count:05d}")),
                         ({TOKENS: row} for row in rows), num_shards=shards)
  tokenizer.save(str(folder / "tokenizer.json"))
  return {"source": f"pydoc_data.topics of CPython {platform.python_version()}",
          "train_blocks": len(train_texts), "eval_blocks": len(eval_texts),
          "train_tokens": int(len(train_ids)), "eval_tokens": int(len(eval_ids)),
          "vocab_size": tokenizer.get_vocab_size(), "seq_length": length,
          "train_examples": cfg.data.train_examples, "eval_examples": cfg.data.eval_examples,
          "seed": SEED}
