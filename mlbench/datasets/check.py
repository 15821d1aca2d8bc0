"""`mlbench data verify`: is a prepared dataset complete and in the schema its workload reads?

Every check is a row: what was checked, what was expected, what was found, and
whether they agree. Expectations come from the folder's manifest when `mlbench data
prepare` wrote it (files, sizes, records per file, sha256), and otherwise from the
reference's published numbers (ImageNet: 1,024 training files of 1,281,167 images
and 128 validation files of 50,000; COCO: 100 files of the 117,266 training images
with annotations and 50 of the 5,000 validation images; BERT: 500 training files and an
evaluation set of 10,000; WMT: training records of one form, packed or one pair each, and
the 3,003 raw sentences of newstest2014 the reference scores BLEU on). The quick checks
(files, sizes, the index of every Megatron dataset and one record's schema, the first
record of every WMT training file) read almost nothing; `full` also counts every record
and recomputes the checksums (the newstest2014 files' md5, as the reference's
verify_dataset.sh). The checks of a workload's own format (the WMT records' form and
newstest2014, the Megatron index) are the reading workload's, asked through the plugin
contract (`InputSpec.verify`): nothing here imports a workload.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from concurrent.futures import ThreadPoolExecutor

from mlbench.storage import paths
from mlbench.datasets import receipts, shards
from mlbench.errors import UserError

BYTES, INT, FLOAT = "bytes", "int64", "float"


@dataclasses.dataclass(frozen=True)
class Row:
  check: str
  expected: str
  found: str
  ok: bool | None  # None: for information, not a failure


@dataclasses.dataclass(frozen=True)
class SplitSpec:
  """One split of a TFRecord dataset as its workload globs it."""

  name: str
  globs: tuple[str, ...]
  files: int | None
  records: int | None
  features: dict[str, str]


_IMAGE = {"image/encoded": BYTES, "image/class/label": INT, "image/height": INT,
          "image/width": INT}
_COCO = {"image/encoded": BYTES, "image/source_id": BYTES, "image/height": INT,
         "image/object/bbox/xmin": FLOAT, "image/object/class/label": INT,
         "image/object/is_crowd": INT, "image/object/area": FLOAT}
_BERT = {k: INT for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions",
                          "masked_lm_ids", "next_sentence_labels")} | {"masked_lm_weights": FLOAT}
TFRECORDS = {
    "imagenet": (SplitSpec("train", ("train-*-of-*",), 1024, 1_281_167, _IMAGE),
                 SplitSpec("validation", ("validation-*-of-*",), 128, 50_000, _IMAGE)),
    "coco": (SplitSpec("train", ("coco_train.record-*", "train-*"), 100, 117_266, _COCO),
             SplitSpec("val", ("coco_val.record-*", "val-*"), 50, 5_000, _COCO)),
    "bert": (SplitSpec("train", ("part-*",), 500, None, _BERT),
             SplitSpec("eval", ("eval_10k", "eval-*"), None, 10_000, _BERT)),
    "wmt": (SplitSpec("train", ("*train*-of-*",), None, None, {"inputs": INT, "targets": INT}),
            SplitSpec("dev", ("*dev*-of-*",), None, None, {"inputs": INT, "targets": INT})),
}
DATASETS = tuple(TFRECORDS) + ("c4",)
READERS = {"imagenet": "resnet50", "coco": "ssd", "bert": "bert", "wmt": "transformer",
           "c4": "llama31_8b"}
"""The workload that reads each dataset, whose own checks (`InputSpec.verify`) it also gets."""


def verify(dataset: str, folder: paths.PathLike, *, full: bool) -> list[Row]:
  """Every check of `dataset` in `folder` (a folder or a bucket's); one-line errors when
  there is nothing to check."""
  folder = paths.require_dir(folder, "data verify")
  with paths.errors("data verify", folder):
    return _verify(dataset, folder, full)


def _verify(dataset: str, folder: paths.Path, full: bool) -> list[Row]:
  manifest = receipts.read_manifest(folder)
  if manifest is not None and not {"complete", "planned", "shards", "files"} <= set(manifest):
    raise UserError(f"{folder / receipts.MANIFEST} is not a manifest this mlbench reads; run the "
                    "same `mlbench data prepare` again to rewrite it (finished shards are kept)")
  rows = _manifest_rows(manifest)
  if dataset == "c4":
    return rows + _reader_rows(dataset, folder, full) + _c4_rows(folder, manifest, full)
  if dataset not in TFRECORDS:
    raise UserError(f"unknown dataset {dataset!r}; choose from {', '.join(DATASETS)}")
  for spec in TFRECORDS[dataset]:
    rows += _split_rows(folder, spec, manifest, full)
  return rows + _reader_rows(dataset, folder, full)


def _manifest_rows(manifest: dict | None) -> list[Row]:
  if manifest is None:
    return [Row("manifest", "mlbench-data.json", "none: checked against the reference", None)]
  rows = [Row("prepare finished", f"{manifest['planned']} shards",
              f"{len(manifest['shards'])} shards", manifest["complete"])]
  if manifest["unreadable"]:
    rows.append(Row("unreadable inputs", "0", f"{len(manifest['unreadable'])} left out", None))
  return rows


def _files(folder: paths.Path, globs: tuple[str, ...]) -> list[paths.Path]:
  """The files matching `globs`, from one listing of `folder` (in a bucket, what is
  listed under a file's name is a file)."""
  local = not paths.is_remote(folder)
  return sorted({p for p in folder.iterdir() for g in globs if fnmatch.fnmatchcase(p.name, g)
                 and not p.name.startswith(".") and (not local or p.is_file())})


def _split_rows(folder: paths.Path, spec: SplitSpec, manifest: dict | None,
                full: bool) -> list[Row]:
  files = _files(folder, spec.globs)
  listed = {n: i for n, i in (manifest or {}).get("files", {}).items()
            if any(fnmatch.fnmatchcase(n, g) for g in spec.globs)}
  want_files = len(listed) if manifest else spec.files
  rows = [Row(f"{spec.name} files", _n(want_files), str(len(files)),
              None if want_files is None else len(files) == want_files)]
  rows += _numbering_rows(spec.name, files)
  if manifest:
    rows.append(_sizes_row(spec.name, folder, listed))
  if files:
    rows.append(_schema_row(spec, files[0]))
  if full and files:
    want = (sum(manifest["shards"][n]["records"] for n in listed if n in manifest["shards"])
            if manifest else spec.records)
    rows.append(_count_row(spec.name, files, want))
    if manifest:
      rows.append(_checksum_row(spec.name, folder, listed))
  return rows


def _count_row(name: str, files: list[paths.Path], want: int | None) -> Row:
  """Every record counted; a file that does not read to its end (a corrupt or truncated
  record) is named, not a traceback."""
  from mlbench.datasets import records

  found, bad = 0, []
  for p in files:
    try:
      found += records.count(str(p))
    except records.tf().errors.OpError as e:  # DataLossError: corrupted record at N
      bad.append(f"{p.name}: {type(e).__name__} ({(str(e).splitlines() or [''])[0][:80]})")
  if bad:
    return Row(f"{name} records", _n(want), f"{bad[0]}" + (f" and {len(bad) - 1} more "
                                                          "unreadable" if len(bad) > 1 else ""),
               False)
  return Row(f"{name} records", _n(want), f"{found:,}", None if want is None else found == want)


def _n(value: int | None) -> str:
  return "-" if value is None else f"{value:,}"


def _numbering_rows(name: str, files: list[paths.Path]) -> list[Row]:
  """`x-00003-of-00008` files: every index of the count present, one count for all."""
  numbered = [re.search(r"-(\d+)-of-(\d+)$", p.name) for p in files]
  if not files or not all(numbered):
    return []
  counts = {int(m.group(2)) for m in numbered}
  indices = {int(m.group(1)) for m in numbered}
  total = max(counts)
  # From 0 (create_coco_tf_record, imagenet_to_gcs) or from 1 (the Transformer reference's
  # process_data.py L319-323: wmt32k-encoded-train-00001-of-00100 ... 00100-of-00100).
  base = 1 if min(indices) == 1 and total in indices else 0
  missing = sorted(set(range(base, total + base)) - indices)
  found = "all" if not missing and len(counts) == 1 else (
      f"missing {', '.join(map(str, missing[:5]))}{'...' if len(missing) > 5 else ''}"
      if missing else f"mixed counts {sorted(counts)}")
  return [Row(f"{name} numbering", f"{base}..{total - 1 + base} of {total}", found,
              found == "all")]


def _sizes_row(name: str, folder: paths.Path, listed: dict[str, dict]) -> Row:
  present = {p.name for p in folder.iterdir()}
  names = [n for n in listed if n in present]
  with ThreadPoolExecutor(16) as pool:  # A bucket answers each look-up in tens of ms.
    sizes = dict(zip(names, pool.map(lambda n: paths.size(folder / n), names)))
  bad = [n for n, info in listed.items() if sizes.get(n) != info["bytes"]]
  return Row(f"{name} sizes", f"{len(listed)} as written", "all" if not bad else
             f"{len(bad)} missing or changed ({bad[0]}...)", not bad)


def _checksum_row(name: str, folder: paths.Path, listed: dict[str, dict]) -> Row:
  bad = [n for n, info in listed.items()
         if (folder / n).is_file() and shards.sha256(folder / n) != info["sha256"]]
  return Row(f"{name} sha256", f"{len(listed)} as written", "all" if not bad else
             f"{len(bad)} differ ({bad[0]}...)", not bad)


def _schema_row(spec: SplitSpec, path: paths.Path) -> Row:
  from google.protobuf.message import DecodeError

  from mlbench.datasets import records

  t = records.tf()
  want = ", ".join(sorted(spec.features))
  try:
    first = records.first(path)
    if first is None:
      return Row(f"{spec.name} schema", want, f"{path.name} is empty", None)
    feature = t.train.Example.FromString(first).features.feature
  except (t.errors.OpError, DecodeError, ValueError) as e:  # a corrupt file: DataLossError...
    return Row(f"{spec.name} schema", want, f"{path.name}: {type(e).__name__}", False)
  kinds = {k: {"bytes_list": BYTES, "int64_list": INT, "float_list": FLOAT}.get(
      feature[k].WhichOneof("kind")) for k in feature}
  wrong = [f"{k} ({kinds.get(k, 'missing')})" for k, v in spec.features.items()
           if kinds.get(k) != v]
  return Row(f"{spec.name} schema", want, "as expected" if not wrong else
             "wrong: " + ", ".join(wrong), not wrong)


def _c4_rows(folder: paths.Path, manifest: dict | None, full: bool) -> list[Row]:
  if not manifest:
    return []
  rows = [_sizes_row("c4", folder, manifest["files"])]
  return rows + ([_checksum_row("c4", folder, manifest["files"])] if full else [])


def _reader_rows(dataset: str, folder: paths.Path, full: bool) -> list[Row]:
  """The checks of its own format that the workload reading `dataset` adds
  (`InputSpec.verify`, for its full config): the WMT records' packing and newstest2014,
  the Megatron datasets llama31_8b reads."""
  from mlbench import registry

  workload = registry.get(READERS[dataset])
  if workload.input.verify is None:
    return []
  return [Row(*row) for row in workload.input.verify(workload.configs["full"](), folder, full)]


def require_complete(folder: paths.PathLike) -> None:
  """The cheap check `mlbench run` makes: a folder `mlbench data prepare` wrote (it has a
  manifest) must be finished and hold every file at its written size. Reads no data, so
  it costs one stat per file; folders without a manifest are left to the workload."""
  folder = paths.path(folder, "--data-dir")
  with paths.errors("--data-dir", folder):
    manifest = receipts.read_manifest(folder) if folder.is_dir() else None
    _require_complete(folder, manifest)


def _require_complete(folder: paths.Path, manifest: dict | None) -> None:
  if manifest is None:
    return
  if not {"complete", "planned", "shards", "files"} <= set(manifest):
    return  # a manifest of another version: `mlbench data verify` says so
  rows = [r for r in _manifest_rows(manifest) + [_sizes_row("files", folder, manifest["files"])]
          if r.ok is False]
  if rows:
    problems = "; ".join(f"{r.check}: expected {r.expected}, found {r.found}" for r in rows)
    raise UserError(f"the dataset in {folder} is not complete ({problems}); finish it with the "
                    "same `mlbench data prepare` (finished shards are kept), then check it with "
                    "`mlbench data verify`")
