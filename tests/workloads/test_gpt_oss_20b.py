"""GPT-OSS 20B specifics: the full model's size from its shapes, the reference's layer
pattern, the attention (per-head QK-norm, rotary embeddings, the sliding window) against a
NumPy transcription, the end-of-document loss mask, Megatron's learning-rate schedule, and
the full config's logged hyperparameters under the official 6.1.0 closed rules (the dropless
MoE layer itself: tests/workloads/test_dropless_moe*.py)."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlbench.workload import StepContext
from workloads.gpt_oss_20b import config, model, train


def test_full_config_has_the_parameters_of_gpt_oss_20b():
  # Per layer: queries 2,880 -> 64 x 64, keys and values 2,880 -> 8 x 64, the output
  # 4,096 -> 2,880; two RMSNorm scales of 2,880 and the query and key norms of 64; the
  # router 2,880 x 32 and 32 SwiGLU experts of three 2,880 x 2,880 matrices. Untied
  # 128,256 x 2,880 embeddings and the final norm.
  h, q, kv, e, f, v, layers = 2880, 64 * 64, 8 * 64, 32, 2880, 128_256, 24
  attention = h * q + 2 * h * kv + q * h + 2 * 64
  moe = h * e + e * 3 * h * f
  expected = layers * (attention + moe + 2 * h) + 2 * v * h + h
  assert expected == 20_488_418_112
  counts = train.count_parameters(config.full())
  assert counts["total"] == expected
  # Active for a token: 4 of 32 experts, and no input embedding (a lookup).
  assert counts["active"] == expected - layers * 28 * 3 * h * f - v * h == 3_397_530_432


def test_model_flops_are_6nd_over_the_active_matmul_parameters_plus_attention():
  """Megatron/MLPerf's convention: 6 x the parameters a token multiplies (the active ones
  less the norm scales) x the tokens, plus attention's scores and weighted values over the
  keys each query sees, causal counted in full: 8,192 keys in the 12 full layers, the
  window's 129 in the 12 sliding ones; 4 x L x keys x 4,096 a layer forward."""
  d, q = 8192, 64 * 64
  matmul = 3_397_530_432 - 24 * (2 * 2880 + 2 * 64) - 2880
  attention = 12 * 4 * d * d * q + 12 * 4 * d * 129 * q
  assert train.flops_per_example(config.full()) == 6 * matmul * d + 3 * attention


def test_layers_alternate_as_megatrons_window_attn_skip_freq_list():
  # The reference's list (gpt_oss_20B-pretrain.yaml L112), read as Megatron-core's
  # is_layer_window_attention reads it: entry layer_number - 1, 1 = sliding window.
  reference = [1, 0] * 12
  m = config.full().model
  assert [m.sliding(i) for i in range(m.num_layers)] == [bool(x) for x in reference]
  assert not any(dataclasses.replace(m, window=0).sliding(i) for i in range(m.num_layers))


def _tiny(**kw):
  return dataclasses.replace(config.mini().model, width=24, num_heads=4, num_kv_heads=2,
                             head_dim=8, num_layers=1, window=3, **kw)


@pytest.fixture(scope="module")
def tiny():
  """(config, parameters, step) of a one-layer (sliding) GPT-OSS 24 wide, initialised once;
  step(params, {"tokens": [2, 17]}) is one compiled program the tests share: the loss, the
  eval step's sums and the logits of the first 16 tokens."""
  cfg = dataclasses.replace(config.mini(), model=_tiny())
  ctx = StepContext(mesh=None)
  step = jax.jit(lambda p, b: (
      train.loss(cfg, ctx, p, {}, b, jax.random.key(0))[0], train.eval_step(cfg, ctx, p, {}, b),
      model.GptOss(cfg.model).apply({"params": p}, b["tokens"][:, :-1])))
  return cfg, jax.jit(lambda k: train.init(cfg, k)[0])(jax.random.key(0)), step


