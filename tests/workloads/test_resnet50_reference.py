"""ResNet-50 against the MLPerf reference (mlcommons/training
retired_benchmarks/resnet-tf2/tensorflow2, the TF2 Keras reference of the 4.0.0
rules): initialisation, padding, weight decay, LARS and the schedule, each
checked against a transcription of the reference's formula or TensorFlow itself."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
import tensorflow as tf

from mlbench import rules
from mlbench.errors import UserError
from mlbench.train import plan

from workloads.resnet50 import WORKLOAD, config
from workloads.resnet50.model import ResNet


_init = jax.jit(WORKLOAD.init, static_argnums=0)


def _small_imagenet() -> config.ResNetConfig:
  cfg = config.mini()
  return dataclasses.replace(cfg, model=dataclasses.replace(
      cfg.model, stem=config.Stem.IMAGENET, stage_sizes=(1, 1), width=8))


def test_kernels_are_keras_he_normal_over_fan_in():
  # Keras he_normal (resnet_model.py L115): VarianceScaling(2, 'fan_in',
  # 'truncated_normal'): stddev = sqrt(2 / fan_in) / .87962566103423978, cut at 2 stddev,
  # so the samples' own standard deviation is sqrt(2 / fan_in).
  params, _ = _init(config.mini(), jax.random.key(0))
  kernel = np.asarray(params["stage4_block1"]["conv3"]["kernel"])  # 1x1, 128 -> 512
  fan_in = int(np.prod(kernel.shape[:-1]))
  assert kernel.shape[-1] == 4 * fan_in  # fan-out would give half this deviation
  assert np.abs(kernel).max() <= 2 * np.sqrt(2 / fan_in) / .87962566103423978
  assert abs(kernel.std() / np.sqrt(2 / fan_in) - 1) < 0.03


def test_the_last_batch_norm_of_a_block_starts_at_gamma_one():
  # Keras BatchNormalization's default gamma_initializer='ones' (resnet_model.py L150-155).
  params, _ = _init(config.mini(), jax.random.key(0))
  for stage in range(1, 5):
    np.testing.assert_array_equal(params[f"stage{stage}_block1"]["bn3"]["scale"], 1.0)
  cfg = config.mini()
  zero = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, zero_init_last_bn=True))
  assert not np.asarray(_init(zero, jax.random.key(0))[0]["stage1_block1"]["bn3"]
                        ["scale"]).any()


def test_strided_convolution_and_max_pool_pad_like_tensorflow_same():
  # The reference's strided 3x3 convolution (resnet_model.py L213-216) and its max pool
  # (L318) use padding='same': on an even size, TensorFlow pads (0, 1), not (1, 1).
  cfg = _small_imagenet()
  variables = ResNet(cfg.model).init(jax.random.key(0), np.zeros((1, 32, 32, 3), np.float32),
                                     train=False)
  image = np.random.default_rng(0).standard_normal((2, 32, 32, 3)).astype(np.float32)
  _, inter = ResNet(cfg.model).apply(variables, image, train=False, capture_intermediates=True)
  inter, params = inter["intermediates"], variables["params"]
  stem = tf.nn.relu(np.asarray(inter["stem_bn"]["__call__"][0]))
  pooled = tf.nn.max_pool2d(stem, 3, 2, padding="SAME").numpy()
  want = np.einsum("bhwc,cd->bhwd", pooled, params["stage1_block1"]["conv1"]["kernel"][0, 0])
  got = np.asarray(inter["stage1_block1"]["conv1"]["__call__"][0])
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  block = inter["stage2_block1"]
  before = tf.nn.relu(np.asarray(block["bn1"]["__call__"][0]))
  kernel = np.asarray(params["stage2_block1"]["conv2"]["kernel"])
  want = tf.nn.conv2d(before, kernel, strides=2, padding="SAME").numpy()
  np.testing.assert_allclose(np.asarray(block["conv2"]["__call__"][0]), want,
                             rtol=1e-4, atol=1e-4)


def _one_update(cfg, params, grads, step=10):
  tx = WORKLOAD.optimizer(cfg, WORKLOAD.schedule(cfg))
  state = tx.init(params)
  for _ in range(step):  # move the schedule off zero
    _, state = tx.update(jax.tree.map(np.zeros_like, grads), state, params)
  updates, _ = tx.update(grads, state, params)
  return updates


def _sgd_cfg():
  cfg = config.mini()
  return dataclasses.replace(cfg, optimizer=dataclasses.replace(
      cfg.optimizer, name=config.Optimizer.SGD, weight_decay=0.01, momentum=0.0))


def test_sgd_weight_decay_is_twice_wd_on_every_non_batch_norm_variable():
  # resnet_runnable.py L287-294: loss += weight_decay * 2 * sum(tf.nn.l2_loss(v)) over
  # trainable variables without 'bn' in their name; l2_loss(v) = sum(v**2) / 2, so the
  # gradient gains 2 * weight_decay * v, for the fc bias too; none for batch norm.
  cfg = _sgd_cfg()
  rng = np.random.default_rng(0)
  params = {"fc": {"kernel": rng.standard_normal((4, 3)), "bias": rng.standard_normal(3)},
            "stem_bn": {"scale": rng.standard_normal(4), "bias": rng.standard_normal(4)}}
  params = jax.tree.map(lambda p: p.astype(np.float32), params)
  grads = jax.tree.map(lambda p: rng.standard_normal(p.shape).astype(np.float32), params)
  updates = _one_update(cfg, params, grads)
  # With momentum 0 the update is -lr * (g + 2 wd w); lr from the bn update (-lr * g).
  lr = -updates["stem_bn"]["scale"][0] / grads["stem_bn"]["scale"][0]
  np.testing.assert_allclose(updates["stem_bn"]["bias"], -lr * grads["stem_bn"]["bias"],
                             rtol=1e-5)
  for name in ("kernel", "bias"):
    want = -lr * (grads["fc"][name] + 2 * 0.01 * params["fc"][name])
    np.testing.assert_allclose(updates["fc"][name], want, rtol=1e-5)


def test_lars_epsilon_zero_means_keras_epsilon():
  # lars_optimizer.py L109: self.epsilon = epsilon or backend_config.epsilon() (1e-7);
  # L134-139: trust = eeta * ||w|| / (||g|| + wd * ||w|| + epsilon).
  cfg = config.mini()
  o = cfg.optimizer
  assert o.lars_epsilon == 0.0
  w = np.full((2, 2), 5e-8, np.float32)
  g = np.full((2, 2), 2e-8, np.float32)
  # At step 0 the warmup learning rate is 0: one update with zero gradients first.
  updates = _one_update(cfg, {"c": {"kernel": w}}, {"c": {"kernel": g}}, step=1)
  w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
  trust = o.lars_eta * w_norm / (g_norm + o.weight_decay * w_norm + 1e-7)
  warmup = o.warmup_epochs * (cfg.data.train_examples // cfg.global_batch_size)
  lr = o.base_learning_rate * 1 / warmup
  np.testing.assert_allclose(updates["c"]["kernel"], -lr * trust * (g + o.weight_decay * w),
                             rtol=1e-4)


def test_the_schedule_counts_whole_steps_per_epoch():
  # resnet-tf2 common.py L637-639: steps_per_epoch = 1,281,167 // 4,096 = 312;
  # lars_util.py L112-114: warmup = 5 * 312, decay_steps = 312 * 42 - 1560 + 1.
  cfg = config.full()
  hp = WORKLOAD.hparams(cfg, WORKLOAD.schedule(cfg), _Ctx())
  assert hp["lars_opt_learning_rate_decay_steps"] == 312 * 42 - 5 * 312 + 1 == 11545


class _Ctx:
  bn_groups = 1


def test_the_full_config_evaluates_at_the_references_epochs():
  # resnet-tf2 README L110-112 (--epochs_between_evals=4 --eval_offset_epochs=2) and
  # resnet_ctl_imagenet_main.py L184-188: the first evaluation after 2 epochs, then every 4;
  # the 4.0.0 rules allow evaluations up to 3 epochs early.
  # In whole steps, the remainder batch dropped (common.py L635-639; L165, L181-188 and
  # L212 of the main): 312 steps an epoch, evaluations at step 624 (not 626), then every
  # 1,248, the budget 312 * 42 = 13,104 steps (not 13,137).
  cfg = config.full()
  sched = WORKLOAD.schedule(cfg)
  points = plan.eval_points(sched, rules.load("resnet", "4.0.0"))
  assert [p.epoch for p in points] == list(range(2, 43, 4))  # 2, 6, ..., 42 (the budget)
  assert [p.step for p in points] == [1_281_167 // 4096 * e for e in range(2, 43, 4)]
  assert points[0].step == 624 and sched.max_steps == points[-1].step == 13_104


def test_an_offset_beyond_the_rules_is_refused():
  cfg = dataclasses.replace(config.full(), eval_offset_epochs=3.5)
  with pytest.raises(UserError, match="outside the 4.0.0 resnet rules"):
    plan.eval_points(WORKLOAD.schedule(cfg), rules.load("resnet", "4.0.0"))
