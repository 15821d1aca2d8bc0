"""ResNet-50 specifics: the full model's size, the ImageNet schema, the digits mini data."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from mlbench.datasets import records
from mlbench.train import data, steps
from mlbench.workload import Split
from workloads.common import digits, imagenet
from workloads.resnet50 import WORKLOAD, config, input_pipeline


def test_full_model_has_the_published_resnet50_parameter_count():
  # 25,557,032 trainable parameters: torchvision's ResNet50_Weights.IMAGENET1K_V1
  # metadata ("num_params": 25557032), i.e. ResNet-50 v1.5 with 1000 classes,
  # counting conv and dense weights, the dense bias and batch-norm scale and bias.
  assert steps.count_params(WORKLOAD, config.full()) == 25_557_032


def test_digits_are_written_in_the_imagenet_schema(data_dir):
  cfg = config.mini()
  train = imagenet.files(cfg, data_dir, Split.TRAIN)
  evals = imagenet.files(cfg, data_dir, Split.EVAL)
  assert [p.rsplit("/", 1)[1] for p in train][0] == "train-00000-of-00008" and len(train) == 8
  assert len(evals) == 4
  counts = {s: sum(len(records.examples(p)) for p in f)
            for s, f in (("train", train), ("eval", evals))}
  assert counts == {"train": cfg.data.train_examples, "eval": cfg.data.eval_examples}
  ex = records.examples(evals[0])[0].features.feature
  tf = data.tf()
  image = tf.io.decode_jpeg(ex["image/encoded"].bytes_list.value[0]).numpy()
  assert image.shape == (32, 32, 3) and ex["image/format"].bytes_list.value[0] == b"JPEG"
  assert 1 <= ex["image/class/label"].int64_list.value[0] <= 10
  assert list(ex["image/object/bbox/xmax"].float_list.value) == [1.0]


def test_the_eval_split_is_stratified_and_fixed():
  x_tr, y_tr, x_ev, y_ev = digits.split()
  assert (len(x_tr), len(x_ev)) == (1257, 540)
  # Stratified: each class keeps its share (30% of 174..183 images) within one image.
  assert np.bincount(y_ev).min() >= 52 and np.bincount(y_ev).max() <= 55
  # Fixed: the split pinned by content (images and labels, in order), as scikit-learn
  # 1.9 makes it from SPLIT_SEED. A change here (another seed, a scikit-learn that
  # shuffles otherwise) changes the evaluation set: mini results stop being comparable.
  sha = lambda *arrays: hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest()[:16]
  assert (sha(x_tr, y_tr), sha(x_ev, y_ev)) == ("87c8eeb13d617799", "815558a276c0e1d6")


def test_decoded_digits_are_the_source_images(data_dir):
  """Through JPEG, upsampling, central crop and normalisation, each eval image is its digit."""
  cfg = config.mini()
  ds = data.eval_dataset(imagenet.files(cfg, data_dir, Split.EVAL),
                         input_pipeline.decode(cfg, Split.EVAL), num_examples=540,
                         per_host_batch=540, host=0, hosts=1)
  batch = next(data.numpy_batches(ds))
  assert batch["image"].shape == (540, 24, 24, 3) and batch["mask"].sum() == 540
  _, _, x_ev, y_ev = digits.split()
  # Written round-robin into 4 files, read file by file.
  order = np.concatenate([np.arange(k, 540, 4) for k in range(4)])
  np.testing.assert_array_equal(batch["label"], y_ev[order])  # label_offset undone
  pixels = batch["image"][..., 0] * cfg.data.stddev_rgb[0] + cfg.data.mean_rgb[0]
  # 8x8 -> 32x32 (stored) -> 27x27 (eval resize) -> central 24x24, approximated
  # independently: nearest upsampling to 216x216, 8x8 box means to 27x27, crop.
  big = np.kron(x_ev[order].astype(np.float32), np.ones((27, 27)))
  source = big.reshape(540, 27, 8, 27, 8).mean(axis=(2, 4))[:, 1:25, 1:25]
  corr = [np.corrcoef(a.ravel(), b.ravel())[0, 1] for a, b in zip(pixels, source)]
  assert min(corr) > 0.85, min(corr)


def test_full_preprocessing_on_a_real_photo(photo_record, china_jpeg):
  tf = data.tf()
  cfg = config.full()
  train = input_pipeline.decode(cfg, Split.TRAIN)
  a = train(photo_record, tf.constant([1, 2], tf.int64))
  b = train(photo_record, tf.constant([1, 2], tf.int64))
  c = train(photo_record, tf.constant([3, 4], tf.int64))
  assert a["image"].shape == (224, 224, 3) and int(a["label"]) == 607
  np.testing.assert_array_equal(a["image"].numpy(), b["image"].numpy())
  assert not np.array_equal(a["image"].numpy(), c["image"].numpy())
  ev = input_pipeline.decode(cfg, Split.EVAL)(photo_record, tf.zeros([2], tf.int64))
  assert ev["image"].shape == (224, 224, 3)
  # Mean subtraction only (the reference divides by nothing): raw pixel range shifted.
  raw = ev["image"].numpy() + np.array(cfg.data.mean_rgb)
  assert raw.min() >= -1 and raw.max() <= 256
  # Central 224x224 crop of the 256x383 resize = rows 27..400, columns 132..506 of the photo.
  photo = tf.io.decode_jpeg(china_jpeg).numpy().astype(np.float32)
  assert photo.shape == (427, 640, 3)
  for (r0, r1, c0, c1), (pr0, pr1, pc0, pc1) in [((0, 224, 0, 224), (27, 400, 132, 506)),
                                                 ((0, 112, 0, 112), (27, 214, 132, 319)),
                                                 ((112, 224, 112, 224), (214, 400, 319, 506))]:
    np.testing.assert_allclose(raw[r0:r1, c0:c1].mean((0, 1)),
                               photo[pr0:pr1, pc0:pc1].mean((0, 1)), atol=3.0)


def test_legw_scales_the_reference_rate_to_a_larger_batch():
  """LEGW (You et al. 2019, whose CNN case is ResNet-50 at batch 32K): a batch 8 times the
  reference's 4,096 gets sqrt(8) times its rate and 8 times its warmup epochs; the log
  carries the values trained with. The reference's own (lr_scaling none) are unchanged."""
  from mlbench import config as config_lib
  from mlbench.workload import StepContext
  from workloads.resnet50 import train

  def logged(*overrides):
    cfg = config_lib.override(config.full(), overrides)
    return train.hparams(cfg, train.schedule(cfg), StepContext(mesh=None))

  legw = logged("global_batch_size=32768", "optimizer.lr_scaling=legw")
  assert legw["lars_opt_base_learning_rate"] == pytest.approx(10.0 * 8 ** 0.5)
  assert legw["lars_opt_learning_rate_warmup_epochs"] == 40.0
  # 39 steps an epoch: 1,638 train steps, 1,560 of them warmup.
  assert legw["lars_opt_learning_rate_decay_steps"] == 1638 - 1560 + 1
  plain = logged("global_batch_size=32768")
  assert (plain["lars_opt_base_learning_rate"], plain["lars_opt_learning_rate_warmup_epochs"]) \
      == (10.0, 5.0)
