"""Weight-update sharding vs replicated data parallelism: step time and optimizer memory.

The same workload and optimizer on 8 simulated CPU devices, compiled twice: once
replicated, once with the optimizer state and update sharded over the data
replicas (--weight-update-sharding). Per-device optimizer-state bytes come from
the state's shardings; step time is measured side by side. Goals: state <= 1/8
of replicated + 3%; step time <= 1.0x replicated.

    python benchmarks/weight_update_sharding.py [--workload resnet50] [--steps 30]
"""

from __future__ import annotations

import argparse

from common import report, side_by_side


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--workload", default="resnet50")
  ap.add_argument("--steps", type=int, default=30)
  ap.add_argument("--rounds", type=int, default=5)
  args = ap.parse_args()

  from mlbench.train import runtime

  rt = runtime.setup(cpu_devices=8)
  import jax
  import numpy as np

  from mlbench.train import mesh as mesh_lib, steps
  from mlbench import registry
  from mlbench.workload import Split, StepContext

  w = registry.get(args.workload)
  cfg = w.configs["mini"]()
  sched = w.schedule(cfg)
  mesh = mesh_lib.make_mesh(devices=rt.devices)
  ctx = StepContext(mesh=mesh)
  batches = [w.synthetic_batch(cfg, Split.TRAIN, sched.global_batch_size,
                               np.random.default_rng(i)) for i in range(4)]
  compiled, states, device_batches = {}, {}, {}
  for name, wus in (("replicated", False), ("sharded", True)):
    p = steps.compile_programs(w, cfg, sched, mesh, ctx, w.optimizer(cfg, sched),
                               weight_update_sharding=wus)
    compiled[name], states[name] = p, [p.init_state(0)]
    device_batches[name] = [mesh_lib.to_global(b, p.batch_sharding, sched.global_batch_size)
                            for b in batches]

  def run(name):
    def fn() -> float:
      p, s, sums = compiled[name], states[name][0], compiled[name].fresh_sums()
      for i in range(args.steps):
        s, sums = p.train(s, sums, device_batches[name][i % len(batches)])
        jax.block_until_ready(s)  # As the harness steps on simulated devices.
      states[name][0] = s
      return args.steps
    return fn

  for name in compiled:
    run(name)()
  rep, shd = compiled["replicated"], compiled["sharded"]
  print(f"weight-update sharding: {w.name} mini, {len(rt.devices)} devices, global batch "
        f"{sched.global_batch_size}, {args.steps} steps per round")
  print(f"  optimizer state per device: replicated {rep.opt_state_bytes:,} B, sharded "
        f"{shd.opt_state_bytes:,} B")
  memory = shd.opt_state_bytes / rep.opt_state_bytes
  speed = report(side_by_side({"replicated": run("replicated"), "sharded": run("sharded")},
                              args.rounds), "steps/s", "replicated", "sharded")
  print(f"RESULT optimizer-state bytes sharded/replicated = {memory:.4f} "
        f"(goal <= {1 / 8 * 1.03:.4f}); step time sharded/replicated = {1 / speed:.3f} "
        "(goal <= 1.0)")


if __name__ == "__main__":
  main()
