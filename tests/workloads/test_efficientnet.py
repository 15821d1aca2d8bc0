"""EfficientNet: the reference's parameter counts, compound scaling by --set, its
preprocessing on real TFRecords, the moving average it evaluates, LARS's exclusions."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest

from mlbench import config as config_lib
from mlbench.train import data, optim
from mlbench.workload import Split
from workloads.common import imagenet
from workloads.efficientnet import config, input_pipeline, model, train


def _params(cfg: config.EfficientNetConfig):
  return jax.eval_shape(lambda k: train.init(cfg, k), jax.random.key(0))[0]


def _count(tree) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(tree)))


@pytest.mark.parametrize("variant, count", [("b0", 5_288_548), ("b5", 30_389_784)])
def test_parameter_counts_are_the_references(variant, count):
  """tensorflow/tpu models/official/efficientnet builds B0 with 5,288,548 trainable
  parameters and B5 with 30,389,784 (its main.py logs them; Keras' port of the same
  builder, keras.applications.EfficientNetB0/B5(weights=None), has as many trainable
  weights). Batch-norm statistics are state, not parameters."""
  cfg = config_lib.override(config.full(), (f"model.variant={variant}",))
  assert _count(_params(cfg)) == count


def test_a_variant_scales_width_depth_resolution_and_dropout_together():
  cfg = config_lib.override(config.full(), ("model.variant=b2",))
  assert (cfg.model.width, cfg.model.depth, cfg.image_size, cfg.model.dropout) == (
      1.1, 1.2, 260, 0.3)
  assert len(model.blocks(cfg.model)) == 23  # 1+2+2+3+3+4+1 stage repeats, x1.2 rounded up
  assert [model.round_filters(f, 1.1) for f in (32, 16, 24, 40, 80, 112, 192, 320, 1280)] == [
      32, 16, 24, 48, 88, 120, 208, 352, 1408]
  # The configured resolution wins over the variant's.
  assert config_lib.override(cfg, ("data.image_size=288",)).image_size == 288


def test_preprocessing_on_the_digits_records(data_dir):
  cfg = config.mini()
  files = imagenet.files(cfg, data_dir, Split.TRAIN)
  tf = data.tf()
  record = next(iter(tf.data.TFRecordDataset(files[:1])))
  seed = tf.constant([3, 4], tf.int64)
  train_a = input_pipeline.decode(cfg, Split.TRAIN)(record, seed)
  train_b = input_pipeline.decode(cfg, Split.TRAIN)(record, seed)
  evaluated = input_pipeline.decode(cfg, Split.EVAL)(record, seed)
  for ex in (train_a, evaluated):
    assert ex["image"].shape == (32, 32, 3) and ex["image"].dtype == tf.float32
    assert 0 <= int(ex["label"]) < 10
  np.testing.assert_array_equal(train_a["image"], train_b["image"])  # stateless
  # Normalised by the ImageNet mean and deviation: a white pixel is about (1 - mean) / std.
  assert float(np.max(evaluated["image"])) == pytest.approx((255 - 0.406 * 255) / (0.225 * 255),
                                                            abs=0.2)


def test_the_average_follows_tfs_num_updates_warmup():
  """tf.train.ExponentialMovingAverage(decay, num_updates=n): min(decay, (1+n)/(10+n))."""
  ema = {"params": {"w": np.zeros(2)}, "batch_stats": {}, "count": np.int32(0)}
  ref, value = np.zeros(2), np.ones(2)
  for n in range(4):
    ema = train._ema(0.9999, ema, {"w": value}, {})
    d = min(0.9999, (1 + n) / (10 + n))
    ref = d * ref + (1 - d) * value
  np.testing.assert_allclose(ema["params"]["w"], ref, rtol=1e-6)
  assert int(ema["count"]) == 4


def test_lars_and_the_l2_term_skip_batch_norm_and_biases():
  params = _params(config.mini())
  flat = {"/".join(str(k.key) for k in p): v for p, v in jax.tree_util.tree_leaves_with_path(params)}
  lars = dict(zip(flat, jax.tree.leaves(optim.kernel_mask(params))))
  assert all(lars[k] == k.endswith("kernel") for k in flat)
  l2 = float(jax.jit(train._l2)(jax.tree.map(lambda x: np.ones(x.shape, np.float32), params)))
  assert l2 == 0.5 * sum(np.prod(v.shape) for k, v in flat.items() if "_bn/" not in k)


def test_the_full_recipe_at_its_batch():
  cfg = config.full()
  sched = train.schedule(cfg)
  lr, warmup, steps = train.learning_rate(cfg, sched)
  assert (cfg.model.variant, cfg.image_size, sched.global_batch_size) == (
      config.Variant.B5, 456, 65536)
  assert lr == 15.0 and warmup == int(50 * 1_281_167 / 65536) and steps == 6843
  legw = dataclasses.replace(cfg, optimizer=dataclasses.replace(
      cfg.optimizer, lr_scaling=config.LrScaling.LEGW), global_batch_size=16384)
  lr, warmup, _ = train.learning_rate(legw, train.schedule(legw))
  assert lr == pytest.approx(7.5) and warmup == int(12.5 * 1_281_167 / 16384)


def _plan(*overrides, bn_group_size=None, config_name="full"):
  from mlbench.config import RunConfig
  from mlbench.train.plan import make_plan
  from mlbench.train.runtime import Runtime

  devices = jax.devices()[:8]
  rc = RunConfig(workload="efficientnet", config=config_name, overrides=overrides,
                 bn_group_size=bn_group_size)
  return make_plan(rc, Runtime(0, 1, devices, devices))


def test_batch_norm_groups_of_128_examples_come_from_the_mesh():
  """The reference normalises over groups of --batch_norm_batch_size 128 examples:
  max(1, 128 / per-replica batch) replicas a group (utils.py DistributedBatchNormalization).
  At 64 images a device (a v3-1024 at 65,536) that is 2 devices a group; the log says the
  span. --bn-group-size overrides it; the mini config normalises over its whole batch."""
  plan = _plan("global_batch_size=512")  # 64 a device on 8
  assert plan.ctx.bn_groups == 4 and plan.hparams["model_bn_span"] == 128
  assert _plan("global_batch_size=256").hparams["model_bn_span"] == 128  # 32 a device: 4
  assert _plan().hparams["model_bn_span"] == 8192  # 8,192 a device: each its own group
  assert _plan("global_batch_size=512", bn_group_size=8).hparams["model_bn_span"] == 512
  assert _plan("global_batch_size=512", "model.bn_group_examples=0").ctx.bn_groups == 1
  assert _plan(config_name="mini").ctx.bn_groups == 1


def test_the_unsourced_full_values_are_provisional_in_check_and_describe(capsys):
  """No source was found for the peak learning rate, warmup and epochs at 65,536: the time
  to train `check` predicts and `describe` say so; the mini config's own values are not."""
  from mlbench.cli import check, main

  source = check.convergence(_plan(), None).source
  assert ("PROVISIONAL: optimizer.base_learning_rate=15.0, optimizer.warmup_epochs=50.0, "
          "train_epochs=350.0 have no source") in source
  assert "PROVISIONAL" not in check.convergence(_plan(config_name="mini"), None).source
  assert main(["describe", "efficientnet", "--json"]) == 0
  described = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  full, mini = (next(d for d in described if d["config"] == c) for c in ("full", "mini"))
  assert set(full["provisional"]) == {"optimizer.base_learning_rate", "optimizer.warmup_epochs",
                                      "train_epochs"}
  assert full["provisional"]["optimizer.base_learning_rate"]["value"] == 15.0
  assert mini["provisional"] == {}
