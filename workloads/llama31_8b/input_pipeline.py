"""Llama's data: Megatron indexed datasets, read as the reference's GPTDataset reads them.

The reference (mlcommons/training small_llm_pretraining/nemo) tokenises C4 with the
Llama 3.1 tokenizer into `.bin`/`.idx` pairs (README section 3): it trains on
`c4-train.en_6_text_document` and evaluates on the first 1,024 samples, unshuffled,
of `c4-validation-91205-samples.en_text_document`. Point --data-dir at the folder
holding both pairs. Training samples are shuffled with the run's seed, as the
reference seeds its dataset with each run's seed. See `mlbench.datasets.indexed` for
the format and `samples.py` for the sample construction.

Every example is one int32 feature `tokens` of seq_length + 1 ids: the model reads
ids [0, L) and predicts ids [1, L].
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from mlbench.datasets import indexed
from mlbench.storage import paths
from mlbench.errors import UserError
from mlbench.train import data
from mlbench.workload import DataCheck, Split
from workloads.common import llm
from workloads.llama31_8b.samples import GptSamples, evaluation_samples, training_samples
from workloads.llama31_8b.config import LlamaConfig, Source

TOKENS = "tokens"
PYDOC_DIR = "llama-pydoc"


def dataset_dir(cfg: LlamaConfig, data_dir: Path) -> Path:
  """The supplied folder, or the generated one named after what shapes its content."""
  if cfg.data.source is not Source.PYDOC:
    return paths.path(data_dir)
  return paths.path(data_dir) / f"{PYDOC_DIR}-v{cfg.model.vocab_size}"


def prefix(cfg: LlamaConfig, data_dir: Path, split: Split) -> Path:
  name = cfg.data.train_prefix if split is Split.TRAIN else cfg.data.eval_prefix
  return dataset_dir(cfg, data_dir) / name


def files(cfg: LlamaConfig, data_dir: Path, split: Split) -> list[str]:
  """The `.bin` and `.idx` files of a split's dataset."""
  p = prefix(cfg, data_dir, split)
  found = [str(p) + ext for ext in (".bin", ".idx")]
  missing = [f for f in found if not paths.path(f).is_file()]
  if missing:
    hint = (data.GENERATE_HINT if cfg.data.source is Source.PYDOC else
            "point --data-dir at the reference's preprocessed C4 (llama3_1_8b_preprocessed_"
            "c4_dataset, see the mlcommons/training small_llm_pretraining README)")
    raise UserError(f"missing Megatron dataset file {missing[0]}; {hint}")
  return found


@dataclasses.dataclass
class TokenExamples:
  """Samples as the harness's examples: {"tokens": int32[seq_length + 1]}."""

  samples: GptSamples

  def __len__(self) -> int:
    return len(self.samples)

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    return {TOKENS: self.samples[i]}


def examples(cfg: LlamaConfig, data_dir: Path, split: Split, seed: int) -> TokenExamples:
  """Training samples, shuffled with `seed`, as many as the schedule's max_steps take;
  or the evaluation set."""
  files(cfg, data_dir, split)
  if paths.is_remote(data_dir):
    raise UserError(f"--data-dir {data_dir}: llama31_8b reads its Megatron .bin/.idx files "
                    "through memory maps, from a local disk; copy them there first")
  try:
    dataset = indexed.IndexedDataset(prefix(cfg, data_dir, split))
  except indexed.FormatError as e:
    raise UserError(f"{e}; point --data-dir at Megatron .bin/.idx files") from None
  length = cfg.data.seq_length
  if split is Split.EVAL:
    return TokenExamples(evaluation_samples(dataset, length, cfg.data.eval_examples))
  # The reference builds its index for max_steps x batch samples (num_train_samples),
  # whatever a run's budget: the epoch count, and so the order, follow from it.
  wanted = cfg.optimizer.max_steps * cfg.global_batch_size
  return TokenExamples(training_samples(dataset, length, wanted, seed))


def verify(cfg: LlamaConfig, folder: Path, full: bool) -> list[DataCheck]:
  """`InputSpec.verify` (`mlbench data verify c4`): the two Megatron datasets this config
  reads, and any other in `folder`, parse and hold exactly the tokens their index lists."""
  del full  # The index and the .bin's size say it all; no token is read.
  reads = {cfg.data.train_prefix, cfg.data.eval_prefix}
  names = {p.name[:-len(".idx")] for p in folder.glob("*_text_document.idx")} | reads
  return [(name, "read by llama31_8b" if name in reads else "extra",
           *indexed.check(folder / name, required=name in reads)) for name in sorted(names)]


def synthetic_batch(cfg: LlamaConfig, split: Split, batch_size: int,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
  """Random samples with the pipeline's keys, shapes and dtypes, and a learnable signal:
  each sample repeats a random 8-token pattern."""
  del split
  return {TOKENS: llm.repeating_tokens(rng, batch_size, cfg.data.seq_length + 1,
                                       cfg.model.vocab_size)}
