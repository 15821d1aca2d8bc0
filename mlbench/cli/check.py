"""`mlbench check`: a compile-only dry run of a workload on a mesh or a TPU slice."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

import click

from mlbench.pod.hlo import COLLECTIVES
from mlbench.cli import output
from mlbench.cli.scaling import scaling_config, scaling_options
from mlbench.config import RunConfig

if TYPE_CHECKING:
  from mlbench.pod.predict import Convergence
  from mlbench.storage import paths
  from mlbench.train.plan import Plan


@click.command("check")
@click.argument("workload")
@click.option("--config", "config_name", metavar="mini|full|PATH", envvar="MLBENCH_CONFIG",
              help="Config name or a .py file with get_config(). [default: mini]")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a config value (repeatable).")
@click.option("--cpu-devices", type=click.IntRange(min=1), envvar="MLBENCH_CPU_DEVICES",
              help="Simulate this many CPU devices, e.g. a pod slice's count.")
@click.option("--topology", metavar="SLICE",
              help="Compile for a Cloud TPU slice with the TPU compiler (no TPU needed; needs "
                   "libtpu): v3-2048, v4-128, v5p-256, v6e-64, ...")
@click.option("--from-log", metavar="PATH",
              help="Steps to converge from this result log of a real run (a file or gs://...), "
                   "instead of MLPerf's reference convergence points.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@scaling_options
def check_cmd(workload: str, config_name: str | None, overrides: tuple[str, ...],
              cpu_devices: int | None, topology: str | None, from_log: str | None,
              as_json: bool, **scaling) -> int:
  """Compile WORKLOAD's init, train and eval steps for the mesh, from shapes alone.

  Prints per-device memory (parameters, optimizer state, temporaries) against the
  chip's HBM, FLOPs per step and the collectives in each compiled program, without
  running a step or reading data, so sharding and out-of-memory errors show before
  pod time. With --topology: also XLA's estimated step time, the roofline terms, the
  predicted samples/s, MFU and time to train.
  """
  from mlbench.storage import paths
  from mlbench.pod import check, parallel
  from mlbench.train import compile_cache

  if topology and cpu_devices:
    raise click.UsageError("--topology and --cpu-devices exclude each other")
  log = None if from_log is None else paths.require_file(from_log, "--from-log")
  rc = RunConfig(workload=workload, config=config_name, overrides=tuple(overrides),
                 cpu_devices=cpu_devices, **scaling_config(scaling))
  plan, note = _topology_plan(rc, topology) if topology else _local_plan(rc)
  report = check.dry_run(plan, topology=topology, convergence=convergence(plan, log))
  axes = parallel.report(plan, report)  # the spatial and stage axes, where the mesh has them
  # The report is the command's product: stdout, where `> report.txt` keeps it; with
  # --json the JSON is, and the report joins the notes on stderr.
  out = output.console(stderr=as_json)
  _print(report, out)
  if note:
    out.print(note, highlight=False)
  for line in parallel.lines(axes, readable=report.programs[0].hlo_readable) if axes else ():
    out.print(line, highlight=False)
  output.console().print(compile_cache.stats().summary(), highlight=False)
  if as_json:
    click.echo(json.dumps({**report.to_json(), "compile_cache": compile_cache.stats().to_json(),
                           "parallel": dataclasses.asdict(axes) if axes else None}, indent=2))
  return 0


def _local_plan(rc: RunConfig):
  from mlbench.pod import check
  from mlbench.train import runtime as runtime_lib
  from mlbench.train.plan import make_plan

  runtime = runtime_lib.setup(cpu_devices=rc.cpu_devices, distributed=runtime_lib.Distributed(
      rc.coordinator, rc.num_processes, rc.process_id), compile_cache=rc.compile_cache)
  rc, note = check.fit_eval_batch(rc, len(runtime.devices))
  return make_plan(rc, runtime), note


def _topology_plan(rc: RunConfig, name: str):
  import jax

  from mlbench.pod import check, topology
  from mlbench.train import compile_cache
  from mlbench.train.plan import make_plan

  slice_ = topology.parse(name)
  # Host-side work (random keys, shapes) stays on the CPU; the TPU compiler is reached
  # through the topology, never through a TPU backend this machine does not have.
  jax.config.update("jax_platforms", "cpu")
  # No cache: the compile-only TPU client writes entries but cannot load them ("PjRtCompiler
  # must be constructed with a Client to call DeserializeLoadedExecutable"), a warning each.
  compile_cache.configure(None)
  runtime = topology.runtime(slice_)
  rc, note = check.fit_eval_batch(rc, len(runtime.devices))
  return make_plan(rc, runtime, machine=topology.machine(slice_, runtime.devices)), note


def convergence(plan: Plan, from_log: paths.Path | None) -> Convergence:
  """Samples to converge for the time to train: from a real run's log, MLPerf's reference
  convergence points, else the config's budget; its source names any provisional config
  values (no source yet: `mlbench.fields.provisional`) the prediction rests on."""
  from mlbench import fields
  from mlbench.pod import predict

  if from_log is not None:
    found = predict.from_log(from_log, plan.rule, plan.schedule.train_examples)
  else:
    found = (predict.from_rcps(plan.rule, plan.gbs, plan.schedule.train_examples)
             or predict.Convergence(samples=plan.schedule.max_train_samples,
                                    source="the config's training budget (an upper bound: no "
                                           "reference convergence points for these rules)"))
  marked = fields.provisionals(plan.cfg)
  if not marked:
    return found
  values = ", ".join(f"{k}={v!r}" for k, (v, _) in marked.items())
  return dataclasses.replace(found, source=f"{found.source}; PROVISIONAL: {values} have no "
                                           "source (mlbench describe lists why)")


def _mib(n: float) -> str:
  return f"{n / 2**20:,.1f} MiB"


def _gib(n: float) -> str:
  return f"{n / 2**30:,.2f} GiB"


def _print(report, console) -> None:
  from rich.table import Table

  mesh = " x ".join(f"{k}={v}" for k, v in report.mesh.items())
  where = f"{report.topology} ({report.device_kind})" if report.topology else report.platform
  console.print(f"[bold]{report.workload}[/] --config {report.config} at global batch "
                f"{report.global_batch_size:,} on {mesh} ({where}): {report.params:,} parameters; "
                f"per device: parameters {_mib(report.param_bytes_per_device)}, optimizer state "
                f"{_mib(report.opt_state_bytes_per_device)} (of {_mib(report.opt_state_bytes_total)})",
                highlight=False)
  if report.rows_per_step != report.global_batch_size:
    console.print(f"packed: the {report.global_batch_size:,} examples of a step in "
                  f"{report.rows_per_step:,} rows (packing factor "
                  f"{report.global_batch_size / report.rows_per_step:.3f}); model FLOPs per "
                  f"example {report.flops_per_example / 1e9:,.1f} GFLOP (the packed step's)",
                  highlight=False)
  table = Table(title="compiled programs (per device)", title_justify="left")
  for col in ("program", "GFLOP/step (all devices)", "arguments", "outputs", "temporaries",
              "peak", *COLLECTIVES):
    table.add_column(col, justify="right" if col != "program" else "left")
  for p in report.programs:
    table.add_row(p.name, "-" if p.flops is None else f"{p.flops / 1e9:,.2f}",
                  _mib(p.argument_bytes), _mib(p.output_bytes), _mib(p.temp_bytes),
                  _mib(p.peak_bytes), *(_collective(p, c) for c in COLLECTIVES))
  console.print(table)
  train = report.programs[0]
  console.print("train step matmul/conv inputs: " + ", ".join(
      f"{k} {v}" for k, v in sorted(train.matmul_input_dtypes.items())) + "; parameters: " +
      ", ".join(f"{k} {v}" for k, v in sorted(report.param_dtypes.items())), highlight=False)
  for line in report.attention:  # which kernel each attention runs on, and why
    console.print("attention, " + line, highlight=False)
  _print_unreadable(report, console)
  if report.hbm_bytes_per_device:
    _print_fit(report, console)
  if report.prediction is not None:
    _print_prediction(report.prediction, report.programs[0], console)
  _print_hbm(report, console)


def _collective(p, op: str) -> str:
  if not p.hlo_readable:
    return "?"
  n = p.collectives[op]
  return f"{n} ({_mib(p.collective_bytes.get(op, 0))})" if n else "0"


def _print_fit(report, console) -> None:
  hbm, peak = report.hbm_bytes_per_device, report.peak_bytes
  if report.fits:
    console.print(f"[green]fits[/]: peak {_gib(peak)} of {_gib(hbm)} HBM per device "
                  f"({100 * peak / hbm:.0f}%)", highlight=False)
  else:
    console.print(f"[red]does not fit[/]: peak {_gib(peak)} of {_gib(hbm)} HBM per device, "
                  f"{_gib(peak - hbm)} over; try --weight-update-sharding, a model axis, remat, "
                  "or a smaller per-chip batch", highlight=False)


def _print_unreadable(report, console) -> None:
  """One line per program XLA could not print: what was read instead, what is unknown."""
  for p in report.programs:
    if p.collective_source == "HLO text":
      continue
    what = ("collectives read from its HLO module proto; matmul dtypes unknown"
            if p.hlo_readable else "collectives and matmul dtypes unknown")
    console.print(f"[yellow]XLA could not print the compiled {p.name}[/] ({p.xla_error}): "
                  f"{what}", highlight=False)


def _ms(s: float) -> str:
  return f"{s * 1e3:,.2f} ms"


def _xla(program) -> str:
  """XLA's estimate of a program as printed: what was added back, or why there is none
  (never the word libtpu: tests read it as the TPU client's noise)."""
  if program.xla_seconds is None:
    return f"- ({program.xla_note})" if program.xla_note else "-"
  said = f" ({program.xla_note})" if program.xla_note else ""
  if program.xla_concat_bitcasts:
    said = (f" (XLA's {program.xla_raw_seconds:.6g} s with its "
            f"{program.xla_concat_bitcasts} ConcatBitcast calls' -1 s added back)")
  return _ms(program.xla_seconds) + said


def _print_prediction(p, train, console) -> None:
  r, t = p.roofline, p.terms
  xla = _xla(train)
  console.print(
      f"step time bounds: compute {_ms(r.compute_s)}, HBM {_ms(r.hbm_s)}, collectives on the "
      f"topology {_ms(r.collective_s)} ({r.limit}-bound); XLA's estimate {xla}", highlight=False)
  c = p.provenance
  console.print(
      f"predicted step {_ms(t.step_s)} = device {_ms(t.device_step_s)} + "
      f"exposed collectives {_ms(t.collective_s)} + host/dispatch {_ms(t.overhead_s)}; input "
      f"decode needs {_ms(t.input_step_s)} per step ("
      f"{'[red]input-bound[/]' if t.input_bound else 'not input-bound'})", highlight=False)
  console.print(
      f"device step {_ms(t.device_step_s)} = fixed work {_ms(t.fixed_s)} + soft maximum of "
      f"compute at the fitted efficiency {_ms(t.compute_s)} and HBM {_ms(t.memory_s)} (the "
      "bytes beyond the weights' fixed traffic at the fitted bandwidth factor)", highlight=False)
  if not p.collectives_known:
    console.print("model-axis collectives unknown (XLA could not print the program): the "
                  "prediction counts only the gradient all-reduce", highlight=False)
  console.print(
      f"[bold]predicted[/]: {p.samples_per_s:,.0f} samples/s, {p.model_flops_per_s / 1e12:,.1f} "
      f"model TFLOP/s = MFU {100 * p.mfu:.1f}% of {p.devices} x {p.accelerator} (analytic "
      "model FLOPs)", highlight=False)
  if p.time_to_train_s is None:
    return
  u = c.get("uncertainty") or {}
  band = f" (x/÷ {u['band_factor']:.2f})" if u else f" ({c.get('fitted_on', '')})"
  console.print(
      f"[bold]time to train {p.time_to_train_s / 60:,.2f} min[/]{band} = warm-up "
      f"{t.warmup_s:,.1f} s + {t.steps:,.0f} steps x {_ms(t.step_s)} ({t.train_s:,.1f} s) + "
      f"{t.evals:,.0f} evaluations x {t.eval_each_s:,.2f} s ({t.eval_s:,.1f} s); steps from "
      f"{p.convergence_source}", highlight=False)
  if u:
    console.print(f"how sure: {u['summary']}; the band is the wider", highlight=False)
  if u.get("extrapolated"):
    console.print(f"[yellow]extrapolated[/]: {'; '.join(u['extrapolated'])}; band widened to "
                  f"x/÷ {u['band_factor']:.2f} ({u['rule']})", highlight=False)


def _print_hbm(report, console) -> None:
  """The train step's HBM bytes by kind (mlbench/pod/hbm.py), with each kind's share of
  the HBM bound where there is a prediction."""
  from rich.table import Table

  from mlbench.pod import hbm

  b = report.programs[0].hbm
  if b is None or not b.total:
    return
  hbm_s = report.prediction.roofline.hbm_s if report.prediction is not None else None
  memory = "HBM" if report.hbm_bytes_per_device else "memory"
  layers = f", of which in its {b.layers} numbered layers" if b.layers else ""
  table = Table(title=f"train step {memory} bytes by kind (per device, XLA's count{layers})",
                title_justify="left")
  for col in ("kind", "GB", "share", *(("ms of the HBM bound",) if hbm_s else ()),
              *(("in layers, GB",) if b.layers else ())):
    table.add_column(col, justify="left" if col == "kind" else "right")
  for kind in (*hbm.KINDS, hbm.UNATTRIBUTED):
    part = b.parts.get(kind, 0.0)
    table.add_row(kind, f"{part / 1e9:,.2f}", f"{100 * part / b.total:.1f}%",
                  *((f"{1e3 * hbm_s * part / b.total:,.2f}",) if hbm_s else ()),
                  *((f"{b.in_layers.get(kind, 0.0) / 1e9:,.2f}",) if b.layers else ()))
  table.add_row("total", f"{b.total / 1e9:,.2f}", "100.0%",
                *((f"{1e3 * hbm_s:,.2f}",) if hbm_s else ()),
                *((f"{sum(b.in_layers.values()) / 1e9:,.2f}",) if b.layers else ()))
  console.print(table)
  if b.between_memories:
    spaces = ", ".join(f"{n / 1e9:,.2f} GB in memory space {k}"
                       for k, n in b.by_memory_space.items() if n >= 1e6)
    console.print(f"of these, {b.between_memories / 1e9:,.2f} GB are prefetches and evictions "
                  "between memories (copy-start/done, slice-start/done), as XLA counts them, "
                  f"under the kind of the op they serve; by where the bytes are: {spaces} (0 is "
                  "HBM)", highlight=False)
  if b.loop_repeats:
    console.print(f"[yellow]XLA counts a loop's body once[/]: its further runs move "
                  f"{b.loop_repeats / 1e9:,.2f} GB more a step, in no part above and not in the "
                  "HBM bound", highlight=False)
