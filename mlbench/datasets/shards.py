"""Sharded, atomic, resumable, parallel writing of a prepared dataset, with a progress bar.

A dataset is prepared as independent shards. Each shard's files are written under a
temporary name and renamed into place, then a small receipt (`.mlbench/<shard>.json`:
records, units, and every file's size and sha256) is written, also atomically. A shard
with its receipt and files is finished, so an interrupted job, run again, redoes only
the shards without a receipt; half-written files never carry a final name. When every
shard is finished the receipts are gathered into `mlbench-data.json`, the manifest
`mlbench data verify` checks against.

Shards run in worker processes forked by a `forkserver` that has imported what the
writer needs and run nothing (TensorFlow and the tokenizers' thread pools do not
survive a fork of a process that has used them); one worker runs in this process. A file that
cannot be read is listed in the shard's receipt and the job goes on.

The out folder may be a bucket (`gs://...`): a worker writes its shard to a local
temporary file, then uploads it under its final name (GCS shows an object only once
its upload is complete, so here too a final name never holds half a file), then the
receipt. One job per out folder: a lock file locally (`flock`), a lock object created
with a generation precondition in a bucket, taken over only from a process of this
host that is gone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import multiprocessing
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from mlbench import paths, pending, storage
from mlbench.errors import UserError

MANIFEST = "mlbench-data.json"
RECEIPTS = ".mlbench"


class Unreadable(Exception):
  """An input a shard cannot be written from; the shard is listed as failed, the job goes on."""


@dataclasses.dataclass(frozen=True)
class Shard:
  """One unit of work: `work(task, tmp_paths)` writes `outputs` (names in the out folder)."""

  name: str
  outputs: tuple[str, ...]
  task: Any
  units: int  # expected progress units (images, input bytes) for the bar and the ETA


@dataclasses.dataclass
class Written:
  """What a worker reports for one shard."""

  records: int
  units: int  # what the rate is counted in: images, tokens
  unreadable: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Summary:
  """The outcome of `run`: shards written now and skipped as finished, and the totals."""

  written: int = 0
  skipped: int = 0
  records: int = 0
  units: int = 0
  seconds: float = 0.0
  unreadable: list[str] = dataclasses.field(default_factory=list)
  failed: list[str] = dataclasses.field(default_factory=list)


def receipt_path(out: paths.PathLike, shard: Shard) -> paths.Path:
  return paths.path(out) / RECEIPTS / f"{shard.name}.json"


def finished(out: paths.PathLike, shards: Sequence[Shard]) -> set[str]:
  """The names of the shards whose receipt and files are all in place (two listings,
  not a look-up per file: a bucket answers each in tens of milliseconds)."""
  out = paths.path(out)
  names = {p.name for p in out.iterdir()} if out.is_dir() else set()
  receipts = out / RECEIPTS
  done = {p.name for p in receipts.iterdir()} if receipts.is_dir() else set()
  return {s.name for s in shards
          if f"{s.name}.json" in done and all(o in names for o in s.outputs)}


def is_finished(out: paths.PathLike, shard: Shard) -> bool:
  """Whether a shard's receipt and all its files are in place."""
  return shard.name in finished(out, [shard])


