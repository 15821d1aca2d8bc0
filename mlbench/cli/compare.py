"""`mlbench compare`: MLPerf scores of submissions side by side."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import os
import uuid
from pathlib import Path

import click

from mlbench.storage import paths as path_lib, writes
from mlbench.cli import output
from mlbench.errors import UserError


@click.command("compare")
@click.argument("paths", nargs=-1, required=True)
@click.option("--ruleset", metavar="VERSION", envvar="MLBENCH_RULESET",
              help="Rules the logs follow. [default: named in mlbench logs, else the round the "
                   "runs' dates fall in]")
@click.option("--csv", "csv_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write result_summarizer's detailed columns (plus mlbench's) as CSV.")
@click.option("--json", "json_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the same rows, and every run, as JSON.")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Draw convergence curves (eval metric against minutes) to a PNG.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=120.0,
              show_default=True, help="Seconds an official tool may take on one input.")
def compare_cmd(paths: tuple[str, ...], ruleset: str | None, csv_file: Path | None,
                json_file: Path | None, plot_file: Path | None, timeout_s: float) -> int:
  """Score and compare PATHS: submission packages, results folders, mlbench results dirs,
  on a disk or in a bucket (gs://...).

  Per benchmark and system: run minutes, the olympic score (as
  result_summarizer computes it), batch size, epochs or samples to converge,
  RCP verdict and scaling; the speedup of each against the first PATH.
  Output files are never overwritten.
  """
  for option, f in (("--csv", csv_file), ("--json", json_file), ("--plot", plot_file)):
    _check_output(option, f)
  from mlbench.verify import compare

  console = output.console()  # notes
  with contextlib.ExitStack() as stack:
    # The official tools read local files: a bucket's logs are read into a local copy.
    local = {stack.enter_context(writes.fetched(path_lib.path(p, "compare"), "compare")): p
             for p in paths}
    output.note_pending(list(local), console)
    entries = [dataclasses.replace(e, source=local.get(e.source, e.source))
               for e in compare.compare(list(local), ruleset=ruleset, timeout_s=timeout_s)]
  if not entries:
    raise UserError("no result logs under " + ", ".join(map(str, paths)))
  # The table is the command's product: stdout, where `> table.txt` keeps it.
  _table(entries, output.console(stderr=False))
  rows = compare.rows(entries)
  if csv_file:
    _write_new(csv_file, _csv(rows))
  if json_file:
    doc = {"rows": rows, "entries": [_entry_json(e) for e in entries]}
    _write_new(json_file, json.dumps(doc, indent=2, default=str) + "\n")
  if plot_file:
    from mlbench.verify import plots

    tmp = plot_file.with_name(f".{plot_file.name}.{uuid.uuid4().hex[:8]}.png")
    plots.convergence(entries, tmp)
    _publish(tmp, plot_file)
  return 0


def _check_output(option: str, path: Path | None) -> None:
  """Refuses an output file that could not be written, before any work is done."""
  if path is None:
    return
  if path.exists() or path.is_symlink():
    raise UserError(f"{path} already exists; choose another name (mlbench never overwrites)")
  folder = path.parent
  if not folder.is_dir():
    what = "is not a folder" if folder.exists() else "does not exist; create it first"
    raise UserError(f"{option} {path}: {folder} {what}")
  if not os.access(folder, os.W_OK | os.X_OK):
    raise UserError(f"{option} {path}: the folder {folder} is not writable")


def _publish(tmp: Path, final: Path) -> None:
  try:
    os.link(tmp, final)  # Atomic, and refuses to replace a file that appeared meanwhile.
  except FileExistsError:
    raise UserError(f"{final} appeared while comparing; the output is kept at {tmp}") from None
  tmp.unlink()


def _write_new(path: Path, text: str) -> None:
  tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
  tmp.write_text(text)
  _publish(tmp, path)


def _csv(rows: list[dict]) -> str:
  buf = io.StringIO()
  writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
  writer.writeheader()
  for row in rows:
    writer.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in row.items()})
  return buf.getvalue()


def _entry_json(e) -> dict:
  return {"source": str(e.source), "system": e.bench.system, "benchmark": e.bench.benchmark,
          "ruleset": e.ruleset, "score_minutes": e.score, "speedup": e.speedup, "gbs": e.gbs,
          "samples_to_converge": e.samples_to_converge, "rcp": e.rcp, "rcp_factor": e.rcp_factor,
          "scaling": e.scaling, "target": e.target, "epochs_problem": e.epochs_problem,
          "runs": [{"path": str(r.path), "minutes": r.minutes, "converged": r.converged,
                    "not_judged": r.problem, "epochs": r.epochs, "evals": r.evals}
                   for r in e.runs]}


def _fmt(x, spec: str = ".4f") -> str:
  return "-" if x is None else format(x, spec)


def _table(entries, console) -> None:
  from rich.table import Table

  table = Table(title="MLPerf scores (minutes; olympic mean of run_stop - run_start)",
                title_justify="left")
  for col in ("submission", "system", "benchmark", "ruleset", "runs", "score", "speedup", "GBS",
              "to converge", "RCP", "run minutes"):
    table.add_column(col, overflow="fold", justify="right" if col in (
        "runs", "score", "speedup", "GBS", "to converge") else "left")
  for e in entries:
    minutes = " ".join(_fmt(r.minutes, ".3f") + _mark(r) for r in e.runs)
    rcp = "-" if e.rcp is None else f"{e.rcp} ({_fmt(e.rcp_factor, '.4f')})"
    score = (_fmt(e.score) if e.score is not None else
             "[red]not judged[/]" if e.unjudged else "[red]invalid[/]")
    table.add_row(str(e.source), e.bench.system, e.bench.benchmark, e.ruleset,
                  f"{len(e.runs) - e.dropped}/{len(e.runs)}", score,
                  _fmt(e.speedup, ".3f") + ("x" if e.speedup else ""), _fmt(e.gbs, ".0f"),
                  _fmt(e.samples_to_converge, ",.1f"), rcp, minutes)
  console.print(table)
  console.print("* did not converge (fails the official compliance check); scaling.json, where "
                "present, is applied as result_summarizer applies it", highlight=False)
  for e in entries:
    for r in e.unjudged:
      console.print(f"? not judged, so {e.bench.benchmark} on {e.bench.system} has no score: "
                    f"{r.path}: {r.problem}", highlight=False)
    if e.epochs_problem and not e.unjudged:
      console.print(f"{e.bench.benchmark} on {e.bench.system}: no epochs to converge: "
                    f"{e.epochs_problem}", highlight=False)


def _mark(run) -> str:
  return "?" if run.problem is not None else "" if run.converged else "*"
