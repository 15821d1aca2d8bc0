"""Every process of a multi-process run ends with one exit code (what SLURM's
--kill-on-bad-exit, a JobSet or a TPU VM's startup script judge a job by), through
`runtime.leave`, as `mlbench` ends: a process that fails ends the others with its code,
whether they still run (after the watch's grace) or are done already."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess

HERE = Path(__file__).parent


@pytest.mark.parametrize("delay", [2, pytest.param(60, marks=pytest.mark.slow)],
                         ids=["done", "running"])  # running: the watch's 15 s grace
def test_a_process_that_fails_gives_every_process_its_exit_code(processes, delay):
  t0 = time.time()
  done = processes.run([sys.executable, HERE / "leave_worker.py", "--code", "70", "--delay",
                        delay], n=2, timeout=120)
  assert [p.returncode for p in done] == [70, 70], [p.stderr[-3000:] for p in done]
  said = done[0].stderr.strip().splitlines()[-1]
  if delay == 2:  # done: it learns the code when every process has left
    assert said == ("error: process 1 of 2 exited with code 70 (see its output); process 0 "
                    "exits with it too"), said
  else:  # still running: its watch ends it the peers' grace (15 s) after process 1 failed
    assert said == ("error: process 1 stopped with exit code 70; process 0 stops without "
                    "writing a result"), said
    assert time.time() - t0 < delay  # not at its own end
  assert all("FATAL" not in p.stderr and "Traceback" not in p.stderr for p in done)
