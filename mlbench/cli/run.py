"""`mlbench run`: time-to-quality runs that write MLPerf result logs."""

from __future__ import annotations

import json
import statistics
from typing import TYPE_CHECKING

import click

from mlbench.cli import output
from mlbench.cli.scaling import scaling_config, scaling_options
from mlbench.config import STALE_AFTER_S, Division, RunConfig

if TYPE_CHECKING:
  from mlbench.rules import Rule
  from mlbench.train.runner import Outcome


@click.command("run")
@click.argument("workload")
@click.option("--config", "config_name", metavar="mini|full|PATH", envvar="MLBENCH_CONFIG",
              help="Config name, or a .py file whose get_config() returns one. "
                   "[default: the workload's default, mini]")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a config value, e.g. --set optimizer.base_learning_rate=8 "
                   "(repeatable; `mlbench describe` lists the keys).")
@click.option("--init-checkpoint", metavar="PATH", envvar="MLBENCH_INIT_CHECKPOINT",
              help="The weights the reference starts from (BERT: the MLPerf phase-1 TensorFlow "
                   "checkpoint model.ckpt-28252; SSD: the ImageNet ResNet-34 backbone .npz), a "
                   "file or gs://... . Closed full runs need it.")
@click.option("--data-dir", metavar="DIR", envvar="MLBENCH_DATA_DIR",
              help="Dataset folder or bucket (gs://...); mini datasets are generated here. "
                   "[default: $MLBENCH_CACHE_DIR/data or ~/.cache/mlbench/data]")
@click.option("--results-dir", metavar="DIR", default="results", show_default=True,
              envvar="MLBENCH_RESULTS_DIR",
              help="Submission folder, on a disk every host shares or in a bucket (gs://...): "
                   "results/<system>/<benchmark>/result_<i>.txt and systems/<system>.json go "
                   "in it.")
@click.option("--system", envvar="MLBENCH_SYSTEM",
              help="System description name. [default: derived from the machine, e.g. cpu-2core]")
@click.option("--seed", type=int, envvar="MLBENCH_SEED",
              help="Seed of the first run (run i uses seed+i). [default: from the OS, per run]")
@click.option("--runs", type=click.IntRange(min=1), default=1, show_default=True,
              envvar="MLBENCH_RUNS", help="Number of independent runs.")
@click.option("--ruleset", metavar="VERSION", envvar="MLBENCH_RULESET",
              help="Rules to follow: 4.0.0, 0.7.0, mini. [default: mini for the mini config, "
                   "else the newest official ruleset]")
@click.option("--division", type=click.Choice([d.value for d in Division]), default="closed",
              show_default=True, envvar="MLBENCH_DIVISION",
              help="closed enforces the rules' hyperparameter constraints.")
@click.option("--submitter", default="mlbench", show_default=True, envvar="MLBENCH_SUBMITTER",
              help="Organisation logged as submission_org.")
@click.option("--cpu-devices", type=click.IntRange(min=1), envvar="MLBENCH_CPU_DEVICES",
              help="Simulate this many CPU devices (a pod on one host).")
@click.option("--clear-caches", is_flag=True, envvar="MLBENCH_CLEAR_CACHES",
              help="Drop the OS page cache before each run (needs root), as MLPerf requires.")
@click.option("--checkpoint-every", type=click.IntRange(min=0), default=0, show_default=True,
              envvar="MLBENCH_CHECKPOINT_EVERY", metavar="STEPS",
              help="Save a checkpoint (asynchronously, with orbax) every STEPS train steps, and "
                   "on SIGTERM/SIGINT, so an interrupted run can be resumed. 0: off.")
@click.option("--checkpoint-dir", metavar="DIR", envvar="MLBENCH_CHECKPOINT_DIR",
              help="Folder for checkpoints (its parent must exist), or a bucket (gs://...) "
                   "every host writes its shards to. [default: each run's folder, "
                   "<results-dir>/runs/<system>/<benchmark>/<run id>/checkpoints]")
