"""Which datasets `mlbench data prepare` knows, and the job (shards + writer) of each."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlbench.datasets import shards
from mlbench.errors import UserError

PREPARED = ("c4", "imagenet", "coco")
# Sets MLPerf distributes already preprocessed: prepare says where they come from.
ELSEWHERE = {
    "bert": "the MLPerf BERT pretraining TFRecords (the reference's create_pretraining_data.py "
            "output, published by MLCommons; see mlcommons/training "
            "language_model/tensorflow/bert), then `mlbench data verify bert DIR`",
    "wmt": "the WMT English-German set as the reference's data_download.py prepares it "
           "(mlcommons/training translation/tensorflow), with the newstest2014.en/.de its "
           "download_data.sh fetches beside it, then `mlbench data verify wmt DIR`",
}


@dataclasses.dataclass(frozen=True)
class Job:
  """A dataset's preparation: its shards and the module-level function writing one."""

  shards: list[shards.Shard]
  work: Callable[[Any, list[Path]], shards.Written]
  unit: str
  description: str
  preload: tuple[str, ...] = ()  # imported once by the fork server, for every worker


def job(dataset: str, raw: Path, out: Path, options: dict[str, Any]) -> Job:
  """The job preparing `dataset` from `raw` into `out`; one-line errors for bad input."""
  if dataset in ELSEWHERE:
    raise UserError(f"{dataset} is not prepared by mlbench: use {ELSEWHERE[dataset]}")
  if dataset == "c4":
    from mlbench.datasets import c4

    if options.get("tokenizer") is None:
      raise UserError("c4 needs --tokenizer PATH (the model's Hugging Face tokenizer.json)")
    return Job(c4.plan(raw, out, options["tokenizer"], options.get("eod")), c4.write_shard,
               "tokens", "tokenising C4", ("tokenizers", "workloads.llama31_8b.indexed"))
  if dataset == "imagenet":
    from mlbench.datasets import imagenet

    return Job(imagenet.plan(raw, options), imagenet.write_shard, "images", "encoding ImageNet",
               ("mlbench.datasets.records", "tensorflow"))
  if dataset == "coco":
    from mlbench.datasets import coco

    return Job(coco.plan(raw, options), coco.write_shard, "images", "encoding COCO",
               ("mlbench.datasets.records", "tensorflow"))
  raise UserError(f"unknown dataset {dataset!r}; choose from "
                  f"{', '.join(PREPARED + tuple(ELSEWHERE))}")
