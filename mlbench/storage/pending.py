"""Runs in progress in a results folder: pending logs, their records and heartbeats.

While a run runs, process 0 logs into `pending_<pid>_<run id>.log` in the
benchmark folder, beside a record of the run, `pending_<pid>_<run id>.json`:

    {"run_id", "host", "boot_id", "pid_ns", "pid", "pid_start", "started", "heartbeat"}

which a thread of the run rewrites every `HEARTBEAT_S` seconds (`heartbeat`,
Unix time; the same record and judgement keep a run folder's lease,
`mlbench.train.lifecycle.lease`). An object in a bucket cannot be appended to, so there the
run logs into a local file and every heartbeat uploads it as the pending log.

A run that ends publishes its log as the lowest free `result_<i>.txt`
(`writes.write_new`: never clobbers, never partial, distinct numbers for runs
finishing at once); one stopped early shelves it into its run folder as
`partial.log`. A results folder may be shared by hosts (NFS, gcsfuse, a bucket),
so before `mlbench run` tidies one it judges each pending log by whose it is:

- this host's (the same boot and PID namespace): abandoned once its process is
  gone (a pid reused since is told apart by the process's start time);
- another host's: abandoned only when its heartbeat is older than the run's
  `--stale-after` limit (`mlbench.config.STALE_AFTER_S` by default): a live run elsewhere is safe;
- a log without a record (from mlbench before records): by the pid in its name.
Every tidy says what it did with each pending log it found.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable

from etils import epath

from mlbench.storage import paths, results, writes

HEARTBEAT_S = 30.0
PARTIAL_LOG = "partial.log"
"""What an interrupted run's log is called inside its run folder."""
_NAME = re.compile(r"pending_(\d+)_([0-9a-f]{8})\.(log|json)")


@dataclasses.dataclass(frozen=True)
class Host:
  """Which machine and PID namespace a process runs in: where its pid means something."""

  name: str
  boot_id: str
  pid_ns: int

  @classmethod
  def this(cls) -> Host:
    try:
      boot_id = pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
      boot_id = ""
    try:
      pid_ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
      pid_ns = 0
    return cls(socket.gethostname(), boot_id, pid_ns)


def _start_ticks(pid: int) -> int | None:
  """When process `pid` started (clock ticks since boot), or None if unknown."""
  try:
    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[19])
  except (OSError, IndexError, ValueError):
    return None


def _alive(pid: int, start: int | None = None) -> bool:
  if pid == os.getpid():  # Left by an earlier run of this very process.
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Someone else's process: alive.
    pass
  return start is None or _start_ticks(pid) in (None, start)


@dataclasses.dataclass(frozen=True)
class Record:
  """Whose a pending log is, and when that run last said it was alive."""

  run_id: str
  host: str
  boot_id: str
  pid_ns: int
  pid: int
  pid_start: int | None
  started: float
  heartbeat: float

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self)) + "\n"

  @classmethod
  def from_json(cls, text: str) -> Record:
    return cls(**json.loads(text))

  @classmethod
  def mine(cls, run_id: str) -> Record:
    """A record of this process, beating now."""
    me, now = Host.this(), time.time()
    return cls(run_id, me.name, me.boot_id, me.pid_ns, os.getpid(), _start_ticks(os.getpid()),
               now, now)


@dataclasses.dataclass(frozen=True)
class Pending:
  """A pending log and its record found in a benchmark folder, judged."""

  stem: str
  log: epath.Path | None
  record: Record | None
  abandoned: bool
  why: str

  @property
  def run_id(self) -> str:  # pending_<pid>_<run id>
    return self.stem.rsplit("_", 1)[1]


