"""The TPU attention kernels against XLA's attention, compiled for real slices without a TPU.

For each full config and slice, `mlbench check --topology` compiles the train and eval
steps twice, `--set model.attention=xla` (XLA's attention: the L x S scores materialised)
and `auto` (the Pallas kernels where they can serve), with the TPU compiler (libtpu), and
prints per device: temporaries, peak, XLA's step-time estimate, and what each attention ran
on. XLA's estimate counts what it can see: a Pallas kernel is a custom call it cannot cost,
so the after column's estimate leaves out the kernel's own time (the temporaries are exact).

    python benchmarks/attention_tpu.py                      # the three of issue 39
    python benchmarks/attention_tpu.py --only llama31_8b

Goal (issue 39): Llama 3.1 8B full on v5p-32 with the Pallas kernel at most half the
temporaries of XLA's attention. Minutes per compile on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CASES = {
    "llama31_8b": ("v5p-32", ()),
    # Google's v0.7 BERT run on this slice (8,192 does not fit 64 chips without remat).
    "bert": ("v4-128", ("global_batch_size=3072",)),
    "transformer": ("v5p-16", ()),
}


def check(workload: str, topology: str, attention: str, more: tuple[str, ...]) -> dict:
  """`mlbench check --json` of the full config on `topology` with `model.attention`."""
  cmd = [sys.executable, "-c", "import sys; from mlbench.cli import main; sys.exit(main())",
         "check", workload, "--config", "full", "--topology", topology, "--json",
         "--set", f"model.attention={attention}", *(a for s in more for a in ("--set", s))]
  done = subprocess.run(cmd, capture_output=True, text=True)
  if done.returncode:
    return {"failed": (done.stderr.strip().splitlines() or ["?"])[-1][:200]}
  return json.loads(done.stdout)


def _gib(n: float) -> str:
  return f"{n / 2**30:,.2f} GiB"


def _program(report: dict, name: str) -> dict:
  return next(p for p in report["programs"] if p["name"] == name)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--only", action="append", choices=list(CASES), help="repeatable")
  args = ap.parse_args()
  print("| full config, slice | program | attention | temporaries | peak | XLA's estimate |")
  print("|---|---|---|---|---|---|")
  for workload in args.only or CASES:
    topology, more = CASES[workload]
    reports = {a: check(workload, topology, a, more) for a in ("xla", "auto")}
    for attention, report in reports.items():
      if "failed" in report:
        print(f"| {workload}, {topology} | | {attention} | failed: {report['failed']} | | |")
        continue
      for name in ("train step", "eval step"):
        p = _program(report, name)
        est = "-" if p["xla_seconds"] is None else f"{1e3 * p['xla_seconds']:,.1f} ms"
        print(f"| {workload}, {topology} | {name} | {attention} | {_gib(p['temp_bytes'])} | "
              f"{_gib(p['peak_bytes'])} | {est} |", flush=True)
    if all("failed" not in r for r in reports.values()):
      before, after = (_program(reports[a], "train step")["temp_bytes"] for a in ("xla", "auto"))
      print(f"| {workload}, {topology} | train step | auto / xla | {after / before:.2f}x | | |")
      for line in reports["auto"]["attention"]:
        print(f"|  | | {line} | | | |")


if __name__ == "__main__":
  main()
