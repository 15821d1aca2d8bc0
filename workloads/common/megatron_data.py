"""The decoder LMs' Megatron data (llama31_8b, gpt_oss_20b): indexed datasets (`.bin` +
`.idx`, `mlbench.datasets.indexed`) read as the harness's examples, one int32 feature
`tokens` of seq_length + 1 ids per sample (the model reads ids [0, L) and predicts ids
[1, L]), built by `gpt_samples`.

Both references read the same C4 files (mlcommons/training small_llm_pretraining/nemo and
small_llm_moe_pretraining/primus: `c4-train.en_6_text_document` and
`c4-validation-91205-samples.en_text_document`); what differs is how each builds its
evaluation set, which the workload chooses.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from mlbench.datasets import indexed
from mlbench.errors import UserError
from mlbench.storage import paths
from mlbench.workload import DataCheck

TOKENS = "tokens"

C4_HINT = ("point --data-dir at the reference's preprocessed C4 (llama3_1_8b_preprocessed_"
           "c4_dataset, see the mlcommons/training small_llm_pretraining README)")
"""What a user whose --data-dir lacks the C4 files is told."""


def files(prefix: Path, hint: str) -> list[str]:
  """The `.bin` and `.idx` files of the dataset at `prefix`; a one-line error naming the
  first one missing, and `hint`, where one is."""
  found = [str(prefix) + ext for ext in (".bin", ".idx")]
  missing = [f for f in found if not paths.path(f).is_file()]
  if missing:
    raise UserError(f"missing Megatron dataset file {missing[0]}; {hint}")
  return found


def open_dataset(prefix: Path, data_dir: Path, *, workload: str) -> indexed.IndexedDataset:
  """The indexed dataset at `prefix` (under `data_dir`), memory-mapped from a local disk."""
  if paths.is_remote(data_dir):
    raise UserError(f"--data-dir {data_dir}: {workload} reads its Megatron .bin/.idx files "
                    "through memory maps, from a local disk; copy them there first")
  try:
    return indexed.IndexedDataset(prefix)
  except indexed.FormatError as e:
    raise UserError(f"{e}; point --data-dir at Megatron .bin/.idx files") from None


@dataclasses.dataclass
class TokenExamples:
  """Samples as the harness's examples: {"tokens": int32[seq_length + 1]}."""

  samples: object  # gpt_samples.GptSamples

  def __len__(self) -> int:
    return len(self.samples)

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    return {TOKENS: self.samples[i]}


def verify(folder: Path, reads: set[str], *, workload: str) -> list[DataCheck]:
  """`InputSpec.verify`: the datasets a config reads (`reads`, prefixes) and any other
  `*_text_document` in `folder` parse and hold exactly the tokens their index lists (the
  index and the .bin's size say it all; no token is read)."""
  names = {p.name[:-len(".idx")] for p in folder.glob("*_text_document.idx")} | reads
  return [(name, f"read by {workload}" if name in reads else "extra",
           *indexed.check(folder / name, required=name in reads)) for name in sorted(names)]
