"""COCO 2017 images and instance annotations into the TFRecords the ssd workload reads.

The schema and the cut are those of the TensorFlow object detection API's
`create_coco_tf_record.py`, which the ssd workload's reader follows: images in the
annotation file's order, dealt round-robin into `coco_train.record-?????-of-00100` and
`coco_val.record-?????-of-00050`; per image `image/height`, `image/width` (from the
annotations), `image/filename`, `image/source_id` (the COCO id, as text),
`image/key/sha256`, `image/encoded`, `image/format`; per box, normalised
`image/object/bbox/{xmin,xmax,ymin,ymax}`, `image/object/class/label` (the COCO
category id: the workload maps ids to its classes), `image/object/class/text`,
`image/object/is_crowd` and `image/object/area`.

Boxes and images as the MLPerf SSD reference's COCODetection takes them (mlcommons/training
aa344c7f retired_benchmarks/ssd-v1/ssd/utils.py): every annotation's box is kept, one with
no width or height and one reaching past the image included (L544-550 append them all;
L591-598 only divide by the image size), where create_coco_tf_record.py would skip them;
a training image without any annotation (crowd ones count) is dropped (L552-555);
validation keeps every image, since the COCO evaluation scores them all. Crowd boxes are
written with `is_crowd` 1: the workload trains on them like any other, as the reference
(which never reads `iscrowd`), and its evaluation hands the flag to pycocotools.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from mlbench.datasets import shards
from mlbench.errors import UserError

LAYOUT = ("RAW/train2017/*.jpg, RAW/val2017/*.jpg and RAW/annotations/instances_train2017.json, "
          "instances_val2017.json")
SPLITS = {"train": ("train2017", "coco_train.record"), "val": ("val2017", "coco_val.record")}


@dataclasses.dataclass(frozen=True)
class Task:
  """One TFRecord file: each image's json entry with its annotations, and the names."""

  folder: str
  images: tuple[str, ...]  # json of {"image": ..., "annotations": [...]}, one per image
  categories: tuple[tuple[int, str], ...]


def _load(raw: Path, split: str) -> dict:
  path = raw / "annotations" / f"instances_{SPLITS[split][0]}.json"
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError) as e:
    raise UserError(f"cannot read {path} ({type(e).__name__}); expected {LAYOUT}") from None


def images(raw: Path, split: str) -> tuple[list[dict], dict[int, str]]:
  """[{"image", "annotations"}] in the annotation file's order, filtered as the reference."""
  data = _load(raw, split)
  by_image: dict[int, list[dict]] = {}
  for a in data.get("annotations", []):
    by_image.setdefault(a["image_id"], []).append(a)
  entries = [{"image": i, "annotations": by_image.get(i["id"], [])} for i in data["images"]]
  if split == "train":
    entries = [e for e in entries if e["annotations"]]
  return entries, {c["id"]: c["name"] for c in data.get("categories", [])}


def plan(raw: Path, options: dict) -> list[shards.Shard]:
  raw = Path(raw)
  present = [s for s, (folder, _) in SPLITS.items() if (raw / folder).is_dir()
             and (raw / "annotations" / f"instances_{folder}.json").is_file()]
  if not present:
    raise UserError(f"{raw} holds no COCO 2017 split; expected {LAYOUT}")
  result = []
  for split in present:
    entries, names = images(raw, split)
    count = options.get(f"{split}_shards") or (100 if split == "train" else 50)
    folder, prefix = SPLITS[split]
    for i in range(count):
      mine = entries[i::count]  # round-robin, as create_coco_tf_record's idx % num_shards
      name = f"{prefix}-{i:05d}-of-{count:05d}"
      task = Task(str(raw / folder), tuple(json.dumps(e) for e in mine),
                  tuple(sorted(names.items())))
      result.append(shards.Shard(name, (name,), task, units=len(mine)))
  return result


def _boxes(image: dict, annotations: list[dict], names: dict[int, str]) -> dict[str, list]:
  w, h = float(image["width"]), float(image["height"])
  out: dict[str, list] = {k: [] for k in ("xmin", "xmax", "ymin", "ymax", "label", "text",
                                          "crowd", "area")}
  for a in annotations:
    x, y, bw, bh = (float(v) for v in a["bbox"])
    out["xmin"].append(x / w)
    out["xmax"].append((x + bw) / w)
    out["ymin"].append(y / h)
    out["ymax"].append((y + bh) / h)
    out["label"].append(int(a["category_id"]))
    out["text"].append(names.get(int(a["category_id"]), "").encode())
    out["crowd"].append(int(a.get("iscrowd", 0)))
    out["area"].append(float(a["area"]))
  return out


def write_shard(task: Task, tmps: list[Path]) -> shards.Written:
  """Writes one TFRecord file (the worker of `shards.run`); bad images are listed."""
  import numpy as np

  from mlbench.datasets import records

  names = dict(task.categories)
  out, unreadable = [], []
  for entry in map(json.loads, task.images):
    image = entry["image"]
    path = Path(task.folder) / image["file_name"]
    try:
      data = records.clean_jpeg(path.read_bytes())[0]
    except (OSError, ValueError) as e:
      unreadable.append(f"{path}: {e}")
      continue
    b = _boxes(image, entry["annotations"], names)
    out.append(records.serialize({
        "image/height": int(image["height"]), "image/width": int(image["width"]),
        "image/filename": image["file_name"], "image/source_id": str(image["id"]),
        "image/key/sha256": hashlib.sha256(data).hexdigest(), "image/encoded": data,
        "image/format": "jpeg",
        **{f"image/object/bbox/{k}": np.asarray(b[k], np.float32)
           for k in ("xmin", "xmax", "ymin", "ymax")},
        "image/object/class/text": np.asarray(b["text"], object),
        "image/object/class/label": np.asarray(b["label"], np.int64),
        "image/object/is_crowd": np.asarray(b["crowd"], np.int64),
        "image/object/area": np.asarray(b["area"], np.float32)}))
  records.write(tmps[0], out)
  return shards.Written(records=len(out), units=len(task.images), unreadable=unreadable)
