"""The shared transformer blocks (`workloads.common.transformer`) and the XLA attention they
run on CPUs (`mlbench.train.attention`): both XLA paths (with and without dropout) compute
the same attention, and the low-precision softmax has softmax's gradient."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlbench.train import attention
from workloads.common import transformer as blocks


def _reference(q, k, v, bias):
  """float64 attention: softmax(q k^T / sqrt(D) + bias) v."""
  q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
  logits = np.einsum("blnd,bsnd->bnls", q, k) / np.sqrt(q.shape[-1]) + np.asarray(bias)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  return np.einsum("bnls,bsnd->blnd", probs, v)


def _qkv_bias(dtype):
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.standard_normal((2, 6, 3, 8)), dtype) for _ in range(3))
  lengths = jnp.asarray([6, 4])  # the second row's last 2 keys are padding
  allowed = attention.allowed_mask(6, 6, causal=True, kv_lengths_B=lengths)
  bias = jnp.where(allowed, 0.0, attention.NEG_INF).astype(jnp.float32)
  return q, k, v, bias


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 3e-2)])
def test_the_dropout_path_and_the_fused_path_compute_the_same_attention(dtype, tol):
  # With dropout off, the explicit path (taken in training when dropout > 0) and
  # jax.nn.dot_product_attention (taken otherwise) are one function: values and
  # gradients against each other and against float64.
  q, k, v, bias = _qkv_bias(dtype)

  def explicit(q, k, v):
    return attention.attention_with_dropout(q, k, v, bias, lambda probs: probs)

  def fused(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, bias=bias)

  want = _reference(q, k, v, bias)
  for f in (explicit, fused):
    assert f(q, k, v).dtype == dtype
    np.testing.assert_allclose(np.asarray(f(q, k, v), np.float64), want, atol=tol, rtol=tol)
  loss = lambda f: lambda *a: (f(*a).astype(jnp.float32) * jnp.arange(8.0)).sum()
  got = jax.grad(loss(explicit), argnums=(0, 1, 2))(q, k, v)
  ref = jax.grad(loss(fused), argnums=(0, 1, 2))(q, k, v)
  for g, r in zip(got, ref):
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32),
                               atol=tol * 4, rtol=tol * 4)


def test_attention_dropout_drops_probabilities_only_in_training():
  layer = blocks.Attention(num_heads=3, head_dim=8, dropout=0.1, causal=True)
  x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 6, 24)), jnp.float32)
  params = layer.init(jax.random.key(0), x)
  masks = {"kv_lengths_B": jnp.asarray([6, 4])}
  run = lambda det, seed: layer.apply(params, x, masks=masks, deterministic=det,
                                      rngs={"dropout": jax.random.key(seed)})
  np.testing.assert_array_equal(run(True, 0), run(True, 1))
  assert not np.allclose(run(False, 0), run(False, 1))
  # Dropout rescales what it keeps: averaged over many masks, the output is the
  # deterministic one (per element, 1,000 masks: a standard error of about 0.01).
  many = jax.vmap(lambda key: layer.apply(params, x, masks=masks, deterministic=False,
                                          rngs={"dropout": key}))
  mean = many(jax.random.split(jax.random.key(2), 1000)).mean(0)
  np.testing.assert_allclose(mean, run(True, 0), atol=0.05)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_softmax_in_a_low_precision_has_the_softmax_gradient(dtype):
  logits = jnp.asarray(np.random.default_rng(2).standard_normal((3, 4, 9)) * 3, jnp.float32)
  weights = jnp.arange(9.0)
  got = jax.grad(lambda z: (attention.softmax_in(z, dtype).astype(jnp.float32) * weights).sum())
  want = jax.grad(lambda z: (jax.nn.softmax(z) * weights).sum())
  assert attention.softmax_in(logits, dtype).dtype == dtype
  assert got(logits).dtype == jnp.float32
  np.testing.assert_allclose(got(logits), want(logits),
                             atol=1e-5 if dtype == jnp.float32 else 5e-2)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["transformer", "bert"])
def test_remat_full_recomputes_each_layer_and_changes_no_number(name):
  # model.remat=full wraps every layer in jax.checkpoint: the same parameters, loss and
  # gradients (dropout on, so the recomputed layers must redraw the same masks).
  import dataclasses

  from mlbench import config as config_lib
  from mlbench import registry
  from mlbench.workload import Split, StepContext

  workload = registry.get(name)
  cfg = workload.configs["mini"]()
  cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dropout=0.1))
  remat = config_lib.override(cfg, ("model.remat=full",))
  params, state = workload.init(cfg, jax.random.key(0))
  assert jax.tree.structure(workload.init(remat, jax.random.key(0))[0]) == \
      jax.tree.structure(params)
  batch = workload.synthetic_batch(cfg, Split.TRAIN, 4, np.random.default_rng(0))

  def grad(c):
    return jax.value_and_grad(
        lambda p: workload.loss(c, StepContext(mesh=None), p, state, batch, jax.random.key(3))[0])

  remats = lambda c: str(jax.make_jaxpr(grad(c))(params)).count("remat")
  assert remats(remat) >= remats(cfg) + 2  # (the Transformer's loss remats its own part)
  (want, want_g), (got, got_g) = jax.jit(grad(cfg))(params), jax.jit(grad(remat))(params)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  jax.tree.map(lambda g, h: np.testing.assert_allclose(g, h, rtol=1e-5, atol=1e-7), got_g,
               want_g)
