"""Golden losses: 20 seeded train steps of every mini config on 8 CPU devices, against the
losses checked in under tests/data/losses/<workload>.json.

A change meant to be numerically neutral (a refactor, plumbing) must reproduce them; a
change meant to alter the numbers (a model, an initialiser, an optimizer, what a synthetic
batch holds) rewrites them, and says why in its commit message:

    MLBENCH_GOLDEN=write pytest tests/workloads/test_golden_losses.py

Each file states its tolerance, per step (`rtol`). On the machine that wrote them the steps
repeat to the bit; another CPU vectorises float sums in another order, and a loss that is
chaotic in 20 steps (ResNet's and SSD's batch norm on random data) amplifies the rounding
differences step by step. So `rtol[i]` is ten times the largest relative difference that
summing in another order gave up to step i when the file was written (the same steps on 4
devices instead of 8), rounded up, and at least 1e-6: tight early, looser where the
workload itself diverges. The 8-device programs are the ones `test_every_workload.py`
compiles (tests/workloads/conftest.py), so checking costs the 20 steps of each workload:
42 s for all eight, measured on the 2-core machine while other jobs shared it (bert 12 s,
transformer and efficientnet 6, llama31_8b and moe 5, resnet50 4, ssd 2.6, vit 1.5).
Writing compiles the 4-device programs too.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import jax
import numpy as np
from mlbench.workload import Split

LOSSES = Path(__file__).parents[1] / "data" / "losses"
STEPS, SEED, OTHER_DEVICES = 20, 0, 4
MIN_RTOL = 1e-6


def seeded_losses(compiled) -> list[float]:
  """The losses of STEPS train steps from the state of SEED, each on a fresh synthetic batch
  drawn from one generator seeded with SEED."""
  w, cfg, sched = compiled.workload, compiled.cfg, compiled.schedule
  state, rng, out = compiled.fresh_state(SEED), np.random.default_rng(SEED), []
  for _ in range(STEPS):
    batch = w.synthetic_batch(cfg, Split.TRAIN, sched.global_batch_size, rng)
    state, sums = compiled.train(state, batch)
    out.append(float(jax.device_get(sums)["loss"]))
  return out


def _round_up(x: float) -> float:
  """x rounded up to one significant digit (3.2e-06 -> 4e-06)."""
  scale = 10.0 ** math.floor(math.log10(x))
  return float(f"{math.ceil(round(x / scale, 9)) * scale:.0e}")


def tolerances(losses: list[float], reordered: list[float]) -> list[float]:
  """Per step: 10x the largest relative difference so far, rounded up, at least MIN_RTOL."""
  diff = np.maximum.accumulate(np.abs(np.subtract(reordered, losses)) / np.abs(losses))
  return [_round_up(max(MIN_RTOL, 10 * float(d))) for d in diff]


def _write(path: Path, compiled, compile_workload, losses: list[float]) -> None:
  w = compiled.workload
  reordered = seeded_losses(compile_workload(w, jax.devices()[:OTHER_DEVICES]))
  doc = {"workload": w.name, "config": "mini", "devices": jax.device_count(), "seed": SEED,
         "steps": STEPS, "loss": losses, "rtol": tolerances(losses, reordered),
         "rtol_from": f"10x the relative difference to the same steps on {OTHER_DEVICES} "
                      f"devices, so far, rounded up, at least {MIN_RTOL}"}
  path.write_text(json.dumps(doc, indent=1) + "\n")


def off_golden(losses: list[float], golden: dict) -> list[tuple[int, float, float, float]]:
  """(step, got, golden, rtol) of every step whose loss is off the golden one."""
  return [(i, got, want, tol) for i, (got, want, tol)
          in enumerate(zip(losses, golden["loss"], golden["rtol"], strict=True))
          if abs(got - want) > tol * abs(want)]


def test_twenty_seeded_steps_give_the_golden_losses(compiled, compile_workload):
  name = compiled.workload.name
  path = LOSSES / f"{name}.json"
  losses = seeded_losses(compiled)
  if os.environ.get("MLBENCH_GOLDEN") == "write":
    _write(path, compiled, compile_workload, losses)
  assert path.exists(), (f"no golden losses for {name}: write them with "
                         "MLBENCH_GOLDEN=write pytest tests/workloads/test_golden_losses.py")
  golden = json.loads(path.read_text())
  assert (golden["devices"], golden["seed"], golden["steps"]) == (jax.device_count(), SEED, STEPS)
  off = off_golden(losses, golden)
  assert not off, (f"{name}: seeded steps changed the loss, (step, got, golden, rtol): {off}; "
                   "if the change is meant to, rewrite tests/data/losses (see this module) "
                   "and say why in the commit")


def test_the_tpu_attention_kernels_give_the_golden_losses(compile_workload):
  # Llama's mini (causal grouped-query attention over 256 tokens, no dropout) with the Pallas
  # splash kernel, run by Pallas's TPU interpreter under shard_map over the 8 devices,
  # trains the same 20 steps as XLA's attention: the kernel is a drop-in on a TPU.
  from mlbench import registry

  kernels = compile_workload(registry.get("llama31_8b"), sets=("model.attention=pallas",))
  assert {u.choice.implementation.value for u in kernels.programs.attention} == {"pallas"}
  golden = json.loads((LOSSES / "llama31_8b.json").read_text())
  off = off_golden(seeded_losses(kernels), golden)
  assert not off, f"(step, got, golden, rtol): {off}"
