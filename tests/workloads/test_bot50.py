"""BoT50: ResNet-50 with relative-position self-attention in its last stage."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from mlbench import config as config_lib
from mlbench.errors import UserError
from workloads.resnet50 import bot, config, train

BOT = ("model.block=bottleneck_transformer",)


def _params(cfg):
  return jax.eval_shape(lambda k: train.init(cfg, k), jax.random.key(0))[0]


def test_bot50_parameters_and_shapes():
  """Srinivas et al. Table: BoT50 has 20.8 M parameters (ResNet-50: 25.5 M): each of the
  last stage's three 3x3x512x512 convolutions becomes 3 x 512x512 projections plus
  relative embeddings of (2H-1) and (2W-1) rows of 128 per head group (14x14 in the
  first block, whose pooling halves it, 7x7 after)."""
  params = _params(config_lib.override(config.full(), BOT))
  count = int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))
  assert count == 25_557_032 - 3 * 9 * 512 * 512 + 3 * 3 * 512 * 512 + 128 * (2 * 27 + 4 * 13)
  assert count == 20_852_008
  first, second = params["stage4_block1"]["mhsa"], params["stage4_block2"]["mhsa"]
  assert first["query"]["kernel"].shape == (512, 4, 128)
  assert first["rel_height"].shape == (27, 128) and second["rel_width"].shape == (13, 128)
  assert "conv2" not in params["stage4_block1"] and "conv2" in params["stage3_block1"]


def _rel_to_abs(x):
  """The paper's rel_to_abs (Figure 4 code), in NumPy: [.., L, 2L-1] relative logits
  to [.., L, L] absolute ones by padding and reshaping."""
  *lead, length, _ = x.shape
  x = np.concatenate([x, np.zeros((*lead, length, 1))], axis=-1).reshape(*lead, -1)
  x = np.concatenate([x, np.zeros((*lead, length - 1))], axis=-1)
  return x.reshape(*lead, length + 1, 2 * length - 1)[..., :length, length - 1:]


def _relative_logits_1d(q, rel):
  """The paper's relative_logits_1d along the last spatial axis: [B, N, H, W, W]."""
  b, n, h, w, _ = q.shape
  logits = np.einsum("bnhwd,md->bnhwm", q, rel).reshape(b, n * h, w, 2 * w - 1)
  return _rel_to_abs(logits).reshape(b, n, h, w, w)


def test_relative_logits_are_the_papers():
  rng = np.random.default_rng(0)
  q = rng.standard_normal((2, 4, 3, 5, 8))
  rel_h, rel_w = rng.standard_normal((5, 8)), rng.standard_normal((9, 8))
  width = _relative_logits_1d(q, rel_w)                                       # [b,n,h,w,q]
  height = _relative_logits_1d(q.transpose(0, 1, 3, 2, 4), rel_h)            # [b,n,w,h,p]
  want = height.transpose(0, 1, 3, 2, 4)[..., :, None] + width[..., None, :]  # [b,n,h,w,p,q]
  got = np.asarray(bot.relative_logits(q.astype(np.float32), rel_h.astype(np.float32),
                                       rel_w.astype(np.float32)))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_strided_bot_block_runs_forward_and_backward():
  """Its last BN scale starts at 0, as the reference's bot_block (init_zero=True), whatever
  zero_init_last_bn says; with it at 1, gradients reach the attention's embeddings."""
  block = bot.BoTBlock(16, 2, config.mini().model)
  assert not config.mini().model.zero_init_last_bn
  x = np.random.default_rng(1).standard_normal((2, 6, 6, 32)).astype(np.float32)
  variables = jax.jit(lambda k: block.init(k, x, train=False))(jax.random.key(0))
  scale = variables["params"]["bn3"]["scale"]
  assert scale.shape == (64,) and not np.asarray(scale).any()
  variables["params"]["bn3"]["scale"] = np.ones_like(scale)

  def loss(params):
    y, _ = block.apply({**variables, "params": params}, x, train=True, mutable=["batch_stats"])
    return (y * np.arange(64, dtype=np.float32)).mean(), y.shape

  grads, shape = jax.jit(jax.grad(loss, has_aux=True))(variables["params"])
  assert shape == (2, 3, 3, 64)  # 2x2 pooling after the attention, as the projection
  g = grads["mhsa"]["rel_height"]
  assert g.shape == (11, 4) and np.isfinite(g).all() and float(np.abs(g).max()) > 0


def _plan(*, ruleset=None, division="closed"):
  from mlbench.config import Division, RunConfig
  from mlbench.train.plan import make_plan
  from mlbench.train.runtime import Runtime

  devices = jax.devices()[:8]
  rc = RunConfig(workload="resnet50", config="full", overrides=BOT, ruleset=ruleset,
                 division=Division(division))
  return make_plan(rc, Runtime(0, 1, devices, devices))


def test_bot50_is_no_closed_mlperf_resnet():
  """The closed division trains the benchmark's model: BoT50 under MLPerf's ResNet rules is
  refused in one line naming the switch, and runs in the open division or under the
  mini rules."""
  with pytest.raises(UserError) as e:
    _plan()
  assert str(e.value) == (
      "model.block=bottleneck_transformer is not the model of the closed 4.0.0 resnet "
      "benchmark (resnet50's has model.block=bottleneck): use --division open, or --ruleset mini")
  assert _plan(division="open").rule.ruleset == "4.0.0"
  assert _plan(ruleset="mini").rule.ruleset == "mini"
