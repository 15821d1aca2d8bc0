"""The mini dataset: scenes of real handwritten digits, as COCO-schema TFRecords.

No real detection dataset ships inside a package, so the scenes are composed:
`sklearn.datasets.load_digits()` ships the 1,797 8x8 greyscale digits of the
UCI Optdigits test set; a fixed stratified split keeps 30% of the glyphs for
the evaluation scenes only. A scene is a black 32x32 image with 1-3 glyphs,
each scaled to 8-16 px (bilinear) and placed at random so that no two boxes
overlap. A glyph's box is exact: the extent of its inked source pixels
(intensity >= 4 of 16), scaled and shifted as the glyph was. Categories are
1..10 for the digits 0..9. Scenes are stored as quality-95 JPEGs in the schema
of the TensorFlow object detection API's create_coco_tf_record.py, in
`train-0000i-of-00008` and `val-0000i-of-00004`; the folder is written once,
atomically, and reused.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import numpy as np

from mlbench.storage import paths
from mlbench.datasets import records
from mlbench.train import data
from workloads.ssd.config import SCENE_SIZE, SSDConfig, Source
from workloads.ssd.input_pipeline import dataset_dir

GLYPH_SIZES = (8, 16)      # side of a scaled glyph, inclusive range
DIGITS_PER_SCENE = (1, 3)  # inclusive range
INK = 4                    # source intensity (0..16) that counts as ink for the box
EVAL_FRACTION = 0.3
SPLIT_SEED = 0
TRAIN_SEED, EVAL_SEED = 1, 2
NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def glyphs() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(train_glyphs, train_digits, eval_glyphs, eval_digits); glyphs float [N, 8, 8] in 0..16."""
  from sklearn.datasets import load_digits
  from sklearn.model_selection import train_test_split

  digits = load_digits()
  x_tr, x_ev, y_tr, y_ev = train_test_split(digits.images, digits.target,
                                            test_size=EVAL_FRACTION, stratify=digits.target,
                                            random_state=SPLIT_SEED)
  return x_tr, y_tr, x_ev, y_ev


def _scaled(glyph: np.ndarray, size: int) -> np.ndarray:
  """Bilinear resampling of a square glyph to size x size (pixel centres aligned, edges
  clamped; what PIL's BILINEAR resize does when enlarging)."""
  n = glyph.shape[0]
  src = np.clip((np.arange(size) + 0.5) * n / size - 0.5, 0, n - 1)
  lo = np.floor(src).astype(int)
  hi = np.minimum(lo + 1, n - 1)
  frac = (src - lo).astype(np.float32)
  g = glyph.astype(np.float32)
  rows = g[lo] * (1 - frac)[:, None] + g[hi] * frac[:, None]
  return rows[:, lo] * (1 - frac)[None] + rows[:, hi] * frac[None]


def _ink_box(glyph: np.ndarray) -> np.ndarray:
  """(left, top, right, bottom) of the inked source pixels, in source pixels."""
  rows = np.flatnonzero((glyph >= INK).any(axis=1))
  cols = np.flatnonzero((glyph >= INK).any(axis=0))
  return np.array([cols[0], rows[0], cols[-1] + 1, rows[-1] + 1], np.float64)


def compose(images: np.ndarray, digits: np.ndarray, rng: np.random.Generator
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """One scene: (pixels uint8 [32, 32], boxes [n, 4] ltrb in pixels, digits [n])."""
  canvas = np.zeros((SCENE_SIZE, SCENE_SIZE), np.float32)
  boxes, labels = [], []
  for _ in range(rng.integers(DIGITS_PER_SCENE[0], DIGITS_PER_SCENE[1] + 1)):
    k = rng.integers(len(images))
    size = int(rng.integers(GLYPH_SIZES[0], GLYPH_SIZES[1] + 1))
    for _ in range(100):  # Rejection sampling: no two boxes may overlap.
      x, y = rng.integers(0, SCENE_SIZE - size + 1, 2)
      box = _ink_box(images[k]) * size / 8 + np.array([x, y, x, y])
      if all(_disjoint(box, b) for b in boxes):
        break
    else:
      continue
    canvas[y:y + size, x:x + size] = np.maximum(canvas[y:y + size, x:x + size],
                                                _scaled(images[k], size))
    boxes.append(box)
    labels.append(int(digits[k]))
  pixels = np.clip(np.round(canvas * (255.0 / 16.0)), 0, 255).astype(np.uint8)
  return pixels, np.array(boxes, np.float64).reshape(-1, 4), np.array(labels, np.int64)


def _disjoint(a: np.ndarray, b: np.ndarray) -> bool:
  return a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1]


def _examples(images: np.ndarray, digits: np.ndarray, count: int, seed: int, name: str):
  tf = data.tf()
  rng = np.random.default_rng(seed)
  for i in range(count):
    pixels, boxes, labels = compose(images, digits, rng)
    encoded = tf.io.encode_jpeg(np.repeat(pixels[..., None], 3, axis=-1), quality=95).numpy()
    norm = boxes / SCENE_SIZE
    yield {
        "image/height": SCENE_SIZE, "image/width": SCENE_SIZE,
        "image/filename": f"digits_{name}_{i + 1:06d}.jpg",
        "image/source_id": str(i + 1),
        "image/key/sha256": hashlib.sha256(encoded).hexdigest(),
        "image/encoded": encoded, "image/format": "jpeg",
        "image/object/bbox/xmin": norm[:, 0].astype(np.float32),
        "image/object/bbox/ymin": norm[:, 1].astype(np.float32),
        "image/object/bbox/xmax": norm[:, 2].astype(np.float32),
        "image/object/bbox/ymax": norm[:, 3].astype(np.float32),
        "image/object/class/text": [NAMES[d].encode() for d in labels],
        "image/object/class/label": (labels + 1).astype(np.int64),
        "image/object/is_crowd": np.zeros(len(labels), np.int64),
        "image/object/area": np.prod(boxes[:, 2:] - boxes[:, :2], axis=-1).astype(np.float32),
    }


def prepare(cfg: SSDConfig, data_dir: Path) -> None:
  """Writes the digit scenes under `data_dir` unless they are already there.

  Does nothing for configs that read COCO, which must be supplied.
  """
  if cfg.data.source is not Source.DIGITS:
    return
  data.write_dataset(dataset_dir(cfg, paths.path(data_dir)), functools.partial(_write, cfg))


def _write(cfg: SSDConfig, folder: Path) -> dict[str, object]:
  x_tr, y_tr, x_ev, y_ev = glyphs()
  train, evals = cfg.data.train_examples, cfg.data.eval_examples
  records.write_shards(str(folder / "train-{index:05d}-of-{count:05d}"),
                       _examples(x_tr, y_tr, train, TRAIN_SEED, "train"), num_shards=8)
  records.write_shards(str(folder / "val-{index:05d}-of-{count:05d}"),
                       _examples(x_ev, y_ev, evals, EVAL_SEED, "val"), num_shards=4)
  return {"source": "sklearn.datasets.load_digits (UCI Optdigits test set), composed into scenes",
          "train_examples": train, "eval_examples": evals, "scene_size": SCENE_SIZE,
          "glyph_sizes": list(GLYPH_SIZES), "digits_per_scene": list(DIGITS_PER_SCENE),
          "glyph_split": f"stratified, test_size={EVAL_FRACTION}, random_state={SPLIT_SEED}; "
                         f"{len(x_tr)} train glyphs, {len(x_ev)} eval glyphs",
          "seeds": {"train": TRAIN_SEED, "eval": EVAL_SEED}}
