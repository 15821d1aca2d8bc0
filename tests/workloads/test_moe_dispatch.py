"""MoE second-expert dispatch: GShard's random routing (the default) against a numpy
expectation, and its use in training only."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from workloads.moe import config, layer


def test_the_second_expert_is_drawn_with_twice_its_gate_as_gshard_does():
  """Over many tokens the share of second experts dispatched is the mean of
  min(1, 2 g2) with g2 the normalised second gate, computed here in numpy."""
  rng = np.random.default_rng(3)
  logits = rng.normal(size=(32, 128, 8)).astype(np.float32)
  top2 = np.sort(np.exp(logits - logits.max(-1, keepdims=True)), -1)[..., -2:]
  want = np.minimum(1.0, 2 * top2[..., 0] / top2.sum(-1)).mean()
  counts = jax.jit(lambda lg, u: layer.route(lg, k=2, capacity_per_group=128,
                                             uniform_GS=u).counts)
  got = counts(logits, jax.random.uniform(jax.random.key(0), logits.shape[:2]))
  tokens = logits.shape[0] * logits.shape[1]
  assert float(got["assignments"]) / tokens - 1.0 == pytest.approx(
      want, abs=4 * math.sqrt(0.25 / tokens))
  assert float(got["dropped_assignments"]) == 0.0


def test_the_layer_draws_the_second_expert_in_training_only():
  """Evaluation (deterministic) and second_expert=all dispatch every second expert."""
  from workloads.moe.model import MoeMlp

  m = config.mini().model
  m = dataclasses.replace(m, width=32, moe=dataclasses.replace(m.moe, expert_size=32))
  x = jnp.asarray(np.random.default_rng(4).normal(size=(4, 16, m.width)), jnp.float32)
  every = dataclasses.replace(m, moe=dataclasses.replace(
      m.moe, second_expert=config.SecondExpert.ALL))
  variables = jax.jit(MoeMlp(m, 2.0).init)(jax.random.key(0), x)

  @jax.jit
  def outputs(variables, x, key):
    rngs, p = {"gating": key}, variables["params"]
    return (MoeMlp(m, 2.0).apply(variables, x)[0],                       # evaluation
            MoeMlp(m, 2.0).apply(variables, x, False, rngs=rngs)[0],      # training
            MoeMlp(every, 2.0).apply(variables, x, False, rngs=rngs)[0],  # training, all
            layer.moe_ffn(x, p["router"], p["intermediate"], p["output"], k=2,
                          capacity_factor=2.0)[0])

  evaluation, drawn, all_, always = outputs(variables, x, jax.random.key(1))
  np.testing.assert_array_equal(evaluation, always)
  np.testing.assert_array_equal(all_, always)
  assert not np.allclose(drawn, always)
