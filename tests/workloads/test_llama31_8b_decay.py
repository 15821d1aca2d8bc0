"""llama31_8b's weight decay by parameter role, as Megatron's parameter groups."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from workloads.llama31_8b import config, model, train


def test_weight_decay_spares_the_norms_by_role_even_when_layers_are_stacked():
  """Megatron's groups (core_r0.11.0 optimizer/__init__.py L90-94) on the unrolled model's
  separate tensors, `name.endswith('.bias') or ndim == 1`, decide; the scanned model's
  stacked [layers, width] norm scales must still be spared, and one AdamW step with zero
  gradients must shrink every kernel by lr * wd and leave every norm scale as it was."""
  import optax

  base = config.mini()
  tokens = jnp.zeros((1, 8), jnp.int32)
  unrolled = jax.eval_shape(model.Llama(base.model).init, jax.random.key(0), tokens)["params"]
  megatron = {path: leaf.ndim > 1 for path, leaf in jax.tree_util.tree_leaves_with_path(unrolled)}
  assert train.decay_mask(unrolled) == jax.tree_util.tree_unflatten(
      jax.tree.structure(unrolled), list(megatron.values()))
  cfg = dataclasses.replace(base, model=dataclasses.replace(base.model, scan_layers=True))
  params = jax.jit(model.Llama(cfg.model).init)(jax.random.key(0), tokens)["params"]
  decayed = sum(x.size for x, d in zip(jax.tree.leaves(params),
                                       jax.tree.leaves(train.decay_mask(params))) if d)
  assert decayed == sum(x.size for x, d in zip(jax.tree.leaves(unrolled), megatron.values()) if d)
  tx = train.optimizer(cfg, train.schedule(cfg))
  new = jax.jit(lambda p: optax.apply_updates(p, tx.update(
      jax.tree.map(jnp.zeros_like, p), tx.init(p), p)[0]))(params)
  lr = float(train.learning_rate(cfg)(0))
  for path, old in jax.tree_util.tree_leaves_with_path(params):
    got = new
    for key in path:
      got = got[key.key]
    norm = path[-1].key == "scale"
    assert old.ndim == 1 + (path[0].key == "layers") or not norm  # stacked: [layers, width]
    np.testing.assert_allclose(got, old if norm else old * (1 - lr * cfg.optimizer.weight_decay),
                               rtol=1e-6)
