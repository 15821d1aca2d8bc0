"""A process of a two-process run dies: the other stops in time, names it, files no result.

Process 1 dying is noticed by mlbench's peer watch (heartbeats in the
coordination service's key-value store); process 0 dying takes the coordination
service with it, and JAX itself aborts the survivor with a message naming the
leader. Either way within seconds, and with no result file."""

from __future__ import annotations

import json
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


def test_every_process_saves_its_shards_and_a_two_process_run_resumes(data_dir, tmp_path):
  """Checkpoints of a two-process run hold both processes' shards; both resume from them."""
  def launch(*extra):
    coordinator = f"127.0.0.1:{_free_port()}"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return [subprocess.Popen(
        [sys.executable, "-c", "import sys; from mlbench.cli import main; sys.exit(main())",
         "run", "resnet50", "--cpu-devices", "4", "--coordinator", coordinator,
         "--num-processes", "2", "--process-id", str(i), "--data-dir", str(data_dir), *extra],
        cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for i in range(2)]

  # With weight-update sharding the optimizer state is split over both processes'
  # devices, so each has shards of its own to write (replicated arrays are written once).
  procs = launch("--set", "train_epochs=1", "--seed", "5", "--system", "cpu-2proc",
                 "--checkpoint-every", "5", "--weight-update-sharding")
  runs = tmp_path / "results" / "runs" / "cpu-2proc" / "resnet"
  deadline = time.time() + 600
  while not list(runs.glob("*/checkpoints/10/commit_success.txt")):
    assert time.time() < deadline and all(p.poll() is None for p in procs)
    time.sleep(0.2)
  for p in procs:
    p.send_signal(signal.SIGTERM)
  for p in procs:
    _, err = p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGTERM, err[-3000:]
  [folder] = list(runs.iterdir())
  step = max(int(p.name) for p in (folder / "checkpoints").iterdir() if p.name.isdigit())
  state = folder / "checkpoints" / str(step) / "state"
  assert {p.name for p in state.glob("ocdbt.process_*")} == {"ocdbt.process_0",
                                                             "ocdbt.process_1"}
  procs = launch("--resume", str(folder), "--weight-update-sharding")
  outs = [p.communicate(timeout=900) for p in procs]
  assert [p.returncode for p in procs] == [1, 1], [e[-3000:] for _, e in outs]
  report = json.loads(outs[0][0].splitlines()[-1])
  assert report["samples"] == 1280 and report["seed"] == 5 and outs[1][0] == ""
  folder = results.benchmark_dir(tmp_path / "results", "cpu-2proc", "resnet")
  assert [p.name for p in results.result_files(folder)] == ["result_0.txt"]
