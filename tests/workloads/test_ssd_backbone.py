"""SSD's pretrained backbone: torchvision-named weights (as the reference loads
resnet34-333f7ec4.pth, retired_benchmarks/ssd-v1/ssd/base_model.py L58-69) from a
.npz go into the flax backbone and compute what torch computes with them."""

from __future__ import annotations

import dataclasses

import flax
import jax
import numpy as np
import pytest

from mlbench.errors import UserError
from workloads.ssd import WORKLOAD, backbone, config
from workloads.ssd.model import SSD


def _torch_weights(cfg, tmp_path, drop=None):
  """Random arrays in torch layout (conv weights [out, in, kh, kw]) under torchvision's
  state-dict names, plus an int num_batches_tracked as in a real state dict."""
  shapes = jax.eval_shape(lambda: WORKLOAD.init(cfg, jax.random.key(0)))
  flat = flax.traverse_util.flatten_dict({"params": shapes[0], **shapes[1]}, sep="/")
  rng, out = np.random.default_rng(0), {}
  for path, name in backbone.torchvision_names(cfg.model).items():
    shape = flat[path].shape
    torch_shape = (shape[3], shape[2], shape[0], shape[1]) if len(shape) == 4 else shape
    value = rng.standard_normal(torch_shape).astype(np.float32) * 0.3
    out[name] = np.abs(value) + 0.5 if name.endswith("running_var") else value
  out["bn1.num_batches_tracked"] = np.asarray(7, np.int64)
  if drop:
    del out[drop]
  np.savez(tmp_path / "resnet34.npz", **out)
  return out, str(tmp_path / "resnet34.npz")


def test_torchvision_weights_load_and_compute_as_torch(tmp_path):
  cfg = config.mini()
  weights, path = _torch_weights(cfg, tmp_path)
  cfg = dataclasses.replace(cfg, backbone_weights=path)
  params, state = jax.jit(WORKLOAD.init, static_argnums=0)(cfg, jax.random.key(1))
  block = params["backbone"]["stage2_block1"]
  np.testing.assert_array_equal(block["conv1"]["kernel"],
                                weights["layer2.0.conv1.weight"].transpose(2, 3, 1, 0))
  np.testing.assert_array_equal(state["batch_stats"]["backbone"]["stage3_block1"]["proj_bn"]
                                ["var"], weights["layer3.0.downsample.1.running_var"])
  # torch's Conv2d(padding=1) is a cross-correlation over [out, in, kh, kw]; BatchNorm2d in
  # eval mode is (x - running_mean) / sqrt(running_var + eps) * weight + bias.
  image = np.random.default_rng(2).standard_normal((1, 32, 32, 3)).astype(np.float32)
  w = weights["conv1.weight"]
  padded = np.pad(image, ((0, 0), (1, 1), (1, 1), (0, 0)))
  conv = sum(np.einsum("bhwi,oi->bhwo", padded[:, ky:ky + 32, kx:kx + 32], w[:, :, ky, kx])
             for ky in range(3) for kx in range(3))
  bn = ((conv - weights["bn1.running_mean"]) / np.sqrt(weights["bn1.running_var"] + 1e-5)
        * weights["bn1.weight"] + weights["bn1.bias"])
  _, inter = SSD(cfg.model, cfg.anchors).apply({"params": params, **state}, image, train=False,
                                               capture_intermediates=True)
  got = np.asarray(inter["intermediates"]["backbone"]["stem_bn"]["__call__"][0])
  np.testing.assert_allclose(got, bn, rtol=1e-4, atol=1e-4)


def test_a_backbone_file_that_does_not_fit_names_the_variable(tmp_path):
  cfg = config.mini()
  _, path = _torch_weights(cfg, tmp_path, drop="layer1.0.bn2.running_mean")
  with pytest.raises(UserError, match="layer1.0.bn2.running_mean missing"):
    jax.jit(WORKLOAD.init, static_argnums=0)(dataclasses.replace(cfg, backbone_weights=path),
                                             jax.random.key(0))


def test_the_full_backbone_is_torchvisions_resnet34_up_to_layer3():
  # ResNet-34's layer1..layer3 have 3, 4, 6 BasicBlocks; downsample in layer2.0 and
  # layer3.0 only; stem conv1/bn1: 2 + 13 * 2 convs (+2 downsample) with their BNs.
  names = set(backbone.torchvision_names(config.full().model).values())
  assert {n for n in names if "downsample" in n} == {
      f"layer{s}.0.downsample.{i}.{k}" for s in (2, 3)
      for i, k in [(0, "weight"), (1, "weight"), (1, "bias"), (1, "running_mean"),
                   (1, "running_var")]}
  assert len(names) == (1 + 26 + 2) * 1 + (1 + 26 + 2) * 4
