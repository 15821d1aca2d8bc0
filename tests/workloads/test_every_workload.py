"""Every registered workload, through the harness's compiled programs, on 8 devices.

One parametrized test per contract duty: the train step learns on its own
synthetic batch, the eval step and the workload's reduction give the quality
metric, and the logged hyperparameters satisfy the workload's rules. Runs on
each workload's mini config (its full config is for a pod).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from mlbench import rules
from mlbench.pod import hbm, hloops, xlacost
from mlbench.train import evaluate, mesh as mesh_lib
from mlbench.train.plan import harness_hparams
from mlbench.workload import Split


def test_train_step_learns_its_synthetic_batch(compiled):
  w, cfg, sched = compiled.workload, compiled.cfg, compiled.schedule
  state = compiled.fresh_state()
  batch = w.synthetic_batch(cfg, Split.TRAIN, sched.rows(), np.random.default_rng(0))
  losses = []
  for _ in range(8):
    state, sums = compiled.train(state, batch)
    losses.append(float(jax.device_get(sums)["loss"]))
  assert all(np.isfinite(losses))
  assert int(jax.device_get(state.step)) == 8
  assert min(losses[-3:]) < losses[0], losses


def test_eval_step_and_reduction_give_the_quality_metric(compiled):
  w, cfg, sched, programs = compiled.workload, compiled.cfg, compiled.schedule, compiled.programs
  state = compiled.fresh_state()
  n = sched.eval_batch_size + sched.eval_batch_size // 2  # A padded last batch.
  rng = np.random.default_rng(1)
  examples = w.synthetic_batch(cfg, Split.EVAL, n, rng)
  pairs = []
  for start in range(0, 2 * sched.eval_batch_size, sched.eval_batch_size):
    chunk = {k: np.zeros((sched.eval_batch_size,) + v.shape[1:], v.dtype)
             for k, v in examples.items()}
    real = max(0, min(sched.eval_batch_size, n - start))
    for k in chunk:
      chunk[k][:real] = examples[k][start:start + real]
    chunk["mask"] = (np.arange(sched.eval_batch_size) < real).astype(np.int32)
    pairs.append((chunk, mesh_lib.to_global(chunk, programs.batch_sharding,
                                            sched.eval_batch_size)))
  metrics, part = evaluate.evaluate(w, cfg, programs.eval, state, pairs, expected=n)
  assert part.count == n
  assert np.isfinite(metrics[w.quality_metric])


def _binding(w, config_name: str) -> list[str]:
  """The rulesets a config must satisfy: all of them, except that a mini config is held
  to the official rules only where the mini rules inherit their constraints (llama31_8b's
  mini rules free the keys that pin the reference's 8,192-token scale)."""
  out = rules.rulesets(w.benchmark, w.rulesets)
  if config_name != rules.MINI or rules.MINI not in out:
    return out
  mini = rules.load(w.benchmark, rules.MINI).hyperparameters
  return [r for r in out if r == rules.MINI or rules.load(w.benchmark, r).hyperparameters == mini]


def test_logged_hyperparameters_satisfy_every_ruleset(compiled):
  w, ctx = compiled.workload, compiled.ctx
  for config_name in w.configs:
    c = w.configs[config_name]()
    s = w.schedule(c)
    logged = {**harness_hparams(s), **w.hparams(c, s, ctx)}
    for ruleset in _binding(w, config_name):
      assert rules.load(w.benchmark, ruleset).problems(logged, closed=True) == [], (
          config_name, ruleset)


def test_the_train_steps_bytes_break_down_by_kind_into_xlas_count(compiled):
  """The parts add up to XLA's bytes accessed; on XLA:CPU (XLA's own cost analysis, no
  memory-space copies) the ops' bytes are its count, nothing is left unattributed."""
  train = compiled.programs.train
  total = xlacost.cost_analysis(train)["bytes accessed"]
  text = train.as_text()
  ops = hloops.from_text(text)
  b = hbm.breakdown(ops, total)
  assert sum(b.parts.values()) == pytest.approx(total)
  assert abs(b.unattributed) <= 1e-3 * total, b.parts
  assert b.parts[hbm.MATMULS] > 0 and b.parts[hbm.OPTIMIZER] > 0, b.parts
  assert b.parts[hbm.OTHER] < 0.05 * total, b.parts
  if "attention" in text:  # the transformers: their scores and masks found
    assert b.parts[hbm.ATTENTION] > 0 and b.layers >= 2, b.parts
