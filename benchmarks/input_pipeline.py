"""Input pipeline: the harness's tuned tf.data pipeline vs a naive one, images/s.

Both read the same ImageNet-schema TFRecords (2,048 JPEGs of 400x300, cut from
scikit-learn's two sample photographs and re-encoded; written once under the
mlbench cache) and decode them with ResNet-50's full training preprocessing
(bounding-box crop, decode-and-crop, flip, resize to 224). Naive: files read one
after another, one decode at a time, TF's automatic optimisations off. Tuned
(mlbench.train.data.train_dataset): files interleaved in parallel, cached, decoded on
every core, batched and prefetched, out of order allowed. Goal on 2 cores:
>= 1.8x (2x is the ceiling).

    python benchmarks/input_pipeline.py [--batches 16] [--rounds 4]
"""

from __future__ import annotations

import argparse
from importlib import resources

from common import report, side_by_side

N_IMAGES, N_FILES, BATCH = 2048, 16, 64


def _records(folder):
  import numpy as np

  from mlbench.datasets import records
  from mlbench.train import data

  tf = data.tf()
  if (folder / "done").is_file():
    return sorted(str(p) for p in folder.glob("train-*"))
  folder.mkdir(parents=True, exist_ok=True)
  photos = [tf.io.decode_jpeg((resources.files("sklearn.datasets") / "images" / n).read_bytes())
            .numpy() for n in ("china.jpg", "flower.jpg")]
  rng = np.random.default_rng(0)

  def examples():
    for i in range(N_IMAGES):
      p = photos[i % 2]
      y, x = rng.integers(0, p.shape[0] - 300), rng.integers(0, p.shape[1] - 400)
      crop = p[y:y + 300, x:x + 400][:, ::-1 if i % 4 >= 2 else 1]
      yield {"image/encoded": tf.io.encode_jpeg(np.ascontiguousarray(crop), quality=90).numpy(),
             "image/class/label": int(i % 1000) + 1,
             **{f"image/object/bbox/{k}": np.zeros(0, np.float32)
                for k in ("ymin", "xmin", "ymax", "xmax")}}

  paths = records.write_shards(str(folder / "train-{index:05d}-of-{count:05d}"), examples(),
                               N_FILES)
  (folder / "done").write_text("ok\n")
  return paths


def _naive(files, decode):
  from mlbench.train import data

  tf = data.tf()
  seeds = tf.data.Dataset.random(seed=0).batch(2)
  ds = tf.data.Dataset.from_tensor_slices(files).flat_map(tf.data.TFRecordDataset).repeat()
  ds = tf.data.Dataset.zip((ds, seeds)).map(decode).batch(BATCH)
  o = tf.data.Options()
  o.autotune.enabled = False
  o.experimental_optimization.map_parallelization = False
  o.experimental_optimization.inject_prefetch = False
  o.threading.private_threadpool_size = 1
  return ds.with_options(o)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--batches", type=int, default=32)
  ap.add_argument("--rounds", type=int, default=4)
  args = ap.parse_args()

  from mlbench.storage import paths
  from mlbench.train import data
  from mlbench.workload import Split
  from workloads.resnet50 import config, input_pipeline

  files = _records(paths.default_cache_dir() / "bench" / "imagenet-like")
  decode = input_pipeline.decode(config.full(), Split.TRAIN)
  tuned = data.train_dataset(files, decode, per_host_batch=BATCH, seed=0, host=0, hosts=1,
                             opts=data.PipelineOptions(deterministic=False))
  datasets = {"naive": _naive(files, decode), "tuned": tuned}

  def prepare(name):
    def fn():
      # A fresh iterator per round: one left alive would keep decoding into its
      # prefetch buffer while the other variant is timed.
      it = iter(data.numpy_batches(datasets[name]))
      for _ in range(4):
        next(it)  # Threads started, buffers primed; not timed.
      return it
    return fn

  def run(it) -> float:
    for _ in range(args.batches):
      next(it)
    return args.batches * BATCH

  print(f"input pipeline: {N_IMAGES} JPEGs 400x300 in {N_FILES} TFRecords, ResNet-50 train "
        f"preprocessing to 224x224, batches of {BATCH}, {args.batches} batches per round")
  ratio = report(side_by_side({"naive": (prepare("naive"), run),
                               "tuned": (prepare("tuned"), run)}, args.rounds),
                 "images/s", "naive", "tuned")
  print(f"RESULT tuned/naive images/s = {ratio:.3f} (goal >= 1.8 on 2 cores)")


if __name__ == "__main__":
  main()
