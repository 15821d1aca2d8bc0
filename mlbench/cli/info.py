"""`mlbench list` and `mlbench describe`: what can run, and under which rules."""

from __future__ import annotations

import enum
import json

import click

from mlbench.cli import output


@click.command("list")
def list_cmd() -> int:
  """List workloads: benchmark key, quality metric, target and default config."""
  from rich.table import Table

  from mlbench import registry, rules

  table = Table(title="mlbench workloads", title_justify="left")
  for col in ("workload", "benchmark", "metric", "target", "default config", "configs", "rulesets"):
    table.add_column(col)
  for w in registry.all_workloads():
    ruleset = rules.default_ruleset(w.benchmark, w.default_config, w.rulesets)
    rule = rules.load(w.benchmark, ruleset)
    sign = ">=" if rule.quality.direction is rules.Direction.HIGHER else "<="
    table.add_row(w.name, w.benchmark, f"{rule.quality.key} ({w.quality_metric})",
                  f"{sign} {rule.quality.target:g} ({ruleset})", w.default_config,
                  ", ".join(w.configs), ", ".join(rules.rulesets(w.benchmark, w.rulesets)))
  output.console(stderr=False).print(table)
  return 0


@click.command("describe")
@click.argument("workload")
@click.option("--config", "config_name", metavar="NAME|PATH",
              help="Describe only this config. [default: every config of the workload]")
@click.option("--ruleset", metavar="VERSION", help="Rules to show. [default: the config's default]")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object per config (parameters, model FLOPs per example, "
                   "schedule, hyperparameters, quality target) instead of tables.")
def describe_cmd(workload: str, config_name: str | None, ruleset: str | None,
                 as_json: bool) -> int:
  """Configs, hyperparameters, rules, parameter count and FLOPs per example of WORKLOAD."""
  from mlbench import config as config_lib, registry

  w = registry.get(workload)
  names = [config_name] if config_name else list(w.configs)
  console = output.console(stderr=False)
  for name in names:
    shown, cfg = config_lib.load(w, name)
    if as_json:
      click.echo(json.dumps(_description(w, shown, cfg, ruleset), default=_plain))
    else:
      _describe_one(console, w, shown, cfg, ruleset)
  return 0


def _description(w, name, cfg, ruleset) -> dict:
  """What `describe --json` prints for one config."""
  from mlbench import config as config_lib, fields, rules
  from mlbench.train import steps

  rule = rules.load(w.benchmark, ruleset or rules.default_ruleset(w.benchmark, name, w.rulesets))
  sched = w.schedule(cfg)
  return {
      "workload": w.name, "benchmark": w.benchmark, "config": name,
      "parameters": steps.count_params(w, cfg),
      # The analytic count where the workload gives one, else the lowered program's:
      # the figure every MFU mlbench reports is computed from.
      "flops_per_example": steps.flops_per_example(w, cfg, _one_device_context()),
      "schedule": {"global_batch_size": sched.global_batch_size,
                   "eval_batch_size": sched.eval_batch_size, "rows_per_step": sched.rows(),
                   "train_examples": sched.train_examples, "eval_examples": sched.eval_examples,
                   "max_train_samples": sched.max_train_samples, "max_steps": sched.max_steps},
      "packing": _packing(sched),
      "hyperparameters": config_lib.flatten(cfg),
      "ruleset": rule.ruleset,
      "quality": {"key": rule.quality.key, "target": rule.quality.target,
                  "direction": rule.quality.direction.value},
      "provisional": {key: {"value": value, "why": why}
                      for key, (value, why) in fields.provisionals(cfg).items()},
      **({"references": references(w)} if name == "full" else {}),
  }


def _packing(sched) -> dict | None:
  """A packed schedule's rows (before the harness rounds them up to split over a run's
  devices) and what they hold; None: one example a row."""
  if sched.packing is None:
    return None
  rows = sched.rows()
  return {"max_per_row": sched.packing.max_per_row, "sized_for": sched.packing.factor,
          "rows_per_step": rows, "packing_factor": sched.global_batch_size / rows}


def _plain(value):
  """JSON for config values json does not know: an enum's value, else its text."""
  return value.value if isinstance(value, enum.Enum) else str(value)


def _one_device_context():
  from mlbench.train import mesh as mesh_lib
  from mlbench.workload import StepContext

  return StepContext(mesh=mesh_lib.make_mesh({"data": 1}, devices=_one_device()))


