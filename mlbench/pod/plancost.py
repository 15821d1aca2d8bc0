"""The per-device programs `mlbench plan` needs: compiled for a proxy slice, kept on disk.

A candidate's per-device program depends on the per-device batch, the mesh's
non-data axes (none: the plan is data-parallel) and the TPU generation, not on
how many devices share the data axis (`plan`'s module doc says why). So each
distinct (proxy slice, per-device batch) is compiled once, through the same
path as `mlbench check --topology` (`check.dry_run`: init, train and eval), with
the eval batch equal to the train batch.

JAX's persistent compilation cache cannot serve these compiles: the
compile-only TPU client writes entries but cannot load them back ("PjRtCompiler
must be constructed with a Client to call DeserializeLoadedExecutable"). What a
plan needs from a compile is a few numbers, so those are kept instead, one JSON
file per compile under `<compile cache>/plan-costs/`, named by a digest of what
decides the program: workload, config, overrides, proxy slice, per-device
batch, the jax, jaxlib and libtpu versions, and the source of mlbench's
training code and of the workload (a changed model is never served an old
count). An out-of-memory verdict is kept too: it is as deterministic as a count.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from mlbench.storage import paths, writes
from mlbench.pod import plan as plan_lib, timemodel

FORMAT = 1


def _versions() -> dict[str, str]:
  out = {}
  for pkg in ("jax", "jaxlib", "libtpu"):
    try:
      out[pkg] = metadata.version(pkg)
    except metadata.PackageNotFoundError:
      out[pkg] = "-"
  return out


def code_digest(workload_module: str) -> str:
  """A digest of the Python source that shapes the compiled programs: mlbench's
  training side, the config and rules modules, and the package of the workload's
  module `workload_module` (and its sibling `common`)."""
  import importlib

  root = Path(__file__).resolve().parents[1]
  files = sorted((root / "train").rglob("*.py")) + [root / n for n in (
      "config.py", "fields.py", "workload.py", "rules.py")]
  pkg = Path(importlib.import_module(workload_module).__file__).resolve().parent
  files += sorted(pkg.rglob("*.py")) + sorted((pkg.parent / "common").rglob("*.py"))
  h = hashlib.sha256()
  for f in files:
    if f.is_file():
      h.update(f.read_bytes())
  return h.hexdigest()[:16]


@dataclasses.dataclass
class Compiler:
  """The `CostFn` of a plan: compiles (or reads back) one per-device program."""

  workload: str
  config: str
  overrides: tuple[str, ...]
  cache: paths.Path | None
  say: Callable[[str], None] = lambda line: None
  log: list[dict[str, Any]] = dataclasses.field(default_factory=list)
  _digest: str = ""

  def key(self, proxy: str, per_device: int) -> str:
    from mlbench import registry

    if not self._digest:
      eps = {ep.name: ep for ep in metadata.entry_points(group=registry.GROUP)}
      self._digest = code_digest(eps[self.workload].module)
    what = {"format": FORMAT, "workload": self.workload, "config": self.config,
            "overrides": list(self.overrides), "proxy": proxy, "per_device": per_device,
            "versions": _versions(), "code": self._digest}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24]

  def __call__(self, proxy: str, per_device: int) -> plan_lib.Costs:
    key = self.key(proxy, per_device)
    where = None if self.cache is None else self.cache / "plan-costs" / f"{key}.json"
    if where is not None and where.exists():
      record = json.loads(where.read_text())
      self.log.append({"proxy": proxy, "per_device": per_device, "origin": "cache",
                       "seconds": record["compile_s"]})
      return _costs(record, "cache")
    self.say(f"compiling {self.workload} --config {self.config} for {proxy} at "
             f"{per_device} examples per device ...")
    t0 = time.monotonic()
    record = compile_record(self.workload, self.config, self.overrides, proxy, per_device)
    record["compile_s"] = round(time.monotonic() - t0, 1)
    self.log.append({"proxy": proxy, "per_device": per_device, "origin": "compiled",
                     "seconds": record["compile_s"]})
    if where is not None:
      writes.write_atomic(_ensure(where), json.dumps(record, indent=1, sort_keys=True) + "\n")
    return _costs(record, "compiled")


def _ensure(p: paths.Path) -> paths.Path:
  p.parent.mkdir(parents=True, exist_ok=True)
  return p


def _costs(r: dict[str, Any], origin: str) -> plan_lib.Costs:
  if r.get("train") is None:
    return plan_lib.Costs(None, None, need_bytes=r.get("need_bytes"), origin=origin,
                          seconds=r["compile_s"])
  return plan_lib.Costs(
      train=timemodel.StepCost(**r["train"]), eval=timemodel.StepCost(**r["eval"]),
      peak_bytes=float(r["peak_bytes"]), param_bytes=float(r["param_bytes"]),
      model_flops_per_example=float(r["model_flops_per_example"]), origin=origin,
      seconds=r["compile_s"])


def compile_record(workload: str, config: str, overrides: tuple[str, ...], proxy: str,
                   per_device: int) -> dict[str, Any]:
  """Compiles the program for `proxy` at `per_device` examples a device (train and eval)
  as `mlbench check --topology` does; its per-device figures, or XLA's out-of-memory."""
  import jax

  from mlbench.config import RunConfig
  from mlbench.pod import check, oom, topology
  from mlbench.train import compile_cache
  from mlbench.train.plan import make_plan

  slice_ = topology.parse(proxy)
  jax.config.update("jax_platforms", "cpu")
  compile_cache.configure(None)  # see the module doc
  runtime = topology.runtime(slice_)
  devices = len(runtime.devices)
  gbs = per_device * devices
  sets = (*overrides, f"global_batch_size={gbs}", f"eval_batch_size={gbs}")
  command = (f"mlbench check {workload} --config {config} --topology {proxy} "
             + " ".join(f"--set {s}" for s in sets))
  rc = RunConfig(workload=workload, config=config, overrides=sets)
  plan = make_plan(rc, runtime, machine=topology.machine(slice_, runtime.devices))
  base = {"workload": workload, "config": config, "overrides": list(overrides), "proxy": proxy,
          "per_device_batch": per_device, "command": command, "versions": _versions()}
  try:
    report = check.dry_run(plan, topology=proxy)
  except oom.DoesNotFit as e:
    return {**base, "train": None, "eval": None, "need_bytes": e.need_bytes,
            "hbm_bytes": e.have_bytes, "error": str(e)}
  train, evaluation = report.programs[0], report.programs[1]
  pred = report.prediction
  return {**base,
          "train": {"flops": (train.flops or 0.0) / devices,
                    "hbm_bytes": float(train.bytes_accessed or 0.0)},
          "eval": {"flops": (evaluation.flops or 0.0) / devices,
                   "hbm_bytes": float(evaluation.bytes_accessed or 0.0)},
          "peak_bytes": report.peak_bytes, "param_bytes": report.param_bytes_per_device,
          "params": report.params, "xla_s": train.xla_seconds,
          "train_collectives": train.collectives,
          "train_collective_group_bytes": {str(k): v for k, v in
                                           train.collective_group_bytes.items()},
          "model_flops_per_example": pred.model_flops_per_step / gbs if pred else 0.0,
          "rows_per_step": report.rows_per_step}  # fewer than gbs where the step packs