def sha256(path: paths.PathLike) -> str:
  digest = hashlib.sha256()
  with paths.path(path).open("rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def atomic_write_text(path: paths.PathLike, text: str) -> None:
  storage.write_atomic(path, text)


def _run_one(work: Callable[[Any, list[Path]], Written], out: str, shard: Shard) -> dict:
  """Writes one shard under temporary names (local ones for a bucket), moves or uploads
  it into place, then writes its receipt."""
  out_dir = paths.path(out)
  remote = paths.is_remote(out_dir)
  staging = Path(tempfile.mkdtemp(prefix="mlbench-shard-")) if remote else Path(out_dir)
  tmps = [staging / f".{name}.tmp-{os.getpid()}" for name in shard.outputs]
  try:
    try:
      written = work(shard.task, tmps)
    except Unreadable as e:
      return {"failed": str(e)}
    files = {}
    for tmp, name in zip(tmps, shard.outputs):
      files[name] = {"bytes": tmp.stat().st_size, "sha256": sha256(tmp)}
      if remote:
        storage.put(tmp, out_dir / name)
      else:
        os.replace(tmp, out_dir / name)
  finally:
    for tmp in tmps:
      tmp.unlink(missing_ok=True)
    if remote:
      shutil.rmtree(staging, ignore_errors=True)
  receipt = {"shard": shard.name, "records": written.records, "units": written.units,
             "unreadable": written.unreadable, "files": files}
  atomic_write_text(receipt_path(out_dir, shard), json.dumps(receipt, indent=1))
  return receipt


def _progress(console: Any, unit: str):
  from rich.progress import (
    BarColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
  )

  return Progress(TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(),
                  TextColumn("{task.fields[shards]} shards"),
                  TextColumn("{task.fields[rate]} " + unit + "/s"), TimeElapsedColumn(),
                  TextColumn("eta"), TimeRemainingColumn(), console=console, transient=False,
                  disable=console is None)


def run(shards: Sequence[Shard], work: Callable[[Any, list[Path]], Written], out: Path, *,
        workers: int, description: str, unit: str, console: Any = None,
        preload: Sequence[str] = ()) -> Summary:
  """Writes every unfinished shard (`workers` processes), then the manifest of all of them.

  `work` must be a module-level function (workers import it by name); `preload` names
  modules the fork server imports once for all workers (TensorFlow, for the writers
  that need it).
  """
  out = paths.path(out, "--out")
  with paths.errors("--out", out):
    (out / RECEIPTS).mkdir(parents=True, exist_ok=True)
    with _bucket_lock(out) if paths.is_remote(out) else _lock(Path(out)):
      return _run_locked(shards, work, out, workers, description, unit, console, preload)


@contextlib.contextmanager
def _bucket_lock(out: paths.Path) -> Iterator[None]:
  """One job per output bucket folder: a lock object that only one job can create."""
  lock = out / RECEIPTS / "lock.json"
  while not storage.write_new(lock, pending.Record.mine("data-prepare").to_json()):
    held = pending.read_record(lock)
    gone, why = (True, "unreadable") if held is None else pending.judge(
        held.pid, held, stale_after=math.inf)
    if not gone:
      raise UserError(f"another `mlbench data prepare` ({why.split(':')[0]}) is writing into "
                      f"{out}; wait for it to finish or stop it (if it is gone, delete {lock})")
    storage.remove(lock)
  try:
    yield
  finally:
    storage.remove(lock)


@contextlib.contextmanager
def _lock(out: Path) -> Iterator[None]:
  """One job per output folder: a second would race the first for the same shards."""
  import fcntl

  with open(out / RECEIPTS / "lock", "w") as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise UserError(f"another `mlbench data prepare` is writing into {out}; wait for it "
                      "to finish or stop it") from None
    # Temporary files left by an interrupted job are garbage now that no job is running.
    for stale in out.glob(".*.tmp-*"):
      stale.unlink()
    yield


def _run_locked(shards: Sequence[Shard], work: Callable, out: Path, workers: int,
                description: str, unit: str, console: Any, preload: Sequence[str]) -> Summary:
  import time

  done_before = finished(out, shards)
  todo = [s for s in shards if s.name not in done_before]
  summary = Summary(skipped=len(shards) - len(todo))
  start = time.perf_counter()
  with _progress(console, unit) as bar:
    task = bar.add_task(description, total=sum(s.units for s in todo) or 1,
                        shards=f"0/{len(todo)}", rate="-")

    def done(shard: Shard, receipt: dict) -> None:
      if "failed" in receipt:
        summary.failed.append(receipt["failed"])
        bar.update(task, advance=shard.units)
        return
      summary.written += 1
      summary.units += receipt["units"]
      summary.unreadable += receipt["unreadable"]
      rate = summary.units / max(time.perf_counter() - start, 1e-9)
      bar.update(task, advance=shard.units, shards=f"{summary.written}/{len(todo)}",
                 rate=f"{rate:,.0f}")

    if workers <= 1 or len(todo) <= 1:
      for shard in todo:
        done(shard, _run_one(work, str(out), shard))
    else:
      _run_parallel(todo, work, out, workers, done, preload)
  summary.seconds = time.perf_counter() - start
  summary.records = write_manifest(out, shards)
  return summary


def _run_parallel(todo: Sequence[Shard], work: Callable, out: Path, workers: int,
                  done: Callable[[Shard, dict], None], preload: Sequence[str]) -> None:
  # Workers inherit these (through the fork server, which starts with the first pool): no
  # TF chatter, and the tokenizers' thread pools share the cores instead of each taking all.
  env = {"TF_CPP_MIN_LOG_LEVEL": "2",
         "RAYON_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // workers))}
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update({k: v for k, v in env.items() if saved[k] is None})
  try:
    _pool(todo, work, out, workers, done, preload)
  finally:
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)


def _pool(todo: Sequence[Shard], work: Callable, out: Path, workers: int,
          done: Callable[[Shard, dict], None], preload: Sequence[str]) -> None:
  # A fork server that has imported the writer's module (and so TensorFlow, where the
  # writer needs it) forks each worker: one import instead of one per worker (20 s each
  # on a busy 2-core box), and no worker inherits this process's threads.
  context = multiprocessing.get_context("forkserver")
  context.set_forkserver_preload([work.__module__] + list(preload))
  pool = ProcessPoolExecutor(max_workers=workers, mp_context=context)
  try:
    pending = {pool.submit(_run_one, work, str(out), s): s for s in todo}
    while pending:
      finished, _ = wait(pending, return_when=FIRST_COMPLETED)
      for future in finished:
        done(pending.pop(future), future.result())
  except BaseException:
    # An interrupt: drop the queued shards rather than finish them all first; the shards
    # being written are lost to their temporary names and rewritten by the next run.
    pool.shutdown(wait=False, cancel_futures=True)
    raise
  pool.shutdown()


def write_manifest(out: paths.PathLike, shards: Sequence[Shard]) -> int:
  """Gathers the receipts of `shards` into the manifest; returns the total record count."""
  out = paths.path(out)
  listed = {p.name for p in (out / RECEIPTS).iterdir()}
  present = [receipt_path(out, s) for s in shards if f"{s.name}.json" in listed]
  with ThreadPoolExecutor(16) as pool:  # A bucket answers reads in parallel.
    receipts = [json.loads(text) for text in pool.map(lambda p: p.read_text(), present)]
  files = {name: info for r in receipts for name, info in r["files"].items()}
  manifest = {"complete": len(receipts) == len(shards), "planned": len(shards),
              "records": sum(r["records"] for r in receipts),
              "shards": {r["shard"]: {"records": r["records"], "files": sorted(r["files"])}
                         for r in receipts},
              "unreadable": [u for r in receipts for u in r["unreadable"]], "files": files}
  atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=1))
  return manifest["records"]


def read_manifest(out: paths.PathLike) -> dict | None:
  path = paths.path(out) / MANIFEST
  return json.loads(path.read_text()) if path.is_file() else None