@click.option("--save-rate", type=click.FloatRange(min=0, min_open=True), metavar="MB/S",
              envvar="MLBENCH_SAVE_RATE",
              help="How fast a host writes its part of a checkpoint, in MB/s: each save may take "
                   "4x the busiest host's bytes at this rate (at least 300 s). [default: 100 "
                   "MB/s until the run's first save, then as that save measured]")
@click.option("--resume", "resume", metavar="PATH",
              help="Continue the interrupted run whose run folder (or checkpoint folder) is "
                   "PATH, on a disk or gs://: same seed and settings, its log continued, its "
                   "time counted from its original run_start.")
@click.option("--stale-after", type=click.FloatRange(min=1), default=STALE_AFTER_S,
              show_default=True, envvar="MLBENCH_STALE_AFTER", metavar="SECONDS",
              help="A pending log of a run on another host counts as abandoned (and is moved "
                   "to its run folder) once its heartbeat is this old; this host's, once its "
                   "process is gone.")
@click.option("--profile", metavar="START:COUNT", envvar="MLBENCH_PROFILE",
              help="Trace COUNT train steps from step START with jax.profiler into the run "
                   "folder (runs/<system>/<benchmark>/<run id>/tensorboard; view with "
                   "TensorBoard's profile plugin).")
@scaling_options
@click.pass_context
def run_cmd(ctx: click.Context, workload: str, config_name: str | None,
            overrides: tuple[str, ...], init_checkpoint: str | None, data_dir: str | None,
            results_dir: str, system: str | None, seed: int | None, runs: int,
            ruleset: str | None, division: str, submitter: str, cpu_devices: int | None,
            clear_caches: bool, checkpoint_every: int, checkpoint_dir: str | None,
            save_rate: float | None, resume: str | None, stale_after: float,
            profile: str | None, **scaling) -> int:
  """Train WORKLOAD to its quality target and write MLPerf result logs.

  Prints one JSON line per run on stdout; progress and summaries on stderr.
  Exit code 0 when every run reached the target with a compliant log, else 1.
  """
  from mlbench.storage import paths
  from mlbench.train.telemetry import ProfileWindow

  window = ProfileWindow.parse(profile) if profile is not None else None
  # Names become folders under --results-dir: refuse a bad one before JAX starts.
  if system is not None:
    paths.check_name("--system", system)
  paths.check_name("--submitter", submitter)
  data = paths.path(data_dir, "--data-dir") if data_dir else paths.path(
      paths.default_cache_dir() / "data")
  if init_checkpoint:  # the config key of the workload's starting point
    overrides = (*overrides, f"{_start_key(workload)}={init_checkpoint}")
  rc = RunConfig(workload=workload, config=config_name, overrides=tuple(overrides),
                 data_dir=data, results_dir=paths.path(results_dir, "--results-dir"),
                 system=system, seed=seed, runs=runs, ruleset=ruleset,
                 division=Division(division), submitter=submitter, cpu_devices=cpu_devices,
                 clear_caches=clear_caches, checkpoint_every=checkpoint_every,
                 checkpoint_dir=paths.optional(checkpoint_dir, "--checkpoint-dir"),
                 save_rate=None if save_rate is None else save_rate * 1e6,
                 stale_after=stale_after, **scaling_config(scaling),
                 profile=None if window is None else (window.start, window.count))
  if resume is not None:  # Before JAX starts: a clashing --resume fails at once.
    from mlbench.train.lifecycle import resume as resume_lib

    given = {p.name for p in ctx.command.params if ctx.get_parameter_source(p.name) in (
        click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)}
    rc = resume_lib.resumed_config(rc, resume, given)
  if data_dir is not None or resume is not None:  # never start on half a prepared set
    from mlbench.datasets import check

    check.require_complete(rc.data_dir)
  from mlbench.train import runner  # Heavy: JAX, Flax, TensorFlow.

  console = output.console()
  plan = runner.prepare(rc)
  if plan.runtime.is_leader:
    _header(plan, console)
  outcomes = runner.run_all(plan, console=console,
                            on_outcome=lambda o: _report(plan, o, console))
  if plan.runtime.is_leader and len(outcomes) > 1:
    _summary(plan, outcomes, console)
  good = all(run_status(plan.rule, plan.rc.division, o) == SUCCESS for o in outcomes)
  return 0 if good else 1