def _ago(seconds: float) -> str:
  return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def judge(pid: int, record: Record | None, *, stale_after: float,
          now: float | None = None, me: Host | None = None) -> tuple[bool, str]:
  """(abandoned, why) for a pending log named with `pid` and carrying `record`."""
  me = me or Host.this()
  if record is None:
    if _alive(pid):
      return False, f"process {pid} of this host still runs"
    return True, f"its process {pid} is gone"
  if (record.host, record.boot_id, record.pid_ns) == (me.name, me.boot_id, me.pid_ns):
    if _alive(record.pid, record.pid_start):
      return False, f"process {record.pid} of this host still runs"
    return True, f"its process {record.pid} on this host is gone"
  age = (time.time() if now is None else now) - record.heartbeat
  where = f"host {record.host}, process {record.pid}"
  if age > stale_after:
    return True, f"{where}: its last heartbeat was {_ago(age)} ago (limit {_ago(stale_after)})"
  return False, f"{where}: heartbeat {_ago(max(age, 0))} ago"


def read_record(p: epath.Path) -> Record | None:
  """The record at `p`; None if it is gone or unreadable."""
  try:
    return Record.from_json(p.read_text())
  except (OSError, ValueError, TypeError):  # Gone meanwhile, or being replaced: no record.
    return None


def scan(folder: paths.PathLike, *, stale_after: float) -> list[Pending]:
  """The pending logs (and lone records) in a benchmark folder, each judged."""
  folder = paths.path(folder)
  try:
    listed = list(folder.iterdir()) if folder.is_dir() else []
  except FileNotFoundError:  # A bucket "folder" whose last object went meanwhile.
    listed = []
  found: dict[str, dict[str, epath.Path]] = {}
  for p in listed:
    m = _NAME.fullmatch(p.name)
    if m:
      found.setdefault(p.name.rsplit(".", 1)[0], {})[m[3]] = p
  out, me = [], Host.this()
  for stem, kinds in sorted(found.items()):
    record = read_record(kinds["json"]) if "json" in kinds else None
    abandoned, why = judge(int(_NAME.fullmatch(stem + ".log")[1]), record,
                           stale_after=stale_after, me=me)
    out.append(Pending(stem, kinds.get("log"), record, abandoned, why))
  return out


def published_as(log: paths.PathLike) -> epath.Path | None:
  """The `result_<i>.txt` a pending log was published as: its run was killed inside
  publishing, after the result was created and before the pending log was removed.
  A result holds the whole log; the pending one holds it, or (in a bucket) what it
  was at the last heartbeat: so the result begins with it."""
  log = paths.path(log)
  data = log.read_bytes()
  for result in results.result_files(log.parent) if data else []:
    if paths.size(result) >= len(data):
      with result.open("rb") as f:
        if f.read(len(data)) == data:
          return result
  return None


def publish(src: pathlib.Path, folder: paths.PathLike) -> epath.Path:
  """Files the finished local log `src` as the lowest free `result_<i>.txt` in `folder`
  (the source stays: the caller removes it)."""
  folder = paths.path(folder)
  with open(src, "rb") as f:
    os.fsync(f.fileno())
  taken = {p.name for p in results.result_files(folder)}
  i = 0
  while f"result_{i}.txt" in taken or not writes.write_new(folder / f"result_{i}.txt",
                                                            src=src):
    i += 1
  return folder / f"result_{i}.txt"


def shelve(src: paths.PathLike, folder: paths.PathLike) -> epath.Path:
  """Moves a log into the run folder `folder` as `partial.log` (`partial_<i>.log` if
  taken; never overwrites). Returns where it is now."""
  folder = paths.path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  local = None if paths.is_remote(src) else src
  data = None if local is not None else paths.path(src).read_bytes()
  dst, i = folder / PARTIAL_LOG, 0
  while not writes.write_new(dst, data, src=local):
    i += 1
    dst = folder / f"partial_{i}.log"
  writes.remove(src)
  return dst


def tidy(folder: epath.Path, run_folder: Callable[[str], epath.Path], *,
         stale_after: float, say: Callable[[str], None]) -> None:
  """Moves the pending logs of abandoned runs out of `folder` into their run folders
  (`run_folder(run id)`), leaves live ones alone; says what it did with each."""
  for p in scan(folder, stale_after=stale_after):
    record = folder / f"{p.stem}.json"
    if not p.abandoned:
      say(f"note: {p.stem}.log belongs to a run in progress ({p.why}); left alone")
    elif p.log is None:
      writes.remove(record)
      say(f"note: removed {record.name}, the record of a run that left no log ({p.why})")
    elif (twin := published_as(p.log)) is not None:
      writes.remove(p.log)
      writes.remove(record)
      say(f"note: removed {p.log.name}, left by a run killed while publishing its log as "
          f"{twin.name}")
    else:
      kept = shelve(p.log, run_folder(p.run_id))
      writes.remove(record)
      say(f"note: {p.log.name} was left by a run that no longer runs ({p.why}); its log is "
          f"kept at {kept} and is not a result")


