"""ImageNet TFRecords, which the image classifiers (resnet50, efficientnet, vit) read alike:
where they come from, the checks of a config that reads them, their files and a record's
image and label. Each workload decodes them with its own reference's preprocessing.

The schema is imagenet_to_gcs.py's: `image/encoded` (JPEG), `image/class/label` (1..1000),
`image/object/bbox/{ymin,xmin,ymax,xmax}`, in files `train-?????-of-01024` and
`validation-?????-of-00128` (`mlbench data prepare imagenet` writes them so). The mini
configs read scikit-learn's handwritten digits written in the same schema
(`workloads.common.digits`), in a folder of their own under --data-dir. Imports nothing
heavy: the configs use it.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any

from mlbench.fields import at_least, interval, require
from mlbench.storage import paths
from mlbench.train import data
from mlbench.workload import Config, Split


class Source(enum.Enum):
  """Where the TFRecords come from."""

  IMAGENET = "imagenet"  # ILSVRC-2012 converted by imagenet_to_gcs.py (supplied by you).
  DIGITS = "digits"      # scikit-learn's handwritten digits, written by mlbench.


DIGITS_SPLIT = (1257, 540)
"""Training and held-out images of scikit-learn's 1,797 digits (`digits.split`)."""
DIGITS_DIR = "resnet50-digits"
"""The digits' folder under --data-dir (named after the workload that wrote them first)."""


def image_records(d: Any) -> None:
  """The checks of a config's `data` that reads these records: its counts, its random
  crop's ranges, and the digits' fixed split."""
  at_least(d, 1, "train_examples", "eval_examples")
  interval(d, "crop_area", 0, 1)
  interval(d, "crop_aspect", 0)
  require(d.source is not Source.DIGITS or (d.train_examples, d.eval_examples) == DIGITS_SPLIT,
          "train_examples", f"the digits hold {DIGITS_SPLIT[0]} training and {DIGITS_SPLIT[1]} "
          f"held-out images, not {d.train_examples} and {d.eval_examples}")


def dataset_dir(cfg: Config, data_dir: Path) -> Path:
  """The folder of the records `cfg.data.source` names: --data-dir, or the digits' in it."""
  return data_dir / DIGITS_DIR if cfg.data.source is Source.DIGITS else data_dir


def files(cfg: Config, data_dir: Path, split: Split) -> list[str]:
  """`InputSpec.files`: the training or validation TFRecord files."""
  prefix = "train" if split is Split.TRAIN else "validation"
  return data.find_files(
      dataset_dir(cfg, paths.path(data_dir)), (f"{prefix}-*-of-*",),
      generated=cfg.data.source is Source.DIGITS,
      supplied="point --data-dir at the ImageNet TFRecords written by imagenet_to_gcs.py")


def parse_image(record: Any) -> dict[str, Any]:
  """The encoded image and label of a record (what the classifiers that read these
  records without their boxes need)."""
  tf = data.tf()
  return tf.io.parse_single_example(record, {
      "image/encoded": tf.io.FixedLenFeature([], tf.string),
      "image/class/label": tf.io.FixedLenFeature([], tf.int64)})