SUCCESS = "success"


def run_status(rule: Rule, division: Division, outcome: Outcome) -> str:
  """A run's status under `rule` in `division`: success only where it reached the target
  and nothing judged it non-compliant (the official checker on its log, the rules' init
  limit); a run that reached the target and failed a check is "not compliant", never a
  success (its log's run_stop still says what the loop saw: the target was reached)."""
  r = outcome.result
  if not r.success:
    return "aborted"
  init_ok = r.init_s <= rule.init_limit_minutes[division.value] * 60
  checked = outcome.check is None or outcome.check.passed
  return SUCCESS if init_ok and checked else "not compliant"


def _start_key(workload: str) -> str:
  from mlbench import registry
  from mlbench.errors import UserError

  w = registry.get(workload)
  if w.start is None:
    have = [x.name for x in registry.all_workloads() if x.start is not None]
    raise UserError(f"{workload} starts from random weights, as its reference does: it takes "
                    f"no --init-checkpoint (workloads that do: {', '.join(have)})")
  return w.start.key


def _header(plan, console) -> None:
  q = plan.rule.quality
  mesh = " x ".join(f"{k}={v}" for k, v in plan.mesh.shape.items())
  console.print(
      f"[bold]{plan.workload.name}[/] ({plan.config_name} config, {plan.rule.ruleset} rules, "
      f"{plan.rc.division.value} division): target {q.key} {'>=' if q.direction.value == 'higher' else '<='} "
      f"{q.target:g}; global batch {plan.gbs}; {len(plan.runtime.devices)} "
      f"{plan.runtime.devices[0].platform} devices ({mesh}), {plan.runtime.process_count} "
      f"process(es); system {plan.system}; data {plan.data_dir}", highlight=False)
  if plan.rc.runs < plan.rule.runs:
    console.print(f"note: an MLPerf result for {plan.rule.benchmark} needs {plan.rule.runs} runs "
                  f"(--runs {plan.rule.runs}); this is {plan.rc.runs}", highlight=False)


def _report(plan, outcome, console) -> None:
  if not plan.runtime.is_leader:
    return
  from mlbench.train import compile_cache
  r, check = outcome.result, outcome.check
  status = run_status(plan.rule, plan.rc.division, outcome)
  last = r.evals[-1][1] if r.evals else float("nan")
  wait = 100 * r.input_wait_s / r.train_s if r.train_s else 0.0
  init_limit = plan.rule.init_limit_minutes[plan.rc.division.value] * 60
  color = "green" if status == SUCCESS else "red"
  console.print(
      f"[{color}]run {outcome.index + 1}: {status}[/] in {r.time_to_train_s:.1f} s "
      f"(epoch {r.epoch:g}, {plan.rule.quality.key}={last:.4f}); "
      f"{r.samples_per_s:,.0f} samples/s ({_utilization(r)}); "
      f"init {r.init_s:.1f} s; input wait {wait:.1f}%; optimizer state "
      f"{r.opt_state_bytes / 2**20:,.2f} MiB per device; log {r.log}", highlight=False)
  if r.goodput is not None:
    console.print(r.goodput.summary(), highlight=False)
  _step_vs_prediction(plan, r, console)
  if r.tensorboard_dir is not None:
    traced = (f" and a trace of steps {plan.rc.profile[0]}-{sum(plan.rc.profile) - 1}"
              if plan.rc.profile else "")
    console.print(f"TensorBoard: scalars{traced} in {r.tensorboard_dir}", highlight=False)
  console.print(compile_cache.stats().summary(), highlight=False)
  if r.checkpoint_saves:
    waits = [w for _, w in r.checkpoint_saves]
    console.print(f"{len(waits)} checkpoint(s); the step loop waited {sum(waits):.2f} s for them "
                  f"(at most {max(waits):.2f} s each)", highlight=False)
  if r.init_s > init_limit:
    console.print(f"[red]init took {r.init_s / 60:.1f} min, over the {init_limit / 60:g} min the "
                  f"{plan.rule.ruleset} rules allow: this run is not compliant", highlight=False)
  if check is not None:
    verdict = "[green]PASS" if check.passed else "[red]FAIL"
    console.print(f"compliance {verdict}[/]: {check.command}", highlight=False)
    for line in ([] if check.passed else check.failures()[:10]):
      console.print(f"  {line}", highlight=False)
  click.echo(json.dumps({
      "workload": plan.workload.name, "benchmark": plan.workload.benchmark,
      "config": plan.config_name, "ruleset": plan.rule.ruleset, "run": outcome.index,
      "seed": r.seed, "status": status, "time_to_train_s": round(r.time_to_train_s, 3),
      "epoch": r.epoch, "samples": r.samples, plan.rule.quality.key: last,
      "samples_per_s": round(r.samples_per_s, 1), "flops_per_example": r.flops_per_example,
      "flops_per_s": round(r.flops_per_s),
      "mfu": round(r.mfu, 4), "peak_flops_per_s": round(r.peak_flops_per_s),
      "peak_source": r.peak_source,
      "init_s": round(r.init_s, 3),
      "input_wait_fraction": round(wait / 100, 4), "train_metrics": r.train_metrics,
      "optimizer_state_bytes_per_device": r.opt_state_bytes,
      "goodput": r.goodput.to_json() if r.goodput else None,
      "checkpoints": len(r.checkpoint_saves),
      "compile_cache": compile_cache.stats().to_json(),
      "log": str(r.log) if r.log else None,
      "tensorboard": str(r.tensorboard_dir) if r.tensorboard_dir else None,
      "compliant": None if check is None else check.passed}))


