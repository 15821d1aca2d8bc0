"""The image classifiers' mini dataset: scikit-learn's handwritten digits as ImageNet-schema
TFRecords (`workloads.common.imagenet`), written by `prepare` for resnet50, efficientnet and
vit alike.

`sklearn.datasets.load_digits()` ships the 1,797 8x8 greyscale digits of the
UCI Optdigits test set with the package, so nothing is downloaded. A fixed
stratified split holds out 540 images (30%) for evaluation. Each image is scaled to
0..255, upsampled to 32x32 RGB and stored as a quality-100 JPEG (as the MLPerf
reference stores ImageNet) with a 1-based label and a whole-image bounding box,
in `train-0000i-of-00008` and `validation-0000i-of-00004` files. The folder is
written once, atomically; later runs reuse it.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from mlbench.datasets import records
from mlbench.storage import paths
from mlbench.train import data
from mlbench.workload import Config
from workloads.common.imagenet import DIGITS_SPLIT, Source, dataset_dir

STORED_SIZE = 32
EVAL_SIZE = DIGITS_SPLIT[1]
SPLIT_SEED = 0
NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(train_images, train_labels, eval_images, eval_labels); images uint8 [N, 8, 8]."""
  from sklearn.datasets import load_digits
  from sklearn.model_selection import train_test_split

  digits = load_digits()
  images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
  x_tr, x_ev, y_tr, y_ev = train_test_split(images, digits.target, test_size=EVAL_SIZE,
                                            stratify=digits.target, random_state=SPLIT_SEED)
  return x_tr, y_tr.astype(np.int64), x_ev, y_ev.astype(np.int64)


def _examples(images: np.ndarray, labels: np.ndarray, name: str):
  tf = data.tf()
  big = tf.image.resize(images[..., None].astype(np.float32), [STORED_SIZE, STORED_SIZE],
                        method="bilinear", antialias=True)
  rgb = tf.cast(tf.round(tf.clip_by_value(tf.tile(big, [1, 1, 1, 3]), 0, 255)), tf.uint8)
  for i, (image, label) in enumerate(zip(rgb, labels)):
    yield {
        "image/encoded": tf.io.encode_jpeg(image, quality=100).numpy(),
        "image/format": "JPEG",
        "image/filename": f"digits_{name}_{i:05d}.JPEG",
        "image/height": STORED_SIZE, "image/width": STORED_SIZE,
        "image/colorspace": "RGB", "image/channels": 3,
        "image/class/label": int(label) + 1,
        "image/class/synset": f"digit_{label}", "image/class/text": NAMES[label],
        "image/object/bbox/ymin": np.array([0.0], np.float32),
        "image/object/bbox/xmin": np.array([0.0], np.float32),
        "image/object/bbox/ymax": np.array([1.0], np.float32),
        "image/object/bbox/xmax": np.array([1.0], np.float32),
        "image/object/bbox/label": int(label) + 1,
    }


def prepare(cfg: Config, data_dir: Path) -> None:
  """`InputSpec.prepare`: writes the digits TFRecords under `data_dir` unless they are
  already there. Does nothing for configs that read ImageNet, which must be supplied.
  """
  if cfg.data.source is not Source.DIGITS:
    return
  data.write_dataset(dataset_dir(cfg, paths.path(data_dir)), functools.partial(_write, cfg))


def _write(cfg: Config, folder: Path) -> dict[str, object]:
  x_tr, y_tr, x_ev, y_ev = split()
  if (len(x_tr), len(x_ev)) != (cfg.data.train_examples, cfg.data.eval_examples):
    raise ValueError(f"digits split is {len(x_tr)}/{len(x_ev)} but the config says "
                     f"{cfg.data.train_examples}/{cfg.data.eval_examples}")
  records.write_shards(str(folder / "train-{index:05d}-of-{count:05d}"),
                       _examples(x_tr, y_tr, "train"), num_shards=8)
  records.write_shards(str(folder / "validation-{index:05d}-of-{count:05d}"),
                       _examples(x_ev, y_ev, "validation"), num_shards=4)
  return {"source": "sklearn.datasets.load_digits (UCI Optdigits test set)",
          "train_examples": len(x_tr), "eval_examples": len(x_ev), "stored_size": STORED_SIZE,
          "split": f"stratified, test_size={EVAL_SIZE}, random_state={SPLIT_SEED}"}
