"""RandAugment (Cubuk et al. 2019, arXiv:1909.13719) as TensorFlow ops, stateless.

The policy of big_vision's `randaug` op (big_vision/pp/archive/autoaugment.py
`distort_image_with_randaugment`, the same as tensorflow/tpu's EfficientNet
autoaugment.py): `num_layers` times, one of 16 operations chosen uniformly is applied
at the fixed `magnitude` (of 10): AutoContrast, Equalize, Invert, Rotate (up to 30
degrees), Posterize (bits = 4 * m / 10), Solarize (threshold 256 * m / 10), Color,
Contrast, Brightness, Sharpness (factor 1.8 * m / 10 + 0.1), ShearX/Y (0.3 * m / 10),
TranslateX/Y (100 * m / 10 pixels), Cutout (a square of side 2 * 40 * m / 10) and
SolarizeAdd (110 * m / 10 below 128). Rotation, shear and translation take a random
sign; pixels they uncover are grey (128), nearest-neighbour sampled (the reference's
tf.contrib.image / tfa.image defaults). Randomness comes from a [2] seed tensor, so an
example is augmented the same way on every run with the same seed.

Images are uint8 [H, W, 3].
"""

from __future__ import annotations

import math
from typing import Any

MAX_LEVEL = 10.0
GREY = 128


def _tf():
  from mlbench.train.data import tf

  return tf()


def _blend(a: Any, b: Any, factor: Any) -> Any:
  """a + factor * (b - a), clipped to 0..255 (PIL ImageEnhance semantics)."""
  tf = _tf()
  a, b = tf.cast(a, tf.float32), tf.cast(b, tf.float32)
  return tf.cast(tf.clip_by_value(a + factor * (b - a), 0.0, 255.0), tf.uint8)


def _grey(image: Any) -> Any:
  tf = _tf()
  return tf.image.grayscale_to_rgb(tf.image.rgb_to_grayscale(image))


def _contrast(image: Any, factor: float) -> Any:
  tf = _tf()
  hist = tf.histogram_fixed_width(tf.cast(tf.image.rgb_to_grayscale(image), tf.int32),
                                  [0, 255], nbins=256)
  # The reference's mean: the pixel count over 256 (as PIL's, not a mean grey level).
  mean = tf.reduce_sum(tf.cast(hist, tf.float32)) / 256.0
  return _blend(tf.fill(tf.shape(image), tf.cast(tf.clip_by_value(mean, 0, 255), tf.uint8)),
                image, factor)


def _sharpness(image: Any, factor: float) -> Any:
  """Blend with PIL's SMOOTH filter ([[1,1,1],[1,5,1],[1,1,1]] / 13), borders kept."""
  tf = _tf()
  kernel = tf.tile(tf.constant([[1., 1, 1], [1, 5, 1], [1, 1, 1]], shape=[3, 3, 1, 1]) / 13.0,
                   [1, 1, 3, 1])
  smooth = tf.nn.depthwise_conv2d(tf.cast(image, tf.float32)[None], kernel, [1, 1, 1, 1], "VALID")
  smooth = tf.cast(tf.clip_by_value(smooth[0], 0.0, 255.0), tf.uint8)
  inside = tf.pad(tf.ones_like(smooth), [[1, 1], [1, 1], [0, 0]])
  smooth = tf.where(tf.equal(inside, 1), tf.pad(smooth, [[1, 1], [1, 1], [0, 0]]), image)
  return _blend(smooth, image, factor)


def _channels(image: Any, fn) -> Any:
  tf = _tf()
  return tf.stack([fn(image[:, :, c]) for c in range(3)], axis=2)


def _autocontrast(image: Any) -> Any:
  tf = _tf()

  def one(ch: Any) -> Any:
    lo, hi = tf.cast(tf.reduce_min(ch), tf.float32), tf.cast(tf.reduce_max(ch), tf.float32)
    scaled = tf.cast(tf.clip_by_value((tf.cast(ch, tf.float32) - lo) * 255.0
                                      / tf.maximum(hi - lo, 1e-6), 0.0, 255.0), tf.uint8)
    return tf.where(hi > lo, scaled, ch)

  return _channels(image, one)