def _describe_one(console, w, name, cfg, ruleset) -> None:
  from rich.table import Table

  from mlbench import config as config_lib, fields, rules
  from mlbench.train import steps
  from mlbench.train.plan import harness_hparams

  rule = rules.load(w.benchmark, ruleset or rules.default_ruleset(w.benchmark, name, w.rulesets))
  sched = w.schedule(cfg)
  ctx = _one_device_context()
  params = steps.count_params(w, cfg)
  flops = steps.flops_per_example(w, cfg, ctx)
  console.rule(f"[bold]{w.name} --config {name}")
  console.print(f"parameters: {params:,}   training FLOPs per example: {flops:,.0f} "
                f"({flops / 1e9:.3f} GFLOP, forward + backward)", highlight=False)
  console.print(f"schedule: global batch {sched.global_batch_size}, eval batch "
                f"{sched.eval_batch_size}, {sched.train_examples:,} train / "
                f"{sched.eval_examples:,} eval examples, budget {sched.max_train_samples:,} "
                f"samples ({sched.max_steps:,} steps)", highlight=False)
  packing = _packing(sched)
  if packing:
    console.print(f"packing: on, {sched.global_batch_size:,} examples a step in "
                  f"{packing['rows_per_step']:,} rows (packing factor "
                  f"{packing['packing_factor']:.3f}; up to {packing['max_per_row']} a row; "
                  "rows are rounded up to split over a run's devices); FLOPs per example "
                  "are the packed step's", highlight=False)
  table = Table(title="hyperparameters (--set KEY=VALUE)", title_justify="left")
  table.add_column("key")
  table.add_column("value")
  marked = fields.provisionals(cfg)
  for k, v in config_lib.flatten(cfg).items():
    table.add_row(k, f"[yellow]{v!r} (provisional)" if k in marked else repr(v))
  console.print(table)
  for key, (value, why) in marked.items():
    console.print(f"[yellow]provisional[/] {key}={value!r}: {why}", highlight=False)
  logged = {**harness_hparams(sched), **w.hparams(cfg, sched, ctx)}
  _describe_rule(console, rule, logged)
  if name == "full":
    _describe_references(console, w)


def references(w) -> list[dict[str, str]]:
  """The rows of the "Checked against the references" table in the README.md of the
  workload's package: each full-config setting, the reference file and lines it was
  checked against, and the commit."""
  import importlib.resources
  import itertools

  package = w.configs[w.default_config].__module__.rpartition(".")[0]
  try:
    text = importlib.resources.files(package).joinpath("README.md").read_text(encoding="utf-8")
  except (ModuleNotFoundError, OSError):
    return []
  _, found, rest = text.partition("## Checked against the references")
  table = itertools.takewhile(lambda ln: ln.startswith("|"),  # its first table only
                              itertools.dropwhile(lambda ln: not ln.startswith("|"),
                                                  rest.splitlines()))
  rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in table] if found else []
  if len(rows) < 2:
    return []
  return [dict(zip(rows[0], r)) for r in rows[2:]]  # rows[1] is the |---| line


def _describe_references(console, w) -> None:
  from rich.table import Table

  rows = references(w)
  if not rows:
    console.print(f"{w.name} lists no references it was checked against", highlight=False)
    return
  table = Table(title=f"checked against the references ({w.name}'s README.md)",
                title_justify="left")
  for col in rows[0]:
    table.add_column(col)
  for r in rows:
    table.add_row(*r.values())
  console.print(table)


def _describe_rule(console, rule, logged) -> None:
  from rich.table import Table

  from mlbench.workload import unpack

  q = rule.quality
  ev = rule.evaluation
  every = ev.interval(int(unpack(logged["global_batch_size"])[0]))  # BERT's depends on it
  console.print(
      f"rules {rule.ruleset} ({rule.source}): {q.key} {'>=' if q.direction.value == 'higher' else '<='}"
      f" {q.target:g}; evaluate every {every:g} {ev.unit.value}"
      + (f" (first up to {ev.max_offset:g} early)" if ev.max_offset else "")
      + f"; {rule.runs} runs per result; untimed init <= {rule.init_limit_minutes['closed']:g} min "
        f"closed, {rule.init_limit_minutes['open']:g} min open", highlight=False)
  table = Table(title="logged hyperparameters under these rules", title_justify="left")
  for col in ("key", "value", "required", "constraint (closed)"):
    table.add_column(col)
  plain = {k: unpack(v)[0] for k, v in logged.items()}
  required = {h.key: h for h in rule.hyperparameters if h.applies(plain)}
  for key in sorted(set(logged) | set(required)):
    h = required.get(key)
    value = logged.get(key, "[red]missing")
    constraint = ", ".join(f"{op} {arg!r}" for op, arg in h.check.items()) if h else ""
    bad = h is not None and key in logged and h.violation(*unpack(logged[key]), logged=plain)
    shown = _shown(logged[key]) if key in logged else value
    table.add_row(key, f"[red]{shown}" if bad else shown, "yes" if h else "", constraint)
  console.print(table)


def _shown(hparam) -> str:
  """A logged value as repr, with its line metadata if it carries any."""
  from mlbench.workload import unpack

  value, metadata = unpack(hparam)
  extra = ", ".join(f"{k}: {v}" for k, v in metadata.items())
  return f"{value!r} ({extra})" if extra else repr(value)


def _one_device():
  import jax

  return jax.devices()[:1]
