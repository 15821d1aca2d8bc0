"""Harness overhead: the mlbench training loop vs a bare jitted loop, same step, same data.

Both drive the same compiled ResNet-50 mini train step on 8 simulated CPU devices
over the same in-memory device batches; the difference is what the harness does
around each step (input iterator, transfer guard, metric accumulation, progress,
the per-step wait on simulated pods). Goal: >= 0.98x the bare loop's steps/s.

    python benchmarks/harness_overhead.py [--steps 60] [--rounds 5]
"""

from __future__ import annotations

import argparse
import itertools

from common import report, side_by_side


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--steps", type=int, default=60)
  ap.add_argument("--rounds", type=int, default=5)
  args = ap.parse_args()

  from mlbench.train import runtime

  rt = runtime.setup(cpu_devices=8)
  import jax
  import numpy as np

  from mlbench.train import loop, mesh as mesh_lib, steps
  from mlbench.train.progress import RunProgress
  from mlbench.workload import Split, StepContext
  from workloads.resnet50 import WORKLOAD, config

  cfg = config.mini()
  sched = WORKLOAD.schedule(cfg)
  mesh = mesh_lib.make_mesh(devices=rt.devices)
  programs = steps.compile_programs(WORKLOAD, cfg, sched, mesh, StepContext(mesh=mesh),
                                    WORKLOAD.optimizer(cfg, sched))
  rng = np.random.default_rng(0)
  host = [WORKLOAD.synthetic_batch(cfg, Split.TRAIN, sched.global_batch_size, rng)
          for _ in range(8)]
  device = [mesh_lib.to_global(b, programs.batch_sharding, sched.global_batch_size) for b in host]
  state = [programs.init_state(0)]

  def bare() -> float:
    s, sums = state[0], programs.fresh_sums()
    for i in range(args.steps):
      s, sums = programs.train(s, sums, device[i % len(device)])
    jax.block_until_ready(s)
    state[0] = s
    return args.steps

  def harness() -> float:
    batches = iter(itertools.cycle(zip(host, device)))
    with RunProgress(title="x", total_samples=1, train_examples=1, enabled=False) as progress:
      s, _, _ = loop._train_block(programs, state[0], batches, args.steps,
                                  sched.global_batch_size, progress, sync=rt.simulated_pod)
    jax.block_until_ready(s)
    state[0] = s
    return args.steps

  bare(), harness()  # Warm up both paths.
  print(f"harness overhead: ResNet-50 mini, global batch {sched.global_batch_size}, "
        f"{len(rt.devices)} devices, {args.steps} steps per round")
  ratio = report(side_by_side({"bare loop": bare, "mlbench loop": harness}, args.rounds),
                 "steps/s", "bare loop", "mlbench loop")
  print(f"RESULT harness/bare steps/s = {ratio:.3f} (goal >= 0.98)")


if __name__ == "__main__":
  main()
