"""A process of a two-process run dies: the other stops in time, names it, files no result.

Process 1 dying is noticed by mlbench's peer watch (heartbeats in the
coordination service's key-value store); process 0 dying takes the coordination
service with it, and JAX itself aborts the survivor with a message naming the
leader. Either way within seconds, and with no result file."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from mlbench import results

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.parametrize("victim", [1, 0])
def test_the_survivor_exits_within_60_s_naming_the_lost_process(data_dir, tmp_path, victim):
  coordinator = f"127.0.0.1:{_free_port()}"
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  procs = [subprocess.Popen(
      [sys.executable, "-c", "import sys; from mlbench.cli import main; sys.exit(main())",
       "run", "resnet50", "--set", "train_epochs=2", "--cpu-devices", "4", "--coordinator",
       coordinator, "--num-processes", "2", "--process-id", str(i), "--data-dir", str(data_dir),
       "--seed", "5", "--system", "cpu-2proc"], cwd=tmp_path, env=env, text=True,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(2)]
  folder = results.benchmark_dir(tmp_path / "results", "cpu-2proc", "resnet")
  deadline = time.time() + 600
  # Kill once training runs: the leader's log has its first block.
  while not any('"block_start"' in p.read_text() for p in folder.glob("pending_*.log")):
    assert time.time() < deadline and all(p.poll() is None for p in procs)
    time.sleep(0.2)
  procs[victim].send_signal(signal.SIGKILL)
  t0 = time.time()
  survivor = procs[1 - victim]
  _, err = survivor.communicate(timeout=120)
  took = time.time() - t0
  procs[victim].wait()
  assert took < 60, took
  assert results.result_files(folder) == []
  if victim == 1:
    assert survivor.returncode == 1, err[-3000:]
    assert "error: process 1 of 2 stopped responding" in err, err[-3000:]
  else:
    # The coordinator died: JAX's coordination client aborts this process at once
    # from C++ (a Python callback cannot be installed there), naming the leader.
    assert survivor.returncode != 0
    assert "the leader task was preempted/died" in err, err[-3000:]
