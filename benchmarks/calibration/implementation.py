"""What each published run did, read from its own implementation in the same results repository.

For every run of the calibration set (and the held-out v0.6 runs) the lines of its
run script, flags or code that say how it treated variable-length inputs (padded to one
length, bucketed by length with a batch per bucket, packed several sequences to a row, or
unpadded) and how it laid its replicas over the chips are kept in
`implementations.json`, each with its file and line in mlcommons/training_results_vX.Y at
the commit named there. `read` turns a run's lines into an `Implementation`; the
calibration costs each run by the program it describes (`cases.inputs`).

The lines are extracted, never typed: from a folder holding those repositories as the
`fetch` tool or `git clone --bare` leaves them,

    python -m benchmarks.calibration.implementation --mirrors DIR [--write]

(prints each run's treatment; --write stores the lines). A pattern that finds nothing
is an error, so a moved line cannot go unnoticed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import subprocess
from pathlib import Path
from typing import Any

from . import implementations_spec

EXCERPTS = Path(__file__).with_name("implementations.json")
LENGTHS = Path(__file__).parents[1] / "bert_wikipedia_lengths.json"
_FLAG = re.compile(r"--([a-z_0-9]+)(?:=([\w.\-/*]+))?")
_EXPORT = re.compile(r"^(?:export )?([A-Z_0-9]+)=(\S+)")
_NUMBER = re.compile(r"^\d+$")


@dataclasses.dataclass(frozen=True)
class Implementation:
  """How a run fed its inputs and laid out its replicas, as its own code says.

  kind: `fixed` (images of one size: nothing varies), `padded` (every sequence to
  `length`), `bucketed` (`buckets`: (longest length, sequences a replica) each),
  `packed` (rows of `length` holding `sequences_per_row` sequences on average;
  `per_replica` rows a replica), `unpadded` (`per_replica` sequences a replica, no
  padding computed). `replicas` x `partitions` TensorCores (or chips) ran the step,
  where the flags say so."""

  kind: str
  length: int = 0
  buckets: tuple[tuple[int, int], ...] = ()
  per_replica: int | None = None
  sequences_per_row: float | None = None
  replicas: int | None = None
  partitions: int = 1
  spatial: bool = False       # partitions split the images, not the weights
  sources: tuple[str, ...] = ()

  def describe(self) -> str:
    if self.kind == "bucketed":
      return "bucketed by length: " + ", ".join(
          f"{b} of <= {n}" for n, b in self.buckets) + " tokens a replica"
    if self.kind == "packed":
      per = (f", {self.sequences_per_row:g} sequences a row" if self.sequences_per_row
             else "")
      return f"packed into rows of {self.length}{per}"
    if self.kind == "unpadded":
      return f"unpadded ({self.per_replica} sequences a replica, up to {self.length} tokens)"
    if self.kind == "padded":
      return f"padded to {self.length}"
    return "fixed-size images"

  def devices(self) -> int | None:
    """TensorCores (or chips) the step ran on, where the flags say."""
    return None if self.replicas is None else self.replicas * self.partitions


def load() -> dict[str, list[dict[str, Any]]]:
  """The stored lines by run folder (<round>/<org>/results/<system>/<benchmark>)."""
  return json.loads(EXCERPTS.read_text())["runs"]


def of(folder: str, excerpts: dict[str, list[dict[str, Any]]] | None = None
       ) -> Implementation:
  """The implementation of the run in `folder`; images where its lines say nothing."""
  lines = (excerpts if excerpts is not None else load()).get(folder, [])
  return read(lines, folder.rsplit("/", 1)[-1])


def _words(lines: list[dict[str, Any]]) -> tuple[dict[str, list[str]], list[str]]:
  flags: dict[str, list[str]] = {}
  for item in lines:
    for text in item["text"].split("\n"):
      text = text.strip()
      m = _EXPORT.match(text)
      if m:
        flags.setdefault(m.group(1), []).append(m.group(2).strip("\"'"))
      for name, value in _FLAG.findall(text):
        flags.setdefault(name, []).append(value)
  return flags, [item["text"] for item in lines]


def _int(flags: dict[str, list[str]], name: str) -> int | None:
  values = [v for v in flags.get(name, []) if _NUMBER.match(v)]
  return int(values[-1]) if values else None


def read(lines: list[dict[str, Any]], benchmark: str) -> Implementation:
  """A run's implementation from its stored lines (`implementations.json`)."""
  flags, texts = _words(lines)
  code = "\n".join(texts)
  sources = tuple(sorted({item["file"] for item in lines}))
  layout = _layout(flags, code)
  kw: dict[str, Any] = {"sources": sources, **layout}
  buckets = [int(v) for v in flags.get("batch_size_buckets", [])]
  length = _int(flags, "max_seq_length") or 0
  if len(buckets) > 1:  # one bucket is no bucketing (dataset_input.py L170-171)
    lengths = [int(v) for v in flags["seq_len_buckets"]]
    return Implementation("bucketed", length, tuple(zip(lengths, buckets)), **kw)
  if "packed_samples" in flags:
    return Implementation("packed", length, per_replica=_int(flags, "BATCHSIZE"),
                          sequences_per_row=float(_int(flags, "PACKING_FACTOR") or 1), **kw)
  if "unpad" in flags:
    return Implementation("unpadded", length, per_replica=_int(flags, "BATCHSIZE"), **kw)
  packed = re.search(r"MAX_TRAIN_LEN = (\d+)|FixateInputShape\(p, self\.TRAIN_BATCH_SIZE, "
                     r"(\d+), \d+\)|return (\d+)", code)
  if packed and ("packed" in code or "--problem" in flags):
    return Implementation("packed", int(next(g for g in packed.groups() if g)), **kw)
  if length:
    return Implementation("padded", length, **kw)
  if benchmark in ("resnet", "ssd"):
    return Implementation("fixed", **kw)
  raise ValueError(f"{benchmark}: its lines say neither padding, buckets nor packing")


