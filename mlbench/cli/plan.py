"""`mlbench plan`: which slice and global batch train a workload fastest or cheapest."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click

from mlbench.cli import output
from mlbench.errors import UserError


def _ints(value: str) -> tuple[int, ...] | None:
  if value.strip().lower() == "auto":
    return None
  try:
    out = tuple(int(v.replace("_", "")) for v in value.split(",") if v.strip())
  except ValueError:
    raise UserError(f"--batches {value}: give auto or comma-separated integers, e.g. "
                    "4096,8192") from None
  if not out or min(out) < 1:
    raise UserError(f"--batches {value}: give auto or positive integers")
  return out


@click.command("plan")
@click.argument("workload")
@click.option("--config", "config_name", default="full", show_default=True, metavar="full|PATH",
              envvar="MLBENCH_CONFIG", help="Config name or a .py file with get_config().")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a config value (repeatable).")
@click.option("--slices", required=True, metavar="SLICE,...", envvar="MLBENCH_PLAN_SLICES",
              help="Candidate slices: Cloud TPU names (v4-128, v5p-256, ...) or GPUs as h100-64 "
                   "(predicted with the constants fitted on H100 runs).")
@click.option("--batches", default="auto", show_default=True, metavar="auto|B,...",
              envvar="MLBENCH_PLAN_BATCHES",
              help="Global batches; auto: the RCP table's that split over each slice.")
@click.option("--objective", type=click.Choice(["time", "chip-hours"]), default="time",
              show_default=True, envvar="MLBENCH_PLAN_OBJECTIVE",
              help="Rank by the expected MLPerf score, or by its chip-hours.")
@click.option("--runs", type=click.IntRange(min=1), envvar="MLBENCH_PLAN_RUNS",
              help="Runs of the MLPerf score (olympic mean). [default: the rules' count]")
@click.option("--rcps", "rcps_file", type=click.Path(dir_okay=False, path_type=Path),
              envvar="MLBENCH_PLAN_RCPS",
              help="Reference convergence points to use (the RCP checker's JSON format). "
                   "[default: mlperf-logging's for the rules' round]")
@click.option("--compile-cache", metavar="DIR|off", envvar="MLBENCH_COMPILE_CACHE",
              help="Where compiled programs' figures are kept (DIR/plan-costs) for the next "
                   "plan. [default: as run's compile cache]")
@click.option("--costs", type=click.Choice(["compile", "calibration"]), default="compile",
              show_default=True, envvar="MLBENCH_PLAN_COSTS",
              help="Where the per-device programs' costs come from: compile them (once per "
                   "TPU generation and per-device batch), or the time model's calibration "
                   "compiles (full configs on TPU v4, interpolated in batch and depth: no "
                   "compile, for BERT-large and the Transformer).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON on stdout.")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a PNG: time to train and chip-hours against chips (never overwrites).")
def plan_cmd(workload: str, config_name: str, overrides: tuple[str, ...], slices: str,
             batches: str, objective: str, runs: int | None, rcps_file: Path | None,
             compile_cache: str | None, costs: str, as_json: bool,
             plot_file: Path | None) -> int:
  """Predict WORKLOAD's time to train on every candidate slice and global batch.

  For each: the steps to converge from MLPerf's reference convergence points (mean and
  spread, interpolated as the RCP checker does), the step time of the program compiled
  for the slice's TPU generation (no TPU needed; one compile per per-device batch, kept
  for the next plan), evaluations and warm-up from the time model fitted on Google's
  published runs; the median run's time, its 10-90% band, the expected MLPerf score of
  --runs runs, chip-hours, and whether it fits in HBM (with the fix when not).
  """
  from mlbench import config as config_lib, registry, rules
  from mlbench.pod import oom, plan as plan_lib, plancost, rcp, uncertainty

  if plot_file is not None and (plot_file.exists() or not plot_file.parent.is_dir()):
    raise UserError(f"--plot {plot_file}: " + ("exists; choose another name (mlbench never "
                    "overwrites)" if plot_file.exists() else "its folder does not exist"))
  wl = registry.get(workload)
  name, cfg, _ = config_lib.configured(wl, config_name, overrides)
  rule = rules.load(wl.benchmark, rules.default_ruleset(wl.benchmark, name, wl.rulesets))
  table = rcp.load(rule, rcps_file)
  targets = [plan_lib.target(s) for s in slices.split(",") if s.strip()]
  console = output.console()
  compiler = plancost.Compiler(workload, config_name, tuple(overrides),
                               config_lib.compile_cache_dir(compile_cache),
                               say=lambda line: console.print(line, highlight=False))
  cost_of = compiler if costs == "compile" else plancost.calibration_costs(
      workload, config_name, tuple(overrides))
  result = plan_lib.evaluate(
      targets, _ints(batches), table, cost_of=cost_of,
      points_of=plancost.points_fn(workload, config_name, tuple(overrides), rule, table),
      workload=workload, eval_examples=wl.schedule(cfg).eval_examples,
      runs=runs or rule.runs, objective=plan_lib.Objective(objective),
      remat_hint=oom.remat_hint(cfg), spread=uncertainty.describe)
  title = f"{workload} --config {name}, {table.source} RCPs, score of {result.runs} runs"
  # The table is the command's output (`mlbench plan ... > plan.txt`); with --json the
  # JSON is, and the table joins the notes on stderr.
  _print(result, table, compiler, console, title, out=output.console(stderr=as_json))
  if plot_file is not None:
    _plot(result, plot_file, title)
    console.print(f"plot: {plot_file}", highlight=False)
  if as_json:
    click.echo(json.dumps(plan_lib.to_json(result, {
        "workload": workload, "config": name, "rcp_source": table.source,
        "compiles": compiler.log, "compile_cache": _cache_note(compiler)}), indent=2))
  return 0


def _plot(result: Any, path: Path, title: str) -> None:
  import tempfile

  from mlbench.storage import writes
  from mlbench.pod import planplot

  with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
    made = planplot.plot(result, Path(tmp) / "plan.png", title)
    if not writes.write_new(path, made.read_bytes()):
      raise UserError(f"{path} appeared while planning; choose another name")


def _cache_note(compiler: Any) -> str:
  where = "off" if compiler.cache is None else f"{compiler.cache}/plan-costs"
  return (f"{where}: compiled programs' figures (JAX's persistent cache cannot load programs "
          "compiled for a TPU topology without a TPU)")


def _unit(result: Any) -> tuple[str, float]:
  """Minutes, or seconds where every time is under two minutes (the mini configs)."""
  times = [c.outlook.p90_s for c in result.candidates
           if c.outlook is not None and math.isfinite(c.outlook.p90_s)]
  return ("s", 1.0) if times and max(times) < 120 else ("min", 60.0)


def _print(result: Any, table: Any, compiler: Any, console: Any, title: str, *,
           out: Any) -> None:
  """The table and its legend to `out`, the notes to `console` (stderr)."""
  from rich.table import Table

  unit, per = _unit(result)

  def _min(s: float) -> str:
    return f"{s / per:,.2f}" if math.isfinite(s) else "-"

  t = Table(title=title, title_justify="left")
  for col in ("rank", "slice", "chips", "batch", "per device", "HBM peak", "step ms", "steps",
              "evals", f"median {unit}", f"10-90% {unit}", f"score ({result.runs} runs) {unit}",
              "chip-h", "RCP", "model x/÷"):
    t.add_column(col, justify="left" if col in ("slice", "RCP", "model x/÷") else "right")
  for c in result.candidates:
    rank = "-" if c.rank is None else f"{c.rank}{' *' if c.pareto else ''}"
    hbm = (f"{c.costs.peak_bytes / 2**30:,.1f} GiB" if c.fits else "[red]does not fit[/]")
    name = f"{c.target.name} (GPU)" if c.target.gpu else c.target.name
    look, terms = c.outlook, c.terms
    t.add_row(rank, name, f"{c.target.chips:,}", f"{c.batch:,}", str(c.per_device), hbm,
              "-" if terms is None else f"{terms.step_s * 1e3:,.2f}",
              "-" if terms is None else f"{terms.steps:,.0f}",
              "-" if terms is None else f"{terms.evals:,.0f}",
              "-" if look is None else _min(look.median_s),
              "-" if look is None else f"{_min(look.p10_s)}-{_min(look.p90_s)}",
              "-" if look is None else _min(look.score_s),
              "-" if c.chip_hours is None else f"{c.chip_hours:,.1f}",
              c.convergence.how.removeprefix("RCP ").lower(), _sure(c))
  out.print(t)
  out.print(f"rank by {result.objective.value} (the expected MLPerf score of "
            f"{result.runs} runs, RCP normalisation included); * on the Pareto front of "
            "time and chip-hours", highlight=False)
  for c in result.candidates:
    if not c.fits:
      console.print(f"{c.target.name} at batch {c.batch:,}: {c.fix}", highlight=False)
  for why in sorted({(c.target.name, "; ".join(c.extrapolated)) for c in result.candidates
                     if c.extrapolated}):
    out.print(f"[yellow]extrapolated[/] {why[0]}: {why[1]}", highlight=False)
  for line in result.skipped:
    console.print(f"left out: {line}", highlight=False)
  _print_sources(result, table, compiler, console)


def _sure(c: Any) -> str:
  """The time model's band factor for a candidate, and whether it extrapolates."""
  if c.spread is None:
    return "-"
  return f"{c.spread['band_factor']:.2f}" + (" extrapolated" if c.extrapolated else "")


