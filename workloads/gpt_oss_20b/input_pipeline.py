"""GPT-OSS 20B's data: the reference's C4 as Megatron indexed datasets, read as its
GPTDataset reads them.

The reference (mlcommons/training small_llm_moe_pretraining/primus) trains on the files
llama31_8b reads (`c4-train.en_6_text_document`, Llama 3.1 tokenizer, no end-of-document
token) and evaluates on `c4-validation-91205-samples.en_text_document`. Point --data-dir
at the folder holding both pairs. Both splits are Megatron GPTDatasets seeded with the
run's seed: training samples shuffled for max_steps x batch samples, the evaluation set
the first `eval_examples` samples of the validation split shuffled the same way
(`workloads/common/gpt_samples.py`). The mini config reads CPython's documentation in
the same format (`workloads/common/pydoc_corpus.py`, llama31_8b's mini corpus).

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
from workloads.gpt_oss_20b.config import GptOssConfig, Source


def dataset_dir(cfg: GptOssConfig, data_dir: Path) -> Path:
  """The supplied folder, or the generated corpus at the config's vocabulary."""
  if cfg.data.source is not Source.PYDOC:
    return paths.path(data_dir)
  return pydoc_corpus.folder(data_dir, cfg.model.vocab_size)


def prefix(cfg: GptOssConfig, data_dir: Path, split: Split) -> Path:
  name = cfg.data.train_prefix if split is Split.TRAIN else cfg.data.eval_prefix
  return dataset_dir(cfg, data_dir) / name


def files(cfg: GptOssConfig, data_dir: Path, split: Split) -> list[str]:
  """The `.bin` and `.idx` files of a split's dataset."""
  hint = data.GENERATE_HINT if cfg.data.source is Source.PYDOC else megatron_data.C4_HINT
  return megatron_data.files(prefix(cfg, data_dir, split), hint)


def prepare(cfg: GptOssConfig, data_dir: Path) -> None:
  """Writes the mini corpus under `data_dir` unless it is already there; does nothing for
  configs that read supplied files."""
  if cfg.data.source is Source.PYDOC:
    pydoc_corpus.prepare(data_dir, cfg.model.vocab_size)


def examples(cfg: GptOssConfig, data_dir: Path, split: Split, seed: int) -> TokenExamples:
  """Training samples for max_steps x batch (the reference's train_iters x
  global_batch_size, whatever a run's budget: the epoch count, and so the order, follow
  from it) or the evaluation set, both shuffled with `seed`."""
  files(cfg, data_dir, split)
  dataset = megatron_data.open_dataset(prefix(cfg, data_dir, split), data_dir,
                                       workload="gpt_oss_20b")
  length = cfg.data.seq_length
  if split is Split.EVAL:
    return TokenExamples(gpt_samples.validation_samples(dataset, length, cfg.data.eval_examples,
                                                        seed))
  wanted = cfg.optimizer.max_steps * cfg.global_batch_size
  return TokenExamples(gpt_samples.training_samples(dataset, length, wanted, seed))


def verify(cfg: GptOssConfig, folder: Path, full: bool) -> list[DataCheck]:
  """`InputSpec.verify`: the two Megatron datasets this config reads, and any other in
  `folder`, parse and hold exactly the tokens their index lists."""
  del full  # The index and the .bin's size say it all; no token is read.
  return megatron_data.verify(folder, {cfg.data.train_prefix, cfg.data.eval_prefix},
                              workload="gpt_oss_20b")


def synthetic_batch(cfg: GptOssConfig, split: Split, batch_size: int,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
  """Random samples with the pipeline's keys, shapes and dtypes, and a learnable signal:
  each sample repeats a random 8-token pattern (ids above the end-of-document token where
  it is 0, so the loss mask keeps every position)."""
  del split
  low = 1 if cfg.data.eod_token == 0 else 0
  return {TOKENS: llm.repeating_tokens(rng, batch_size, cfg.data.seq_length + 1,
                                       cfg.model.vocab_size, low=low)}
