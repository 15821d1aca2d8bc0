"""`mlbench check`: a compile-only dry run of a workload on a mesh."""

from __future__ import annotations

import json

import click

from mlbench.pod.check import COLLECTIVES
from mlbench.cli import output
from mlbench.cli.scaling import scaling_config, scaling_options
from mlbench.config import RunConfig


@click.command("check")
@click.argument("workload")
@click.option("--config", "config_name", metavar="mini|full|PATH", envvar="MLBENCH_CONFIG",
              help="Config name or a .py file with get_config(). [default: mini]")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a config value (repeatable).")
@click.option("--cpu-devices", type=click.IntRange(min=1), envvar="MLBENCH_CPU_DEVICES",
              help="Simulate this many CPU devices, e.g. a pod slice's count.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@scaling_options
def check_cmd(workload: str, config_name: str | None, overrides: tuple[str, ...],
              cpu_devices: int | None, as_json: bool, **scaling) -> int:
  """Compile WORKLOAD's train and eval steps for the mesh, from shapes alone.

  Prints per-device memory (parameters, optimizer state, temporaries), FLOPs per
  step and the collectives in each compiled program, without running a step or
  reading data, so sharding and out-of-memory errors show before pod time.
  """
  from mlbench.pod import check
  from mlbench.train import runtime as runtime_lib
  from mlbench.train.plan import make_plan

  rc = RunConfig(workload=workload, config=config_name, overrides=tuple(overrides),
                 cpu_devices=cpu_devices, **scaling_config(scaling))
  runtime = runtime_lib.setup(cpu_devices=cpu_devices, distributed=runtime_lib.Distributed(
      rc.coordinator, rc.num_processes, rc.process_id))
  report = check.dry_run(make_plan(rc, runtime))
  _print(report, output.console())
  if as_json:
    click.echo(json.dumps(report.to_json(), indent=2))
  return 0


def _mib(n: int) -> str:
  return f"{n / 2**20:,.1f} MiB"


def _print(report, console) -> None:
  from rich.table import Table

  mesh = " x ".join(f"{k}={v}" for k, v in report.mesh.items())
  console.print(f"[bold]{report.workload}[/] --config {report.config} on {mesh} "
                f"({report.platform}): {report.params:,} parameters; per device: parameters "
                f"{_mib(report.param_bytes_per_device)}, optimizer state "
                f"{_mib(report.opt_state_bytes_per_device)} (of {_mib(report.opt_state_bytes_total)})",
                highlight=False)
  table = Table(title="compiled programs (per device)", title_justify="left")
  for col in ("program", "GFLOP/step (all devices)", "arguments", "outputs", "temporaries",
              "peak", *COLLECTIVES):
    table.add_column(col, justify="right" if col != "program" else "left")
  for p in report.programs:
    table.add_row(p.name, "-" if p.flops is None else f"{p.flops / 1e9:,.2f}",
                  _mib(p.argument_bytes), _mib(p.output_bytes), _mib(p.temp_bytes),
                  _mib(p.peak_bytes), *(str(p.collectives[c]) for c in COLLECTIVES))
  console.print(table)
