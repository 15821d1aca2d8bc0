"""A real disk that fills up under a run (a small tmpfs, where the tests run as root): the
run ends in one line naming the --resume, nothing half-written; the start-up check refuses
the disk while it has too little room, saying both numbers; with space back, that
--resume finishes the run and files its one result."""

from __future__ import annotations

import json
import re
import shutil
import time

import pytest

from mlbench.storage import results
from mlbench.errors import StorageFailed

pytestmark = pytest.mark.slow

# One epoch (19 steps), saving every 2: the disk fills after the save of step 2, the saves
# of 4, 6 and 8 fail, and the run stops well before its end.
ARGS = ["run", "resnet50", "--set", "train_epochs=1", "--system", "cpu-test", "--seed", "3",
        "--cpu-devices", "8"]


def _committed(ckpt) -> list[int]:
  return sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit())


def _whole_lines(log) -> list[dict]:
  """A log's records; each line must be a whole one."""
  return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines()]


def test_a_disk_that_fills_up_stops_the_run_resumably(small_disk, processes, mlbench, data_dir,
                                                     tmp_path, official_check, budget_rule):
  disk = small_disk(80)
  where = ["--data-dir", str(data_dir), "--results-dir", str(disk / "results")]
  [proc] = processes.mlbench(*ARGS, *where, "--checkpoint-every", "2", cwd=tmp_path)
  runs = disk / "results" / "runs" / "cpu-test" / "resnet"
  deadline = time.time() + 600
  while not list(runs.glob("*/checkpoints/2/commit_success.txt")):
    assert proc.poll() is None and time.time() < deadline, proc.stderr[-3000:]
    time.sleep(0.01)
  filler = small_disk.fill(disk)
  out = proc.wait(600)
  [folder] = list(runs.iterdir())
  ckpt = folder / "checkpoints"
  [step] = _committed(ckpt)[-1:]
  assert out.returncode == StorageFailed.EXIT_CODE, out.stderr[-3000:]
  assert "Traceback" not in out.stderr and "Event loop is closed" not in out.stderr
  # What is free when a save fails: under a MiB (a failed save's leftovers, removed, free
  # a little of the filled disk, more or less of it by when the next one looks).
  free = r"0\.\d MiB free"
  assert re.fullmatch(re.escape(f"error: disk full at {ckpt}: ") + free + re.escape(
      f" (3 checkpoint saves in a row failed): the partial log is kept at "
      f"{folder / 'partial.log'}, the checkpoint of step {step} in {ckpt}; free space and "
      f"resume with: mlbench run resnet50 --resume {ckpt}"),
      out.stderr.strip().splitlines()[-1]), out.stderr[-3000:]
  assert len(re.findall(re.escape(f"was not saved (disk full at {ckpt}: ") + free + re.escape(
      f"); training goes on, the checkpoint of step {step} stays the one to resume from"),
      out.stderr)) == 2, out.stderr[-3000:]
  # Nothing half-written: no temporary checkpoint, a log of whole lines, nothing pending.
  assert sorted(p.name for p in ckpt.iterdir()) == [*map(str, _committed(ckpt)), "run.json"]
  assert _whole_lines(folder / "partial.log")[0]["key"] == "cache_clear"
  bench = results.benchmark_dir(disk / "results", "cpu-test", "resnet")
  assert not list(bench.iterdir())

  # Room for a little: a new run is refused before it compiles, with both numbers; its
  # checkpoints as counted are what the disk holds for one.
  filler.unlink()
  filler.write_bytes(b"\0" * (shutil.disk_usage(disk).free - (5 << 20)))
  out = mlbench(*ARGS, *where, "--checkpoint-every", "2", cwd=tmp_path, timeout=300)
  assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr[-2000:]
  message = out.stderr
  assert message.startswith(f"error: --results-dir {disk / 'results'} has only 5.0 MiB "
                            "free; this run needs about "), message
  assert "; this run needs about " in message and "checkpoints 3 x " in message, message
  counted = float(message.split("checkpoints 3 x ")[1].split(" MiB")[0])
  on_disk = folder_bytes(ckpt / str(step)) / 2**20
  assert abs(counted - on_disk) < 0.2 * on_disk, (counted, on_disk)

  filler.unlink()
  out = mlbench("run", "resnet50", "--resume", str(ckpt), "--cpu-devices", "8", "--data-dir",
                str(data_dir), "--checkpoint-every", "50", cwd=tmp_path)
  assert out.returncode == 1, out.stderr[-3000:]  # its one epoch ends below the target
  report = json.loads(out.stdout.splitlines()[-1])
  assert report["status"] == "aborted" and report["seed"] == 3 and report["samples"] == 19 * 64
  assert [p.name for p in bench.iterdir()] == ["result_0.txt"]
  official_check(bench / "result_0.txt", budget_rule)


def folder_bytes(folder) -> int:
  """Bytes in the files under `folder`."""
  return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
