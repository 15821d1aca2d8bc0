"""The full configs' compiled costs, cached as data (`calibration_costs.json`), at any batch.

The time model's calibration (benchmarks/calibration/costs.py) compiles each workload's
full config for a 4-chip TPU v4 slice at two per-device batches, BERT-large and
Transformer-big at two depths as well, and stores what the time model needs of each
compile, per device: the train and eval steps' FLOPs, HBM bytes, collective bytes and
peak memory, and the parameters. For data parallelism those depend on the per-device
batch, not on how many devices there are, so the figures of any per-device batch follow
on straight lines through the compiled ones (FLOPs are linear in the batch; HBM bytes
are weights plus activations), and those of the full depth on a line in the depth (a
layer adds the same program each time). `mlbench plan --costs calibration` predicts from
them without a compile; the calibration predicts the published runs from them.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

FULL_DEPTH = {"bert": 24, "transformer": 6}  # layers of the full configs compiled shallower


def path() -> Any:
  """The table the package carries (a `Traversable`)."""
  return resources.files("mlbench").joinpath("pod", "calibration_costs.json")


def load() -> dict[str, dict[str, Any]]:
  """The cached records by variant key (`resnet50@b64/m1`, `bert@b2/m1/L4`, ...)."""
  return json.loads(path().read_text())["records"]


def _affine(points: dict[float, float], x: float) -> float:
  """The straight line through two measured points at x; from one point, proportional to
  x (exact for FLOPs, an overestimate of the HBM bytes of larger batches)."""
  (x0, y0), *rest = sorted(points.items())
  if not rest:
    return y0 * x / x0 if x0 else y0
  x1, y1 = rest[-1]
  return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def device_cost(records: dict[str, dict[str, Any]], workload: str, batch: float, model: int,
                program: str, seq: int | None = None, packed: bool = False
                ) -> dict[str, float]:
  """Per-device FLOPs, HBM bytes and collective bytes of `program` at a per-device
  batch, from the cached compiles: a line in the batch, a line in the depth. `seq`: the
  compiles at that sequence length (BERT's length buckets), else the full config's;
  `packed`: the compiles of the packed program (BERT's), whose batch counts rows."""
  mine = [r for r in records.values() if r["workload"] == workload and r["model"] == model
          and r.get("seq") == seq and bool(r.get("packed")) == packed]
  if not mine:
    at = ("" if seq is None else f" at sequence length {seq}") + (" packed" if packed else "")
    raise KeyError(f"no cached compile of {workload} with model={model}{at}; run "
                   "python -m benchmarks.calibration.costs")
  fields = {"flops": lambda p: p["flops_per_device"], "bytes": lambda p: p["bytes_per_device"],
            "coll": lambda p: float(sum(p["collective_bytes"].values())),
            "peak": lambda p: float(p["peak_bytes"])}
  depths = sorted({r["depth"] or 0 for r in mine})
  if workload in FULL_DEPTH and len(depths) < 2:
    raise KeyError(f"{workload} is compiled at one depth only; the full depth needs two (run "
                   "python -m benchmarks.calibration.costs)")
  shallow = [r for r in mine if (r["depth"] or 0) == depths[0]]
  batches = sorted({r["batch"] for r in shallow})
  if len(batches) == 1 and not batches[0] / 4 <= batch <= batches[0] * 4:
    raise KeyError(f"{workload} is compiled at per-device batch {batches[0]} only; {batch:g} is "
                   "too far from it to scale (python -m benchmarks.calibration.costs adds the "
                   "second batch)")
  out = {}
  for name, get in fields.items():
    # The shallowest depth at every compiled batch gives the line in the batch ...
    value = _affine({r["batch"]: get(r[program]) for r in shallow}, batch)
    full = FULL_DEPTH.get(workload)
    if full and len(depths) > 1:
      # ... and a layer (the difference of two depths at one batch) scales with it.
      b0 = min(r["batch"] for r in mine if (r["depth"] or 0) == depths[1])
      at = {(r["depth"] or 0): get(r[program]) for r in mine if r["batch"] == b0}
      base = get(next(r for r in shallow if r["batch"] == b0)[program])
      layer = (at[depths[1]] - at[depths[0]]) / (depths[1] - depths[0])
      value += layer * (full - depths[0]) * (value / base if base > 0 else 1.0)
    out[name] = max(value, 0.0)
  out["params"] = _params(mine, workload)
  return out


def _params(records: list[dict[str, Any]], workload: str) -> float:
  """Parameters of the full-depth model, linear in the depth of the compiled ones."""
  by_depth = {(r["depth"] or 0): float(r["params"]) for r in records}
  full = FULL_DEPTH.get(workload)
  return _affine(by_depth, full) if full and len(by_depth) > 1 else next(iter(by_depth.values()))