def test_attention_is_qk_normed_rotary_grouped_query_attention_in_its_window():
  cfg = _tiny()
  length = 9
  rng = np.random.default_rng(1)
  x = rng.normal(size=(2, length, cfg.width)).astype(np.float32)
  freq = model.decoder.inverse_frequencies(cfg.rope_theta, cfg.head_dim)
  cos, sin = model.decoder.rope_tables(freq, length)

  def layers(x):  # both layers, and XLA's query blocks (model.attention_chunk): one compile
    out = {}
    for sliding in (True, False):
      layer = model.Attention(cfg, sliding)
      blocked = model.Attention(dataclasses.replace(cfg, attention_chunk=3), sliding)
      params = layer.init(jax.random.key(0), x, cos, sin)["params"]
      out[sliding] = (params, layer.apply({"params": params}, x, cos, sin),
                      blocked.apply({"params": params}, x, cos, sin))
    return out

  for sliding, (params, got, got_blocked) in jax.jit(layers)(x).items():
    got = np.asarray(got)
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)

    def norm(t, scale):  # RMSNorm over each head's D channels
      return t / np.sqrt((t * t).mean(-1, keepdims=True) + cfg.norm_epsilon) * scale

    rope = lambda t: np.asarray(model.decoder.apply_rope(jnp.asarray(t, jnp.float32), cos, sin),
                                np.float64)
    q = rope(norm(np.einsum("blh,hnd->blnd", x, p["query"]["kernel"]), p["query_norm"]["scale"]))
    k = rope(norm(np.einsum("blh,hkd->blkd", x, p["key"]["kernel"]), p["key_norm"]["scale"]))
    val = np.einsum("blh,hkd->blkd", x, p["value"]["kernel"])
    out = np.zeros(q.shape)
    for b in range(2):
      for n in range(cfg.num_heads):
        g = n // (cfg.num_heads // cfg.num_kv_heads)
        for i in range(length):
          first = max(0, i - cfg.window) if sliding else 0  # keys i - window ... i
          s = np.array([q[b, i, n] @ k[b, j, g] for j in range(first, i + 1)])
          w = np.exp(s / math.sqrt(cfg.head_dim) - (s / math.sqrt(cfg.head_dim)).max())
          out[b, i, n] = (w / w.sum()) @ val[b, first:i + 1, g]
    want = np.einsum("blnd,ndh->blh", out, p["output"]["kernel"])
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
    # XLA's query blocks (model.attention_chunk) compute the same.
    np.testing.assert_allclose(np.asarray(got_blocked), got, rtol=1e-5, atol=1e-6)


def test_a_sliding_layer_never_sees_past_its_window(tiny):
  """One sliding layer: the logit at position i moves with token i - window and never
  with an earlier one (window + 1 keys: Transformer Engine's (window, 0))."""
  full, params, step = tiny
  window = full.model.window
  tokens = np.random.default_rng(2).integers(1, full.model.vocab_size, (2, 17)).astype(np.int32)
  moved = tokens.copy()
  moved[0, 2] = tokens[0, 2] % 7 + 1  # never the end-of-document token (0)
  base, after = (np.asarray(step(params, {"tokens": t})[2]) for t in (tokens, moved))
  changed = np.abs(after - base).max(-1) > 1e-6
  assert changed[0].tolist() == [False, False] + [True] * (window + 1) + [False] * (
      16 - 3 - window)
  assert not changed[1].any()


def test_the_loss_leaves_out_positions_after_an_end_of_document(tiny):
  cfg, params, step = tiny
  rng = np.random.default_rng(3)
  tokens = rng.integers(1, cfg.model.vocab_size, (2, 17)).astype(np.int32)
  tokens[0, 5] = tokens[1, 11] = cfg.data.eod_token  # inputs 5 and 11 predict nothing
  loss, sums, logits = step(params, {"tokens": tokens})
  nll = -np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), tokens[:, 1:, None], -1)[..., 0]
  keep = np.ones_like(nll, bool)
  keep[0, 5] = keep[1, 11] = False
  assert float(loss) == pytest.approx(nll[keep].mean(), rel=1e-5)
  assert float(sums["nll"].sum()) == pytest.approx(nll[keep].sum(), rel=1e-5)
  assert np.asarray(sums["tokens"]).tolist() == [15.0, 15.0]