def _print_sources(result: Any, table: Any, compiler: Any, console: Any) -> None:
  conv = {c.batch: c.convergence for c in result.candidates}
  for b in sorted(conv):
    console.print("steps to converge: " + conv[b].describe(), highlight=False)
  if any(c.costs.origin == "calibration" for c in result.candidates):
    console.print("programs: the time model's calibration compiles (mlbench/pod/"
                  "calibration_costs.json: the full config on a 4-chip TPU v4 slice at two "
                  "per-device batches, and depths), on straight lines in the per-device batch "
                  "and depth; no compile", highlight=False)
  if not compiler.log:
    return _print_constants(result, console)
  made = [e for e in compiler.log if e["origin"] == "compiled"]
  read = [e for e in compiler.log if e["origin"] == "cache"]
  served = len(result.candidates)
  console.print(
      f"programs: {len(made)} compiled ({sum(e['seconds'] for e in made):,.0f} s), {len(read)} "
      f"read back from {_cache_note(compiler)} (they took {sum(e['seconds'] for e in read):,.0f}"
      f" s to compile), for {served} candidates: one program per TPU generation and per-device "
      "batch, compiled for the generation's smallest slice; the per-device program does not "
      "depend on how many devices share the data axis, whose gradient all-reduce is timed on "
      "each slice's torus", highlight=False)
  _print_constants(result, console)


def _print_constants(result: Any, console: Any) -> None:
  from mlbench.pod import estimate

  from mlbench.pod import uncertainty

  for platform in sorted({c.target.accelerator.platform for c in result.candidates}):
    _, prov = estimate.constants(platform)
    gpu = (" (GPU candidates: program counts from the TPU v4 compile, memory approximate)"
           if platform == "gpu" else "")
    u = uncertainty.of(platform)
    console.print(f"time model ({platform}): constants fitted on {prov.get('fitted_on', '?')}"
                  f"{gpu}; how sure: {u.summary()}", highlight=False)
    console.print(f"  the 10-90% band and the score carry the wider, x/÷ "
                  f"{math.exp(u.sigma()):.2f}, as a log-normal factor on the time model; "
                  f"extrapolated candidates wider still ({uncertainty.RULE})", highlight=False)
