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
import subprocess
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


@pytest.mark.parametrize("fault", ["full", "denied", "slow", "final"])
def test_the_hosts_agree_on_every_save_and_stop_together(processes, small_disk, fault):
  """full: the shared disk fills (each host's writes fail); denied: only process 0's writes
  are refused (process 1's own part of each save works); slow: process 0's first write of
  a save takes 8 s, past a save deadline of 3 s. Each host says the same warning per save,
  the third failure in a row stops both with the same cause, and nothing waits for long.
  final: a stop with a failing save in flight, where each host waits for its part alone."""
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
  if fault == "final":  # a stop by signal: no vote, each its own part, nobody waits long
    assert lines[0][-1] == "final 5" and len(lines[0]) == 2, lines
    assert lines[0][0].startswith("warn warning: the checkpoint of step 10 was not saved ("), lines
    assert took < 60, took
    return
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


# One epoch (19 steps) on 2 x 2 devices, saving every 2 steps: the saves of 4, 6 and 8
# fail and the run stops well before its end.
ARGS = ["run", "resnet50", "--set", "train_epochs=1", "--system", "cpu-2proc", "--seed", "3",
        "--cpu-devices", "2", "--checkpoint-every", "2"]


def _stopped_together(done, ckpt: Path, folder: Path, cause: str, fix: str) -> int:
  """Both hosts exited 75 with the same line naming the --resume; returns its step."""
  [step] = sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit())[-1:]
  line = (f"error: {cause} (3 checkpoint saves in a row failed): the partial log is kept at "
          f"{folder / 'partial.log'}, the checkpoint of step {step} in {ckpt}; {fix} and resume "
          f"with: mlbench run resnet50 --resume {ckpt}")
  for p in done:
    assert p.returncode == StorageFailed.EXIT_CODE, p.stderr[-3000:]
    assert p.stderr.strip().splitlines()[-1] == line, p.stderr[-3000:]
    assert "Traceback" not in p.stderr and "Event loop is closed" not in p.stderr, p.stderr
  # Nothing half-written: only committed steps (no orbax tmp), the log of whole lines kept.
  assert sorted(p.name for p in ckpt.iterdir()) == sorted(
      [p.name for p in ckpt.iterdir() if p.name.isdigit()] + ["run.json"])
  assert all(":::MLLOG " in line for line in (folder / "partial.log").read_text().splitlines())
  return step


@pytest.mark.slow
def test_a_shared_disk_that_fills_stops_both_hosts_and_the_resume_files_one_result(
    processes, small_disk, data_dir, tmp_path, official_check, budget_rule):
  disk = small_disk(80)
  where = ["--data-dir", str(data_dir), "--results-dir", str(disk / "results")]
  procs = processes.mlbench(*ARGS, *where, n=2, cwd=tmp_path)
  runs = disk / "results" / "runs" / "cpu-2proc" / "resnet"
  deadline = time.time() + 600
  while not list(runs.glob("*/checkpoints/2/commit_success.txt")):
    assert all(p.poll() is None for p in procs) and time.time() < deadline
    time.sleep(0.01)
  filler = small_disk.fill(disk)
  t0 = time.time()
  done = [p.wait(300) for p in procs]
  assert time.time() - t0 < 120  # no host waits for another's save
  [folder] = list(runs.iterdir())
  ckpt = folder / "checkpoints"
  _stopped_together(done, ckpt, folder, f"disk full at {ckpt}: 0.0 MiB free", "free space")

  filler.unlink()
  done = [p.wait(600) for p in processes.mlbench(
      "run", "resnet50", "--resume", str(ckpt), "--cpu-devices", "2", "--data-dir",
      str(data_dir), n=2, cwd=tmp_path)]
  assert [p.returncode for p in done] == [1, 1], done[0].stderr[-3000:]  # budget < target
  report = json.loads(done[0].stdout.splitlines()[-1])
  assert report["status"] == "aborted" and report["seed"] == 3 and report["samples"] == 19 * 64
  bench = results.benchmark_dir(disk / "results", "cpu-2proc", "resnet")
  assert [p.name for p in bench.iterdir()] == ["result_0.txt"]
  official_check(bench / "result_0.txt", budget_rule)
  assert glob.glob(f"{ckpt}/*.orbax-checkpoint-tmp*") == []


