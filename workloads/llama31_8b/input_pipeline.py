"""Llama's data: Megatron indexed datasets, read as the reference's GPTDataset reads them.

The reference (mlcommons/training small_llm_pretraining/nemo) tokenises C4 with the
Llama 3.1 tokenizer into `.bin`/`.idx` pairs (README section 3): it trains on
`c4-train.en_6_text_document` and evaluates on the first 1,024 samples, unshuffled,
of `c4-validation-91205-samples.en_text_document`. Point --data-dir at the folder
holding both pairs. Training samples are shuffled with the run's seed, as the
reference seeds its dataset with each run's seed. See `mlbench.datasets.indexed` for
the format, `workloads/common/gpt_samples.py` for the sample construction and
`workloads/common/megatron_data.py` for the examples (shared with gpt_oss_20b, which reads
the same files). The mini config reads CPython's documentation written in the same format
(`workloads/common/pydoc_corpus.py`).

Every example is one int32 feature `tokens` of seq_length + 1 ids: the model reads
ids [0, L) and predicts ids [1, L].
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mlbench.storage import paths
from mlbench.train import data
from mlbench.workload import DataCheck, Split
from workloads.common import gpt_samples, llm, megatron_data, pydoc_corpus
from workloads.common.megatron_data import TOKENS, TokenExamples
from workloads.llama31_8b.config import LlamaConfig, Source


def dataset_dir(cfg: LlamaConfig, data_dir: Path) -> Path:
  """The supplied folder, or the generated one named after what shapes its content."""
  if cfg.data.source is not Source.PYDOC:
    return paths.path(data_dir)
  return pydoc_corpus.folder(data_dir, cfg.model.vocab_size)


def prefix(cfg: LlamaConfig, data_dir: Path, split: Split) -> Path:
  name = cfg.data.train_prefix if split is Split.TRAIN else cfg.data.eval_prefix
  return dataset_dir(cfg, data_dir) / name


def files(cfg: LlamaConfig, data_dir: Path, split: Split) -> list[str]:
  """The `.bin` and `.idx` files of a split's dataset."""
  hint = data.GENERATE_HINT if cfg.data.source is Source.PYDOC else megatron_data.C4_HINT
  return megatron_data.files(prefix(cfg, data_dir, split), hint)


def prepare(cfg: LlamaConfig, data_dir: Path) -> None:
  """Writes the mini corpus under `data_dir` unless it is already there; does nothing for
  configs that read supplied files."""
  if cfg.data.source is Source.PYDOC:
    pydoc_corpus.prepare(data_dir, cfg.model.vocab_size)


def examples(cfg: LlamaConfig, data_dir: Path, split: Split, seed: int) -> TokenExamples:
  """Training samples, shuffled with `seed`, as many as the schedule's max_steps take;
  or the evaluation set: the first `eval_examples` samples of the validation documents,
  in order (NeMo reads them unshuffled)."""
  files(cfg, data_dir, split)
  dataset = megatron_data.open_dataset(prefix(cfg, data_dir, split), data_dir,
                                       workload="llama31_8b")
  length = cfg.data.seq_length
  if split is Split.EVAL:
    return TokenExamples(gpt_samples.evaluation_samples(dataset, length, cfg.data.eval_examples))
  # The reference builds its index for max_steps x batch samples (num_train_samples),
  # whatever a run's budget: the epoch count, and so the order, follow from it.
  wanted = cfg.optimizer.max_steps * cfg.global_batch_size
  return TokenExamples(gpt_samples.training_samples(dataset, length, wanted, seed))


def verify(cfg: LlamaConfig, folder: Path, full: bool) -> list[DataCheck]:
  """`InputSpec.verify` (`mlbench data verify c4`): the two Megatron datasets this config
  reads, and any other in `folder`, parse and hold exactly the tokens their index lists."""
  del full  # The index and the .bin's size say it all; no token is read.
  return megatron_data.verify(folder, {cfg.data.train_prefix, cfg.data.eval_prefix},
                              workload="llama31_8b")


def synthetic_batch(cfg: LlamaConfig, split: Split, batch_size: int,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
  """Random samples with the pipeline's keys, shapes and dtypes, and a learnable signal:
  each sample repeats a random 8-token pattern."""
  del split
  return {TOKENS: llm.repeating_tokens(rng, batch_size, cfg.data.seq_length + 1,
                                       cfg.model.vocab_size)}
