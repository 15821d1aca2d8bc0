"""How long `mlbench plan` takes: a 6-slice x 3-batch ResNet-50 sweep, cold and warm.

Runs the command twice with the same compile cache (a fresh folder unless --cache is
given): cold, every distinct per-device program is compiled for TPU v5p (libtpu, no
TPU); warm, their figures are read back. Prints the wall time of each, the compiles the
plan reports, and the warm plan's table (stderr of the command).

    python benchmarks/plan_sweep.py [--cache DIR] [--slices ...] [--batches ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

SLICES = "v5p-8,v5p-32,v5p-128,v5p-256,v5p-512,v5p-1024"
BATCHES = "4096,8192,32768"


def plan(cache: str, slices: str, batches: str, workload: str) -> tuple[float, dict, str]:
  t0 = time.monotonic()
  out = subprocess.run([sys.executable, "-c", "import sys; from mlbench.cli import main; "
                        "sys.exit(main())", "plan", workload, "--slices", slices, "--batches",
                        batches, "--compile-cache", cache, "--json"],
                       capture_output=True, text=True, check=True)
  return time.monotonic() - t0, json.loads(out.stdout), out.stderr


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--cache", help="compile cache folder (default: a fresh temporary one)")
  ap.add_argument("--slices", default=SLICES)
  ap.add_argument("--batches", default=BATCHES)
  ap.add_argument("--workload", default="resnet50")
  args = ap.parse_args()
  with tempfile.TemporaryDirectory() as tmp:
    cache = args.cache or tmp
    for label in ("cold", "warm"):
      seconds, doc, err = plan(cache, args.slices, args.batches, args.workload)
      made = [c for c in doc["compiles"] if c["origin"] == "compiled"]
      read = [c for c in doc["compiles"] if c["origin"] == "cache"]
      print(f"{label}: {seconds:,.0f} s wall; {len(made)} programs compiled "
            f"({sum(c['seconds'] for c in made):,.0f} s), {len(read)} read back; "
            f"{len(doc['candidates'])} candidates", flush=True)
    print(err)


if __name__ == "__main__":
  main()
