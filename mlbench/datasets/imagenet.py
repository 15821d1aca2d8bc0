"""ILSVRC2012 folders of JPEGs into the ImageNet TFRecords the resnet50 workload reads.

As the MLPerf reference's conversion (tensorflow/tpu `imagenet_to_gcs.py`) does:
training images `train/<wnid>/*.JPEG` are shuffled with `random.seed(0)` (here over
the sorted file list, so the order does not depend on the file system); validation
images `val/*.JPEG` are sorted by name; labels are 1 + the position of the wnid among
all wnids sorted; each split is cut into equal consecutive chunks, one per file
`train-00000-of-01024` ... `validation-00127-of-00128`. Features: `image/encoded`,
`image/height`, `image/width`, `image/colorspace` (RGB), `image/channels` (3),
`image/class/label`, `image/class/synset`, `image/format` (JPEG), `image/filename`.
The reference fixes its known bad files by name (one PNG saved as .JPEG, 22 CMYK
JPEGs); this looks at the bytes instead, which finds the same files, and re-encodes
them as the reference does: decoded to RGB, JPEG quality 100.

Validation labels come from `LOC_val_solution.csv` (Kaggle's CSV), a file of one wnid
per image in name order (`imagenet_2012_validation_synset_labels.txt`, the
reference's), the devkit (`data/ILSVRC2012_validation_ground_truth.txt` and
`data/meta.mat`), or `val/<wnid>/` folders.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

from mlbench.datasets import shards
from mlbench.errors import UserError

LAYOUT = "RAW/train/<wnid>/*.JPEG and RAW/val/*.JPEG (ILSVRC2012)"
LABEL_FILES = ("LOC_val_solution.csv", "imagenet_2012_validation_synset_labels.txt",
               "ILSVRC2012_devkit_t12")
TRAIN_IMAGES, VAL_IMAGES = 1_281_167, 50_000


@dataclasses.dataclass(frozen=True)
class Task:
  """One TFRecord file: (path, label, wnid) of each image, in order."""

  images: tuple[tuple[str, int, str], ...]


def _jpegs(folder: Path) -> list[Path]:
  return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.upper() == ".JPEG")


def train_images(raw: Path) -> list[tuple[Path, str]]:
  """(path, wnid) of every training image, in the reference's shuffled order."""
  folder = Path(raw) / "train"
  found = [(p, d.name) for d in sorted(folder.iterdir()) if d.is_dir() for p in _jpegs(d)]
  if not found:
    raise UserError(f"no training images in {folder}; expected {LAYOUT}")
  order = list(range(len(found)))
  random.Random(0).shuffle(order)  # the reference: random.seed(0); random.shuffle(...)
  return [found[i] for i in order]


def val_images(raw: Path, labels: Path | None) -> list[tuple[Path, str]]:
  """(path, wnid) of every validation image, sorted by name."""
  folder = Path(raw) / "val"
  subfolders = sorted(d for d in folder.iterdir() if d.is_dir())
  if subfolders and labels is None:  # the val/<wnid>/ layout of the common valprep.sh
    found = [(p, d.name) for d in subfolders for p in _jpegs(d)]
    return sorted(found, key=lambda pair: pair[0].name)
  files = _jpegs(folder)
  if not files:
    raise UserError(f"no validation images in {folder}; expected {LAYOUT}")
  wnids = _val_labels(raw, labels, [p.name for p in files])
  return list(zip(files, wnids))


def _val_labels(raw: Path, given: Path | None, names: list[str]) -> list[str]:
  path = given or next((Path(raw) / n for n in LABEL_FILES if (Path(raw) / n).exists()), None)
  if path is None or not Path(path).exists():
    raise UserError(f"no validation labels for {raw}/val; give --val-labels (one of "
                    f"{', '.join(LABEL_FILES)}) or put one in {raw}")
  path = Path(path)
  if path.is_dir():
    wnids = _devkit_labels(path)
  elif path.suffix == ".csv":
    wnids = _csv_labels(path, names)
  else:
    wnids = path.read_text().split()
  if len(wnids) != len(names):
    raise UserError(f"{path} labels {len(wnids)} validation images but {raw}/val holds "
                    f"{len(names)}; give the labels of these images with --val-labels")
  return wnids


