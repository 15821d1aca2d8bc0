"""Llama 3.1 specifics: the full model's size, rotary embeddings and grouped-query attention
against NumPy transcriptions of their formulas, gradient accumulation and the schedule (the
Megatron indexed-dataset reader and samples: test_llama31_8b_indexed.py)."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlbench.train import attention
from workloads.llama31_8b import config, model, train


def test_full_config_has_the_parameters_of_llama_3_1_8b():
  # Llama 3.1 8B (Llama 3 herd paper table 3; Hugging Face meta-llama/Llama-3.1-8B:
  # 8,030,261,248 parameters): per layer the query and output projections are
  # 4096 x 4096, key and value 4096 x 1024 (8 heads of 128), three SwiGLU matrices
  # 4096 x 14336 and two RMSNorm scales; plus untied input and output embeddings of
  # 128256 x 4096 and the final norm.
  width, mlp, kv, vocab, layers = 4096, 14336, 8 * 128, 128256, 32
  per_layer = 2 * width * width + 2 * width * kv + 3 * width * mlp + 2 * width
  expected = layers * per_layer + 2 * vocab * width + width
  assert expected == 8_030_261_248
  assert train.count_parameters(config.full()) == expected


def _numpy_llama31_frequencies(theta, dim, factor, low, high, old_context):
  """Meta's llama3 `apply_scaling`, one frequency at a time."""
  out = []
  for i in range(0, dim, 2):
    freq = 1.0 / theta ** (i / dim)
    wavelen = 2 * math.pi / freq
    if wavelen < old_context / high:
      out.append(freq)
    elif wavelen > old_context / low:
      out.append(freq / factor)
    else:
      smooth = (old_context / wavelen - low) / (high - low)
      out.append((1 - smooth) * freq / factor + smooth * freq)
  return np.array(out)


def test_rope_frequencies_and_rotation_match_the_formulas():
  rope = config.RopeConfig()
  freq = model.inverse_frequencies(rope, 128)
  expected = _numpy_llama31_frequencies(500000.0, 128, 8.0, 1.0, 4.0, 8192)
  np.testing.assert_allclose(freq, expected, rtol=1e-12)
  # All three bands occur for head size 128: kept, interpolated and stretched.
  ratio = freq / (1.0 / 500000.0 ** (np.arange(0, 128, 2) / 128))
  assert ratio[0] == 1 and ratio[-1] == pytest.approx(1 / 8) and ((ratio < 1) & (ratio > 1 / 8)).any()

  rng = np.random.default_rng(0)
  length, heads, dim = 12, 3, 16
  x = rng.normal(size=(2, length, heads, dim)).astype(np.float32)
  cos, sin = model.rope_tables(rope, dim, length)
  got = np.asarray(model.apply_rope(jnp.asarray(x), jnp.asarray(cos), jnp.asarray(sin)))
  f = model.inverse_frequencies(rope, dim)
  want = np.empty_like(x)
  for pos in range(length):
    for i in range(dim // 2):  # rotate the pair (i, i + dim/2) by pos * f_i
      a, b = x[:, pos, :, i], x[:, pos, :, i + dim // 2]
      c, s = math.cos(pos * f[i]), math.sin(pos * f[i])
      want[:, pos, :, i], want[:, pos, :, i + dim // 2] = a * c - b * s, b * c + a * s
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_grouped_query_attention_matches_numpy():
  cfg = dataclasses.replace(config.mini().model, width=32, num_heads=4, num_kv_heads=2)
  layer = model.Attention(cfg)
  rng = np.random.default_rng(1)
  length = 7
  x = rng.normal(size=(2, length, cfg.width)).astype(np.float32)
  cos, sin = model.rope_tables(cfg.rope, cfg.head_dim, length)
  params = layer.init(jax.random.key(0), x, cos, sin)["params"]
  got = np.asarray(layer.apply({"params": params}, x, cos, sin))

  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  rope = lambda t: np.asarray(model.apply_rope(jnp.asarray(t, jnp.float32), cos, sin), np.float64)
  q = rope(np.einsum("blh,hnd->blnd", x, p["query"]["kernel"]))
  k = rope(np.einsum("blh,hkd->blkd", x, p["key"]["kernel"]))
  v = np.einsum("blh,hkd->blkd", x, p["value"]["kernel"])
  group = cfg.num_heads // cfg.num_kv_heads
  out = np.zeros(q.shape)
  for b in range(2):
    for n in range(cfg.num_heads):
      kv = n // group  # query heads 0,1 read key/value head 0; 2,3 read head 1
      for i in range(length):
        scores = np.array([q[b, i, n] @ k[b, j, kv] / math.sqrt(cfg.head_dim)
                           for j in range(i + 1)])
        w = np.exp(scores - scores.max())
        out[b, i, n] = (w / w.sum()) @ v[b, :i + 1, kv]
  want = np.einsum("blnd,ndh->blh", out, p["output"]["kernel"])
  np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)


def _small(layers: int):
  """The mini config with `layers` layers on sequences of 16 tokens."""
  from mlbench.config import override

  return override(config.mini(), [f"model.num_layers={layers}", "data.seq_length=16"])


@pytest.mark.slow
def test_remat_policies_give_the_same_gradients():
  cfg = _small(2)
  from workloads.llama31_8b import input_pipeline
  from mlbench.workload import Split, StepContext
  batch = input_pipeline.synthetic_batch(cfg, Split.TRAIN, 2, np.random.default_rng(0))
  params, _ = train.init(cfg, jax.random.key(0))
  grads = {}
  for remat in config.Remat:
    c = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, remat=remat))
    grads[remat] = jax.grad(lambda p: train.loss(c, StepContext(mesh=None), p, {}, batch,
                                                 jax.random.key(0))[0])(params)
  for remat in (config.Remat.DOTS, config.Remat.FULL):
    for a, b in zip(jax.tree.leaves(grads[config.Remat.NONE]), jax.tree.leaves(grads[remat])):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_learning_rate_is_nemos_cosine_annealing_with_warmup():
  cfg = dataclasses.replace(config.mini(), optimizer=dataclasses.replace(
      config.mini().optimizer, base_learning_rate=1.0, end_learning_rate=0.1, warmup_steps=4,
      max_steps=14))
  lr = train.learning_rate(cfg)
  got = [float(lr(t)) for t in range(16)]
  # NeMo WarmupPolicy: (t + 1) / (W + 1) up to t = W; CosineAnnealing after, min_lr past T.
  want = [(t + 1) / 5 for t in range(5)]
  want += [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (t - 4) / 10)) for t in range(5, 15)]
  want += [0.1]
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_gradient_accumulation_gives_the_mean_gradient_of_the_whole_batch():
  from mlbench.train import steps
  from mlbench.workload import Split, StepContext
  from workloads.llama31_8b import WORKLOAD, input_pipeline

  cfg = _small(1)
  batch = input_pipeline.synthetic_batch(cfg, Split.TRAIN, 8, np.random.default_rng(3))
  params, _ = train.init(cfg, jax.random.key(0))
  ctx = StepContext(mesh=None)
  (loss1, _), g1 = steps.value_and_grad(WORKLOAD, cfg, ctx, params, {}, batch, jax.random.key(1))
  (loss4, _), g4 = jax.jit(lambda p, b: steps.value_and_grad(
      WORKLOAD, cfg, ctx, p, {}, b, jax.random.key(1), accumulate=4))(params, batch)
  np.testing.assert_allclose(loss4, loss1, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g4)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def test_hparams_follow_the_mesh_and_the_official_and_mini_rules():
  from mlbench import compliance, rules
  from mlbench.storage import paths
  from mlbench.train import mesh as mesh_lib
  from mlbench.train.plan import harness_hparams
  from mlbench.workload import StepContext

  mesh = mesh_lib.make_mesh({"data": 2, "model": 4})
  cfg = dataclasses.replace(config.full(), gradient_accumulation_steps=2)
  sched = train.schedule(cfg)
  logged = {**harness_hparams(sched), **train.hparams(cfg, sched, StepContext(mesh=mesh))}
  assert (logged["tensor_parallelism"], logged["micro_batch_size"],
          logged["gradient_accumulation_steps"]) == (4, 8, 2)
  official = rules.load("llama31_8b", "6.0.0")
  assert official.problems(logged, closed=True) == []
  bad = {**logged, "opt_learning_rate_decay_steps": 1_200_000}  # must be max_steps - warmup
  assert official.problems(bad, closed=True) == [
      "opt_learning_rate_decay_steps=1200000 must satisfy total_with "
      "{'key': 'opt_learning_rate_warmup_steps', 'eq': 1200000}"]
  mini = rules.load("llama31_8b", "mini")
  assert {h.key for h in mini.hyperparameters} == {h.key for h in official.hyperparameters}
  # The derived checker rules free the scale-pinning keys and keep the optimizer's.
  import yaml
  derived = compliance.checker_config(mini, paths.default_cache_dir()).parent
  keys = {r["KEY"]["NAME"]: r["KEY"] for r in yaml.safe_load(
      (derived / "closed_llama31_8b.yaml").read_text()) if "KEY" in r}
  assert "CHECK" not in keys["max_sequence_length"] and "CHECK" not in keys["max_steps"]
  assert keys["opt_adamw_beta_2"]["CHECK"] == "v['value'] == 0.95"
  assert "<= 5.4" in keys["eval_accuracy"]["ATLEAST_ONE_CHECK"]


