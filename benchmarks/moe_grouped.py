"""The dropless MoE layer on grouped matmuls against GShard's capacity dispatch by einsums,
at gpt_oss_20b's sizes and the same tokens (issue 56).

gpt-oss's MoE: width M 2,880, 32 experts of SwiGLU width F 2,880, top-4. Both layers
route the same way (top 4 of the float32 logits, their gates a softmax over the four) and
run the same SwiGLU experts in bfloat16 with float32 parameters; they differ in how the
tokens reach the experts:
- dropless (`workloads.common.dropless_moe`): the N x 4 assignments sorted by expert,
  gathered, three grouped matmuls (megablox `gmm` on TPUs, `ragged_dot` elsewhere), and
  gathered back: N x 4 rows of expert work, none dropped;
- capacity (`workloads.moe.layer.moe_ffn`, GShard's; one routing group per 8,192-token
  sequence): one-hot dispatch and combine tensors [S, E, C] and einsums with them,
  C = ceil(1.25 x 4 x S / 32) slots per expert: 1.25 x N x 4 rows of expert work, the
  tokens over capacity dropped.
Each program is the layer's forward and backward (gradients of every input and
parameter, as a train step computes them) at `--tokens` a device.

`--tpu`: each program compiled with libtpu for one chip of a v5p slice (no TPU needed)
in a process of its own: XLA's estimate of its run time (`optimal_seconds`, corrected as
`mlbench check` corrects it, `mlbench/pod/xlacost.py`: a Pallas kernel that declares no
cost makes it "none"), its FLOPs, bytes accessed and temporaries. With `--chips N`,
also on N chips (N x the tokens): expert parallel (mesh `expert=N`: the tokens travel to
their experts by all-to-all) and FSDP (mesh `data=N`: the experts' weights travel).
Without `--tpu`: CPU, XLA: the programs' FLOPs and bytes from XLA's CPU cost analysis and
their wall time, side by side in alternating rounds, at `--cpu-tokens` and widths cut to
`--cpu-width` (a quarter of gpt-oss's; the experts, top-k and routing kept), dropless with
the CPU's grouped matmul, `chunked` (see CPU_VARIANTS). XLA's CPU cost analysis counts a
loop's body once: the chunked loop's FLOPs are its per-chunk FLOPs.

    python benchmarks/moe_grouped.py --tpu                 # 1-3 min per compile here
    python benchmarks/moe_grouped.py --tpu --chips 4
    python benchmarks/moe_grouped.py                       # CPU, 2,048 tokens, width 720
    python benchmarks/moe_grouped.py --tpu --case moe     # workloads/moe's full sizes

Goal (issue 56): the grouped-matmul layer's step estimate at least 1.3x faster than the
capacity einsum's at capacity factor 1.25, with the same tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import report, side_by_side

@dataclasses.dataclass(frozen=True)
class Case:
  """A MoE layer's sizes: width, expert width, experts, top-k, sequence, gated (SwiGLU) or
  ReLU experts."""

  m: int
  f: int
  e: int
  k: int
  seq: int
  gated: bool


CASES = {
    "gpt_oss_20b": Case(2880, 2880, 32, 4, 8192, True),
    # workloads/moe's full config (GShard's MoE(64E) at width 1024): is dropless faster there?
    "moe": Case(1024, 8192, 64, 2, 1024, False),
}
VARIANTS = ("dropless gmm", "dropless ragged_dot", "capacity 1.25", "capacity 1.0")
CPU_VARIANTS = ("dropless chunked", "capacity 1.25", "capacity 1.0")
"""On the CPU: `chunked` is the CPU's grouped matmul; XLA's CPU ragged_dot runs every
expert on every row (E times the FLOPs: hours here at these widths), gmm its interpreter."""


def layer_step(variant: str, batch: int, mesh: Any, case: Case) -> tuple[Any, tuple]:
  """(fn, abstract args): the layer's forward and backward at `batch` sequences (a scalar
  of the output, so every gradient flows)."""
  import jax
  import jax.numpy as jnp

  from workloads.common import dropless_moe
  from workloads.common.grouped_matmul import Grouped
  from workloads.moe import layer

  c = case
  act = jax.nn.silu if c.gated else jax.nn.relu

  def run(x, router, wi_gate, wi_up, wo):
    wi_gate = wi_gate if c.gated else None
    if variant.startswith("dropless"):
      kernel = Grouped(variant.split()[1])
      y = dropless_moe.dropless_ffn(x, router, wi_gate, wi_up, wo, k=c.k, mesh=mesh,
                                    grouped=kernel, activation=act)
    else:
      y, _ = layer.moe_ffn(x, router, wi_up, wo, k=c.k, mesh=mesh, activation=act,
                           capacity_factor=float(variant.split()[1]), wi_gate_EMF=wi_gate)
    return jnp.sum(y.astype(jnp.float32) * jnp.linspace(-1, 1, c.m))

  fn = jax.value_and_grad(run, argnums=tuple(range(5)))
  shapes = [((batch, c.seq, c.m), jnp.bfloat16), ((c.m, c.e), jnp.float32),
            ((c.e, c.m, c.f) if c.gated else (1,), jnp.float32), ((c.e, c.m, c.f), jnp.float32),
            ((c.e, c.f, c.m), jnp.float32)]
  return fn, shapes


def tpu_costs(variant: str, topology: str, chips: str, tokens: str, axis: str,
              case: str) -> dict:
  """Compiles `variant` for `chips` chips of `topology` with libtpu, the tokens and the
  experts' weights split over mesh axis `axis` (`expert`: expert parallel; `data`: FSDP,
  every chip runs every expert on its tokens); XLA's estimate, FLOPs, bytes."""
  import jax
  from jax.sharding import NamedSharding, PartitionSpec as P

  from mlbench.pod import topology as topo
  from mlbench.train import mesh as mesh_lib

  jax.config.update("jax_platforms", "cpu")  # host work on the CPU; libtpu compiles
  n = int(chips)
  devices = topo.devices(topo.parse(topology))[:n]
  mesh = mesh_lib.make_mesh({axis: n}, devices=devices)
  c = CASES[case]
  fn, shapes = layer_step(variant, n * int(tokens) // c.seq, mesh, c)
  specs = [P(axis) if n > 1 and i != 1 and (i != 2 or c.gated) else P() for i in range(5)]
  args = [jax.ShapeDtypeStruct(s, d, sharding=NamedSharding(mesh, spec))
          for (s, d), spec in zip(shapes, specs)]
  lowered = jax.jit(fn).lower(*args)
  return {"chips": n, **_estimate(lowered, lowered.compile())}


def _estimate(lowered: Any, compiled: Any) -> dict:
  """XLA's cost analysis, its estimate corrected as `mlbench check` corrects it. Where
  jaxlib cannot re-read the compiled program (libtpu's async ops; the module proto fails
  alike), the Pallas kernels and whether they declare a cost are read from the lowered
  program instead (XLA's own kernels, such as its ragged dot's, are not in it)."""
  from mlbench.pod import xlacost

  cost = xlacost.cost_analysis(compiled)
  try:
    calls = xlacost.custom_calls(compiled.as_text())
  except Exception:  # jaxlib fails to re-read some libtpu programs (async ops)
    kernels = [line for line in lowered.as_text().splitlines() if "@tpu_custom_call" in line]
    calls = xlacost.CustomCalls(0, sum("cost_estimate" not in line for line in kernels))
  est = xlacost.estimate(cost.get("optimal_seconds"), calls)
  mem = compiled.memory_analysis()
  return {"xla_seconds": est.seconds, "raw_seconds": est.raw_seconds, "note": est.note,
          "flops": cost.get("flops"), "bytes": cost.get("bytes accessed"),
          "temp_bytes": mem.temp_size_in_bytes, "argument_bytes": mem.argument_size_in_bytes}


def _in_child(*args: str) -> dict:
  done = subprocess.run([sys.executable, __file__, "--child", *args], check=False,
                        capture_output=True, text=True, cwd=Path(__file__).parent)
  if done.returncode:
    return {"failed": (done.stderr.strip().splitlines() or ["?"])[-1][:200]}
  return json.loads(done.stdout.strip().splitlines()[-1])


def tpu(topology: str, tokens: int, chips: int, case: str) -> None:
  print(f"# {case}: {CASES[case]}")
  print(f"| {topology} chips (mesh), tokens a chip | layer (fwd + bwd) | XLA's estimate | raw "
        "estimate | TFLOP | GB accessed | temporaries GiB |\n" + "|---" * 7 + "|", flush=True)
  layouts = [(1, "data")] + ([(chips, "expert"), (chips, "data")] if chips > 1 else [])
  for n, axis in layouts:
    times, where = {}, f"{n}{f' ({axis}={n})' if n > 1 else ''}, {tokens:,}"
    for variant in VARIANTS:
      r = _in_child("tpu_costs", variant, topology, str(n), str(tokens), axis, case)
      print(f"# {variant}, {n} chips, {axis}: {json.dumps(r)}", file=sys.stderr, flush=True)
      head = f"| {where} | {variant} |"
      if "failed" in r:
        print(f"{head} failed: {r['failed']} | | | | |", flush=True)
        continue
      est = "none" if r["xla_seconds"] is None else f"{1e3 * r['xla_seconds']:.2f} ms"
      times[variant] = r["xla_seconds"]
      print(f"{head} {est} | {1e3 * r['raw_seconds']:.2f} ms | {r['flops'] / 1e12:.2f} | "
            f"{r['bytes'] / 1e9:.1f} | {r['temp_bytes'] / 2**30:.2f} |", flush=True)
    if times.get("dropless gmm") and times.get("capacity 1.25"):
      print(f"| {where} | capacity 1.25 / dropless gmm | "
            f"**{times['capacity 1.25'] / times['dropless gmm']:.2f}x** | | | | |", flush=True)


def cpu(tokens: int, rounds: int, case: str, width: int) -> None:
  """FLOPs and bytes from XLA's CPU cost analysis, and wall time side by side, with the
  widths M and F cut to `width` (the experts, k and routing as the case's): gpt-oss's
  float32 weights and their gradients alone are 6.4 GB, more than this shared box gives
  one job."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from mlbench.pod import xlacost

  rng = np.random.default_rng(0)
  ready = {}
  for variant in CPU_VARIANTS:
    c = CASES[case]
    fn, shapes = layer_step(variant, 1, None, dataclasses.replace(
        c, m=width or c.m, f=width or c.f, seq=tokens))
    args = [jnp.asarray(rng.normal(size=s) * (1.0 if i == 0 else 0.02), d)
            for i, (s, d) in enumerate(shapes)]
    compiled = jax.jit(fn).lower(*args).compile()
    cost = xlacost.cost_analysis(compiled)
    print(f"# {variant}: {tokens} tokens, width {width or c.m}, "
          f"{cost.get('flops', 0) / 1e9:,.1f} GFLOP, "
          f"{cost.get('bytes accessed', 0) / 1e9:,.2f} GB accessed (XLA CPU)", flush=True)
    jax.block_until_ready(compiled(*args))
    ready[variant] = (compiled, args)

  def timed(variant):
    def run() -> float:
      compiled, args = ready[variant]
      jax.block_until_ready(compiled(*args))
      return float(tokens)
    return run

  results = side_by_side({v: timed(v) for v in ready}, rounds)
  ratio = report(results, "tokens/s", "capacity 1.25", "dropless chunked")
  print(f"RESULT dropless/capacity 1.25 tokens/s on the CPU: {ratio:.3f}x")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--tpu", action="store_true", help="compile for a v5p slice with libtpu")
  ap.add_argument("--topology", default="v5p-8")
  ap.add_argument("--case", choices=list(CASES), default="gpt_oss_20b")
  ap.add_argument("--tokens", type=int, default=0,
                  help="tokens a chip (a multiple of the sequence; default one sequence)")
  ap.add_argument("--chips", type=int, default=1,
                  help="also over N chips: expert parallel (expert=N) and FSDP (data=N)")
  ap.add_argument("--cpu-tokens", type=int, default=2048)
  ap.add_argument("--cpu-width", type=int, default=720, help="M = F on the CPU (0: the case's)")
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)  # one compile, JSON out
  args = ap.parse_args()
  if args.child:
    print(json.dumps(tpu_costs(*args.child[1:])))
  elif args.tpu:
    tpu(args.topology, args.tokens or CASES[args.case].seq, args.chips, args.case)
  else:
    cpu(args.cpu_tokens, args.rounds, args.case, args.cpu_width)


if __name__ == "__main__":
  main()
