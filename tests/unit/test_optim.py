"""MLPerf LARS and its schedule against a NumPy transcription of the reference.

The transcription follows mlcommons/training image_classification/tensorflow2:
lars_optimizer.py (compute_lr, _resource_apply_dense) and lars_util.py
(PolynomialDecayWithWarmup over Keras PolynomialDecay), written here in float64
independently of mlbench.optim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mlbench import optim


def reference_lr(step, base, warmup, train_steps, end=1e-4, power=2.0):
  if step <= warmup:
    return base * step / warmup
  decay_steps = train_steps - warmup + 1
  p = min(step - warmup, decay_steps) / decay_steps
  return (base - end) * (1 - p) ** power + end


def reference_lars(w, g, mom, lr, *, skip, momentum, wd, eta=1e-3, eps=0.0):
  scaled_lr = lr
  if not skip:
    w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
    trust = eta * w_norm / (g_norm + wd * w_norm + eps) if w_norm > 0 and g_norm > 0 else 1.0
    scaled_lr = lr * trust
    g = g + wd * w
  mom = mom * momentum - g * scaled_lr
  return w + mom, mom


@pytest.mark.parametrize("warmup, train_steps", [(703.0, 2503), (10.5, 40), (5.0, 5)])
def test_schedule_matches_the_reference_at_every_step(warmup, train_steps):
  sched = optim.poly_warmup_schedule(29.0, warmup_steps=warmup, train_steps=train_steps)
  ours = np.asarray(jax.vmap(sched)(jnp.arange(train_steps + 3)))
  ref = np.array([reference_lr(s, 29.0, warmup, train_steps) for s in range(train_steps + 3)])
  np.testing.assert_allclose(ours, ref, rtol=2e-6, atol=1e-6)
  assert ours[0] == 0.0 and ours[-1] == pytest.approx(1e-4)


def _params(rng):
  return {"conv": {"kernel": rng.standard_normal((3, 3, 4, 8))},
          "bn": {"scale": 1 + 0.1 * rng.standard_normal(8), "bias": 0.1 * rng.standard_normal(8)},
          "fc": {"kernel": 0.01 * rng.standard_normal((8, 10)), "bias": np.zeros(10)}}


@pytest.mark.parametrize("wd", [1e-4, 5e-2])
def test_mlperf_lars_matches_the_reference_for_every_parameter_kind(wd):
  rng = np.random.default_rng(0)
  params = _params(rng)
  grads = [jax.tree.map(lambda p: rng.standard_normal(p.shape), params) for _ in range(6)]
  sched = optim.poly_warmup_schedule(10.0, warmup_steps=2, train_steps=6)
  tx = optim.mlperf_lars(sched, momentum=0.9, weight_decay=wd, mask=optim.kernel_mask)
  ours = jax.tree.map(lambda p: jnp.asarray(p, jnp.float32), params)
  state = tx.init(ours)
  ref = [np.array(x) for x in jax.tree.leaves(params)]
  moms = [np.zeros_like(x) for x in ref]
  for step, g in enumerate(grads):
    updates, state = tx.update(jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), g), state, ours)
    ours = optax.apply_updates(ours, updates)
    lr = reference_lr(step, 10.0, 2, 6)
    for i, gi in enumerate(jax.tree.leaves(g)):
      # BN scale/bias and biases are in the reference's skip list: plain momentum.
      ref[i], moms[i] = reference_lars(ref[i], gi, moms[i], lr, skip=ref[i].ndim == 1,
                                       momentum=0.9, wd=wd)
  for ours_leaf, ref_leaf in zip(jax.tree.leaves(ours), ref):
    np.testing.assert_allclose(np.asarray(ours_leaf), ref_leaf, rtol=2e-5, atol=2e-6)


def test_optax_lars_computes_a_different_trust_ratio():
  """Why mlbench ships its own: optax.lars uses eta*||w|| / ||g + wd*w||."""
  rng = np.random.default_rng(1)
  w = {"k": jnp.asarray(rng.standard_normal((16, 16)), jnp.float32)}
  g = {"k": jnp.asarray(rng.standard_normal((16, 16)), jnp.float32)}
  ours = optim.mlperf_lars(1.0, momentum=0.9, weight_decay=5e-2, mask=optim.kernel_mask)
  theirs = optax.lars(1.0, weight_decay=5e-2, trust_coefficient=1e-3, momentum=0.9)
  u1, _ = ours.update(g, ours.init(w), w)
  u2, _ = theirs.update(g, theirs.init(w), w)
  assert float(jnp.max(jnp.abs(u1["k"] - u2["k"]))) > 1e-5


def test_sgd_momentum_decays_only_kernels():
  w = {"kernel": jnp.ones((2, 2)), "bias": jnp.ones((2,))}
  g = jax.tree.map(jnp.zeros_like, w)
  tx = optim.sgd_momentum(0.5, momentum=0.9, weight_decay=0.1, mask=optim.kernel_mask)
  updates, _ = tx.update(g, tx.init(w), w)
  np.testing.assert_allclose(updates["kernel"], -0.05 * np.ones((2, 2)), rtol=1e-6)
  np.testing.assert_allclose(updates["bias"], np.zeros(2))