def points_fn(workload: str, config: str, overrides: tuple[str, ...], rule: Any,
              table: Any) -> plan_lib.PointsFn:
  """The evaluations a run of the config can stop at, at any global batch: (step, epoch or
  samples as its log says them) at the rules' cadence (`mlbench.train.plan.eval_points`),
  with the training budget stretched where the config's ends before the RCP table's
  mean + 6 spreads at that batch (a full config's budget is for its own batch)."""
  from mlbench import config as config_lib, registry, rules
  from mlbench.pod import rcp
  from mlbench.train.plan import eval_points

  wl = registry.get(workload)

  def points(batch: int) -> list[tuple[int, float]]:
    sets = (*overrides, f"global_batch_size={batch}", f"eval_batch_size={batch}")
    _, cfg, _ = config_lib.configured(wl, config, sets)
    schedule = wl.schedule(cfg)
    c = rcp.at(table, batch)
    per = schedule.train_examples if c.unit is rules.Unit.EPOCHS else 1
    need = math.ceil((c.mean + 6 * c.stdev) * per)
    if need > schedule.max_train_samples:
      schedule = dataclasses.replace(schedule, max_train_samples=need)
    return [(p.step, float(p.epoch)) for p in eval_points(schedule, rule)]

  return points


def calibration_costs(workload: str, config: str, overrides: tuple[str, ...]
                      ) -> plan_lib.CostFn:
  """A `CostFn` from the calibration's cached compiles (`calibration_costs.json`: the full
  configs on a 4-chip TPU v4 slice at two per-device batches, BERT and the Transformer at
  two depths), on the straight lines `costtable.device_cost` draws through them: no
  compile, for the workloads whose full compile takes hours here (BERT-large). Only for
  the full config as the calibration compiled it (no --set)."""
  from mlbench import config as config_lib, registry
  from mlbench.errors import UserError
  from mlbench.pod import costtable

  records = costtable.load()
  if config != "full" or overrides:
    raise UserError("--costs calibration has the full configs' compiles only; drop --set and "
                    "--config, or use --costs compile")
  if not any(r["workload"] == workload for r in records.values()):
    raise UserError(f"the calibration compiled no {workload}; use --costs compile")
  wl = registry.get(workload)
  _, cfg, _ = config_lib.configured(wl, config, ())
  per_example = float(wl.flops_per_example(cfg))
  # A packed step (BERT's) runs examples / factor rows: the calibration's compiles of the
  # packed program at that many rows a device, or where it has none, a padded example's
  # (the same length through the same layers) for a row.
  packing = wl.schedule(cfg).packing
  per_row = packing.factor if packing is not None else 1.0
  packed = packing is not None and any(r["workload"] == workload and r.get("packed")
                                       for r in records.values())

  def cost(proxy: str, per_device: int) -> plan_lib.Costs:
    train = costtable.device_cost(records, workload, per_device / per_row, 1, "train",
                                  packed=packed)
    evaluation = costtable.device_cost(records, workload, per_device, 1, "eval")
    return plan_lib.Costs(
        train=timemodel.StepCost(train["flops"], train["bytes"]),
        eval=timemodel.StepCost(evaluation["flops"], evaluation["bytes"]),
        peak_bytes=max(train["peak"], evaluation["peak"]), param_bytes=4.0 * train["params"],
        model_flops_per_example=per_example, origin="calibration")

  return cost
