"""Fixed-length token sequences in TFRecords, for causal language modelling.

Schema: one int64 feature `tokens` of seq_length + 1 ids per record; the model
reads ids [0, L) and predicts ids [1, L]. Training files `train-*`, evaluation
files `eval-*`, in one folder (the mini data in `moe-pydoc-*/` under --data-dir).
Sequences are fixed in the data, so decoding uses no randomness.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mlbench.storage import paths
from mlbench.train import data
from mlbench.workload import Split
from workloads.common import llm
from workloads.moe.config import MoeLMConfig, Source

PYDOC_DIR = "moe-pydoc"
TOKENS = "tokens"
_GLOBS = {Split.TRAIN: "train-*", Split.EVAL: "eval-*"}


def dataset_dir(cfg: MoeLMConfig, data_dir: Path) -> Path:
  """The supplied folder, or the generated one named after what shapes its content (so a
  config with another vocabulary or length gets its own)."""
  if cfg.data.source is not Source.PYDOC:
    return data_dir
  d = cfg.data
  return data_dir / (f"{PYDOC_DIR}-v{cfg.model.vocab_size}-l{d.seq_length}"
                     f"-t{d.train_examples}-e{d.eval_examples}")


def files(cfg: MoeLMConfig, data_dir: Path, split: Split) -> list[str]:
  return data.find_files(
      dataset_dir(cfg, paths.path(data_dir)), (_GLOBS[split],),
      generated=cfg.data.source is Source.PYDOC,
      supplied=f"point --data-dir at TFRecords of `{TOKENS}` sequences "
               f"({cfg.data.seq_length + 1} int64 ids each) named train-* and eval-*")


def feature_shapes(cfg: MoeLMConfig) -> dict[str, tuple[int, ...]]:
  return {TOKENS: (cfg.data.seq_length + 1,)}


def decode(cfg: MoeLMConfig, split: Split):
  """The `DecodeFn`: parse one record; int64 ids become int32 for the devices."""
  from mlbench.train.data import tf

  del split
  t = tf()
  spec = {k: t.io.FixedLenFeature(shape, t.int64) for k, shape in feature_shapes(cfg).items()}

  def parse(record: Any, seed: Any) -> dict[str, Any]:
    del seed
    return {k: t.cast(v, t.int32) for k, v in t.io.parse_single_example(record, spec).items()}

  return parse


def synthetic_batch(cfg: MoeLMConfig, split: Split, batch_size: int,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
  """Random sequences with `decode`'s keys, shapes and dtypes, and a learnable signal:
  each sequence repeats a random 8-token pattern."""
  del split
  return {TOKENS: llm.repeating_tokens(rng, batch_size, cfg.data.seq_length + 1,
                                       cfg.model.vocab_size, low=1)}
