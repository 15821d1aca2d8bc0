"""Which datasets `mlbench data prepare` knows, and the job (shards + writer) of each."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from mlbench.datasets import shards
from mlbench.datasets.receipts import digest
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
  options: dict[str, str] = dataclasses.field(default_factory=dict)  # what shapes the bytes


def _version(*dists: str) -> str:
  for dist in dists:
    try:
      return metadata.version(dist)
    except metadata.PackageNotFoundError:
      continue
  return "none"


def _tools(*dists: str) -> dict[str, str]:
  """The versions of mlbench and of the libraries that write a dataset's bytes."""
  return {"mlbench": _version("mlbench"),
          **{d: _version(d, f"{d}-cpu") for d in dists}}


def _shard_counts(shard_list: list[shards.Shard]) -> dict[str, str]:
  """Files per split (`train-00000-of-01024` -> train: 1024): a count changes every name."""
  counts: dict[str, str] = {}
  for s in shard_list:
    prefix, _, count = s.name.rpartition("-of-")
    counts[f"{prefix.rsplit('-', 1)[0]} files"] = str(int(count))
  return counts


def job(dataset: str, raw: Path, out: Path, options: dict[str, Any]) -> Job:
  """The job preparing `dataset` from `raw` into `out`; one-line errors for bad input."""
  if dataset in ELSEWHERE:
    raise UserError(f"{dataset} is not prepared by mlbench: use {ELSEWHERE[dataset]}")
  if dataset == "c4":
    from mlbench.datasets import c4

    if options.get("tokenizer") is None:
      raise UserError("c4 needs --tokenizer PATH (the model's Hugging Face tokenizer.json)")
    planned = c4.plan(raw, out, options["tokenizer"], options.get("eod"))
    return Job(planned, c4.write_shard, "tokens", "tokenising C4",
               ("tokenizers", "mlbench.datasets.indexed"),
               {**_tools("tokenizers"), **c4.shaping(planned)})
  if dataset == "imagenet":
    from mlbench.datasets import imagenet

    planned = imagenet.plan(raw, options)
    return Job(planned, imagenet.write_shard, "images", "encoding ImageNet",
               ("mlbench.datasets.records", "tensorflow"),
               {**_tools("tensorflow"), **_shard_counts(planned), **imagenet.shaping(planned)})
  if dataset == "coco":
    from mlbench.datasets import coco

    planned = coco.plan(raw, options)
    categories = planned[0].task.categories if planned else ()
    return Job(planned, coco.write_shard, "images", "encoding COCO",
               ("mlbench.datasets.records", "tensorflow"),
               {**_tools("tensorflow"), **_shard_counts(planned),
                "categories": digest(categories)})
  raise UserError(f"unknown dataset {dataset!r}; choose from "
                  f"{', '.join(PREPARED + tuple(ELSEWHERE))}")
