"""Sharded, atomic, resumable, parallel writing of a prepared dataset, with a progress bar.

A dataset is prepared as independent shards. Each shard's files are written under a
temporary name, fsynced and renamed into place, then a small receipt
(`mlbench.datasets.receipts`: records, units, every file's size and sha256, the
options that shaped the bytes and the tools' versions) is written, also atomically. A
shard with its receipt and files is finished, so an interrupted job, run again, redoes
only the shards without a receipt; half-written files never carry a final name. A job
whose options differ from those of the finished shards is refused with the difference.
When every shard is finished the receipts are gathered into `mlbench-data.json`, the
manifest `mlbench data verify` checks against.

Shards run in worker processes forked by a `forkserver` that has imported what the
writer needs and run nothing (TensorFlow and the tokenizers' thread pools do not
survive a fork of a process that has used them); one worker runs in this process. A file that
cannot be read is listed in the shard's receipt and the job goes on. A worker that dies
(killed, out of memory) breaks its pool: the unfinished shards are written again by a
fresh one, twice at most, then the job ends in one line (run again: it resumes).

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
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from mlbench.storage import paths, pending, writes
from mlbench.datasets import receipts as receipts_lib
from mlbench.datasets.receipts import MANIFEST, RECEIPTS, receipt_path
from mlbench.errors import UserError

__all__ = ["MANIFEST", "RECEIPTS", "Shard", "Summary", "Unreadable", "Written", "run",
           "receipt_path", "sha256"]
RESTARTS = 2  # fresh pools after workers died, before the job gives up


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
  notes: list[str] = dataclasses.field(default_factory=list)


def sha256(path: paths.PathLike) -> str:
  digest = hashlib.sha256()
  with paths.path(path).open("rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def _run_one(work: Callable[[Any, list[Path]], Written], out: str, shard: Shard,
             options: dict[str, str]) -> dict:
  """Writes one shard under temporary names (local ones for a bucket), moves (fsynced) or
  uploads it into place, then writes its receipt."""
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
        writes.put(tmp, out_dir / name)
      else:
        writes.replace_synced(tmp, out_dir / name)
  finally:
    for tmp in tmps:
      tmp.unlink(missing_ok=True)
    if remote:
      shutil.rmtree(staging, ignore_errors=True)
  receipt = {"shard": shard.name, "records": written.records, "units": written.units,
             "unreadable": written.unreadable, "files": files, "options": options}
  writes.write_atomic(receipt_path(out_dir, shard), json.dumps(receipt, indent=1))
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


@dataclasses.dataclass(frozen=True)
class _Job:
  """What every shard of one `run` shares."""

  work: Callable[[Any, list[Path]], Written]
  out: paths.Path
  options: dict[str, str]
  workers: int
  preload: Sequence[str]


def run(shards: Sequence[Shard], work: Callable[[Any, list[Path]], Written], out: Path, *,
        workers: int, description: str, unit: str, console: Any = None,
        preload: Sequence[str] = (), options: dict[str, str] | None = None) -> Summary:
  """Writes every unfinished shard (`workers` processes), then the manifest of all of them.

  `work` must be a module-level function (workers import it by name); `preload` names
  modules the fork server imports once for all workers (TensorFlow, for the writers
  that need it); `options` are what shapes the bytes (see `receipts`).

  Raises:
    UserError: the finished shards were written with other options; workers kept dying.
  """
  out = paths.path(out, "--out")
  job = _Job(work, out, dict(options or {}), workers, tuple(preload))
  with paths.errors("--out", out):
    (out / RECEIPTS).mkdir(parents=True, exist_ok=True)
    with _bucket_lock(out) if paths.is_remote(out) else _lock(Path(out)):
      return _run_locked(shards, job, description, unit, console)


@contextlib.contextmanager
def _bucket_lock(out: paths.Path) -> Iterator[None]:
  """One job per output bucket folder: a lock object that only one job can create."""
  lock = out / RECEIPTS / "lock.json"
  while not writes.write_new(lock, pending.Record.mine("data-prepare").to_json()):
    held = pending.read_record(lock)
    gone, why = (True, "unreadable") if held is None else pending.judge(
        held.pid, held, stale_after=math.inf)
    if not gone:
      raise UserError(f"another `mlbench data prepare` ({why.split(':')[0]}) is writing into "
                      f"{out}; wait for it to finish or stop it (if it is gone, delete {lock})")
    writes.remove(lock)
  try:
    yield
  finally:
    writes.remove(lock)


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
    # Temporary files left by an interrupted job (or a worker that died) are garbage while
    # no other job runs.
    for stale in out.glob(".*.tmp-*"):
      stale.unlink()
    yield
    for stale in out.glob(".*.tmp-*"):
      stale.unlink(missing_ok=True)


def todo(out: paths.PathLike, shards: Sequence[Shard],
         options: dict[str, str]) -> tuple[list[Shard], list[str]]:
  """(the shards still to write, notes on damaged receipts); refuses other options."""
  receipts, damaged = receipts_lib.read_receipts(out, shards)
  receipts_lib.refuse_other_options(out, receipts, options)
  done = receipts_lib.finished(out, shards, receipts)
  notes = [f"note: {RECEIPTS}/{name}.json in {out} is damaged (empty or truncated); its "
           "shard is written again" for name in damaged]
  return [s for s in shards if s.name not in done], notes


def _run_locked(shards: Sequence[Shard], job: _Job, description: str, unit: str,
                console: Any) -> Summary:
  import time

  left, notes = todo(job.out, shards, job.options)
  summary = Summary(skipped=len(shards) - len(left), notes=notes)
  start = time.perf_counter()
  with _progress(console, unit) as bar:
    task = bar.add_task(description, total=sum(s.units for s in left) or 1,
                        shards=f"0/{len(left)}", rate="-")

    def done(shard: Shard, receipt: dict) -> None:
      if "failed" in receipt:
        summary.failed.append(receipt["failed"])
        bar.update(task, advance=shard.units)
        return
      summary.written += 1
      summary.units += receipt["units"]
      summary.unreadable += receipt["unreadable"]
      rate = summary.units / max(time.perf_counter() - start, 1e-9)
      bar.update(task, advance=shard.units, shards=f"{summary.written}/{len(left)}",
                 rate=f"{rate:,.0f}")

    if job.workers <= 1 or len(left) <= 1:
      for shard in left:
        done(shard, _run_one(job.work, str(job.out), shard, job.options))
    else:
      _run_parallel(left, job, done, summary.notes)
  summary.seconds = time.perf_counter() - start
  summary.records = receipts_lib.write_manifest(job.out, shards, job.options)
  return summary


def _run_parallel(left: Sequence[Shard], job: _Job, done: Callable[[Shard, dict], None],
                  notes: list[str]) -> None:
  # Workers inherit these (through the fork server, which starts with the first pool): no
  # TF chatter, and the tokenizers' thread pools share the cores instead of each taking all.
  env = {"TF_CPP_MIN_LOG_LEVEL": "2",
         "RAYON_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // job.workers))}
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update({k: v for k, v in env.items() if saved[k] is None})
  try:
    for _ in range(RESTARTS + 1):
      broken = _pool(left, job, done)
      if not broken:
        return
      left = broken
      notes.append(f"note: a worker process died (killed, or out of memory?) while writing "
                   f"{_names(broken)}; a fresh pool writes {len(broken)} unfinished shard(s)")
    raise UserError(f"worker processes died {RESTARTS + 1} times while writing "
                    f"{_names(left)}; the finished shards are kept: run the same command "
                    "again to resume (with fewer --workers if they ran out of memory)")
  finally:
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)


def _names(shards: Sequence[Shard]) -> str:
  return ", ".join(s.name for s in shards[:3]) + (", ..." if len(shards) > 3 else "")


def _pool(left: Sequence[Shard], job: _Job, done: Callable[[Shard, dict], None]) -> list[Shard]:
  """Writes `left` with a pool of workers; returns the shards lost to a worker that died."""
  # A fork server that has imported the writer's module (and so TensorFlow, where the
  # writer needs it) forks each worker: one import instead of one per worker (20 s each
  # on a busy 2-core box), and no worker inherits this process's threads.
  context = multiprocessing.get_context("forkserver")
  context.set_forkserver_preload([job.work.__module__] + list(job.preload))
  pool = ProcessPoolExecutor(max_workers=job.workers, mp_context=context)
  broken = []
  try:
    pending = {pool.submit(_run_one, job.work, str(job.out), s, job.options): s for s in left}
    while pending:
      finished, _ = wait(pending, return_when=FIRST_COMPLETED)
      for future in finished:
        shard = pending.pop(future)
        try:
          receipt = future.result()
        except BrokenProcessPool:  # Its temporary files are swept by the lock's next holder.
          broken.append(shard)
          continue
        done(shard, receipt)
  except BaseException:
    # An interrupt: drop the queued shards rather than finish them all first; the shards
    # being written are lost to their temporary names and rewritten by the next run.
    pool.shutdown(wait=False, cancel_futures=True)
    raise
  pool.shutdown()
  return broken
