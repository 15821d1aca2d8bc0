"""One live run per run folder, across hosts: the lease on a checkpoint folder.

A run that checkpoints holds a lease on its checkpoint folder (the one with
`run.json`) from its start to its end: `lease-<n>.json`, the same record a
pending log has (`mlbench.storage.pending.Record`: host, boot id, PID namespace, pid and
its start time, heartbeat), refreshed by the same heartbeat every
`pending.HEARTBEAT_S` seconds. The holder is the newest lease, judged as a
pending log's owner is (`pending.judge`): a process of this host is alive while
it runs; another host's run while its heartbeat is younger than `--stale-after`.

`--resume` takes the run over only from a holder that is gone, by creating the
next lease, `lease-<n + 1>.json`, with `writes.write_new` (a hard link of a
complete file on a disk, an upload with the precondition "no such object" in a
bucket): of two resumes at once exactly one creates it, the other is refused. A
run that ends (finished, stopped, crashed) removes its lease; one killed
outright leaves it to be judged by the next taker. A run taken over meanwhile
(judged gone on another host after `--stale-after` without a heartbeat) finds a
newer lease than its own and does not publish its log.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import time
from collections.abc import Callable

from mlbench.storage import paths, pending, writes
from mlbench.errors import UserError

_NAME = re.compile(r"lease-(\d+)\.json")


@dataclasses.dataclass(frozen=True)
class Holder:
  """The newest lease of a folder: its number, its record (None: unreadable), and whether
  its run counts as gone."""

  number: int
  record: pending.Record | None
  gone: bool
  why: str


def _numbers(folder: paths.Path) -> list[int]:
  try:
    names = [p.name for p in folder.iterdir()]
  except FileNotFoundError:
    return []
  return sorted(int(m[1]) for n in names if (m := _NAME.fullmatch(n)))


def holder(folder: paths.PathLike, *, stale_after: float) -> Holder | None:
  """Who holds the lease on `folder` (None: nobody ever did)."""
  folder = paths.path(folder)
  numbers = _numbers(folder)
  if not numbers:
    return None
  record = pending.read_record(folder / f"lease-{numbers[-1]}.json")
  if record is None:  # Removed by its run a moment ago, or damaged: nobody holds it.
    return Holder(numbers[-1], None, True, "its lease is gone or unreadable")
  gone, why = pending.judge(record.pid, record, stale_after=stale_after)
  return Holder(numbers[-1], record, gone, why)


def _refusal(what: str, held: Holder, stale_after: float) -> str:
  record = held.record
  wait = ("wait for it to end, or stop it" if record is None or
          record.host != pending.Host.this().name else
          f"wait for it to end, or stop it (kill -TERM {record.pid})")
  return (f"{what}: that run is in progress elsewhere ({held.why}); {wait}. A run folder is "
          f"continued by one run at a time; a run on another host counts as gone after "
          f"{stale_after:g} s without a heartbeat (--stale-after)")


def check(folder: paths.PathLike, *, stale_after: float, what: str) -> None:
  """Refuses (one line) when a live run holds `folder`; takes nothing."""
  with paths.errors(what, folder):
    held = holder(folder, stale_after=stale_after)
  if held is not None and not held.gone:
    raise UserError(_refusal(what, held, stale_after))


class Lease:
  """The lease this process holds on a checkpoint folder (see the module docstring)."""

  def __init__(self, folder: paths.Path, number: int, record: pending.Record, *,
               heartbeat_s: float):
    self.folder, self.number = folder, number
    self.path = folder / f"lease-{number}.json"
    self._record = record
    self._heart = pending.Heartbeat(self._refresh, heartbeat_s, self.path)

  @classmethod
  def take(cls, folder: paths.PathLike, run_id: str, *, stale_after: float, what: str,
           heartbeat_s: float = pending.HEARTBEAT_S,
           say: Callable[[str], None] = lambda line: None) -> Lease:
    """The lease of `folder`, taken from nobody or from a run that is gone.

    Raises:
      UserError: a live run holds it, or another process took it a moment ago.
    """
    folder = paths.path(folder)
    with paths.errors(what, folder):
      held = holder(folder, stale_after=stale_after)
      if held is not None and not held.gone:
        raise UserError(_refusal(what, held, stale_after))
      number = 0 if held is None else held.number + 1
      record = pending.Record.mine(run_id)
      if not writes.write_new(folder / f"lease-{number}.json", record.to_json()):
        raise UserError(f"{what}: another mlbench took this run over a moment ago; two runs "
                        "must not continue one run folder")
      if held is not None:
        writes.remove(folder / f"lease-{held.number}.json")
        if held.record is not None:
          say(f"note: took over {folder} from a run that is gone ({held.why})")
    return cls(folder, number, record, heartbeat_s=heartbeat_s)._start()

  def _start(self) -> Lease:
    self._heart.start()
    return self

  def _refresh(self) -> None:
    beat = dataclasses.replace(self._record, heartbeat=time.time())
    writes.write_atomic(self.path, beat.to_json())

  def ours(self) -> bool:
    """Whether no other run has taken this folder over since (a newer lease)."""
    try:
      return max(_numbers(self.folder), default=self.number) <= self.number
    except Exception:  # Cannot tell (a bucket that does not answer): keep going as before.
      return True

  def release(self) -> None:
    """Stops the heartbeat and removes the lease (a run ending, however it ends)."""
    self._heart.stop()
    try:
      writes.remove(self.path)
    except Exception as e:  # The next taker judges a lease left behind by its process.
      print(f"warning: could not remove {self.path} ({paths.why(e)})", file=sys.stderr)