def test_chunked_attention_is_causal_attention():
  rng = np.random.default_rng(4)
  q = jnp.asarray(rng.normal(size=(2, 16, 4, 8)), jnp.float32)
  k, v = (jnp.asarray(rng.normal(size=(2, 16, 2, 8)), jnp.float32) for _ in range(2))
  whole = attention.xla.attend(q, k, v, causal=True)
  np.testing.assert_allclose(attention.xla.attend(q, k, v, causal=True, chunk=4), whole, rtol=1e-5,
                             atol=1e-6)
  g = lambda c: jax.grad(lambda q: (attention.xla.attend(q, k, v, causal=True, chunk=c) ** 2).sum())(q)
  np.testing.assert_allclose(g(4), g(0), rtol=1e-4, atol=1e-5)


def test_scanned_layers_compute_what_unrolled_layers_do():
  base = config.mini()
  unrolled = dataclasses.replace(base.model, num_layers=3, remat=config.Remat.FULL)
  scanned = dataclasses.replace(unrolled, scan_layers=True)
  tokens = jnp.asarray(np.random.default_rng(6).integers(0, 1024, (2, 16)), jnp.int32)
  params = model.Llama(unrolled).init(jax.random.key(0), tokens)["params"]
  stacked = {k: v for k, v in params.items() if not k.startswith("layer_")}
  stacked["layers"] = {"layer": jax.tree.map(lambda *xs: jnp.stack(xs),
                                             *[params[f"layer_{i}"] for i in range(3)])}
  want = model.Llama(unrolled).apply({"params": params}, tokens)
  got = model.Llama(scanned).apply({"params": stacked}, tokens)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  shapes = jax.eval_shape(lambda: model.Llama(scanned).init(jax.random.key(0), tokens))
  assert jax.tree.map(lambda x: x.shape, shapes["params"]) == jax.tree.map(
      lambda x: x.shape, stacked)
