"""The space-to-depth stem against the plain one (`model.stem=space_to_depth` vs `imagenet`):
ResNet-50's and SSD's 7x7/2 first convolution as a 4x4/1 convolution over 2x2 blocks of
pixels folded into 12 channels (issue 47).

Two measurements, each side by side in one run:

- `--tpu` (no TPU needed; libtpu compiles): each full config's train step compiled for its
  slice as `mlbench check --topology` compiles it, once per stem: XLA's estimate of the step
  (`optimal_seconds`, corrected for the -1 s libtpu books for each "ConcatBitcast" custom
  call, which made `check` print no estimate for ResNet-50 on v4) and the ratio; and the
  first convolution's share of the step: the stem convolution alone (its forward and its
  kernel's gradient, which is all training computes of it: the image needs none), compiled
  for one chip of the slice at the same per-chip batch and precision with the model's own
  layers (`flax.linen.Conv`, `workloads.common.blocks.SpaceToDepthConv`), its estimate over
  the step's.
- Without `--tpu`: train-step images/s on one local device, alternating rounds.
  On a CPU the ResNet-50 mini with the ImageNet stem (`--set model.stem=...`; its own
  stem is the 3x3 one for 24x24 digits, which has no stride to fold); on a GPU or TPU
  ResNet-50's full config in bfloat16 at `--batch` (256) a device, and the compiled
  torchvision peer's images/s for scale (`peers.py`, where torch is installed).

    python benchmarks/space_to_depth.py                 # train step on the local device
    python benchmarks/space_to_depth.py --tpu           # libtpu compiles, 5-15 min each here
    python benchmarks/space_to_depth.py --tpu --only resnet50

Goal (issue 47): the space-to-depth train step's TPU estimate no slower than the plain
one's (ratio <= 1.0).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import config_for, report, side_by_side

STEMS = ("imagenet", "space_to_depth")
# The slices Google's v0.7 submissions ran these full configs on (tpu-v4-128-TF).
TPU_CASES = {"resnet50": "v4-128", "ssd": "v4-128"}


def _estimate(compiled: Any) -> dict:
  """XLA's cost analysis of a compiled program, its estimate corrected: libtpu counts each
  "ConcatBitcast" custom call (the async slices it gathers weights and images with) as -1 s,
  an unknown cost (ResNet-50's train step on v4-128: 103 of them, an estimate of -102.965 s),
  so they are added back at no cost. Also the arguments' and temporaries' bytes."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  unknown = compiled.as_text().count('custom_call_target="ConcatBitcast"')
  mem = compiled.memory_analysis()
  return {"raw_seconds": cost["optimal_seconds"], "unknown_ops": unknown,
          "xla_seconds": cost["optimal_seconds"] + unknown, "flops": cost.get("flops"),
          "bytes_accessed": cost.get("bytes accessed"),
          "argument_bytes": mem.argument_size_in_bytes, "temp_bytes": mem.temp_size_in_bytes}


def step_costs(workload: str, topology: str, stem: str) -> dict:
  """The full config's train step with `model.stem=stem`, compiled for `topology` as
  `mlbench check --topology` compiles it (the same plan and programs), and its estimate."""
  import jax

  from mlbench.config import RunConfig
  from mlbench.pod import check, topology as topo
  from mlbench.train import steps as steps_lib
  from mlbench.train.plan import make_plan

  slice_ = topo.parse(topology)
  jax.config.update("jax_platforms", "cpu")  # host work on the CPU; libtpu compiles
  runtime = topo.runtime(slice_)
  rc, _ = check.fit_eval_batch(RunConfig(workload=workload, config="full",
                                         overrides=(f"model.stem={stem}",)),
                               len(runtime.devices))
  plan = make_plan(rc, runtime, machine=topo.machine(slice_, runtime.devices))
  p = steps_lib.compile_programs(plan.workload, plan.cfg, plan.schedule, plan.mesh, plan.ctx,
                                 plan.tx)
  return {"chips": slice_.chips, **_estimate(p.train)}


def stem_conv_alone(workload: str, topology: str, stem: str) -> dict:
  """XLA's estimate of the stem convolution alone on one chip of `topology`, at the full
  config's per-chip batch, in the model's dtype, with the model's own layer: the float32
  image (laid out as the step's argument) cast and convolved, and the kernel's gradient
  (all that training computes of this layer: the image needs none). The output and its
  cotangent are laid out as XLA likes (inside the step they are intermediates)."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.experimental.layout import Format, Layout

  from mlbench import config as config_lib
  from mlbench import registry
  from mlbench.pod import topology as topo
  from workloads.common import blocks, conv

  jax.config.update("jax_platforms", "cpu")
  _, cfg = config_lib.load(registry.get(workload), "full")
  slice_ = topo.parse(topology)
  batch = cfg.global_batch_size // slice_.chips
  size, dtype, width = cfg.data.image_size, jnp.dtype(cfg.model.dtype.value), 64
  layer = (blocks.SpaceToDepthConv(width, 7, blocks.he_normal, dtype)
           if stem == "space_to_depth" else
           nn.Conv(width, (7, 7), strides=2, padding=((3, 3), (3, 3)), use_bias=False,
                   dtype=dtype))

  def step(kernel, x_BHWC, dy_BHWC):
    # The model casts the float32 image to its dtype first (ResNet.__call__, SSD.__call__).
    out, vjp = jax.vjp(lambda k: layer.apply({"params": {"kernel": k}}, x_BHWC.astype(dtype)),
                       kernel)
    return out, vjp(dy_BHWC)[0]

  mesh = jax.sharding.Mesh(np.array(topo.devices(slice_)[:1]), ("d",))
  one = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  auto = Format(Layout.AUTO, one)
  out = -(-size // 2)
  args = (jax.ShapeDtypeStruct((7, 7, 3, width), jnp.float32, sharding=one),
          jax.ShapeDtypeStruct((batch, *conv.stem_input_shape(conv.Stem(stem), size, size)),
                               jnp.float32, sharding=one),
          jax.ShapeDtypeStruct((batch, out, out, width), dtype, sharding=one))
  compiled = jax.jit(step, in_shardings=(one, one, auto), out_shardings=(auto, one)).lower(
      *args).compile()
  return {"batch": batch, **_estimate(compiled)}


def _in_child(fn: str, *args: str) -> dict:
  """`fn(*args)` of this script in a process of its own (one libtpu compile each)."""
  done = subprocess.run([sys.executable, __file__, "--child", fn, *args], check=False,
                        capture_output=True, text=True, cwd=Path(__file__).parent)
  if done.returncode:
    return {"failed": (done.stderr.strip().splitlines() or ["?"])[-1][:200]}
  return json.loads(done.stdout.strip().splitlines()[-1])


def tpu(only: list[str] | None) -> None:
  """The TPU table: train-step estimates of both stems, their ratio, the stem's share."""
  print("| full config, slice | stem | train step (XLA's estimate) | stem conv alone (fwd + "
        "kernel grad) | its share | train step GFLOP a chip | arguments + temporaries GiB |\n"
        + "|---" * 7 + "|", flush=True)
  details = []
  for workload in only or TPU_CASES:
    topology = TPU_CASES[workload]
    times, stems = {}, {}
    for stem in STEMS:
      step = _in_child("step_costs", workload, topology, stem)
      alone = _in_child("stem_conv_alone", workload, topology, stem)
      details.append(f"# {workload} {stem}: step {json.dumps(step)}; stem conv {json.dumps(alone)}")
      head = f"| {workload}, {topology} | {stem} |"
      if "failed" in step or "failed" in alone:
        print(f"{head} failed: {step.get('failed') or alone.get('failed')} | | | | |")
        continue
      times[stem], stems[stem] = step["xla_seconds"], alone["xla_seconds"]
      print(f"{head} {1e3 * step['xla_seconds']:.3f} ms (raw {step['raw_seconds']:.3f} s, "
            f"{step['unknown_ops']} ConcatBitcast) | {1e3 * alone['xla_seconds']:.4f} ms "
            f"(batch {alone['batch']} a chip) | {alone['xla_seconds'] / step['xla_seconds']:.2%} "
            f"| {step['flops'] / 1e9:,.1f} | "
            f"{(step['argument_bytes'] + step['temp_bytes']) / 2**30:.2f} |", flush=True)
    if len(times) == 2:
      print(f"| {workload}, {topology} | space_to_depth / imagenet | "
            f"**{times['space_to_depth'] / times['imagenet']:.4f}x** | "
            f"{stems['space_to_depth'] / stems['imagenet']:.4f}x | | | |", flush=True)
  print("\n".join(details))


def local_step(batch: int, steps: int, rounds: int) -> None:
  """Train-step images/s of both stems on one local device, alternating rounds."""
  from mlbench.train import runtime

  runtime.setup()
  import jax
  import numpy as np

  from mlbench.train import mesh as mesh_lib, steps as steps_lib
  from mlbench.workload import Split, StepContext

  device = jax.devices()[0]
  on_cpu = device.platform == "cpu"
  config, precision = ("mini", "float32") if on_cpu else ("full", "bfloat16")
  mesh = mesh_lib.make_mesh({"data": 1}, devices=[device])
  ready = {}
  for stem in STEMS:
    w, cfg = config_for("resnet50", config, precision, None if on_cpu else batch,
                        (f"model.stem={stem}",))
    sched = w.schedule(cfg)
    p = steps_lib.compile_programs(w, cfg, sched, mesh, StepContext(mesh=mesh),
                                   w.optimizer(cfg, sched))
    gbs = sched.global_batch_size
    x = mesh_lib.to_global(w.synthetic_batch(cfg, Split.TRAIN, gbs, np.random.default_rng(0)),
                           p.batch_sharding, gbs)
    ready[stem] = (p, [p.init_state(0)], x, gbs)
  print(f"# {device.device_kind}: resnet50 {config} ({precision}, batch "
        f"{ready['imagenet'][3]}), {steps} steps a round")

  def run(stem):
    def fn() -> float:
      p, state, x, gbs = ready[stem]
      s, sums = state[0], p.fresh_sums()
      for _ in range(steps):
        s, sums = p.train(s, sums, x)
      jax.block_until_ready(s)
      state[0] = s
      return steps * gbs
    return fn

  for stem in STEMS:  # compile-time warm-up outside the timed rounds
    run(stem)()
  results = side_by_side({stem: run(stem) for stem in STEMS}, rounds)
  ratio = report(results, "images/s", "imagenet", "space_to_depth")
  print(f"RESULT space_to_depth/imagenet images/s on {device.platform}: {ratio:.3f}x")
  if not on_cpu:
    _peer(batch, steps)


def _peer(batch: int, steps: int) -> None:
  """The compiled torchvision ResNet-50's images/s at the same batch (peers.py)."""
  import peers

  if not peers.available():
    print("# torchvision peer skipped: torch and torchvision are not installed")
    return
  cmd = [sys.executable, "peers.py", "--workload", "resnet50", "--config", "full",
         "--precision", "bfloat16", "--batch", str(batch), "--steps", str(steps)]
  done = subprocess.run(cmd, check=False, capture_output=True, text=True,
                        cwd=Path(__file__).parent)
  lines = done.stdout.strip().splitlines()
  said = lines[-1] if done.returncode == 0 and lines else done.stderr[-300:]
  print(f"# torchvision peer: {said}")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--tpu", action="store_true", help="compile the full configs with libtpu")
  ap.add_argument("--only", action="append", choices=list(TPU_CASES), help="with --tpu")
  ap.add_argument("--batch", type=int, default=256, help="a device's batch on a GPU or TPU")
  ap.add_argument("--steps", type=int, default=60, help="train steps a round")
  ap.add_argument("--rounds", type=int, default=7)
  ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)  # one compile, JSON out
  args = ap.parse_args()
  if args.child:
    fn, *rest = args.child
    print(json.dumps({"step_costs": step_costs, "stem_conv_alone": stem_conv_alone}[fn](*rest)))
  elif args.tpu:
    tpu(args.only)
  else:
    local_step(args.batch, args.steps, args.rounds)


if __name__ == "__main__":
  main()