@pytest.mark.slow
def test_a_host_whose_writes_are_refused_stops_every_host_with_one_line(processes, data_dir,
                                                                       tmp_path):
  """Only process 0's writes into the checkpoints are refused after the save of step 2;
  process 1's own part of each save works, so alone it would count every save a success."""
  env = {deny_writes.ENV: r"EACCES:/checkpoints/([4-9]|1\d)\.orbax-checkpoint-tmp"}
  argv = [*ARGS, "--data-dir", str(data_dir), "--results-dir", str(tmp_path / "results")]
  done = [p.wait(600) for p in processes.start(
      lambda i: [*(deny_writes.COMMAND if i == 0 else processes.MLBENCH), *argv], n=2,
      env_for=lambda i: env if i == 0 else {}, cwd=tmp_path)]
  [folder] = list((tmp_path / "results" / "runs" / "cpu-2proc" / "resnet").iterdir())
  ckpt = folder / "checkpoints"
  step = _stopped_together(done, ckpt, folder, f"permission denied at {ckpt}",
                           "make it writable")
  assert step == 2
  from mlbench.train.lifecycle import restore

  assert restore.read_meta(ckpt, step)["step"] == 2  # the named checkpoint reads back


@pytest.fixture
def second_path(tmp_path):
  """second_path(folder) -> the same folder at another path, a bind mount: a host that
  mounts the shared disk elsewhere (skips where it cannot mount: not root)."""
  mounted = []

  def bind(folder: Path) -> Path:
    other = tmp_path / f"other{len(mounted)}"
    other.mkdir()
    if subprocess.run(["mount", "--bind", str(folder), str(other)],
                      capture_output=True).returncode:
      pytest.skip("cannot bind-mount a folder here (needs root)")
    mounted.append(other)
    return other

  yield bind
  for other in mounted:
    subprocess.run(["umount", "-l", str(other)], check=True)


def _saves(processes, dirs, fault: str) -> list[list[str]]:
  """save_worker.py on two processes, process i saving into dirs[i]: each one's lines."""
  done = [p.wait(120) for p in processes.start(
      lambda i: [sys.executable, HERE / "save_worker.py", "--dir", dirs[i], "--fault", fault],
      n=2)]
  assert [p.returncode for p in done] == [0, 0], [p.stderr[-3000:] for p in done]
  return [p.stdout.splitlines() for p in done]


def test_hosts_that_mount_the_shared_folder_at_different_paths_agree(processes, tmp_path,
                                                                   second_path):
  """The hosts' keys come from the run (its id), not from each host's path of the folder:
  process 1 saves through a bind mount of process 0's folder, and every save commits. Both
  count what each host writes alike (the deadline's bytes): its half of the sharded
  parameters, and process 0 the replicated step and loss besides."""
  (tmp_path / "shared").mkdir()
  other = second_path(tmp_path / "shared")
  lines = _saves(processes, [tmp_path / "shared" / "ck", other / "ck"], "none")
  assert lines == [["bytes 800008 800000", "went on"]] * 2, lines
  assert sorted(p.name for p in (tmp_path / "shared" / "ck").iterdir()) == ["20", "25"]


def test_a_host_whose_main_thread_hangs_is_named_unresponsive_not_its_storage(processes,
                                                                            tmp_path):
  """Process 1's main thread sleeps past the save deadline before the last save's vote while
  its heartbeat goes on: both hosts name it unresponsive, and the save, which process 0
  committed, counts."""
  lines = _saves(processes, [tmp_path / "ck"] * 2, "hang")
  assert lines[0] == lines[1] == [
      "warn warning: process 1 did not report on the save of step 25 within 3 s while its "
      "heartbeat went on: it is unresponsive (its main thread hangs), not its storage; the "
      "checkpoint of step 25 was saved", "went on"], lines
