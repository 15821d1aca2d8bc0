"""Compiling the cost table the package carries (mlbench/pod/calibration_costs.json).

The published TPU runs used 8 to 4,096 chips; compiling mlbench's full configs
for each of those slices takes hours on a laptop (BERT-large on v3-8192: over an
hour per compile). What the time model needs from a compile is per device: the
train step's FLOPs and HBM bytes (XLA's cost analysis), the eval step's, and
the bytes of its collectives; for data parallelism those depend on the
per-device batch, not on how many devices there are (the collectives' times
come from the topology model in `mlbench.pod.collectives`). So each workload is
compiled for a 4-chip TPU v4 slice at two per-device batches, and the figures of
any per-device batch follow by straight-line interpolation (`mlbench.pod.costtable`,
what `mlbench plan --costs calibration` and the calibration read). BERT-large and
Transformer-big are compiled at two depths as well (BERT 2 and 4 layers, the
Transformer 1+1 and 2+2) at the smaller batch; the 24 and 6+6 layer figures follow
linearly in the depth. BERT is compiled as well at the shapes of the length buckets of the
one bucketed run in the calibration set (v2.0 cloud-tpu-v4-8192-TF: 14 sequences of at most
64 tokens a replica, 8 of 128, 5 of 192, 4 of 256, 3 of 304; the 2 of 512 are the padded
program's), each at two depths, at its own batch (`implementation.py` says where the buckets
come from).

Regenerate (hours on a loaded 2-core machine, 3 to 42 minutes a compile; needs libtpu):

    python -m benchmarks.calibration.costs [--only resnet50,bert|ssd@b32/m1] [--missing]
        [--out mlbench/pod/calibration_costs.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mlbench.pod import costtable

SLICE = "v4-8"          # 4 chips, one device each
DEVICES = 4
# The keys of the depths compiled shallower than the full one (`costtable.FULL_DEPTH`).
DEPTH_KEYS = {"bert": ("model.num_layers",),
              "transformer": ("model.encoder_layers", "model.decoder_layers")}


@dataclasses.dataclass(frozen=True)
class Variant:
  """One compile: a workload at a per-device batch (and depth) on a mesh of 4 chips."""

  workload: str
  batch: int            # per device (per data shard with a model axis)
  model: int = 1        # model-parallel ways (the mesh is data=4/model x model)
  depth: int | None = None
  seq: int | None = None  # BERT's sequence length where not the full config's 512
  packed: bool = False    # BERT's packed program (batch: rows a device, PACKING a row)

  @property
  def key(self) -> str:
    return (f"{self.workload}@b{self.batch}/m{self.model}"
            + ("" if self.depth is None else f"/L{self.depth}")
            + ("" if self.seq is None else f"/s{self.seq}")
            + ("/packed" if self.packed else ""))


VARIANTS = (
    Variant("resnet50", 8), Variant("resnet50", 64),
    Variant("ssd", 1), Variant("ssd", 32),
    Variant("bert", 2, depth=2), Variant("bert", 2, depth=4), Variant("bert", 16, depth=2),
    Variant("transformer", 4, depth=1), Variant("transformer", 4, depth=2),
    Variant("transformer", 32, depth=1),
    # The v2.0 4,096-chip BERT run's length buckets (sequences a replica, longest length).
    *(Variant("bert", b, depth=d, seq=s) for b, s in ((14, 64), (8, 128), (5, 192), (4, 256),
                                                      (3, 304)) for d in (2, 4)),
    # BERT's packed program (issue 47), rows of two sequences: NVIDIA's and Dell's runs.
    Variant("bert", 2, depth=2, packed=True), Variant("bert", 2, depth=4, packed=True),
    Variant("bert", 16, depth=2, packed=True),
)
# Sequences a packed row: MLPerf's Wikipedia data at 512 tokens averages 255.8 tokens a
# sequence (half padding, benchmarks/bert_wikipedia_lengths.json); Dell's packed data set
# holds 2 a row (its PACKING_FACTOR).
PACKING = 2
# BERT's masked positions per sequence: the full config's 76, as Google's bucketed program
# keeps (its masked-position features are not cut to the bucket: run_pretraining.py L272-280),
# except where a bucket is shorter: at most the tokens between [CLS] and the last [SEP]
# (workloads/bert/input_pipeline.py's synthetic batch draws them there), 62 of 64.
MAX_PREDICTIONS = 76


def _args(v: Variant) -> list[str]:
  data = DEVICES // v.model
  gbs = v.batch * data * (PACKING if v.packed else 1)
  args = ["check", v.workload, "--config", "full", "--topology", SLICE, "--json",
          "--set", f"global_batch_size={gbs}", "--set", f"eval_batch_size={gbs}"]
  if v.workload == "bert":  # the full config packs (issue 47): padded, one sequence a row
    args += (["--set", f"data.packing_factor={PACKING}"] if v.packed
             else ["--set", "data.max_sequences_per_row=1"])
  if v.model > 1:
    args += ["--mesh", f"data={data},model={v.model}"]
  for key in DEPTH_KEYS.get(v.workload, ()) if v.depth is not None else ():
    args += ["--set", f"{key}={v.depth}"]
  if v.seq is not None:
    args += ["--set", f"data.max_seq_length={v.seq}",
             "--set", f"data.max_predictions_per_seq={min(v.seq - 2, MAX_PREDICTIONS)}"]
  return args


def _program(p: dict[str, Any]) -> dict[str, Any]:
  return {"flops_per_device": (p["flops"] or 0.0) / DEVICES,
          "bytes_per_device": p["bytes_accessed"], "xla_s": p["xla_seconds"],
          "collective_bytes": p["collective_bytes"], "hlo_readable": p["hlo_readable"],
          "peak_bytes": p["peak_bytes"]}


def compile_variant(v: Variant, timeout: int) -> dict[str, Any]:
  """`mlbench check` of one variant in its own process; the figures it needs."""
  t0 = time.monotonic()
  script = "import sys; from mlbench.cli import main; sys.exit(main())"
  out = subprocess.run([sys.executable, "-c", script, *_args(v)], check=False,
                       capture_output=True, text=True, timeout=timeout)
  if out.returncode:
    raise RuntimeError(f"{v.key}: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
  report = json.loads(out.stdout)
  train, evaluation = report["programs"][0], report["programs"][1]
  return {"workload": v.workload, "batch": v.batch, "model": v.model, "depth": v.depth,
          **({} if v.seq is None else {"seq": v.seq}),
          **({"packed": True, "sequences_per_row": PACKING} if v.packed else {}),
          "params": report["params"],
          "eval_batch_per_device": v.batch,
          "train": _program(train), "eval": _program(evaluation),
          "command": "mlbench " + " ".join(_args(v)),
          "compile_s": round(time.monotonic() - t0, 1)}


def wanted(v: Variant, only: set[str], have: dict[str, Any], missing: bool) -> bool:
  """Whether to compile `v`: named in `only` (by workload or key; empty: all), and not
  already among the records `have` where only the `missing` ones are asked for."""
  return (not only or bool(only & {v.workload, v.key})) and not (missing and v.key in have)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--only", default="", help="comma-separated workloads or variant keys "
                  "(e.g. ssd@b32/m1)")
  ap.add_argument("--missing", action="store_true", help="skip variants already cached")
  ap.add_argument("--out", type=Path, default=Path(str(costtable.path())),
                  help="the table to add the compiles to (default: the package's)")
  ap.add_argument("--timeout", type=int, default=3600)
  args = ap.parse_args()
  only = set(filter(None, args.only.split(",")))
  doc = json.loads(args.out.read_text()) if args.out.exists() else {"records": {}}
  doc["generated_by"] = "python -m benchmarks.calibration.costs"
  for v in VARIANTS:
    if not wanted(v, only, doc["records"], args.missing):
      continue
    print(f"compiling {v.key} ...", file=sys.stderr, flush=True)
    doc["records"][v.key] = compile_variant(v, args.timeout)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    tmp.replace(args.out)  # after every compile: an interrupted run keeps what it has


if __name__ == "__main__":
  main()
