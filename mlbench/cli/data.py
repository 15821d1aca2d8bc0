"""`mlbench data prepare` and `mlbench data verify`: datasets on disk into the workloads' formats."""

from __future__ import annotations

import os
from pathlib import Path

import click

from mlbench.cli import output

DATASETS = ("imagenet", "coco", "c4", "bert", "wmt")


@click.group("data")
def data_group() -> None:
  """Prepare the datasets the full configs read, and check prepared ones."""


@data_group.command("prepare")
@click.argument("dataset", type=click.Choice(DATASETS))
@click.option("--raw", metavar="DIR", help="The dataset as you have it (a local folder).")
@click.option("--out", metavar="DIR",
              help="Folder or bucket (gs://...) to write the prepared set to.")
@click.option("--workers", type=click.IntRange(1), default=os.cpu_count() or 1, show_default=True,
              help="Processes writing shards in parallel.")
@click.option("--dry-run", is_flag=True, help="Say what would be written, write nothing.")
@click.option("--tokenizer", type=click.Path(path_type=Path),
              help="c4: the model's Hugging Face tokenizer.json.")
@click.option("--eod", default="none", show_default=True,
              help="c4: an end-of-document token to append to every document (a token, or "
                   "`auto`); the reference appends none.")
@click.option("--train-shards", type=click.IntRange(1),
              help="imagenet, coco: training TFRecord files. [default: the reference's, "
                   "1,024 and 100]")
@click.option("--val-shards", type=click.IntRange(1),
              help="imagenet, coco: validation TFRecord files. [default: 128 and 50]")
@click.option("--val-labels", type=click.Path(path_type=Path),
              help="imagenet: LOC_val_solution.csv, a file of one wnid per validation image, or "
                   "the devkit folder. [default: found under --raw]")
def prepare_cmd(dataset: str, raw: str | None, out: str | None, workers: int, dry_run: bool,
                **options) -> int:
  """Turn DATASET as found under --raw into the files its workload reads, under --out.

  Shards are written atomically; run it again after an interrupt and only the
  unfinished shards are written.
  """
  from mlbench.storage import paths
  from mlbench.datasets import jobs, shards
  from mlbench.errors import UserError

  if dataset in jobs.ELSEWHERE:
    raise UserError(f"{dataset} is not prepared by mlbench: use {jobs.ELSEWHERE[dataset]}")
  if raw is None or out is None:
    raise UserError(f"prepare {dataset} needs --raw DIR (the dataset as you have it) and "
                    "--out DIR")
  if paths.is_remote(paths.path(raw, "--raw")):
    raise UserError(f"--raw {raw}: give a local folder (copy the raw set to a local disk "
                    "first, e.g. with `gcloud storage cp -r`)")
  out = paths.path(out, "--out")
  job = jobs.job(dataset, Path(raw), out, options)
  console = output.console()
  if dry_run:
    _show_plan(console, job, out)
    return 0
  summary = shards.run(job.shards, job.work, out, workers=workers, description=job.description,
                       unit=job.unit, console=console, preload=job.preload, options=job.options)
  return _report(console, summary, job, out)


def _show_plan(console, job, out) -> None:
  """What a dry run would write, on stdout (its product); the notes on `console`."""
  from mlbench.storage import paths
  from mlbench.datasets import shards

  with paths.errors("--out", out):
    left, notes = shards.todo(out, job.shards, job.options)
  for note in notes:
    console.print(note, highlight=False, markup=False)
  console = output.console(stderr=False)
  console.print(f"dry run: {len(left)} of {len(job.shards)} shards to write into {out} "
                f"({len(job.shards) - len(left)} already finished)", highlight=False)
  for s in job.shards:
    state = "to write" if s in left else "finished"
    console.print(f"  {state:9} {', '.join(s.outputs)}", highlight=False)


def _report(console, summary, job, out) -> int:
  rate = summary.units / summary.seconds if summary.seconds else 0.0
  console.print(f"wrote {summary.written} shard(s), skipped {summary.skipped} finished; "
                f"{summary.records:,} records in {out}; {summary.units:,} {job.unit} in "
                f"{summary.seconds:.1f}s ({rate:,.0f} {job.unit}/s)", highlight=False)
  for note in summary.notes:
    console.print(note, highlight=False, markup=False)
  for item in summary.unreadable:
    console.print(f"[yellow]unreadable, left out:[/] {item}", highlight=False)
  for item in summary.failed:
    console.print(f"[red]shard not written:[/] {item}", highlight=False)
  return 1 if summary.failed else 0


@data_group.command("verify")
@click.argument("dataset", type=click.Choice(DATASETS))
@click.argument("folder")
@click.option("--full", is_flag=True,
              help="Also count every record and recompute the checksums (reads everything).")
def verify_cmd(dataset: str, folder: str, full: bool) -> int:
  """Check a prepared DATASET in FOLDER (a folder or gs://...): files, sizes, numbering,
  a record's schema.

  Exits 1 when anything is missing or wrong.
  """
  from rich.table import Table

  from mlbench.storage import paths
  from mlbench.datasets import check

  rows = check.verify(dataset, paths.path(folder, "data verify"), full=full)
  table = Table(title=f"{dataset} in {folder}", title_justify="left")
  for col in ("check", "expected", "found", ""):
    table.add_column(col)
  marks = {True: "[green]ok[/]", False: "[red]WRONG[/]", None: "[dim]note[/]"}
  for row in rows:
    table.add_row(row.check, row.expected, row.found, marks[row.ok])
  console = output.console(stderr=False)
  console.print(table)
  bad = [r.check for r in rows if r.ok is False]
  if bad:
    output.console().print(f"{dataset} in {folder}: {len(bad)} check(s) failed: "
                           f"{', '.join(bad)}", highlight=False)
  return 1 if bad else 0
