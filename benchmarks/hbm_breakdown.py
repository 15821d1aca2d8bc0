"""Where the train step's HBM bytes go, and what the step is bound by (issue 54), side by side.

Compiles a full config (optionally reduced: fewer layers, a smaller slice and batch) for a
TPU slice with libtpu (`mlbench check --topology ... --json`, one fresh process per
variant, no TPU needed) and prints, per variant: the compute and HBM bounds, XLA's
corrected step estimate, the predicted step with the time model's terms (compute at the
fitted efficiency, the HBM term, fixed work, exposed collectives: below the ridge the
step follows the compute term, benchmarks/README.md), sequences/s and time to train, the train
step's temporaries, and its HBM bytes by kind (mlbench/pod/hbm.py: attention, matmuls,
norms and elementwise, embeddings and heads, the optimizer update, collectives, ...), with
the bytes a numbered layer adds. XLA counts a loop's body once: the last column gives the
bounds with the bytes of the loop's repeats and with no fewer FLOPs than the model's
(analytic) count, what the step runs (the predicted step stays on XLA's counts, as `check`
and the time model's calibration use them). Compiles are deterministic: a row saved by an
earlier commit (`--save`, `--compare FILE`) compares with one measured now.

Variants (`--variant`, repeatable; default: today and weight-update):
- today: the config as it is (attention on XLA where it drops out);
- weight-update: `--weight-update-sharding` (the optimizer's update sharded over the data
  axis: each chip updates 1/N of the weights, as the TPU submissions do);
- no-dropout: dropout 0 (a reference only, NOT the reference's math: the fused attention
  kernels then serve training, counted free where they declare no cost);
- NAME=ARGS: any `mlbench check` arguments, e.g. 'fused=--set model.attention=pallas'.

Presets (`--preset`): bert-2 and bert-4 (BERT-large, 2 or 4 layers, packed, v4-8, batch
256), bert (BERT-large on v4-128 at 3,072), transformer-2 (Transformer-big, 2+2 layers, v4-8,
batch 256), transformer (Transformer-big on v4-128 at 2,048); `--layers`, `--topology`,
`--batch` override a preset's. Goals (issue 54, packed BERT-large, v4-128, 3,072): the HBM
bound within 1.1x the compute bound and a predicted step <= 150 ms; Transformer-big: 1.3x
today's sequences/s.

  nice -n 10 python benchmarks/hbm_breakdown.py --preset bert-2 --save /tmp/bert2.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

MLBENCH = [sys.executable, "-c", "import sys; from mlbench.cli import main; sys.exit(main())"]
PRESETS = {
    "bert-2": ("bert", "v4-8", 256, 2), "bert-4": ("bert", "v4-8", 256, 4),
    "bert": ("bert", "v4-128", 3072, 0),
    "transformer-2": ("transformer", "v4-8", 256, 2),
    "transformer": ("transformer", "v4-128", 2048, 0),
}
VARIANTS = {
    "today": (),
    "weight-update": ("--weight-update-sharding",),
    "no-dropout": ("--set", "model.dropout=0.0"),
}
KINDS = ("attention, scores and probabilities", "attention, masks and bias",
         "dropout random bits", "matmuls", "norms and elementwise", "embeddings and heads",
         "optimizer update", "collectives", "other", "unattributed")
SHORT = ("attention", "masks", "random bits", "matmuls", "norms & elementwise",
         "embeddings & heads", "optimizer", "collectives", "other", "unattributed")


def layer_sets(workload: str, layers: int) -> tuple[str, ...]:
  if not layers:
    return ()
  if workload == "transformer":
    return (f"model.encoder_layers={layers}", f"model.decoder_layers={layers}")
  return (f"model.num_layers={layers}",)


def check(workload: str, topology: str, batch: int, layers: int, extra: tuple[str, ...]) -> dict:
  """check's JSON report of one variant, or {"failed": its last error line}."""
  args = ["check", workload, "--config", "full", "--topology", topology, "--json",
          "--set", f"global_batch_size={batch}", *extra]
  for s in layer_sets(workload, layers):
    args += ["--set", s]
  t0 = time.time()
  done = subprocess.run([*MLBENCH, *args], capture_output=True, text=True)
  if done.returncode:
    return {"failed": (done.stderr.strip().splitlines() or ["?"])[-1][:300]}
  report = json.loads(done.stdout[done.stdout.rfind("\n{") + 1:])  # check's spans lines
  report["compile_wall_s"] = time.time() - t0
  return report


def row(name: str, r: dict) -> dict:
  """What the tables show of one report."""
  train, p = r["programs"][0], r["prediction"]
  roof, b = p["roofline"], train["hbm"] or {}
  per_layer = {}
  if b.get("layers"):
    per_layer = {k: v / b["layers"] for k, v in b["in_layers"].items()}
  devices = 1
  for n in r["mesh"].values():
    devices *= n
  # XLA counts a loop's body once; check's bounds take its repeats' bytes and no fewer
  # FLOPs than the model's (the analytic count): what the step runs.
  return {"name": name, "compute_ms": 1e3 * roof["compute_s"], "hbm_ms": 1e3 * roof["hbm_s"],
          "devices": devices,
          "xla_flops": train["flops"], "model_flops": p["model_flops_per_step"],
          "xla_ms": None if train["xla_seconds"] is None else 1e3 * train["xla_seconds"],
          "xla_note": train["xla_note"], "step_ms": 1e3 * p["step_s"],
          "terms_ms": [1e3 * (p.get("terms") or {}).get(k, 0.0)
                       for k in ("compute_s", "memory_s", "fixed_s", "collective_s")],
          "samples_per_s": p["samples_per_s"], "ttt_min": (p["time_to_train_s"] or 0) / 60,
          "temp_gib": train["temp_bytes"] / 2**30, "hbm_gb": (b.get("total") or 0) / 1e9,
          "parts_gb": {k: v / 1e9 for k, v in (b.get("parts") or {}).items()},
          "per_layer_gb": {k: v / 1e9 for k, v in per_layer.items()},
          "layers": b.get("layers", 0), "between_memories_gb": b.get("between_memories", 0) / 1e9,
          "space0_gb": (b.get("by_memory_space") or {}).get("0", 0) / 1e9,
          "loop_repeats_gb": b.get("loop_repeats", 0) / 1e9,
          "top": b.get("top", [])[:8], "rows": r["rows_per_step"],
          "batch": r["global_batch_size"], "topology": r["topology"],
          "compile_wall_s": r.get("compile_wall_s")}