def _csv_labels(path: Path, names: list[str]) -> list[str]:
  import csv

  with path.open(newline="") as f:
    rows = {r["ImageId"]: r["PredictionString"].split()[0] for r in csv.DictReader(f)}
  missing = [n for n in names if Path(n).stem not in rows]
  if missing:
    raise UserError(f"{path} has no label for {missing[0]} ({len(missing)} missing); expected "
                    "rows ImageId,PredictionString as in LOC_val_solution.csv")
  return [rows[Path(n).stem] for n in names]


def _devkit_labels(devkit: Path) -> list[str]:
  """The devkit's ILSVRC2012_IDs per image, mapped to wnids by its meta.mat."""
  from scipy.io import loadmat

  truth, meta = devkit / "data" / "ILSVRC2012_validation_ground_truth.txt", devkit / "data" / "meta.mat"
  if not (truth.is_file() and meta.is_file()):
    raise UserError(f"{devkit} lacks data/ILSVRC2012_validation_ground_truth.txt or "
                    "data/meta.mat; give the ILSVRC2012_devkit_t12 folder")
  synsets = loadmat(str(meta), squeeze_me=True)["synsets"]
  wnid_of = {int(i): str(w) for i, w in zip(synsets["ILSVRC2012_ID"], synsets["WNID"])}
  return [wnid_of[int(i)] for i in truth.read_text().split()]


def _shards(prefix: str, images: list[tuple[Path, str]], labels: dict[str, int],
            count: int) -> list[shards.Shard]:
  """Consecutive chunks of ceil(n / count) images, one per file (the reference's split)."""
  size = -(-len(images) // count)
  result = []
  for i in range(count):
    chunk = images[i * size:(i + 1) * size]
    name = f"{prefix}-{i:05d}-of-{count:05d}"
    task = Task(tuple((str(p), labels[w], w) for p, w in chunk))
    result.append(shards.Shard(name, (name,), task, units=len(chunk)))
  return result


def plan(raw: Path, options: dict) -> list[shards.Shard]:
  """The training and validation files of `raw`, as the reference cuts them."""
  raw = Path(raw)
  has = {s: (raw / s).is_dir() for s in ("train", "val")}
  if not any(has.values()):
    raise UserError(f"{raw} holds neither train/ nor val/; expected {LAYOUT}")
  train = train_images(raw) if has["train"] else []
  val = val_images(raw, options.get("val_labels")) if has["val"] else []
  labels = {w: i + 1 for i, w in enumerate(sorted({w for _, w in train + val}))}
  # A split that is not there gets no files (not empty ones).
  return ((_shards("train", train, labels, options.get("train_shards") or 1024) if train else [])
          + (_shards("validation", val, labels, options.get("val_shards") or 128) if val else []))


def shaping(planned: list[shards.Shard]) -> dict[str, str]:
  """The options that shape the records: the label of every wnid, and every validation
  image's wnid (from --val-labels or a labels file found under --raw)."""
  from mlbench.datasets.receipts import digest

  labels = sorted({(wnid, label) for s in planned for _, label, wnid in s.task.images})
  val = [(Path(p).name, wnid) for s in planned if s.name.startswith("validation")
         for p, _, wnid in s.task.images]
  return {"label map": digest(labels), "validation labels": digest(val)}


def write_shard(task: Task, tmps: list[Path]) -> shards.Written:
  """Writes one TFRecord file (the worker of `shards.run`); bad images are listed."""
  from mlbench.datasets import records

  out, unreadable = [], []
  for path, label, wnid in task.images:
    try:
      data, height, width, fixed = records.clean_jpeg(Path(path).read_bytes())
    except (OSError, ValueError) as e:
      unreadable.append(f"{path}: {e}")
      continue
    del fixed  # stored already re-encoded; nothing else differs
    out.append(records.serialize({
        "image/height": height, "image/width": width, "image/colorspace": "RGB",
        "image/channels": 3, "image/class/label": label, "image/class/synset": wnid,
        "image/format": "JPEG", "image/filename": Path(path).name, "image/encoded": data}))
  records.write(tmps[0], out)
  return shards.Written(records=len(out), units=len(task.images), unreadable=unreadable)
