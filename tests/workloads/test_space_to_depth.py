"""The space-to-depth stem (`model.stem=space_to_depth`, issue 47) is the plain 7x7/2 stem
computed another way: with the same parameters it gives the same outputs and gradients,
on images the real host pipelines fold into 2x2 blocks, for ResNet-50 and SSD; the
parameter trees (and so checkpoints) do not change."""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlbench import config as config_lib
from mlbench.fields import ConfigError
from mlbench.train import data, steps
from mlbench.workload import Split, StepContext
from workloads.common import blocks, conv, imagenet
from workloads.common.conv import Stem
from workloads.resnet50 import WORKLOAD as RESNET, config as resnet_config, input_pipeline
from workloads.ssd import WORKLOAD as SSD, config as ssd_config, input_pipeline as ssd_input

PLAIN, S2D = "model.stem=imagenet", "model.stem=space_to_depth"


def _plain_conv(x_BHWC, kernel):
  """The reference's stem convolution: 7x7, stride 2, padded 3 (resnet_stem's Stem.IMAGENET)."""
  return jax.lax.conv_general_dilated(x_BHWC, kernel, (2, 2), ((3, 3), (3, 3)),
                                      dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _s2d_conv(x_BhwD, kernel):
  return blocks.SpaceToDepthConv(kernel.shape[-1], 7, blocks.he_normal).apply(
      {"params": {"kernel": kernel}}, x_BhwD)


def test_the_rearranged_kernel_computes_the_plain_convolution():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 18, 22, 3)).astype(np.float32)  # even, not square
  kernel = rng.standard_normal((7, 7, 3, 5)).astype(np.float32)
  cot = rng.standard_normal((2, 9, 11, 5)).astype(np.float32)
  plain, plain_vjp = jax.vjp(_plain_conv, x, kernel)
  folded, s2d_vjp = jax.vjp(_s2d_conv, conv.space_to_depth(x), kernel)
  assert folded.shape == plain.shape == (2, 9, 11, 5)
  np.testing.assert_allclose(folded, plain, rtol=1e-5, atol=1e-5)
  dx_plain, dk_plain = plain_vjp(cot)
  dx_s2d, dk_s2d = s2d_vjp(cot)
  np.testing.assert_allclose(dk_s2d, dk_plain, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(dx_s2d, conv.space_to_depth(dx_plain), rtol=1e-5, atol=1e-5)
  # Google's TF ResNet-50 instead zeroes the last tap of an 8x8 kernel (resnet_model.py L66):
  # a one-pixel shift, which a test of equality must tell apart.
  shifted = jnp.pad(kernel, ((0, 1), (0, 1), (0, 0), (0, 0)))[1:, 1:]
  assert not np.allclose(_s2d_conv(conv.space_to_depth(x), shifted), plain, atol=1e-2)


def test_an_odd_image_size_is_refused_with_the_fix():
  with pytest.raises(ConfigError, match=r"data.image_size: 225 is odd.*model.stem=imagenet"):
    config_lib.override(resnet_config.full(), (S2D, "data.image_size=225"))
  assert conv.stem_input_shape(Stem.SPACE_TO_DEPTH, 300, 300) == (150, 150, 12)  # SSD's 300


def _tree_shapes(w, cfg):
  return jax.tree.map(lambda a: (a.shape, a.dtype),
                      jax.eval_shape(lambda k: w.init(cfg, k), jax.random.key(0)))


@pytest.mark.parametrize("w, full", [(RESNET, resnet_config.full), (SSD, ssd_config.full)],
                         ids=["resnet50", "ssd"])
def test_the_full_models_keep_their_parameter_trees(w, full):
  plain, s2d = (config_lib.override(full(), (s,)) for s in (PLAIN, S2D))
  assert _tree_shapes(w, s2d) == _tree_shapes(w, plain)
  if w is RESNET:  # torchvision's ResNet50_Weights.IMAGENET1K_V1: 25,557,032 parameters
    assert steps.count_params(w, s2d) == 25_557_032
  assert w.hparams(s2d, w.schedule(s2d), StepContext(mesh=None))["mlbench_stem"] == \
      "space_to_depth"


def _first_batch(files, decode, n: int) -> dict[str, np.ndarray]:
  ds = data.eval_dataset(files, decode, num_examples=n, per_host_batch=n, host=0, hosts=1)
  return {k: v for k, v in next(data.numpy_batches(ds)).items() if k != data.MASK}


def _loss_and_grads(w, cfg, batch):
  """(params, loss, grads) of the workload's training loss."""
  ctx = StepContext(mesh=None)

  @jax.jit
  def run(batch):
    params, state = w.init(cfg, jax.random.key(0))
    (loss, _), grads = jax.value_and_grad(
        lambda p: w.loss(cfg, ctx, p, state, batch, jax.random.key(1)), has_aux=True)(params)
    return params, loss, grads

  return run(batch)


def _assert_same_grads(got, want) -> None:
  """Per parameter: float32 sums in another order, through batch norm over a small batch,
  differ by 1e-5 of the largest entry; a misplaced pixel costs whole units."""
  flat_want = flax.traverse_util.flatten_dict(want, sep="/")
  for name, g in flax.traverse_util.flatten_dict(got, sep="/").items():
    scale = float(np.abs(flat_want[name]).max())
    np.testing.assert_allclose(g, flat_want[name], atol=1e-4 * scale, rtol=0, err_msg=name)


def test_resnet_on_real_digits_through_the_pipeline(data_dir):
  """The whole model, loss and gradients, on digits decoded by the real pipeline: the same
  parameters from the same seed, the same loss and gradients (two stages: the stem is what
  differs, and each compile costs seconds)."""
  mini = resnet_config.mini()
  plain, s2d = (config_lib.override(mini, (s, "model.stage_sizes=1,1")) for s in (PLAIN, S2D))
  files = imagenet.files(mini, data_dir, Split.EVAL)
  batches = [_first_batch(files, input_pipeline.decode(c, Split.EVAL), 32) for c in (plain, s2d)]
  assert batches[1]["image"].shape == (32, 12, 12, 12)
  np.testing.assert_array_equal(batches[1]["image"], conv.space_to_depth(batches[0]["image"]))
  p_plain, loss_plain, g_plain = _loss_and_grads(RESNET, plain, batches[0])
  p_s2d, loss_s2d, g_s2d = _loss_and_grads(RESNET, s2d, batches[1])
  jax.tree.map(np.testing.assert_array_equal, p_s2d, p_plain)
  np.testing.assert_allclose(loss_s2d, loss_plain, rtol=1e-6)
  _assert_same_grads(g_s2d, g_plain)


def test_ssd_backbone_on_real_scenes_through_the_pipeline(ssd_data_dir):
  """SSD's backbone (its stem pools as torchvision does) on scenes decoded by SSD's real
  training pipeline: the same features and parameter gradients with the same weights."""
  from workloads.ssd.model import Backbone

  mini = ssd_config.mini()
  plain, s2d = (config_lib.override(mini, (s, "model.stage_strides=1,1,1")) for s in (PLAIN, S2D))
  files = ssd_input.files(mini, ssd_data_dir, Split.TRAIN)
  images = [_first_batch(files, ssd_input.decode(c, Split.TRAIN), 16)["image"]
            for c in (plain, s2d)]
  np.testing.assert_array_equal(images[1], conv.space_to_depth(images[0]))
  out = [_features_and_grads(Backbone(c.model), x) for c, x in zip((plain, s2d), images)]
  assert out[0][0].shape == (16, 8, 8, 64)
  np.testing.assert_allclose(out[1][0], out[0][0], rtol=1e-4, atol=1e-4)
  _assert_same_grads(out[1][1], out[0][1])


def test_the_full_stem_on_a_real_photo(photo_record):
  """ResNet-50's full preprocessing of a photograph, training and evaluation, hands the
  space-to-depth stem the plain one's pixels; both stems (convolution, batch norm, ReLU,
  max pool) give the same features and kernel gradients."""
  tf = data.tf()
  plain, s2d = (config_lib.override(resnet_config.full(), (s, "model.dtype=float32"))
                for s in (PLAIN, S2D))
  images = {}
  for cfg in (plain, s2d):
    train = input_pipeline.decode(cfg, Split.TRAIN)(photo_record, tf.constant([1, 2], tf.int64))
    ev = input_pipeline.decode(cfg, Split.EVAL)(photo_record, tf.zeros([2], tf.int64))
    images[cfg.model.stem] = np.stack([train["image"].numpy(), ev["image"].numpy()])
  assert images[Stem.SPACE_TO_DEPTH].shape == (2, 112, 112, 12)
  np.testing.assert_array_equal(images[Stem.SPACE_TO_DEPTH],
                                conv.space_to_depth(images[Stem.IMAGENET]))
  features, grads = {}, {}
  for cfg in (plain, s2d):
    features[cfg.model.stem], grads[cfg.model.stem] = _features_and_grads(
        _Stem(cfg.model), images[cfg.model.stem])
  assert features[Stem.IMAGENET].shape == (2, 56, 56, 64)
  np.testing.assert_allclose(features[Stem.SPACE_TO_DEPTH], features[Stem.IMAGENET],
                             rtol=1e-4, atol=1e-4)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               grads[Stem.SPACE_TO_DEPTH], grads[Stem.IMAGENET])


def _features_and_grads(module, images):
  """A module's features on `images` in training mode (batch statistics) and its
  parameters' gradients for their mean, the same initial variables whatever the stem."""

  @jax.jit
  def run(images):
    variables = module.init(jax.random.key(0), images, train=True)
    out, vjp = jax.vjp(lambda p: module.apply({**variables, "params": p}, images, train=True,
                                              mutable=["batch_stats"])[0], variables["params"])
    return out, vjp(jnp.ones_like(out) / out.size)[0]

  return run(images)


class _Stem(flax.linen.Module):
  """ResNet-50's stem as its model builds it, training mode."""

  cfg: resnet_config.ModelConfig

  @flax.linen.compact
  def __call__(self, x_BHWC, train: bool):
    from workloads.resnet50.model import same_padding

    return blocks.resnet_stem(x_BHWC, self.cfg, width=64, train=train, groups=1,
                              kernel_init=blocks.he_normal,
                              pool_padding=lambda x: (same_padding(x.shape[1], 3, 2),
                                                      same_padding(x.shape[2], 3, 2)))
