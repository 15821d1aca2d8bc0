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
`FULL_BATCH` table of common.py; `--batch` overrides it); MoE and Llama 3.1 8B run with fewer
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
from typing import Any

from common import config_for

WORKLOADS = ("resnet50", "bert", "transformer", "ssd", "moe", "llama31_8b")

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
  gbs, rows = sched.global_batch_size, sched.rows()  # rows < gbs where a step packs (BERT)
  batch = mesh_lib.to_global(w.synthetic_batch(cfg, Split.TRAIN, rows, np.random.default_rng(0)),
                             p.batch_sharding, rows)
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
  return {"batch": gbs, "rows": rows, "step_ms": 1e3 * step_s, "samples_per_s": gbs / step_s,
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
  ap.add_argument("--attention", action="append", choices=("auto", "xla", "cudnn", "pallas"),
                  help="repeatable: rows per attention implementation (model.attention) of "
                       "the attention workloads [default: auto]")
  ap.add_argument("--no-peers", action="store_true",
                  help="skip the PyTorch peers (benchmarks/peers.py; run where torch, "
                       "torchvision and transformers are installed)")
  ap.add_argument("--compile-cache", default="off", metavar="DIR|off",
                  help="JAX's persistent compilation cache: off (the default here, so the "
                       "compile column measures compiles) or a folder")
  args = ap.parse_args()
  names = args.workload or WORKLOADS
  precisions = args.precision or ("bfloat16", "float32")
  # The peers first, each in its own process, before JAX takes the accelerator's memory.
  peer_rows = {} if args.no_peers else run_peers(names, precisions, args)

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
    print("| workload | config | precision | attention | batch | step ms | samples/s | "
          "GFLOP/example | MFU | x bf16 matmul | compile s | step GB |\n" + "|---" * 12 + "|")
  for name in names:
    for precision in precisions:
      for attention in _attentions(name, args.attention):
        row = _row(name, config, precision, attention, args, peak.flops_per_s, bf16)
        _print_row(row, args.json)
        peer = peer_rows.get((name, precision))
        if peer and row.get("samples_per_s"):
          _print_peer(peer | {"workload": name, "precision": precision}, row,
                      peak.flops_per_s, args.json)


ATTENTION = ("bert", "transformer", "moe", "llama31_8b")  # workloads with model.attention


def _attentions(name: str, wanted: list[str] | None) -> list[str | None]:
  return list(wanted or ["auto"]) if name in ATTENTION else [None]


def _row(name: str, config: str, precision: str, attention: str | None, args: Any,
         peak: float, bf16: float) -> dict:
  """One measured row, or one that says why it failed (e.g. out of memory)."""
  more = () if attention is None else (f"model.attention={attention}",)
  row = {"workload": name, "config": config, "precision": precision,
         "attention": attention or "-"}
  try:
    w, cfg = config_for(name, config, precision, args.batch, more)
    row |= time_step(w, cfg, args.steps, args.warmup)
  except Exception as e:  # One row's failure must not end the table.
    return row | {"failed": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
  rate = row["samples_per_s"] * row["flops_per_example"]
  return row | {"mfu": rate / peak, "vs_bf16_matmul": rate / bf16}


def _print_row(row: dict, as_json: bool) -> None:
  if as_json:
    print(json.dumps(row), flush=True)
    return
  head = f"| {row['workload']} | {row['config']} | {row['precision']} | {row['attention']} |"
  if "failed" in row:
    print(f"{head} | failed: {row['failed']} |", flush=True)
    return
  gb = "" if row["step_bytes"] is None else f"{row['step_bytes'] / 1e9:.2f}"
  print(f"{head} {row['batch']} | {row['step_ms']:.1f} | {row['samples_per_s']:,.1f} | "
        f"{row['flops_per_example'] / 1e9:,.3f} | {100 * row['mfu']:.1f}% | "
        f"{row['vs_bf16_matmul']:.3f} | {row['compile_s']:.0f} | {gb} |", flush=True)


def _print_peer(peer: dict, row: dict, peak: float, as_json: bool) -> None:
  """The peer's row, with its MFU from mlbench's analytic FLOPs and mlbench's ratio to it."""
  if "failed" in peer:
    print(f"| {peer['workload']} peer | | {peer['precision']} | | failed: {peer['failed']} |")
    return
  peer = peer | {"mfu": peer["samples_per_s"] * row["flops_per_example"] / peak,
                 "mlbench_over_peer": row["samples_per_s"] / peer["samples_per_s"]}
  if as_json:
    print(json.dumps(peer), flush=True)
    return
  gb = "" if peer["peak_bytes"] is None else f"{peer['peak_bytes'] / 1e9:.2f}"
  print(f"| {peer['peer']} (torch {peer['torch']}, compiled) | | {peer['precision']} | | "
        f"{peer['batch']} | {peer['step_ms']:.1f} | {peer['samples_per_s']:,.1f} | | "
        f"{100 * peer['mfu']:.1f}% | mlbench / peer: **{peer['mlbench_over_peer']:.2f}x** | "
        f"{peer['compile_s']:.0f} | {gb} |", flush=True)


def run_peers(names: list[str], precisions: tuple[str, ...], args: Any) -> dict:
  """{(workload, precision): the PyTorch peer's row} from `peers.py` subprocesses; empty
  where torch, torchvision or transformers is missing."""
  import subprocess
  import sys
  from pathlib import Path

  import peers

  if not peers.available():
    print("# peers skipped: PyTorch, torchvision and transformers are not all installed")
    return {}
  here, out = Path(__file__).parent, {}
  config = args.config or _default_config()
  for name in (n for n in names if n in peers.PEERS):
    for precision in precisions:
      cmd = [sys.executable, str(here / "peers.py"), "--workload", name, "--config", config,
             "--precision", precision, "--steps", str(args.steps), "--warmup", str(args.warmup)]
      if args.batch:
        cmd += ["--batch", str(args.batch)]
      done = subprocess.run(cmd, capture_output=True, text=True, cwd=here)
      lines = done.stdout.strip().splitlines()
      out[name, precision] = (json.loads(lines[-1]) if done.returncode == 0 and lines else
                              {"failed": (done.stderr.strip().splitlines() or ["?"])[-1][:160]})
  return out


def _default_config() -> str:
  """full where an accelerator is attached (the runtime's test), else mini."""
  from mlbench.train import runtime

  return "full" if runtime._accelerator_attached() else "mini"


if __name__ == "__main__":
  main()
