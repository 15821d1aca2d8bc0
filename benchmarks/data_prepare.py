"""How fast `mlbench data prepare` converts, with 1 and with 2 worker processes.

Builds ImageNet-like raw data (JPEGs of 375x500, ImageNet's most common size, a few
classes) and C4-like json.gz files with a BPE tokenizer trained here, then times
`shards.run` for each dataset with 1 and 2 workers, alternating rounds (see
common.py: on a shared box the other tenants' load is reported beside each round).
The times include starting the workers (each spawned worker imports TensorFlow).

    python benchmarks/data_prepare.py [--images 256] [--docs 4000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import common

from mlbench.datasets import c4, imagenet, shards


def _images(root: Path, n: int, classes: int = 8) -> Path:
  import tensorflow as tf

  rng = np.random.default_rng(0)
  base = tf.image.resize(rng.uniform(0, 255, (1, 24, 32, 3)), [375, 500]).numpy()[0]
  for i in range(n):
    folder = root / "train" / f"n{i % classes:08d}"
    folder.mkdir(parents=True, exist_ok=True)
    image = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
    (folder / f"{folder.name}_{i}.JPEG").write_bytes(tf.io.encode_jpeg(image, quality=90).numpy())
  return root


def _texts(root: Path, docs: int, files: int = 4) -> tuple[Path, Path]:
  from tokenizers import Tokenizer, models, pre_tokenizers, trainers

  rng = np.random.default_rng(0)
  words = [f"w{chr(97 + i % 26)}{chr(97 + (i * 7) % 26)}{i % 13}" for i in range(3000)]
  raw = root / "c4"
  raw.mkdir()
  for f in range(files):
    with gzip.open(raw / f"c4-train.{f:05d}-of-01024.json.gz", "wt") as out:
      for _ in range(docs // files):  # C4's median document is about 400 words
        text = " ".join(rng.choice(words, 400))
        out.write(json.dumps({"text": text}) + "\n")
  tok = Tokenizer(models.BPE(unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.train_from_iterator((" ".join(rng.choice(words, 400)) for _ in range(500)),
                          trainers.BpeTrainer(vocab_size=8000, special_tokens=["<unk>", "</s>"]))
  tok.save(str(root / "tokenizer.json"))
  return raw, root / "tokenizer.json"


def main() -> None:
  args = argparse.ArgumentParser()
  args.add_argument("--images", type=int, default=256)
  args.add_argument("--docs", type=int, default=4000)
  args.add_argument("--rounds", type=int, default=2)
  a = args.parse_args()
  root = Path(tempfile.mkdtemp(prefix="prepare-bench-"))
  try:
    _images(root / "ilsvrc", a.images)
    raw, tok = _texts(root, a.docs)
    plans = {"imagenet": (imagenet.plan(root / "ilsvrc", {"train_shards": 8}),
                          imagenet.write_shard, "images/s", ("tensorflow",)),
             "c4": (c4.plan(raw, root / "o", tok, "auto"), c4.write_shard, "tokens/s",
                    ("tokenizers",))}
    for name, (plan, work, unit, preload) in plans.items():
      print(f"{name}: {len(plan)} shards", flush=True)
      variants = {f"{w} worker(s)": _variant(plan, work, root / f"out-{name}-{w}", w, preload)
                  for w in (1, 2)}
      common.report(common.side_by_side(variants, a.rounds), unit, "1 worker(s)", "2 worker(s)")
  finally:
    shutil.rmtree(root, ignore_errors=True)


def _variant(plan, work, out: Path, workers: int, preload):
  def prepare():
    shutil.rmtree(out, ignore_errors=True)

  def run(_):
    return shards.run(plan, work, out, workers=workers, description="", unit="",
                      preload=preload).units
  return prepare, run


if __name__ == "__main__":
  main()
