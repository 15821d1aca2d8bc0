"""`mlbench plan`: which slice and batch train a workload fastest or cheapest, with the odds.

For every candidate (a slice and a global batch) the plan joins three things:
the per-device program's costs (compiled once per distinct per-device batch and
slice generation, `plancost`), the time model fitted on the published runs
(`timemodel`, `estimate`) and the reference convergence points at that batch
(`rcp`), whose spread becomes the distribution of the time to train (`odds`).

Why one compile serves many slices: with data parallelism every device runs the
same program on its share of the batch, whatever the number of devices; what
changes with the slice is the gradient all-reduce's group, whose time the model
takes from the slice's torus (`collectives`), never from the compiled program.
So the program compiled for a small slice of the same TPU generation at the
same per-device batch (its proxy) gives every slice's per-device FLOPs, HBM
bytes and peak memory. GPU candidates reuse a TPU v4 compile's counts (FLOPs are
the program's; bytes and memory are the TPU compiler's, an approximation) with
the GPU constants fitted on the H100 runs.

Nothing here compiles or imports JAX: the costs come from a function given in
(`CostFn`), so the search can be tested on a synthetic time model.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from mlbench import accelerators
from mlbench.errors import UserError
from mlbench.pod import estimate, odds, rcp, timemodel


class Objective(enum.Enum):
  TIME = "time"
  CHIP_HOURS = "chip-hours"


@dataclasses.dataclass(frozen=True)
class Target:
  """A candidate slice: TPU slices by their Cloud name, GPUs as `h100-64`."""

  name: str
  accelerator: accelerators.Accelerator
  chips: int
  proxy: str          # the TPU slice its per-device program is compiled for
  gpu: bool = False

  @property
  def devices(self) -> int:
    return self.chips * self.accelerator.devices_per_chip


@dataclasses.dataclass(frozen=True)
class Costs:
  """One compiled per-device program's figures (per device; the eval step at the same
  per-device batch), or why there are none."""

  train: timemodel.StepCost | None
  eval: timemodel.StepCost | None
  peak_bytes: float = 0.0
  param_bytes: float = 0.0          # the f32 parameters on a device (the gradient all-reduce)
  model_flops_per_example: float = 0.0
  grad_bytes: float | None = None   # the gradient all-reduce's bytes, if not param_bytes
  need_bytes: float | None = None   # what XLA said it needed where the program does not fit
  origin: str = "compiled"          # compiled, cache, not compiled
  seconds: float = 0.0              # compile time (of the cached compile, for a cache hit)

  @property
  def compiled(self) -> bool:
    return self.train is not None


# (proxy slice, per-device batch) -> its costs.
CostFn = Callable[[str, int], Costs]
# global batch -> the evaluations a run can stop at: (step, value in the RCP's unit).
PointsFn = Callable[[int], Sequence[tuple[int, float]]]
# (platform, accelerator, workload) -> the time model's uncertainty there
# (`uncertainty.describe`: the band's factor, why it extrapolates).
SpreadFn = Callable[[str, str, str], dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One slice at one global batch, predicted."""

  target: Target
  batch: int
  convergence: rcp.Convergence
  costs: Costs
  fits: bool
  fix: str = ""
  terms: timemodel.Terms | None = None   # at the median run's stop
  outlook: odds.Outlook | None = None
  rank: int | None = None
  pareto: bool = False
  spread: dict[str, Any] | None = None  # the time model's uncertainty here (band, why)

  @property
  def extrapolated(self) -> tuple[str, ...]:
    return tuple((self.spread or {}).get("extrapolated") or ())

  @property
  def per_device(self) -> int:
    return self.batch // self.target.devices

  @property
  def chip_hours(self) -> float | None:
    """Chip-hours of the expected MLPerf score's time."""
    return None if self.outlook is None else self.outlook.score_s * self.target.chips / 3600

  def objective(self, objective: Objective) -> float:
    if self.outlook is None:
      return math.inf
    return self.outlook.score_s if objective is Objective.TIME else self.chip_hours


@dataclasses.dataclass(frozen=True)
class Result:
  candidates: tuple[Candidate, ...]   # ranked first, then those without a prediction
  skipped: tuple[str, ...]            # (slice, batch) pairs left out, and why
  objective: Objective
  runs: int


_GPU = re.compile(r"(h100|h200|a100|b200)-(\d+)")
# The smallest slice of each TPU generation, compiled for as every slice's proxy.
PROXY = {"tpu_v2": "v2-8", "tpu_v3": "v3-8", "tpu_v4": "v4-8", "tpu_v5p": "v5p-8",
         "tpu_v5e": "v5e-4", "tpu_v6e": "v6e-4"}


def target(name: str) -> Target:
  """`v5p-256` (a Cloud TPU slice) or `h100-64` (64 GPUs, 8 a node)."""
  from mlbench.pod import topology

  m = _GPU.fullmatch(name.strip().lower())
  if m:
    acc = accelerators.table()[m.group(1)]
    gpus = int(m.group(2))
    if gpus < 1 or (gpus > 8 and gpus % 8):
      raise UserError(f"{name}: GPUs come in nodes of 8; give 1 to 8 or a multiple of 8")
    return Target(name=name.lower(), accelerator=acc, chips=gpus, proxy="v4-8", gpu=True)
  s = topology.parse(name)
  proxy = PROXY[s.generation.accelerator]
  if s.chips * s.accelerator.devices_per_chip < 4:
    proxy = s.name
  return Target(name=s.name, accelerator=s.accelerator, chips=s.chips, proxy=proxy)


