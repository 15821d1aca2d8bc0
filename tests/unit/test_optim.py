"""MLPerf LARS and LAMB and their schedules against NumPy transcriptions of the references.

The transcription follows mlcommons/training image_classification/tensorflow2:
lars_optimizer.py (compute_lr, _resource_apply_dense) and lars_util.py
(PolynomialDecayWithWarmup over Keras PolynomialDecay), written here in float64
independently of mlbench.train.optim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mlbench.train import optim


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


# LAMB: a NumPy transcription of mlcommons/training language_model/tensorflow/bert
# optimization.py (create_optimizer: polynomial decay, warmup from start_warmup_step,
# clip_by_global_norm 1.0) and lamb_optimizer_v1.py (_apply_dense), float64.

EXCLUDE = ("LayerNorm", "layer_norm", "bias")


def reference_bert_lr(step, base, warmup, start, train_steps, power=1.0, end=0.0):
  lr = (base - end) * (1 - min(step, train_steps) / train_steps) ** power + end
  if warmup and step - start < warmup:
    lr = base * (step - start) / warmup
  return lr


def reference_lamb_step(ws, ms, vs, grads, names, step, lr, *, b1, b2, eps, wd, clip=1.0):
  norm = np.sqrt(sum((g ** 2).sum() for g in grads))
  grads = [g * clip / max(norm, clip) for g in grads]
  t = step + 1
  for i, (w, g, name) in enumerate(zip(ws, grads, names)):
    ms[i] = b1 * ms[i] + (1 - b1) * g
    vs[i] = b2 * vs[i] + (1 - b2) * g * g
    update = (ms[i] / (1 - b1 ** t)) / (np.sqrt(vs[i] / (1 - b2 ** t)) + eps)
    excluded = any(x in name for x in EXCLUDE)
    ratio = 1.0
    if not excluded:
      update = update + wd * w
      w_norm, u_norm = np.linalg.norm(w), np.linalg.norm(update)
      ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
    ws[i] = w - ratio * lr * update


def _bert_params(rng):
  return {"layer_0": {"attention": {"query": {"kernel": 0.02 * rng.standard_normal((8, 2, 4)),
                                              "bias": np.zeros((2, 4))}},
                      "attention_layer_norm": {"scale": np.ones(8),
                                               "bias": 0.01 * rng.standard_normal(8)}},
          "word_embeddings": {"embedding": 0.02 * rng.standard_normal((16, 8))},
          "mlm_output_bias": np.zeros(16)}


@pytest.mark.parametrize("warmup, start, train_steps", [(287, -76, 600), (0, 0, 50), (5, 0, 12)])
def test_bert_schedule_matches_the_reference_at_every_step(warmup, start, train_steps):
  sched = optim.bert_lr_schedule(0.00288293, warmup_steps=warmup, start_warmup_step=start,
                                 train_steps=train_steps)
  ours = np.asarray(jax.vmap(sched)(jnp.arange(train_steps + 3)))
  ref = np.array([reference_bert_lr(s, 0.00288293, warmup, start, train_steps)
                  for s in range(train_steps + 3)])
  np.testing.assert_allclose(ours, ref, rtol=2e-6, atol=1e-10)


@pytest.mark.parametrize("grad_scale", [0.01, 10.0], ids=["unclipped", "clipped"])
def test_mlperf_lamb_matches_the_reference_for_every_parameter_kind(grad_scale):
  rng = np.random.default_rng(0)
  params = _bert_params(rng)
  names = ["/".join(str(k.key) for k in path)
           for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  grads = [jax.tree.map(lambda p: grad_scale * rng.standard_normal(p.shape), params)
           for _ in range(6)]
  sched = optim.bert_lr_schedule(0.05, warmup_steps=3, start_warmup_step=-1, train_steps=8)
  tx = optim.mlperf_lamb(sched, b1=0.88, b2=0.88, eps=1e-6, weight_decay=0.0166629,
                         mask=optim.name_mask(EXCLUDE))
  ours = jax.tree.map(lambda p: jnp.asarray(p, jnp.float32), params)
  state = tx.init(ours)
  ws = [np.array(x) for x in jax.tree.leaves(params)]
  ms, vs = [np.zeros_like(w) for w in ws], [np.zeros_like(w) for w in ws]
  for step, g in enumerate(grads):
    updates, state = tx.update(jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), g), state, ours)
    ours = optax.apply_updates(ours, updates)
    reference_lamb_step(ws, ms, vs, jax.tree.leaves(g), names, step,
                        reference_bert_lr(step, 0.05, 3, -1, 8), b1=0.88, b2=0.88, eps=1e-6,
                        wd=0.0166629)
  for name, ours_leaf, ref_leaf in zip(names, jax.tree.leaves(ours), ws):
    np.testing.assert_allclose(np.asarray(ours_leaf), ref_leaf, rtol=2e-5, atol=2e-7,
                               err_msg=name)


def test_optax_lamb_adapts_layer_norm_where_the_reference_does_not():
  """Why mlbench ships its own: optax.lamb(mask=) masks only the weight decay."""
  rng = np.random.default_rng(2)
  w = {"layer_norm": {"scale": jnp.asarray(1 + 0.1 * rng.standard_normal(8), jnp.float32)}}
  g = {"layer_norm": {"scale": jnp.asarray(rng.standard_normal(8), jnp.float32)}}
  mask = optim.name_mask(EXCLUDE)
  ours = optim.mlperf_lamb(1.0, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, mask=mask)
  theirs = optax.lamb(1.0, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, mask=mask)
  u1, _ = ours.update(g, ours.init(w), w)
  u2, _ = theirs.update(g, theirs.init(w), w)
  assert float(jnp.max(jnp.abs(u1["layer_norm"]["scale"] - u2["layer_norm"]["scale"]))) > 1e-3


def _torch_sgd_reference(w, grads, lrs, momentum, wd):
  """torch/optim/sgd.py (_single_tensor_sgd, dampening 0, no Nesterov), as the SSD
  reference uses it (retired_benchmarks/ssd-v1/ssd/train.py L292-295):
  d_p = g + wd * p; buf = d_p at the first step, else momentum * buf + d_p; p -= lr * buf."""
  buf = None
  for g, lr in zip(grads, lrs):
    d_p = g + wd * w
    buf = d_p.copy() if buf is None else momentum * buf + d_p
    w = w - lr * buf
  return w


def test_torch_sgd_puts_the_learning_rate_outside_the_momentum_buffer():
  rng = np.random.default_rng(0)
  w0 = rng.standard_normal(5).astype(np.float32)
  grads = [rng.standard_normal(5).astype(np.float32) for _ in range(6)]
  lrs = [0.01, 0.02, 0.04, 0.08, 0.08, 0.008]  # warmup, then a step decay
  tx = optim.torch_sgd(lambda count: jnp.asarray(lrs)[count], momentum=0.9, weight_decay=5e-4,
                       mask=lambda p: jax.tree.map(lambda _: True, p))
  w, state = jnp.asarray(w0), tx.init(jnp.asarray(w0))
  for g in grads:
    updates, state = tx.update(jnp.asarray(g), state, w)
    w = optax.apply_updates(w, updates)
  want = _torch_sgd_reference(w0.astype(np.float64), grads, lrs, 0.9, 5e-4)
  np.testing.assert_allclose(np.asarray(w), want, rtol=1e-5, atol=1e-6)
  # The Keras-style form (rate inside the buffer) is measurably different here.
  tx = optim.sgd_momentum(lambda count: jnp.asarray(lrs)[count], momentum=0.9,
                          weight_decay=5e-4, mask=lambda p: jax.tree.map(lambda _: True, p))
  v, state = jnp.asarray(w0), tx.init(jnp.asarray(w0))
  for g in grads:
    updates, state = tx.update(jnp.asarray(g), state, v)
    v = optax.apply_updates(v, updates)
  assert np.abs(np.asarray(v) - want).max() > 1e-3


def reference_legw_lr(step, *, lr0, warmup_epochs0, batch0, batch, examples, epochs, power=2.0):
  """LEGW as You et al. 2019 (arXiv:1901.08256) state it, for batch = k * batch0: the
  learning rate tuned at batch0 grows sqrt(k) times (Sqrt Scaling) and its gradual
  (linear) warmup lasts k times as many epochs; a polynomial decay to 0 follows over
  the remaining updates (the schedule's own)."""
  k = batch / batch0
  peak, warmup = lr0 * np.sqrt(k), warmup_epochs0 * k * (examples // batch)
  if step <= warmup:
    return peak * step / warmup
  decay = epochs * (examples // batch) - warmup + 1
  return peak * (1 - min(step - warmup, decay) / decay) ** power


@pytest.mark.parametrize("batch", [512, 4096, 16384])
def test_legw_matches_the_papers_rule_at_every_step(batch):
  examples, epochs, batch0 = 100_000, 6, 256
  lr, warmup_epochs = optim.scale_for_batch("legw", 0.2, 0.05, base_batch_size=batch0,
                                            global_batch_size=batch)
  per_epoch = examples // batch
  sched = optim.poly_warmup_schedule(lr, warmup_steps=warmup_epochs * per_epoch,
                                     train_steps=epochs * per_epoch, end_lr=0.0)
  steps = np.arange(epochs * per_epoch + 2)
  ours = np.asarray(jax.vmap(sched)(jnp.asarray(steps)))
  ref = np.array([reference_legw_lr(s, lr0=0.2, warmup_epochs0=0.05, batch0=batch0,
                                    batch=batch, examples=examples, epochs=epochs)
                  for s in steps])
  np.testing.assert_allclose(ours, ref, rtol=2e-5, atol=1e-7)
  # The paper's two claims: the peak grows with sqrt(k), the warmup in epochs with k.
  assert lr == pytest.approx(0.2 * np.sqrt(batch / batch0))
  assert warmup_epochs == pytest.approx(0.05 * batch / batch0)


def test_linear_and_no_scaling_and_an_unknown_rule():
  kw = dict(base_batch_size=256, global_batch_size=65536)
  assert optim.scale_for_batch("linear", 0.016, 5.0, **kw) == (0.016 * 256, 5.0)
  assert optim.scale_for_batch("none", 0.016, 5.0, **kw) == (0.016, 5.0)
  from mlbench.errors import UserError

  with pytest.raises(UserError, match="legw, linear, none"):
    optim.scale_for_batch("sqrt", 0.016, 5.0, **kw)
