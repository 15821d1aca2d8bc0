"""Storage that fails under a two-process run (jax.distributed on 127.0.0.1, one shared
checkpoint folder): the hosts agree on every save, stop together with the same line, and
never wait forever.

The quick tests drive mlbench's `Checkpoints` from two processes (save_worker.py); the slow
ones run `mlbench run` on both, as a pod's hosts do: a shared results disk (a real small
tmpfs) that fills after the first checkpoint, and a host whose writes are refused (the
audit hook of tests/storage/deny_writes.py: process 0's, the one that commits steps).
"""

from __future__ import annotations

import glob
import json
import sys
import time
from pathlib import Path

import pytest

from mlbench.errors import StorageFailed
from mlbench.storage import results

pytestmark = pytest.mark.multiprocess

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "storage"))
import deny_writes  # noqa: E402  (tests/storage/deny_writes.py)


@pytest.mark.parametrize("fault", ["full", "denied", "slow"])
def test_the_hosts_agree_on_every_save_and_stop_together(processes, small_disk, fault):
  """full: the shared disk fills (each host's writes fail); denied: only process 0's writes
  are refused (process 1's own part of each save works); slow: process 0's first write of
  a save takes 8 s, past a save deadline of 3 s. Each host says the same warning per save,
  the third failure in a row stops both with the same cause, and nothing waits for long."""
  disk = small_disk(6)
  env = {deny_writes.ENV: r"EACCES:/ck/(10|15|20)\.orbax-checkpoint-tmp"}
  t0 = time.time()
  done = [p.wait(120) for p in processes.start(
      [sys.executable, HERE / "save_worker.py", "--dir", disk / "ck", "--fault", fault], n=2,
      env_for=lambda i: env if fault == "denied" and i == 0 else {})]
  took = time.time() - t0
  assert all(p.returncode == 0 for p in done), [p.stderr[-3000:] for p in done]
  lines = [p.stdout.splitlines() for p in done]
  assert lines[0] == lines[1], lines  # one verdict, said alike on every host
  ck = disk / "ck"
  if fault == "slow":
    assert lines[0] == [f"warn warning: the checkpoint of step 10 was not saved (the save did "
                        f"not finish within 3 s at {ck}); training goes on, the checkpoint of "
                        "step 5 stays the one to resume from; 2 more failed save(s) in a row "
                        "stop the run", "went on"]
    return
  cause = (f"disk full at {ck}: 0.0 MiB free" if fault == "full" else
           f"permission denied at {ck}")
  fix = "free space" if fault == "full" else "make it writable"
  assert lines[0] == [
      f"warn warning: the checkpoint of step {s} was not saved ({cause}); training goes on, "
      f"the checkpoint of step 5 stays the one to resume from; {n} more failed save(s) in a "
      "row stop the run" for s, n in ((10, 2), (15, 1))] + [
      f"stop {cause} (3 checkpoint saves in a row failed) | {fix} | 5"]
  assert sorted(p.name for p in ck.iterdir()) == ["5"]  # nothing half-written
  assert took < 60, took
  for p in done:
    assert "Traceback" not in p.stderr and "Event loop is closed" not in p.stderr, p.stderr
