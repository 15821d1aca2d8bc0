"""Spatial partitioning: every image split by height over a `spatial` mesh axis.

The mini ResNet (two of its four stages, batch 16, to compile in seconds) through the
harness's compiled step with 2 data-parallel replicas and each image on 1, 2 and 4
devices: the same losses and batch-norm statistics (the statistics combine the spatial
group's rows), halo exchanges in the program, and less activation memory per device as
the axis grows. The mini EfficientNet (depthwise convolutions, squeeze-excite pooling
over the whole image) likewise on 1 and 2 devices per image.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from mlbench import config as config_lib, registry
from mlbench.train import mesh as mesh_lib, steps
from mlbench.workload import Split, StepContext

SPATIAL = (1, 2, 4)


def _train(name: str, overrides: list[str], spatial: tuple[int, ...]) -> dict:
  """{m: (programs, losses of 3 steps, model state)} with each image on m devices."""
  w = registry.get(name)
  cfg = config_lib.override(w.configs["mini"](), overrides)
  sched = w.schedule(cfg)
  batch = w.synthetic_batch(cfg, Split.TRAIN, sched.global_batch_size, np.random.default_rng(0))
  out = {}
  for m in spatial:
    mesh = mesh_lib.make_mesh({"data": 2, "spatial": m}, devices=jax.devices()[:2 * m])
    programs = steps.compile_programs(w, cfg, sched, mesh, StepContext(mesh=mesh),
                                      w.optimizer(cfg, sched))
    state, losses = programs.init_state(0), []
    device_batch = mesh_lib.to_global(batch, programs.batch_sharding, sched.global_batch_size)
    for _ in range(3):
      state, sums = programs.train(state, programs.fresh_sums(), device_batch)
      losses.append(float(jax.device_get(sums)["loss"]))
    out[m] = programs, np.array(losses), jax.device_get(state.model_state)
  return out


@pytest.fixture(scope="module")
def resnet():
  return _train("resnet50", ["model.stage_sizes=1,1", "global_batch_size=16",
                             "eval_batch_size=16"], SPATIAL)


@pytest.mark.slow
def test_split_images_train_like_whole_ones(resnet):
  _, want, stats = resnet[1]
  for m in SPATIAL[1:]:
    _, losses, got = resnet[m]
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    # Running batch-norm statistics equal: each device's partial sums over its rows of
    # the images were combined across the spatial group, not normalised alone.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), got, stats)


@pytest.mark.slow
def test_halo_exchanges_and_activation_memory_per_device(resnet):
  temps = []
  for m in SPATIAL:
    programs = resnet[m][0]
    permutes = programs.train.as_text().count("collective-permute")
    assert (permutes > 0) == (m > 1), (m, permutes)
    temps.append(programs.train.memory_analysis().temp_size_in_bytes)
  assert temps[0] > temps[1] > temps[2], temps


@pytest.mark.slow  # EfficientNet's depthwise step compiles for a minute on 2 cores
def test_efficientnet_splits_its_images_too():
  out = _train("efficientnet", ["global_batch_size=16", "eval_batch_size=16"], (1, 2))
  np.testing.assert_allclose(out[2][1], out[1][1], rtol=1e-5)
  assert "collective-permute" in out[2][0].train.as_text()