def print_tables(title: str, rows: list[dict]) -> None:
  print(f"\n{title}\n\n| variant | compute bound | HBM bound | HBM / compute | XLA's estimate "
        "| predicted step (compute at eta, HBM term, fixed, collectives) | sequences/s "
        "| time to train | temporaries |\n" + "|---" * 9 + "|")
  for r in rows:
    xla = f"{r['xla_ms']:.2f} ms" if r["xla_ms"] is not None else f"- ({r['xla_note'][:60]})"
    terms = ", ".join(f"{t:.1f}" for t in r.get("terms_ms", ()))
    terms = f" ({terms})" if terms else ""
    print(f"| {r['name']} | {r['compute_ms']:.2f} ms | {r['hbm_ms']:.2f} ms | "
          f"{r['hbm_ms'] / r['compute_ms']:.2f}x | {xla} | {r['step_ms']:.2f} ms{terms} | "
          f"{r['samples_per_s']:,.0f} | {r['ttt_min']:.2f} min | {r['temp_gib']:.2f} GiB |")
  print("\nHBM GB per device per step, by kind (XLA's count; per numbered layer in brackets)\n\n"
        "| variant | total | " + " | ".join(SHORT) + " | of all: between memories | in "
        "memory space 0 | loops' repeats (in the HBM bound) |\n" + "|---" * (len(SHORT) + 5) + "|")
  for r in rows:
    cells = []
    for k in KINDS:
      part = r["parts_gb"].get(k, 0.0)
      layer = r["per_layer_gb"].get(k)
      cells.append(f"{part:.2f}" + (f" ({layer:.2f})" if layer else ""))
    print(f"| {r['name']} | {r['hbm_gb']:.2f} | " + " | ".join(cells)
          + f" | {r['between_memories_gb']:.2f} | {r.get('space0_gb', 0):.2f} | "
          f"{r.get('loop_repeats_gb', 0):.2f} |")
  if rows:
    first = rows[0]
    for r in rows[1:]:
      print(f"RESULT {r['name']} vs {first['name']}: HBM bound {r['hbm_ms']:.2f} vs "
            f"{first['hbm_ms']:.2f} ms ({r['hbm_ms'] / first['hbm_ms']:.3f}x), predicted step "
            f"{r['step_ms']:.2f} vs {first['step_ms']:.2f} ms, sequences/s "
            f"{r['samples_per_s'] / first['samples_per_s']:.3f}x")


def print_top(rows: list[dict]) -> None:
  for r in rows:
    print(f"\nbiggest ops, {r['name']}:")
    for t in r["top"]:
      print(f"  {t['nbytes'] / 1e6:9.1f} MB  {t['kind']:36s} {t['op_name'][:90]}  "
            f"{t['outputs'][:60]}")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--preset", choices=sorted(PRESETS), default="bert-2")
  ap.add_argument("--layers", type=int,
                  help="layers (the Transformer: of each stack); 0: the config's")
  ap.add_argument("--topology")
  ap.add_argument("--batch", type=int)
  ap.add_argument("--variant", action="append",
                  help=f"{', '.join(VARIANTS)} or NAME=ARGS (check arguments); repeatable")
  ap.add_argument("--save", help="append the rows to this JSON file")
  ap.add_argument("--compare", action="append", default=[],
                  help="rows saved by an earlier run (--save) to show first")
  ap.add_argument("--top", action="store_true", help="also list each variant's biggest ops")
  args = ap.parse_args()
  workload, topology, batch, layers = PRESETS[args.preset]
  topology, batch = args.topology or topology, args.batch or batch
  layers = layers if args.layers is None else args.layers
  rows = [r for f in args.compare for r in json.loads(Path(f).read_text())]
  for v in args.variant or ["today", "weight-update"]:
    name, _, more = v.partition("=")
    extra = tuple(shlex.split(more)) if more else VARIANTS[name]
    report = check(workload, topology, batch, layers, extra)
    if "failed" in report:
      print(f"{name}: failed: {report['failed']}", flush=True)
      continue
    rows.append(row(name, report))
    print(f"{name}: compiled in {report['compile_wall_s']:.0f} s", flush=True)
    if args.save:
      saved = json.loads(Path(args.save).read_text()) if Path(args.save).exists() else []
      Path(args.save).write_text(json.dumps([*saved, rows[-1]], indent=1))
  what = f"{layers} layers" if layers else "full depth"
  print_tables(f"{workload} --config full, {what}, {topology}, batch {batch:,} "
               f"(libtpu compile, no TPU)", rows)
  if args.top:
    print_top(rows)


if __name__ == "__main__":
  main()