class Heartbeat:
  """Calls `refresh` every `interval` s on a daemon thread until `stop()`, keeping a record
  (a pending log's, a run folder's lease) alive; a failed refresh only warns, once."""

  def __init__(self, refresh: Callable[[], None], interval: float, record: epath.Path):
    self._refresh, self._interval, self._record = refresh, interval, record
    self._lock, self._done, self._warned = threading.Lock(), threading.Event(), False

  def start(self) -> Heartbeat:
    threading.Thread(target=self._run, daemon=True, name="mlbench-heartbeat").start()
    return self

  def _run(self) -> None:
    while not self._done.wait(self._interval):
      try:
        self.beat()
      except Exception as e:  # A missed heartbeat must never end the run.
        if not self._warned:
          self._warned = True
          print(f"warning: could not refresh {self._record} ({paths.why(e)}); another host "
                "may take this run for abandoned after --stale-after", file=sys.stderr)

  def beat(self) -> None:
    with self._lock:
      if not self._done.is_set():
        self._refresh()

  def stop(self) -> None:
    with self._lock:  # Waits for a refresh in flight.
      self._done.set()


class PendingRun:
  """The pending log and record of one run (process 0 writes them), and its heartbeat.

  Args:
    folder, run_id: the benchmark folder (`results/<system>/<benchmark>`); the run's id.
  """

  def __init__(self, folder: epath.Path, run_id: str, *, heartbeat_s: float = HEARTBEAT_S):
    self.folder = paths.path(folder)
    stem = f"pending_{os.getpid()}_{run_id}"
    self.pending_log = self.folder / f"{stem}.log"
    self._record_path = self.folder / f"{stem}.json"
    self._spool: str | None = None
    if paths.is_remote(self.folder):  # Logged locally, uploaded at every heartbeat.
      self._spool = tempfile.mkdtemp(prefix="mlbench-log-")
      self.log_path = pathlib.Path(self._spool, f"{stem}.log")
    else:
      self.log_path = pathlib.Path(self.pending_log)
    self._record = Record.mine(run_id)
    self._heart = Heartbeat(self._refresh, heartbeat_s, self._record_path)

  def start(self) -> PendingRun:
    """Writes the record (before the log exists) and starts the heartbeat."""
    self.folder.mkdir(parents=True, exist_ok=True)
    if not writes.write_new(self._record_path, self._record.to_json()):
      raise FileExistsError(f"{self._record_path} exists")
    self._heart.start()
    return self

  def abandon(self) -> None:
    """Stops the heartbeat; removes the record (and log) of a run that never began."""
    self._heart.stop()
    self._remove()

  def _refresh(self) -> None:
    """One heartbeat: the log so far (in a bucket), then the record's time."""
    if self._spool is not None and self.log_path.exists():
      writes.put(self.log_path, self.pending_log)
    beat = dataclasses.replace(self._record, heartbeat=time.time())
    writes.write_atomic(self._record_path, beat.to_json())

  def _remove(self) -> None:
    writes.remove(self.pending_log)
    writes.remove(self._record_path)
    if self._spool is not None:
      shutil.rmtree(self._spool, ignore_errors=True)

  def publish(self) -> epath.Path:
    """Files the finished log as the lowest free `result_<i>.txt`; returns it."""
    self._heart.stop()
    result = publish(self.log_path, self.folder)
    self._remove()
    return result

  def shelve(self, run_folder: epath.Path) -> epath.Path:
    """Moves the log of a run that stopped early into its run folder; returns where."""
    self._heart.stop()
    kept = shelve(self.log_path, run_folder)
    self._remove()
    return kept