def _equalize(image: Any) -> Any:
  tf = _tf()

  def one(ch: Any) -> Any:
    ch = tf.cast(ch, tf.int32)
    hist = tf.histogram_fixed_width(ch, [0, 255], nbins=256)
    nonzero = tf.boolean_mask(hist, hist > 0)
    step = (tf.reduce_sum(nonzero) - nonzero[-1]) // 255
    lut = (tf.cumsum(hist) + step // 2) // tf.maximum(step, 1)
    lut = tf.clip_by_value(tf.concat([[0], lut[:-1]], 0), 0, 255)
    return tf.cast(tf.where(tf.equal(step, 0), ch, tf.gather(lut, ch)), tf.uint8)

  return _channels(image, one)


def _transform(image: Any, matrix: Any) -> Any:
  """A projective transform (output pixel (x, y) samples the input at matrix * (x, y, 1)),
  nearest neighbour, uncovered pixels grey."""
  tf = _tf()
  out = tf.raw_ops.ImageProjectiveTransformV3(
      images=tf.cast(image, tf.float32)[None], transforms=tf.cast(matrix, tf.float32)[None],
      output_shape=tf.shape(image)[:2], fill_value=float(GREY), interpolation="NEAREST",
      fill_mode="CONSTANT")
  return tf.cast(out[0], tf.uint8)


def _rotate(image: Any, degrees: Any) -> Any:
  """tfa.image.rotate about the centre (angles_to_projective_transforms)."""
  tf = _tf()
  h, w = tf.cast(tf.shape(image)[0], tf.float32), tf.cast(tf.shape(image)[1], tf.float32)
  a = degrees * math.pi / 180.0
  cos, sin = tf.cos(a), tf.sin(a)
  dx = ((w - 1) - (cos * (w - 1) - sin * (h - 1))) / 2.0
  dy = ((h - 1) - (sin * (w - 1) + cos * (h - 1))) / 2.0
  return _transform(image, tf.stack([cos, -sin, dx, sin, cos, dy, 0.0, 0.0]))


def _cutout(image: Any, half: int, seed: Any) -> Any:
  """A grey square of side 2 * half centred on a uniformly drawn pixel."""
  tf = _tf()
  h, w = tf.shape(image)[0], tf.shape(image)[1]
  cy = tf.random.stateless_uniform([], seed, 0, h, tf.int32)
  cx = tf.random.stateless_uniform([], seed + 1, 0, w, tf.int32)
  ys, xs = tf.range(h)[:, None], tf.range(w)[None, :]
  inside = (ys >= cy - half) & (ys < cy + half) & (xs >= cx - half) & (xs < cx + half)
  return tf.where(inside[:, :, None], tf.constant(GREY, tf.uint8), image)


def _ops(image: Any, m: float, sign: Any, seed: Any) -> list:
  """The 16 operations at magnitude m (0..10), in the reference's order, as thunks."""
  tf = _tf()
  enhance, shear, shift = m / MAX_LEVEL * 1.8 + 0.1, sign * m / MAX_LEVEL * 0.3, sign * m * 10.0
  bits, threshold = int(m / MAX_LEVEL * 4), int(m / MAX_LEVEL * 256)
  add = int(m / MAX_LEVEL * 110)
  shift_bits = lambda x: tf.bitwise.left_shift(tf.bitwise.right_shift(x, 8 - bits), 8 - bits)  # noqa: E731
  added = lambda x: tf.cast(tf.clip_by_value(tf.cast(x, tf.int32) + add, 0, 255), tf.uint8)  # noqa: E731
  return [
      lambda: _autocontrast(image),
      lambda: _equalize(image),
      lambda: 255 - image,
      lambda: _rotate(image, sign * m / MAX_LEVEL * 30.0),
      lambda: shift_bits(image),
      lambda: tf.where(tf.cast(image, tf.int32) < threshold, image, 255 - image),
      lambda: _blend(_grey(image), image, enhance),
      lambda: _contrast(image, enhance),
      lambda: _blend(tf.zeros_like(image), image, enhance),
      lambda: _sharpness(image, enhance),
      lambda: _transform(image, tf.stack([1.0, shear, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])),
      lambda: _transform(image, tf.stack([1.0, 0.0, 0.0, shear, 1.0, 0.0, 0.0, 0.0])),
      lambda: _transform(image, tf.stack([1.0, 0.0, shift, 0.0, 1.0, 0.0, 0.0, 0.0])),
      lambda: _transform(image, tf.stack([1.0, 0.0, 0.0, 0.0, 1.0, shift, 0.0, 0.0])),
      lambda: _cutout(image, int(m / MAX_LEVEL * 40), seed),
      lambda: tf.where(image < 128, added(image), image),
  ]


def randaugment(image: Any, seed: Any, *, num_layers: int = 2, magnitude: float = 10.0) -> Any:
  """`num_layers` operations drawn uniformly, each at `magnitude`, from seed [2]."""
  tf = _tf()
  seeds = tf.random.experimental.stateless_split(seed, num_layers * 3)
  for layer in range(num_layers):
    choice_seed, sign_seed, op_seed = seeds[3 * layer], seeds[3 * layer + 1], seeds[3 * layer + 2]
    choice = tf.random.stateless_uniform([], choice_seed, 0, 16, tf.int32)
    sign = tf.where(tf.random.stateless_uniform([], sign_seed) < 0.5, 1.0, -1.0)
    image = tf.switch_case(choice, _ops(image, float(magnitude), sign, op_seed))
    image = tf.ensure_shape(image, [None, None, 3])
  return image