def test_learning_rate_is_megatrons_optimizer_param_scheduler():
  cfg = dataclasses.replace(config.mini(), optimizer=dataclasses.replace(
      config.mini().optimizer, base_learning_rate=1.0, end_learning_rate=0.1, warmup_steps=4,
      max_steps=18))
  lr = train.learning_rate(cfg)
  # megatron/core/optimizer_param_scheduler.py get_lr, num_steps = t (x batch on both
  # sides), lr_decay_iters = max_steps - warmup = 14 (the reference's decay iters).
  want = []
  for t in range(20):
    if t <= 4:
      want.append(t / 4)
    elif t > 14:
      want.append(0.1)
    else:
      want.append(0.1 + 0.9 * 0.5 * (math.cos(math.pi * (t - 4) / 10) + 1))
  np.testing.assert_allclose([float(lr(t)) for t in range(20)], want, rtol=1e-6, atol=1e-7)


def test_the_full_configs_logged_keys_pass_the_official_6_1_0_closed_checker(tmp_path):
  """The log the full config writes before any step (the plan's setup records on 8
  devices, tokens over data x expert) with one evaluation at the target, through the
  official compliance checker and its own 6.1.0 closed rules (no derived files)."""
  import jax as jax_

  from mlbench import compliance, rules
  from mlbench.config import RunConfig
  from mlbench.mllog import MLLog
  from mlbench.train import loop
  from mlbench.train.plan import make_plan
  from mlbench.train.runtime import Runtime

  devices = jax_.devices()[:8]
  plan = make_plan(RunConfig(workload="gpt_oss_20b", config="full", results_dir=tmp_path,
                             mesh=(("data", 2), ("expert", 4))),
                   Runtime(0, 1, devices, devices))
  assert plan.rule.ruleset == "6.1.0" and plan.rule.official
  assert (plan.hparams["expert_parallelism"], plan.hparams["micro_batch_size"],
          plan.hparams["train_samples"]) == (4, 2, 1_200_000 * 16)
  point = plan.points[0]
  assert point.samples == 12288
  log = MLLog(tmp_path / "full.txt")
  log.cache_clear(False)
  log.init_start()
  loop._log_setup(plan, 7, log)
  log.init_stop()
  log.run_start()
  log.block_start(1, point.epoch, 0)
  log.eval_start(point.epoch, point.samples)
  log.eval_result("eval_accuracy", 3.3, point.epoch, point.samples)
  log.eval_stop(point.epoch, point.samples)
  log.block_stop(1, point.samples)
  log.run_stop(True)
  log.close()
  assert compliance.checker_config(plan.rule, tmp_path) is None  # the official files as they are
  verdict = compliance.check_log(tmp_path / "full.txt", plan.rule, tmp_path)
  assert verdict.passed, verdict.failures()
  assert rules.load("gpt_oss_20b", "mini").hyperparameters != plan.rule.hyperparameters


def test_partition_rules_split_experts_over_expert_and_widths_over_data():
  """The full model's parameters on a data=2 x expert=4 mesh, from shapes alone: every
  expert matrix over both axes (its experts and its width), the rest FSDP over data, the
  norm scales replicated; the scanned stack's layer axis left whole (no stage axis)."""
  from jax.sharding import PartitionSpec as P

  from mlbench.train import mesh as mesh_lib, sharding

  cfg = config.full()
  params = jax.eval_shape(lambda k: train.init(cfg, k)[0], jax.random.key(0))
  mesh = mesh_lib.make_mesh({"data": 2, "expert": 4})
  shardings = sharding.tree_shardings(params, train.partition_rules(cfg), mesh,
                                      stack=train.layer_stack(cfg).path)
  layer = shardings["layers"]["layer"]["layer_0"]
  assert layer["moe"]["wi_gate"].spec == layer["moe"]["wi_up"].spec == P(None, "expert", "data")
  assert layer["moe"]["wo"].spec == P(None, "expert", None, "data")
  assert layer["moe"]["router"].spec == P(None, "data")
  assert layer["attention"]["query"]["kernel"].spec == P(None, "data")
  assert layer["attention"]["output"]["kernel"].spec == P(None, None, None, "data")
  assert layer["attention"]["query_norm"]["scale"].spec == P()
  assert shardings["embedding"]["embedding"].spec == P(None, "data")
  assert shardings["output"]["kernel"].spec == P("data")
  experts = sum(math.prod(x.shape) for k, x in params["layers"]["layer"]["layer_1"]["moe"].items()
                if k != "router")
  held = sharding.bytes_per_device({"e": params["layers"]["layer"]["layer_1"]["moe"]},
                                   {"e": shardings["layers"]["layer"]["layer_1"]["moe"]})
  assert held <= 4 * experts / 8 * 1.001  # the experts split 8 ways
