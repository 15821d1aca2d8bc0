"""Train-step speed per workload, precision and batch: step time, samples/s, MFU, and the
ratio of the model's FLOP/s to a bf16 matmul measured in the same process.

Each row compiles the workload's train step exactly as a run does
(`steps.compile_programs`, one device), feeds it the workload's synthetic batch
(no input pipeline in the way), runs `--warmup` steps, then times `--steps` steps
one at a time (`block_until_ready` each) and reports the median. Model FLOPs are the
workload's analytic count (`flops_per_example`, what every MFU mlbench reports
uses), so rows compare across backends. MFU is against the accelerator table's
dense bf16 peak, or on a CPU against this host's measured float32 matmul (as a
run's MFU is); "x bf16 matmul" is against an 8192^2 (CPU: 2048^2) bf16 matmul
timed in this process, the attainable peak. "step GB" is XLA's memory plan for the
compiled step (arguments, outputs and temporaries; donated buffers counted once).

    python benchmarks/accelerator_step.py                       # mini configs (CPU)
    python benchmarks/accelerator_step.py --config full         # on a GPU or TPU
    python benchmarks/accelerator_step.py --workload bert --precision bfloat16 --batch 32

On an accelerator the full configs run at one device's share of a batch (the
`FULL_BATCH` table; `--batch` overrides it); MoE and Llama 3.1 8B run with fewer
layers (`FULL_REDUCED`), which changes nothing per layer. Goals (issue 21, one
H100, bf16): BERT-large >= 45 % MFU (>= 600 samples/s at sequence 512), ResNet-50
>= 7,000 images/s, Transformer-big >= 40 % MFU at 256 x 256 tokens. On this CPU
the mini configs are the workload: model FLOP/s >= 0.3x the float32 matmul for
the ResNet-50 mini and >= 0.5x for the BERT mini.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

WORKLOADS = ("resnet50", "bert", "transformer", "ssd", "moe", "llama31_8b")

# One device's share of a normal global batch for each full config.
FULL_BATCH = {"resnet50": 256, "bert": 32, "transformer": 256, "ssd": 32, "moe": 16,
              "llama31_8b": 1}
# Full configs that do not fit one device for training, cut in depth only.
FULL_REDUCED = {"moe": ("model.num_layers=4",), "llama31_8b": ("model.num_layers=4",)}


def config_for(name: str, config: str, precision: str, batch: int | None):
  """The workload, its config at `precision` and the batch, with the full-config cuts."""
  from mlbench import config as config_lib, registry

  w = registry.get(name)
  _, cfg = config_lib.load(w, config)
  sets = [f"model.dtype={precision}"]
  if config == "full":
    sets += FULL_REDUCED.get(name, ())
    batch = batch or FULL_BATCH[name]
  if batch:
    sets.append(f"global_batch_size={batch}")
  return w, config_lib.override(cfg, sets)


def time_step(w, cfg, steps: int, warmup: int) -> dict:
  """Compiles the train step for one device and times it on a synthetic batch."""
  import jax
  import numpy as np

  from mlbench.train import mesh as mesh_lib, steps as steps_lib
  from mlbench.workload import Split, StepContext

  sched = w.schedule(cfg)
  mesh = mesh_lib.make_mesh({"data": 1}, devices=jax.devices()[:1])
  t0 = time.perf_counter()
  p = steps_lib.compile_programs(w, cfg, sched, mesh, StepContext(mesh=mesh),
                                 w.optimizer(cfg, sched))
  compile_s = time.perf_counter() - t0
  gbs = sched.global_batch_size
  batch = mesh_lib.to_global(w.synthetic_batch(cfg, Split.TRAIN, gbs, np.random.default_rng(0)),
                             p.batch_sharding, gbs)
  state, sums = p.init_state(0), p.fresh_sums()
  times = []
  for i in range(warmup + steps):
    t = time.perf_counter()
    state, sums = p.train(state, sums, batch)
    jax.block_until_ready(state)
    if i >= warmup:
      times.append(time.perf_counter() - t)
  step_s = statistics.median(times)
  mem = p.train.memory_analysis()  # XLA's plan for the step: what it must hold at once
  step_bytes = (mem.argument_size_in_bytes + mem.output_size_in_bytes
                - mem.alias_size_in_bytes + mem.temp_size_in_bytes) if mem else None
  return {"batch": gbs, "step_ms": 1e3 * step_s, "samples_per_s": gbs / step_s,
          "compile_s": compile_s, "step_bytes": step_bytes,
          "flops_per_example": steps_lib.flops_per_example(w, cfg, StepContext(mesh=mesh))}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--workload", action="append", choices=WORKLOADS,
                  help="repeatable [default: all]")
  ap.add_argument("--config", choices=("mini", "full"),
                  help="[default: full on an accelerator, mini on a CPU]")
  ap.add_argument("--precision", action="append", choices=("float32", "bfloat16"),
                  help="repeatable [default: bfloat16 and float32]")
  ap.add_argument("--batch", type=int, help="global batch (one device) [default: see FULL_BATCH; "
                                            "the mini config's own]")
  ap.add_argument("--steps", type=int, default=10)
  ap.add_argument("--warmup", type=int, default=3)
  ap.add_argument("--json", action="store_true", help="one JSON line per row instead of a table")
  ap.add_argument("--compile-cache", default="off", metavar="DIR|off",
                  help="JAX's persistent compilation cache: off (the default here, so the "
                       "compile column measures compiles) or a folder")
  args = ap.parse_args()

  from mlbench import config as config_lib
  from mlbench.train import mfu, runtime

  rt = runtime.setup(compile_cache=config_lib.compile_cache_dir(args.compile_cache))
  import jax

  device = jax.devices()[0]
  config = args.config or ("mini" if device.platform == "cpu" else "full")
  peak = mfu.peak([device])
  bf16 = mfu.measured_matmul_flops_per_s(2048 if device.platform == "cpu" else 8192, 10,
                                         "bfloat16")
  print(f"# {device.device_kind} ({len(rt.devices)} device(s), one used), jax {jax.__version__}; "
        f"peak {peak.flops_per_s / 1e12:,.2f} TFLOP/s ({peak.source}); bf16 matmul "
        f"{bf16 / 1e12:,.2f} TFLOP/s")
  if not args.json:
    print("| workload | config | precision | batch | step ms | samples/s | GFLOP/example | "
          "MFU | x bf16 matmul | compile s | step GB |\n" + "|---" * 11 + "|")
  for name in args.workload or WORKLOADS:
    for precision in args.precision or ("bfloat16", "float32"):
      w, cfg = config_for(name, config, precision, args.batch)
      try:
        row = time_step(w, cfg, args.steps, args.warmup)
      except Exception as e:  # One row's failure (e.g. out of memory) must not end the table.
        print(f"| {name} | {config} | {precision} | | failed: {type(e).__name__}: "
              f"{str(e).splitlines()[0][:120]} |")
        continue
      rate = row["samples_per_s"] * row["flops_per_example"]
      row |= {"workload": name, "config": config, "precision": precision,
              "mfu": rate / peak.flops_per_s, "vs_bf16_matmul": rate / bf16}
      if args.json:
        print(json.dumps(row))
        continue
      gb = "" if row["step_bytes"] is None else f"{row['step_bytes'] / 1e9:.2f}"
      print(f"| {name} | {config} | {precision} | {row['batch']} | {row['step_ms']:.1f} | "
            f"{row['samples_per_s']:,.1f} | {row['flops_per_example'] / 1e9:,.3f} | "
            f"{100 * row['mfu']:.1f}% | {row['vs_bf16_matmul']:.3f} | {row['compile_s']:.0f} | "
            f"{gb} |", flush=True)


if __name__ == "__main__":
  main()
