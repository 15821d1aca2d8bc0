"""`mlbench data prepare coco`: a tiny COCO 2017 tree written here (crowd boxes, a box
past the image, one without width, images without annotations), converted, verified, and
decoded by the ssd workload's own pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from mlbench.cli import main

CATEGORIES = [{"id": 1, "name": "person"}, {"id": 18, "name": "dog"},
              {"id": 90, "name": "toothbrush"}]


def _split(root: Path, folder: str, boxes: dict[int, list], rng) -> None:
  (root / folder).mkdir(parents=True)
  images, annotations = [], []
  for image_id, anns in boxes.items():
    name = f"{image_id:012d}.jpg"
    image = rng.integers(0, 255, (60, 80, 3), dtype=np.uint8)
    (root / folder / name).write_bytes(tf.io.encode_jpeg(image).numpy())
    images.append({"id": image_id, "file_name": name, "height": 60, "width": 80})
    for bbox, category, crowd in anns:
      annotations.append({"id": len(annotations) + 1, "image_id": image_id, "bbox": bbox,
                          "category_id": category, "iscrowd": crowd,
                          "area": float(bbox[2] * bbox[3]) * 0.7})
  (root / "annotations").mkdir(exist_ok=True)
  (root / "annotations" / f"instances_{folder}.json").write_text(json.dumps(
      {"images": images, "annotations": annotations, "categories": CATEGORIES}))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
  root = tmp_path_factory.mktemp("coco")
  rng = np.random.default_rng(0)
  _split(root / "raw", "train2017", {
      9: [([10, 5, 30, 20], 1, 0), ([0, 0, 80, 60], 18, 1)],  # a crowd box
      25: [],                                                  # no annotation: dropped
      30: [([50, 40, 40, 30], 90, 0), ([5, 5, 10, 10], 18, 0),  # the first reaches past
           ([7, 8, 0, 12], 1, 0)],                                # no width
      42: [([0, 0, 40, 60], 1, 1)],                            # only a crowd box: kept
  }, rng)
  _split(root / "raw", "val2017", {139: [([1, 2, 3, 4], 1, 0)], 285: [],
                                    632: [([20, 10, 20, 20], 90, 1)]}, rng)
  out = root / "out"
  assert main(["data", "prepare", "coco", "--raw", str(root / "raw"), "--out", str(out),
               "--train-shards", "2", "--val-shards", "2", "--workers", "1"]) == 0
  return out


def _examples(out: Path, prefix: str) -> dict[str, dict]:
  found = {}
  for path in sorted(out.glob(f"{prefix}-*-of-00002")):
    for r in tf.data.TFRecordDataset(str(path)):
      f = tf.train.Example.FromString(r.numpy()).features.feature
      found[f["image/source_id"].bytes_list.value[0].decode()] = f
  return found


def test_training_drops_unannotated_images_and_keeps_crowd_flags(prepared):
  train = _examples(prepared, "coco_train.record")
  assert sorted(train) == ["30", "42", "9"]
  f = train["9"]
  assert list(f["image/object/class/label"].int64_list.value) == [1, 18]
  assert list(f["image/object/is_crowd"].int64_list.value) == [0, 1]
  assert list(f["image/object/class/text"].bytes_list.value) == [b"person", b"dog"]
  np.testing.assert_allclose(f["image/object/bbox/xmin"].float_list.value, [10 / 80, 0])
  np.testing.assert_allclose(f["image/object/bbox/ymax"].float_list.value, [25 / 60, 1])
  np.testing.assert_allclose(f["image/object/area"].float_list.value, [420, 3360])
  # Degenerate boxes are kept as the reference's COCODetection keeps them (utils.py
  # L544-550, L591-598): past the image (xmax 90/80) and with no width, normalised only.
  f = train["30"]
  assert list(f["image/object/class/label"].int64_list.value) == [90, 18, 1]
  np.testing.assert_allclose(f["image/object/bbox/xmax"].float_list.value,
                             [90 / 80, 15 / 80, 7 / 80])
  np.testing.assert_allclose(f["image/object/bbox/ymax"].float_list.value,
                             [70 / 60, 15 / 60, 20 / 60])


def test_validation_keeps_every_image(prepared):
  val = _examples(prepared, "coco_val.record")
  assert sorted(val) == ["139", "285", "632"]
  assert list(val["285"]["image/object/class/label"].int64_list.value) == []
  assert val["285"]["image/object/class/label"].WhichOneof("kind") == "int64_list"


def test_the_ssd_pipeline_decodes_a_batch_and_verify_passes(prepared, capsys):
  from mlbench.train import data
  from mlbench.workload import Split
  from workloads.ssd import config, input_pipeline

  cfg = config.full()
  ds = data.train_dataset(input_pipeline.files(cfg, prepared, Split.TRAIN),
                          input_pipeline.decode(cfg, Split.TRAIN), per_host_batch=2, seed=0,
                          host=0, hosts=1)
  batch = next(data.numpy_batches(ds))
  assert batch["image"].shape[0] == 2 and np.isfinite(batch["image"]).all()
  evals = data.eval_dataset(input_pipeline.files(cfg, prepared, Split.EVAL),
                            input_pipeline.decode(cfg, Split.EVAL), num_examples=3,
                            per_host_batch=3, host=0, hosts=1)
  batch = next(data.numpy_batches(evals))
  assert sorted(batch["image_id"].tolist()) == [139, 285, 632]
  capsys.readouterr()
  assert main(["data", "verify", "coco", str(prepared), "--full"]) == 0
  assert "WRONG" not in capsys.readouterr().out


def test_a_wrong_layout_is_one_line_with_exit_code_2(tmp_path, capsys):
  (tmp_path / "train2017").mkdir()
  assert main(["data", "prepare", "coco", "--raw", str(tmp_path), "--out",
               str(tmp_path / "out")]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and "expected RAW/train2017/*.jpg" in err
  assert err.count("\n") == 1
