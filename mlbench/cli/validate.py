"""`mlbench validate`: check result logs and submission packages."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import click

from mlbench.cli import output


@click.command("validate")
@click.argument("path")
@click.option("--ruleset", metavar="VERSION", envvar="MLBENCH_RULESET",
              help="Rules to check against (e.g. 4.0.0, 0.7.0, mini). [default: named in mlbench "
                   "logs, else the round the runs' dates fall in]")
@click.option("--usage", default="training", show_default=True, type=click.Choice(["training"]),
              help="MLPerf usage the logs belong to.")
@click.option("--json", "as_json", is_flag=True, help="Print the full report as JSON on stdout.")
@click.option("--official-timeout", "--timeout", "timeout_s", type=click.FloatRange(min=1),
              default=120.0, show_default=True, envvar="MLBENCH_OFFICIAL_TIMEOUT",
              help="Seconds the official checker may take on one log (and each other official "
                   "tool on one input); a log it runs out of fails, naming the line it was on.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), envvar="MLBENCH_JOBS",
              help="Logs checked at once by the official checker.  [default: one per core "
                   "and per 20 logs]")
@click.option("--tolerance-ms", type=click.FloatRange(min=0), default=1000.0, show_default=True,
              help="Clock skew between a job's processes: a step back in time of up to this "
                   "many ms is no broken order, an evaluation this late after run_stop no clock "
                   "stopped early.")
@click.option("--strict", is_flag=True, envvar="MLBENCH_STRICT",
              help="Fail on warnings too: anything mlbench notices that no written rule "
                   "forbids (placeholders, a status word, order outside the timed region).")
def validate_cmd(path: str, ruleset: str | None, usage: str, as_json: bool, timeout_s: float,
                 jobs: int | None, tolerance_ms: float, strict: bool) -> int:
  """Check PATH: a result log, a results/<system>/<benchmark> folder, or a package,
  on a disk or in a bucket (gs://...).

  Runs the official compliance checker on every log, the package checks (result
  count, seeds, RCP, system description), and checks the official tools lack
  (time order, run order, evaluation schedule, submission_* against
  systems/*.json, seed). A FAIL is what the official tools fail or what breaks a
  written MLPerf rule (each names it); the rest is a WARN naming the line. Exit 0
  when everything passes (under olympic scoring for packages), 1 when a rule fails
  (or, with --strict, anything warns), 2 for input that is not a log or package.
  """
  from mlbench.storage import paths, writes
  from mlbench.verify import validate

  console = output.console()  # progress and notes
  # The report is the command's product: stdout, where `> report.txt` keeps it; with
  # --json the JSON is, and the report joins the notes on stderr.
  out = output.console(stderr=as_json)
  # The official tools read local files: a bucket's logs are read into a local copy.
  with writes.fetched(paths.path(path, "validate"), "validate") as local:
    output.note_pending([local], console)
    with _progress(console) as progress:
      report = validate.validate(local, ruleset=ruleset, usage=usage, timeout_s=timeout_s,
                                 tolerance_ms=tolerance_ms, strict=strict, processes=jobs,
                                 progress=progress)
    _print(report, out)
    if as_json:
      click.echo(json.dumps(output.unfetched(report.to_json(), local, path), indent=2))
  return report.exit_code


@contextlib.contextmanager
def _progress(console) -> Iterator[Callable[[int, int], None] | None]:
  """A bar over the logs the official checker has judged, on a terminal, for many logs."""
  from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

  if not console.is_terminal:
    yield None
    return
  bar = Progress("official checker", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                 console=console, transient=True)
  task = None

  def update(done: int, total: int) -> None:
    nonlocal task
    if total < 2:
      return
    if task is None:
      bar.start()
      task = bar.add_task("logs", total=total)
    bar.update(task, completed=done)

  try:
    yield update
  finally:
    bar.stop()


def _rel(path: Path, root: Path) -> str:
  try:
    return str(path.relative_to(root)) or path.name
  except ValueError:
    return str(path)


MAX_ROWS = 40  # a longer table of logs lists the failing ones only: the rest are in --json


def _files_table(report, files, console) -> None:
  from rich.markup import escape
  from rich.table import Table

  root = report.target.path if report.target.path.is_dir() else report.target.path.parent
  shown = files if len(files) <= MAX_ROWS else [f for f in files if f.fails(report.strict)]
  more = len(files) - len(shown)
  table = Table(title="result logs", title_justify="left",
                caption=f"and {more} passing logs (--json lists them)" if more else None)
  for col in ("file", "benchmark", "ruleset", "checker", "mlbench", "problem", "line"):
    table.add_column(col, overflow="fold")
  for f in shown:
    first = f.first_problem(report.strict)
    mine = [x for x in f.findings if x.severity.value == "FAIL"]
    warns = [x for x in f.findings if x.severity.value == "WARN"]
    own = "FAIL" if mine or (report.strict and warns) else (
        "PASS" + (f" ({len(warns)} warn)" if warns else ""))
    table.add_row(_rel(f.path, root), str(f.benchmark), f.ruleset, _mark(f.checker), _mark(own),
                  escape(f"{first.check}: {first.message}"
                         + (f" [{first.rule}]" if first.rule else "")) if first else "",
                  str(first.lineno) if first and first.lineno else "")
  console.print(table)


def _mark(text: str) -> str:
  color = "green" if text.startswith("PASS") else "red"
  return f"[{color}]{text}[/]"


def _print(report, console) -> None:
  from rich.table import Table

  if report.files:
    _files_table(report, report.files, console)
    for finding in report.files[0].checker_findings + report.files[0].findings:
      if finding.severity.value != "INFO" or finding.check in ("eval schedule", "resumed"):
        console.print(f"  {finding.severity.value} {finding.check}: {finding.message}"
                      + (f" (line {finding.lineno})" if finding.lineno else "")
                      + (f" [{finding.rule}]" if finding.rule else ""),
                      highlight=False, markup=False)
  if report.benchmarks:
    _files_table(report, [f for b in report.benchmarks for f in b.files], console)
    table = Table(title="benchmarks (olympic scoring)", title_justify="left")
    for col in ("system", "benchmark", "ruleset", "runs", "failing", "package checks", "verdict"):
      table.add_column(col, overflow="fold")
    for b in report.benchmarks:
      notes = "; ".join(f"{x.check}: {x.message}" for x in b.findings) or "-"
      table.add_row(b.bench.system, b.bench.benchmark, b.ruleset, str(len(b.files)),
                    str(sum(f.fails(report.strict) for f in b.files)), notes,
                    _mark("PASS" if b.passes(report.strict) else "FAIL"))
    console.print(table)
    _warnings(report, console)
  for path, findings in report.systems:
    verdict = "FAIL" if any(f.severity.value == "FAIL" for f in findings) else "PASS"
    console.print(f"system {path.name}: {_mark(verdict)}"
                  + "".join(f"; {f.message}" for f in findings), highlight=False)
  console.print(f"exit code {report.exit_code}" + (" (--strict: warnings fail)" if report.strict
                                                   else ""), highlight=False)


def _warnings(report, console) -> None:
  """Warnings by kind: how many, and the first with its file and line."""
  root = report.target.path if report.target.path.is_dir() else report.target.path.parent
  kinds: dict[str, list] = {}
  for b in report.benchmarks:
    for f, finding in [(None, x) for x in b.findings] + [(r, x) for r in b.files
                                                          for x in r.findings]:
      if finding.severity.value == "WARN":
        kinds.setdefault(finding.check, []).append((f, finding))
  for kind, found in kinds.items():
    f, first = found[0]
    where = f"{_rel(f.path, root)}" + (f" line {first.lineno}" if first.lineno else "") \
        if f is not None else ""
    console.print(f"  WARN {kind} ({len(found)}): {first.message}" + (f" [{where}]" if where
                                                                      else ""),
                  highlight=False, markup=False)
