"""The plain ViT: parameter counts, the 2-D sin-cos embedding, big_vision's schedule and
optimizer chain, Mixup, and RandAugment's operations against PIL on a real digit."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlbench import config as config_lib
from mlbench.train import data
from mlbench.workload import Split
from workloads.common import imagenet, randaugment as ra
from workloads.vit import config, input_pipeline, model, train


def _count(cfg) -> int:
  params = jax.eval_shape(lambda k: train.init(cfg, k), jax.random.key(0))[0]
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


@pytest.mark.parametrize("variant, plain, original", [("S/16", 22_122_472, 22_050_664 - 384),
                                                      ("B/16", 87_006_184, 86_567_656 - 768)])
def test_parameter_counts(variant, plain, original):
  """Plain ViT (GAP, fixed sin-cos, tanh pre-logits) and, with a class token, learned
  position embeddings and no pre-logits, the original ViT's published 22,050,664 /
  86,567,656 (timm vit_small/base_patch16_224) less one position embedding: big_vision's
  learned embedding covers the patches, not the class token. The model's docstring quotes
  the plain counts."""
  cfg = config_lib.override(config.full(), (f"model.variant={variant}",))
  assert _count(cfg) == plain and f"{plain:,}" in model.__doc__
  cfg = config_lib.override(cfg, ("model.pool=tok", "model.posemb=learn", "model.pre_logits=false"))
  assert _count(cfg) == original


def test_sincos_posemb_is_mocov3s():
  """Channel k of token (y, x): sin(x w_k), cos(x w_k), sin(y w_k), cos(y w_k) blocks,
  w_k = 10000^-(k / (D/4 - 1))."""
  h, w, width = 3, 5, 16
  pe = model.posemb_sincos_2d(h, w, width)[0]
  q = width // 4
  for y in range(h):
    for x in range(w):
      for k in range(q):
        omega = 10000.0 ** -(k / (q - 1))
        row = pe[y * w + x]
        np.testing.assert_allclose([row[k], row[q + k], row[2 * q + k], row[3 * q + k]],
                                   [np.sin(x * omega), np.cos(x * omega),
                                    np.sin(y * omega), np.cos(y * omega)], rtol=1e-5, atol=1e-6)


def test_schedule_and_one_update_follow_big_vision():
  cfg = dataclasses.replace(config.mini(), optimizer=dataclasses.replace(
      config.mini().optimizer, warmup_steps=4, grad_clip_norm=1e9, mu_bfloat16=False))
  sched = train.schedule(cfg)
  rate = train.warmup_cosine(4, 20)
  for t, want in [(0, 0.0), (2, 0.5), (4, 1.0), (12, 0.5), (20, 0.0), (25, 0.0)]:
    assert float(rate(t)) == pytest.approx(want, abs=1e-6)
  # The first update: Adam's first step is g / (|g| + eps) per element; times lr, plus
  # wd * w on kernels only, times the schedule at count 0 (= 0), so nothing moves.
  params = {"dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)}}
  grads = jax.tree.map(lambda p: 0.5 * jnp.ones_like(p), params)
  tx = train.optimizer(cfg, sched)
  updates, state = tx.update(grads, tx.init(params), params)
  assert all(float(jnp.abs(u).max()) == 0.0 for u in jax.tree.leaves(updates))
  updates, _ = tx.update(grads, state, params)  # count 1: schedule 1/4 of the warmup
  lr, s = cfg.optimizer.learning_rate, 0.25
  np.testing.assert_allclose(updates["dense"]["bias"], -s * lr * np.ones(2), rtol=1e-4)
  np.testing.assert_allclose(updates["dense"]["kernel"], -s * (lr + 1e-4) * np.ones((2, 2)),
                             rtol=1e-4)


def test_mixup_mixes_each_example_with_its_neighbour():
  x = jnp.arange(4.0)[:, None] * jnp.ones((4, 3))
  labels = jax.nn.one_hot(jnp.arange(4), 4)
  mx, ml = train.mix(0.7, x, labels)
  np.testing.assert_allclose(ml[0], [0.7, 0, 0, 0.3], rtol=1e-6)
  np.testing.assert_allclose(mx[:, 0], 0.7 * np.arange(4) + 0.3 * np.roll(np.arange(4), 1),
                             rtol=1e-6)


@pytest.fixture(scope="module")
def digit(data_dir):
  """A real training digit as a uint8 image, and its TFRecord."""
  tf = data.tf()
  files = imagenet.files(config.mini(), data_dir, Split.TRAIN)
  record = next(iter(tf.data.TFRecordDataset(files[:1])))
  features = tf.io.parse_single_example(record, {"image/encoded": tf.io.FixedLenFeature([],
                                                                                     tf.string)})
  return tf.io.decode_jpeg(features["image/encoded"], channels=3), record


def test_randaugment_operations_match_pil(digit):
  from PIL import Image, ImageEnhance, ImageOps

  image, _ = digit
  pil = Image.fromarray(image.numpy())
  ops = ra._ops(image, 10.0, 1.0, np.array([1, 2]))
  want = {0: ImageOps.autocontrast(pil), 1: ImageOps.equalize(pil), 2: ImageOps.invert(pil),
          4: ImageOps.posterize(pil, 4), 6: ImageEnhance.Color(pil).enhance(1.9),
          8: ImageEnhance.Brightness(pil).enhance(1.9)}
  for i, ref in want.items():
    got = ops[i]().numpy().astype(int)
    assert np.abs(got - np.asarray(ref, int)).max() <= 1, i
  # Solarize at magnitude 10 has a threshold of 256: nothing changes.
  np.testing.assert_array_equal(ops[5]().numpy(), image.numpy())


def test_randaugment_is_stateless_and_keeps_shape(digit):
  image, record = digit
  tf = data.tf()
  a = ra.randaugment(image, tf.constant([5, 6], tf.int64))
  b = ra.randaugment(image, tf.constant([5, 6], tf.int64))
  np.testing.assert_array_equal(a.numpy(), b.numpy())
  assert a.shape == image.shape and a.dtype == tf.uint8
  for split in (Split.TRAIN, Split.EVAL):
    ex = input_pipeline.decode(config.full(), split)(record, tf.constant([1, 2], tf.int64))
    assert ex["image"].shape == (224, 224, 3)
    assert -1.0 <= float(tf.reduce_min(ex["image"])) <= float(tf.reduce_max(ex["image"])) <= 1.0