def _layout(flags: dict[str, list[str]], code: str) -> dict[str, Any]:
  """Replicas and partitions as the flags (or the Lingvo params' per-core batch) say."""
  replicas = (_int(flags, "num_replicas") or _int(flags, "num_shards")
              or _int(flags, "num_tpu_cores"))
  per_core = re.findall(r"TRAIN_BATCH_SIZE = (\d+)", code)
  total = re.findall(r"global_batch_size = (\d+)", code)
  if replicas is None and per_core and total:
    replicas = int(total[-1]) // int(per_core[-1])
  dims = [int(v) for v in flags.get("input_partition_dims", [])]
  if dims:
    return {"replicas": replicas, "partitions": math.prod(dims), "spatial": True}
  partitions = _int(flags, "num_partitions") or int(
      (re.findall(r"XLA_NUM_PARTITIONS = (\d+)", code) or ["1"])[-1])
  if "num_tpu_cores" in flags and replicas is not None:
    replicas //= partitions  # BERT's --num_tpu_cores counts every core of every replica
  return {"replicas": replicas, "partitions": partitions}


def lengths() -> list[int]:
  """Sequences of each length (index + 1 tokens) in MLPerf BERT's Wikipedia training data
  (benchmarks/bert_wikipedia_lengths.json says where the counts come from)."""
  return json.loads(LENGTHS.read_text())["counts"]


def bucket_shares(buckets: tuple[tuple[int, int], ...], counts: list[int]
                  ) -> list[tuple[float, float]]:
  """Per bucket (share of the sequences, share of a replica's steps). A sequence of n
  tokens goes to the first bucket whose bound is at least n (dataset_input.py L180-186:
  the bucket is the count of bounds below n); a replica's step takes one bucket's batch
  (`group_by_window`), so its steps fall in a bucket in proportion to sequences / batch."""
  total = sum(counts)
  shares, low = [], 0
  for bound, _ in buckets:
    shares.append(sum(counts[low:bound]) / total)
    low = bound
  per_step = [s / b for s, (_, b) in zip(shares, buckets)]
  return [(s, p / sum(per_step)) for s, p in zip(shares, per_step)]


def mean_length(counts: list[int]) -> float:
  return sum((i + 1) * c for i, c in enumerate(counts)) / sum(counts)


def _git_lines(repo: Path, commit: str, path: str) -> list[str]:
  out = subprocess.run(["git", "--git-dir", str(repo), "show", f"{commit}:{path}"],
                       check=True, capture_output=True, text=True)
  return out.stdout.splitlines()


def _repo(mirrors: Path, name: str) -> Path:
  for where in (mirrors / f"mlcommons+{name}" / "repo", mirrors / name, mirrors / f"{name}.git"):
    if where.exists():
      return where
  raise FileNotFoundError(f"no {name} under {mirrors}; fetch mlcommons/{name} there")


def extract(mirrors: Path) -> dict[str, Any]:
  """The lines `implementations_spec.SPEC` names, from the repositories under `mirrors`."""
  rounds, runs = {}, {}
  for folder, specs in implementations_spec.SPEC.items():
    kept = []
    for s in specs:
      name = implementations_spec.REPOS[s.round]
      repo = _repo(mirrors, name)
      rounds[s.round] = f"mlcommons/{name}@" + subprocess.run(
          ["git", "--git-dir", str(repo), "rev-parse", "HEAD"], check=True,
          capture_output=True, text=True).stdout.strip()
      text = _git_lines(repo, "HEAD", s.path)
      first, last = s.lines or (1, len(text))
      found = [(n, m) for n in range(first, last + 1)
               for m in re.findall(s.pattern, text[n - 1])]
      if not found:
        raise ValueError(f"{folder}: {s.pattern!r} is not in {s.round}:{s.path} "
                         f"L{first}-{last}")
      for n in sorted({n for n, _ in found}):
        words = [m if isinstance(m, str) else m[0] for k, m in found if k == n]
        kept.append({"file": f"{s.round}:{s.path}", "line": n, "text": " ".join(words)})
    runs[folder] = kept
  return {"sources": dict(sorted(rounds.items())), "runs": runs}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--mirrors", type=Path, required=True,
                  help="folder with mlcommons/training_results_v0.6 ... v4.0 (bare) repositories")
  ap.add_argument("--write", action="store_true", help=f"store the lines in {EXCERPTS.name}")
  args = ap.parse_args()
  doc = extract(args.mirrors)
  for folder, lines in doc["runs"].items():
    impl = read(lines, folder.rsplit("/", 1)[-1])
    where = f"{impl.devices()} devices" if impl.devices() else "layout not in its flags"
    print(f"{folder}: {impl.describe()}; {where}")
  if args.write:
    tmp = EXCERPTS.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(EXCERPTS)


if __name__ == "__main__":
  main()
