"""The fused attention that drops out (issue 54) against XLA's attention, compiled for TPUs.

Reduced BERT-large (its 1,024-wide layers, 16 heads of 64, 512 tokens, packed rows; 2 and
4 layers) on v4-8 at 256 sequences (132 rows, 33 a chip), and optionally the Transformer-big
reduced the same way (2 + 2 layers, 256 rows of 256 tokens): `mlbench check --topology
--json` with `--set model.attention=xla` (the dropout on XLA: [B, N, L, S] scores,
probabilities, random bits and mask in HBM) and `auto` (the dropout kernel in training),
compiled by the TPU compiler (libtpu) on this CPU, one after the other. Prints per device,
train step: the roofline's compute and HBM bounds (XLA's FLOPs and bytes over the chip's
peak), XLA's bytes, its step estimate (corrected as `check` does; none where a kernel
declares no cost), the predicted step, the temporaries, and what the attention ran on.

    python benchmarks/attention_dropout.py                       # BERT, 2 and 4 layers
    python benchmarks/attention_dropout.py --only transformer    # the Transformer

Minutes per compile on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

BERT = ("bert", ("global_batch_size=256", "eval_batch_size=256"))
CASES = {
    "bert2": ("BERT-large, 2 layers", "bert", ("model.num_layers=2", *BERT[1])),
    "bert4": ("BERT-large, 4 layers", "bert", ("model.num_layers=4", *BERT[1])),
    "transformer": ("Transformer-big, 2 + 2 layers", "transformer",
                    ("model.encoder_layers=2", "model.decoder_layers=2",
                     "global_batch_size=256")),
}


def check(workload: str, attention: str, more: tuple[str, ...]) -> dict:
  """`mlbench check --json` of the reduced full config on v4-8 with `model.attention`."""
  cmd = [sys.executable, "-c", "import sys; from mlbench.cli import main; sys.exit(main())",
         "check", workload, "--config", "full", "--topology", "v4-8", "--json",
         "--set", f"model.attention={attention}", *(a for s in more for a in ("--set", s))]
  done = subprocess.run(cmd, capture_output=True, text=True)
  if done.returncode:
    return {"failed": (done.stderr.strip().splitlines() or ["?"])[-1][:200]}
  return json.loads(done.stdout)


def _ms(seconds: float | None) -> str:
  return "none" if seconds is None else f"{1e3 * seconds:,.2f} ms"


def row(label: str, attention: str, report: dict) -> str:
  if "failed" in report:
    return f"| {label} | {attention} | failed: {report['failed']} | | | | | |"
  train = report["programs"][0]
  roof = report["prediction"]["roofline"]
  return (f"| {label} | {attention} | {_ms(roof['compute_s'])} | {_ms(roof['hbm_s'])} | "
          f"{train['bytes_accessed'] / 1e9:,.2f} GB | {_ms(train['xla_seconds'])} | "
          f"{_ms(report['prediction']['step_s'])} | {train['temp_bytes'] / 2**30:,.2f} GiB |")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--only", action="append", choices=list(CASES),
                  help="repeatable; default bert2 and bert4")
  args = ap.parse_args()
  cases = [CASES[c] for c in args.only or ("bert2", "bert4")]
  print("| reduced config, v4-8 | attention | compute bound | HBM bound | bytes | "
        "XLA's estimate | predicted step | temporaries |")
  print("|---|---|---|---|---|---|---|---|")
  lines = []
  for label, workload, more in cases:
    for attention in ("xla", "auto"):
      report = check(workload, attention, more)
      print(row(label, attention, report), flush=True)
      if attention == "auto" and "failed" not in report:
        lines += [f"{label}: {line}" for line in report["attention"]
                  if line.startswith("train step")]
  print()
  print("\n".join(lines))


if __name__ == "__main__":
  main()