def _step_vs_prediction(plan, r, console) -> None:
  """On an accelerator: the measured step time against `mlbench check`'s model for the
  same config and mesh (from the compiled step the run used)."""
  from mlbench import accelerators
  from mlbench.pod import estimate

  acc = accelerators.for_device_kind(plan.runtime.devices[0].device_kind)
  got = None if acc is None else estimate.run_step(acc, plan, r)
  if got is None:
    return
  measured, t = got
  console.print(
      f"step time: measured {measured * 1e3:,.2f} ms, check predicts {t.step_s * 1e3:,.2f} ms "
      f"(device {t.device_step_s * 1e3:,.2f} + collectives {t.collective_s * 1e3:,.2f} + "
      f"host {t.overhead_s * 1e3:,.2f} ms); measured / predicted {measured / t.step_s:.2f}x",
      highlight=False)


def _utilization(r) -> str:
  """Model FLOP/s and MFU of a run, from the workload's model FLOPs per example."""
  if not r.flops_per_example:
    return "model FLOPs not counted, no MFU"
  return (f"{r.flops_per_s / 1e9:,.1f} model GFLOP/s, MFU {100 * r.mfu:.1f}% of "
          f"{r.peak_source}")


def _summary(plan, outcomes, console) -> None:
  from rich.table import Table

  table = Table(title=f"{plan.workload.name}: {len(outcomes)} runs", title_justify="left")
  for col in ("run", "seed", "status", "time to train (s)", "epoch", "samples/s",
              "model TFLOP/s", "MFU", "log"):
    table.add_column(col, justify="right" if col not in ("status", "log") else "left")
  for o in outcomes:
    r = o.result
    table.add_row(str(o.index + 1), str(r.seed), run_status(plan.rule, plan.rc.division, o),
                  f"{r.time_to_train_s:.1f}", f"{r.epoch:g}", f"{r.samples_per_s:,.0f}",
                  f"{r.flops_per_s / 1e12:,.3g}", f"{100 * r.mfu:.1f}%", str(r.log))
  console.print(table)
  times = [o.result.time_to_train_s for o in outcomes
           if run_status(plan.rule, plan.rc.division, o) == SUCCESS]
  if times:
    console.print(f"median time to train: {statistics.median(times):.1f} s over {len(times)} "
                  f"successful runs", highlight=False)
