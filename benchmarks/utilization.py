"""Utilisation: a workload's model FLOP/s against a large matmul's FLOP/s, same process.

The matmul (2048x2048 float32, jitted) is what this machine can do; the model's
FLOP/s is XLA's count of the compiled train step times steps/s, on 8 simulated
CPU devices as the mini runs use. Goals: >= 0.3x for the ResNet-50 mini,
>= 0.5x for the BERT mini.

    python benchmarks/utilization.py [--workload resnet50] [--steps 20]
"""

from __future__ import annotations

import argparse

from common import side_by_side


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--workload", default="resnet50")
  ap.add_argument("--steps", type=int, default=20)
  ap.add_argument("--rounds", type=int, default=5)
  args = ap.parse_args()

  from mlbench.train import runtime

  rt = runtime.setup(cpu_devices=8)
  import jax
  import jax.numpy as jnp
  import numpy as np

  from mlbench.train import mesh as mesh_lib, steps
  from mlbench import registry
  from mlbench.workload import Split, StepContext

  w = registry.get(args.workload)
  cfg = w.configs["mini"]()
  sched = w.schedule(cfg)
  mesh = mesh_lib.make_mesh(devices=rt.devices)
  p = steps.compile_programs(w, cfg, sched, mesh, StepContext(mesh=mesh), w.optimizer(cfg, sched))
  flops_per_step = p.train_flops * len(rt.devices)
  batch = mesh_lib.to_global(w.synthetic_batch(cfg, Split.TRAIN, sched.global_batch_size,
                                               np.random.default_rng(0)),
                             p.batch_sharding, sched.global_batch_size)
  state = [p.init_state(0)]
  n = 2048
  a = jax.device_put(jnp.asarray(np.random.default_rng(1).standard_normal((n, n)), jnp.float32),
                     rt.devices[0])
  dot = jax.jit(lambda x: x @ x).lower(a).compile()

  def model() -> float:
    s, sums = state[0], p.fresh_sums()
    for _ in range(args.steps):
      s, sums = p.train(s, sums, batch)
      jax.block_until_ready(s)
    state[0] = s
    return args.steps * flops_per_step / 1e9

  def matmul() -> float:
    for _ in range(10):
      out = dot(a)
    jax.block_until_ready(out)
    return 10 * 2 * n ** 3 / 1e9

  model(), matmul()
  print(f"utilisation: {w.name} mini on {len(rt.devices)} devices, "
        f"{flops_per_step / 1e9:.2f} GFLOP per step (XLA count); matmul {n}x{n} float32")
  results = side_by_side({"matmul": matmul, "model": model}, args.rounds)
  for name, rows in results.items():
    print(f"  {name:>7}: " + ", ".join(f"{r[0]:.1f}" for r in rows)
          + " GFLOP/s (other processes: " + ", ".join(f"{r[2]:.2f}" for r in rows) + " cores)")
  ratios = sorted(m[0] / x[0] for m, x in zip(results["model"], results["matmul"]))
  print(f"RESULT model/matmul FLOP/s = {ratios[len(ratios) // 2]:.3f} (median of "
        f"{', '.join(f'{r:.3f}' for r in ratios)})")


if __name__ == "__main__":
  main()
