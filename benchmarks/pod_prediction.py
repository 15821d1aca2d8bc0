"""Pod prediction vs measurement: Google's TPU-v3 JAX MLPerf v0.7 runs, side by side.

For each of Google's JAX submissions in ../shared/mlperf-results/v0.7 (global
batch from the logs, chips from the system name), `mlbench check --config full
--topology v3-N` compiles mlbench's own full config with the TPU compiler and
predicts a step time; the measured step time comes from the logs (samples of a
block of training between two evaluations, divided by the block's time, median
over blocks and runs). Also ResNet-50 at batch 65,536 on 1,024 chips against the
published 1.05 million images/s. Each compile takes minutes on a 2-core machine.

    python benchmarks/pod_prediction.py [--results DIR] [--only resnet,bert] [--timeout 1800]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

# ../shared beside the checkout (for a worktree, beside the folder of worktrees).
RESULTS = next((p / "shared" / "mlperf-results" / "v0.7" / "Google"
                for p in Path(__file__).resolve().parents
                if (p / "shared" / "mlperf-results").is_dir()), Path("mlperf-results"))

# (system folder, benchmark folder, mlbench workload, slice, mesh, samples per log "epoch")
# BERT's v0.7 JAX log counts epoch_num in steps (62 per block: ~500k samples at 8192);
# ResNet-50 and SSD in epochs of their training sets; the Transformer in epochs of the
# logged train_samples.
CASES = [
    ("tpu-v3-8192-JAX", "resnet", "resnet50", "v3-8192", None, "epochs"),
    ("tpu-v3-8192-JAX", "bert", "bert", "v3-8192", None, "steps"),
    ("tpu-v3-8192-JAX", "transformer", "transformer", "v3-8192", "data=2048,model=4", "epochs"),
    ("tpu-v3-4096-JAX", "ssd", "ssd", "v3-4096", None, "epochs"),
]
PUBLISHED = ("resnet50", "v3-2048", 65536, 1.05e6)  # "1.05 million images/s" on 1,024 chips


def _events(path: Path) -> list[dict]:
  return [json.loads(line.split(":::MLLOG", 1)[1]) for line in path.read_text().splitlines()
          if ":::MLLOG" in line]


def measured(folder: Path, unit: str) -> tuple[int, float, int]:
  """(global batch, median samples/s over training blocks, blocks) from every result log."""
  rates, gbs = [], 0
  for log in sorted(folder.glob("result_*.txt")):
    ev = _events(log)
    value = {e["key"]: e["value"] for e in ev if e["value"] is not None}
    gbs = int(value["global_batch_size"])
    per_unit = {"steps": gbs, "epochs": float(value.get("train_samples", 0))}[unit]
    starts = [e for e in ev if e["key"] == "block_start"]
    stops = [e for e in ev if e["key"] == "block_stop"]
    for a, b in zip(starts[1:], stops[1:]):  # The first block carries warm-up.
      count = a["metadata"].get("epoch_count", 1)
      seconds = (b["time_ms"] - a["time_ms"]) / 1e3
      if seconds > 0:
        rates.append(count * per_unit / seconds)
  return gbs, statistics.median(rates), len(rates)


def predicted(workload: str, slice_: str, gbs: int, mesh: str | None, timeout: int) -> dict:
  """mlbench check's report for the full config on the slice (a subprocess per compile)."""
  # Evaluation at the training batch: it divides over the data axis as training does,
  # and keeps the Transformer's beam search (4 beams, a cache per beam) in memory.
  args = ["check", workload, "--config", "full", "--topology", slice_, "--json",
          "--set", f"global_batch_size={gbs}", "--set", f"eval_batch_size={gbs}"]
  if mesh:
    args += ["--mesh", mesh]
  out = subprocess.run([sys.executable, "-c", "import sys; from mlbench.cli import main; "
                        "sys.exit(main())", *args], capture_output=True, text=True,
                       timeout=timeout)
  sys.stderr.write(out.stderr)  # mlbench check's human report, for the record.
  if out.returncode:
    return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
  return json.loads(out.stdout)


def _row(name: str, gbs: int, measured_rate: float | None, report: dict) -> str:
  if "error" in report:
    return f"| {name} | {gbs:,} | {_fmt(measured_rate)} | - | - | {report['error'][:160]} |"
  p = report["prediction"]
  step_ms = p["step_s"] * 1e3
  meas_ms = gbs / measured_rate * 1e3 if measured_rate else None
  ratio = f"{p['samples_per_s'] / measured_rate:.2f}" if measured_rate else "-"
  return (f"| {name} | {gbs:,} | {_fmt(measured_rate)} ({_fmt_ms(meas_ms)}) | "
          f"{p['samples_per_s']:,.0f} ({step_ms:,.1f} ms; {p['roofline']['limit']}-bound, XLA "
          f"{_fmt_ms(None if p['xla_step_s'] is None else p['xla_step_s'] * 1e3)}) | {ratio} | "
          f"MFU {100 * p['mfu']:.1f}%, peak {report['peak_bytes'] / 2**30:.1f} GiB |")


def _fmt(x: float | None) -> str:
  return "-" if x is None else f"{x:,.0f}"


def _fmt_ms(x: float | None) -> str:
  return "-" if x is None else f"{x:,.1f} ms"


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--results", type=Path, default=RESULTS)
  ap.add_argument("--only", default="",
                  help="comma-separated workloads or workload@slice (default: all)")
  ap.add_argument("--timeout", type=int, default=3600, help="seconds per compile")
  ap.add_argument("--no-header", dest="header", action="store_false",
                  help="print table rows only (to append to an earlier table)")
  args = ap.parse_args()
  only = set(filter(None, args.only.split(",")))

  if args.header:
    print("| benchmark on slice | global batch | measured samples/s (step) | predicted samples/s "
          "(step) | predicted / measured | notes |")
    print("|---|---|---|---|---|---|")
  for system, bench, workload, slice_, mesh, unit in CASES:
    if only and not {workload, f"{workload}@{slice_}"} & only:
      continue
    gbs, rate, blocks = measured(args.results / "results" / system / bench, unit)
    report = predicted(workload, slice_, gbs, mesh, args.timeout)
    print(_row(f"{workload} {slice_} ({blocks} blocks)", gbs, rate, report), flush=True)
  workload, slice_, gbs, rate = PUBLISHED
  if not only or {workload, f"{workload}@{slice_}"} & only:
    report = predicted(workload, slice_, gbs, None, args.timeout)
    print(_row(f"{workload} {slice_} (published)", gbs, rate, report), flush=True)


if __name__ == "__main__":
  main()