def pairs(targets: Sequence[Target], batches: Sequence[int] | None, table: rcp.Table
          ) -> tuple[list[tuple[Target, int]], list[str]]:
  """The (slice, batch) candidates: the batches given, or the RCP table's that split over
  the slice's devices; and why the others are left out."""
  out, skipped = [], []
  for t in targets:
    for b in (batches if batches else table.batches):
      if b % t.devices:
        if batches:
          skipped.append(f"{t.name} at batch {b:,}: does not split over its {t.devices:,} "
                         "devices")
        continue
      out.append((t, b))
  if not out:
    raise UserError("no batch splits over any of the slices; give --batches that are multiples "
                    "of the slices' device counts")
  return out, skipped


def _costs(pairs_: list[tuple[Target, int]], cost_of: CostFn) -> dict[tuple[str, int], Costs]:
  """One compile per (proxy, per-device batch), smallest batch first; a batch above one
  that did not fit is not compiled (memory only grows with the batch)."""
  out: dict[tuple[str, int], Costs] = {}
  keys = sorted({(t.proxy, b // t.devices) for t, b in pairs_}, key=lambda k: (k[0], k[1]))
  too_big: dict[str, int] = {}
  for proxy, per_device in keys:
    if proxy in too_big and per_device > too_big[proxy]:
      out[(proxy, per_device)] = Costs(None, None, origin="not compiled")
      continue
    c = cost_of(proxy, per_device)
    out[(proxy, per_device)] = c
    if not c.compiled:
      too_big[proxy] = per_device
  return out


def fix_line(t: Target, batch: int, c: Costs, remat_hint: str) -> str:
  """The one-line fix for a candidate that does not fit."""
  hbm = t.accelerator.device_hbm_bytes
  per = batch // t.devices
  if c.need_bytes:
    smaller = max(1, int(per * hbm / c.need_bytes * 0.8))
  elif c.compiled:
    smaller = max(1, int(per * hbm / c.peak_bytes * 0.8))
  else:
    smaller = max(1, per // 2)
  need = (f"{(c.need_bytes or c.peak_bytes) / 2**30:,.1f} GiB per device of "
          f"{hbm / 2**30:,.0f}" if (c.need_bytes or c.peak_bytes) else
          "a smaller per-device batch did not fit either")
  return (f"does not fit ({need}); try --weight-update-sharding{remat_hint}, or a per-device "
          f"batch of {smaller} (--batches {smaller * t.devices})")


def _stops(x: timemodel.Inputs, c: timemodel.Constants, points: Sequence[tuple[int, float]]
           ) -> odds.Stops:
  times = [timemodel.predict(dataclasses.replace(x, steps=float(step), evals=float(i + 1)),
                             c).total_s for i, (step, _) in enumerate(points)]
  return odds.Stops(values=tuple(float(v) for _, v in points), times_s=tuple(times))


def inputs(t: Target, batch: int, c: Costs, workload: str, eval_examples: int
           ) -> timemodel.Inputs:
  """The time model's inputs for a candidate (the eval batch is the global batch)."""
  p = estimate.CompiledRun(
      workload=workload, devices=t.devices, mesh={"data": t.devices}, global_batch=batch,
      train=c.train, eval_batch=c.eval, eval_batches=math.ceil(eval_examples / batch),
      grad_bytes_per_device=c.param_bytes if c.grad_bytes is None else c.grad_bytes,
      model_collective_bytes=None, model_flops_per_step=c.model_flops_per_example * batch,
      steps=0.0, evals=0.0)
  x = dataclasses.replace(estimate.inputs(t.accelerator, p),
                          param_bytes_per_device=c.param_bytes)
  if t.gpu:  # XLA's TPU counts stand in; the analytic FLOPs where they are larger
    flops = max(x.train.flops, c.model_flops_per_example * batch / t.devices)
    x = dataclasses.replace(x, train=dataclasses.replace(x.train, flops=flops))
  return x


def predict_candidate(t: Target, batch: int, c: Costs, conv: rcp.Convergence, *,
                      workload: str, eval_examples: int, points: Sequence[tuple[int, float]],
                      runs: int, constants: Callable[[str], timemodel.Constants],
                      remat_hint: str = "", spread: SpreadFn | None = None) -> Candidate:
  """One candidate's prediction from its program's costs and the RCPs at its batch; with
  `spread`, the time model's own uncertainty widens its band and raises its score."""
  acc = t.accelerator
  sure = None if spread is None else spread(acc.platform, acc.name, workload)
  fits = c.compiled and c.peak_bytes <= acc.device_hbm_bytes
  if not fits:
    return Candidate(t, batch, conv, c, fits=False, fix=fix_line(t, batch, c, remat_hint),
                     spread=sure)
  x = inputs(t, batch, c, workload, eval_examples)
  k = constants(acc.platform)
  stops = _stops(x, k, points)
  sigma = math.log(sure["band_factor"]) if sure else 0.0
  look = odds.outlook(stops, conv.mean, conv.stdev, runs, model_sigma=sigma)
  i = min(look.median_stop, len(points) - 1)
  terms = timemodel.predict(dataclasses.replace(x, steps=float(points[i][0]),
                                                evals=float(i + 1)), k)
  return Candidate(t, batch, conv, c, fits=True, terms=terms, outlook=look, spread=sure)


def pareto(cands: Sequence[Candidate]) -> set[int]:
  """Indices of the candidates no other beats on both expected time and chip-hours."""
  ok = [(i, c.outlook.score_s, c.chip_hours) for i, c in enumerate(cands)
        if c.outlook is not None and math.isfinite(c.outlook.score_s)]
  return {i for i, t, h in ok
          if not any(t2 <= t and h2 <= h and (t2 < t or h2 < h) for _, t2, h2 in ok)}


def evaluate(targets: Sequence[Target], batches: Sequence[int] | None, table: rcp.Table, *,
             cost_of: CostFn, points_of: PointsFn, workload: str, eval_examples: int,
             runs: int, objective: Objective,
             constants: Callable[[str], timemodel.Constants] | None = None,
             remat_hint: str = "", spread: SpreadFn | None = None) -> Result:
  """Predicts every candidate and ranks those that fit by `objective` (the expected
  MLPerf score of `runs` runs, or its chip-hours); `spread`: the time model's uncertainty
  (none: the band is convergence's alone)."""
  consts = constants or (lambda platform: estimate.constants(platform)[0])
  cands_, skipped = pairs(targets, batches, table)
  costs = _costs(cands_, cost_of)
  out = [predict_candidate(t, b, costs[(t.proxy, b // t.devices)], rcp.at(table, b),
                           workload=workload, eval_examples=eval_examples, points=points_of(b),
                           runs=runs, constants=consts, remat_hint=remat_hint,
                           spread=spread)
         for t, b in cands_]
  front = pareto(out)
  order = sorted(range(len(out)), key=lambda i: (out[i].objective(objective), out[i].target.chips,
                                                 out[i].batch))
  ranked = []
  for rank, i in enumerate(order, 1):
    c = out[i]
    ok = c.outlook is not None and math.isfinite(c.objective(objective))
    ranked.append(dataclasses.replace(c, rank=rank if ok else None, pareto=i in front))
  return Result(candidates=tuple(ranked), skipped=tuple(skipped), objective=objective, runs=runs)


def to_json(r: Result, extra: dict[str, Any] | None = None) -> dict[str, Any]:
  """The plan as data (the schema in plan.schema.json): per platform both spreads of the
  time model (`uncertainty`), per candidate its band's factor and why it extrapolates."""
  rows = []
  for c in r.candidates:
    look, t = c.outlook, c.terms
    rows.append({
        "slice": c.target.name, "accelerator": c.target.accelerator.name,
        "platform": c.target.accelerator.platform, "chips": c.target.chips,
        "devices": c.target.devices, "global_batch": c.batch, "per_device_batch": c.per_device,
        "fits": c.fits, "fix": c.fix or None, "peak_bytes": c.costs.peak_bytes or None,
        "hbm_bytes": c.target.accelerator.device_hbm_bytes,
        "program": {"compiled_for": c.target.proxy, "origin": c.costs.origin,
                    "counts_from_tpu": c.target.gpu},
        "convergence": {"mean": c.convergence.mean, "stdev": c.convergence.stdev,
                        "unit": c.convergence.unit.value, "how": c.convergence.how},
        "step_s": None if t is None else t.step_s,
        "terms": None if t is None else {**dataclasses.asdict(t), "total_s": t.total_s,
                                          "input_bound": t.input_bound},
        "time_s": None if look is None else {"median": look.median_s, "p10": look.p10_s,
                                             "p90": look.p90_s, "score": look.score_s},
        "rcp_scaling": None if look is None else look.scaling,
        "p_no_result": None if look is None else look.p_no_result,
        "chip_hours": c.chip_hours, "rank": c.rank, "pareto": c.pareto,
        "extrapolated": list(c.extrapolated),
        "band_factor": None if c.spread is None else c.spread["band_factor"]})
  spreads = {c.target.accelerator.platform: {k: v for k, v in c.spread.items()
                                             if k not in ("extrapolated", "rule", "band_factor")}
             for c in r.candidates if c.spread}
  return _finite({"objective": r.objective.value, "runs": r.runs, "candidates": rows,
                  "skipped": list(r.skipped), "uncertainty": spreads, **(extra or {})})


def _finite(x: Any) -> Any:
  """JSON has no infinity: a time that never comes (no convergence) is null."""
  if isinstance(x, float) and not math.isfinite(x):
    return None
  if isinstance(x, dict):
    return {k: _finite(v) for k, v in x.items()}
  if isinstance(x, list):
    return [_finite(v) for v in x]
  return x
