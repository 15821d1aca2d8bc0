"""The harness's whole eval path for the metric tests (test_metrics*.py): a workload's
mini eval step compiled as `steps.compile_programs` compiles it, an evaluation set fed in
batches with a padded last one through `evaluate.evaluate`, and the helpers the
independent computations share."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlbench import registry
from mlbench.train import data, evaluate, mesh as mesh_lib, sharding, steps
from mlbench.workload import Split, StepContext

BATCH = 16
"""Global eval batch: 2 examples per device on the 8-device mesh."""
REAL = 40
"""Real examples: two full batches and a last one of 8 real and 8 padded rows."""


@dataclasses.dataclass(frozen=True)
class Compiled:
  """A workload's mini config, its compiled eval step and an initial state on the mesh."""

  workload: object
  cfg: object
  eval: object
  batch_sharding: object
  state: steps.TrainState

  @property
  def params(self):
    """The parameters, fetched to the host: the independent computation runs them
    unsharded on one device, outside the harness."""
    return jax.device_get(self.state.params)

  @property
  def model_state(self):
    return jax.device_get(self.state.model_state)


def compile_eval(name: str, edit=lambda cfg: cfg) -> Compiled:
  """The mini config with BATCH-example eval batches; the init and eval programs
  compiled as `steps.compile_programs` compiles them (the train step, which
  evaluation never runs, is left out: it would double the compile time)."""
  w = registry.get(name)
  cfg = dataclasses.replace(edit(w.configs["mini"]()), eval_batch_size=BATCH)
  mesh = mesh_lib.make_mesh()
  init = steps.init_fn(w, cfg, w.optimizer(cfg, w.schedule(cfg)))
  rng_spec = jax.ShapeDtypeStruct((), jnp.uint32, sharding=mesh_lib.replicated(mesh))
  shapes = jax.eval_shape(init, rng_spec)
  state_sh = sharding.tree_shardings(shapes, w.partition_rules(cfg), mesh)
  batch_sh = mesh_lib.batch_sharding(mesh)
  spec = steps.batch_spec(w, cfg, Split.EVAL, BATCH, batch_sh)
  state_in = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          shapes, state_sh)
  ev = jax.jit(steps.eval_fn(w, cfg, StepContext(mesh=mesh)), in_shardings=(state_sh, batch_sh),
               out_shardings=batch_sh).lower(state_in, spec).compile()
  state = jax.jit(init, out_shardings=state_sh)(mesh_lib.replicated_value(mesh, np.uint32(0)))
  return Compiled(w, cfg, ev, batch_sh, state)


def with_params(c: Compiled, params) -> Compiled:
  """`c` with its state's parameters replaced, placed with the same shardings."""
  placed = jax.device_put(params, jax.tree.map(lambda x: x.sharding, c.state.params))
  return dataclasses.replace(c, state=dataclasses.replace(c.state, params=placed))


def add_to_fc_bias(params, delta: np.ndarray):
  """`params` with `delta` added to the ResNet classifier's bias."""
  fc = dict(params["fc"])
  fc["bias"] = (np.asarray(fc["bias"]) + delta).astype(fc["bias"].dtype)
  return {**params, "fc": fc}


def harness_eval(c: Compiled, real: dict[str, np.ndarray],
                  padding: dict[str, np.ndarray]) -> tuple[dict[str, float], int]:
  """The harness's evaluation of `real`, in batches of BATCH; the last batch is
  filled up with rows of `padding` (mask 0). Returns (metrics, examples counted)."""
  n = len(next(iter(real.values())))
  assert n % BATCH != 0, "the last batch must be padded"
  pairs = []
  for start in range(0, n, BATCH):
    m = min(BATCH, n - start)
    chunk = {k: np.concatenate([v[start:start + m], padding[k][:BATCH - m]]).astype(v.dtype)
             for k, v in real.items()}
    chunk[data.MASK] = (np.arange(BATCH) < m).astype(np.int32)
    pairs.append((chunk, mesh_lib.to_global(chunk, c.batch_sharding, BATCH)))
  metrics, part = evaluate.evaluate(c.workload, c.cfg, c.eval, c.state, pairs,
                                    expected=n)
  return metrics, part.count


def assert_same(reported: dict[str, float], independent: dict[str, float]) -> None:
  assert set(reported) == set(independent)
  for k, v in independent.items():
    assert reported[k] == pytest.approx(v, rel=1e-6, abs=1e-12), k


def log_softmax(logits: np.ndarray) -> np.ndarray:
  x = np.asarray(logits, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def hits_and_misses(pred: np.ndarray, num_classes: int, rng: np.random.Generator,
                     hit_rate: float) -> np.ndarray:
  """Labels that equal `pred` with probability `hit_rate`, and another class otherwise."""
  other = (pred + rng.integers(1, num_classes, pred.shape)) % num_classes
  return np.where(rng.random(pred.shape) < hit_rate, pred, other).astype(np.int32)
