"""No litter: logs of killed runs are never counted, and a bad results dir fails before training."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from mlbench.storage import pending, results, writes
from mlbench.cli import main
from mlbench.config import STALE_AFTER_S
from mlbench.errors import UserError


def _dead_pid() -> int:
  """The pid of a real process that has exited."""
  proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  return int(proc.stdout)


def _stale(folder, text="partial"):
  p = folder / f"pending_{_dead_pid()}_{uuid.uuid4().hex[:8]}.log"
  p.write_text(text)
  return p


def test_pending_logs_tell_dead_from_live(tmp_path):
  stale = _stale(tmp_path)
  live = tmp_path / f"pending_{os.getppid()}_{uuid.uuid4().hex[:8]}.log"
  live.write_text("running")
  (tmp_path / "pending_notes.log").write_text("not a pending log")
  found = {p.log.name: p.abandoned for p in pending.scan(tmp_path, stale_after=STALE_AFTER_S)}
  assert found == {stale.name: True, live.name: False}


def test_shelve_moves_a_log_into_its_run_folder_and_never_overwrites(tmp_path):
  folder = results.benchmark_dir(tmp_path, "sys", "resnet")
  folder.mkdir(parents=True)
  first = _stale(folder, "one")
  rid = first.stem.rsplit("_", 1)[1]
  home = results.run_folder(tmp_path, "sys", "resnet", rid)
  kept = pending.shelve(first, home)
  assert kept == tmp_path / "runs" / "sys" / "resnet" / rid / "partial.log"
  assert kept.read_text() == "one" and not first.exists()
  again = folder / first.name
  again.write_text("two")
  second = pending.shelve(again, home)
  assert second.name == "partial_1.log" and kept.read_text() == "one"
  assert list(folder.iterdir()) == []


def test_validate_ignores_a_killed_runs_log_with_a_note(capsys, tmp_path, write_log):
  folder = results.benchmark_dir(tmp_path, "cpu-test", "resnet")
  folder.mkdir(parents=True)
  write_log(folder / "result_0.txt", [0.5, 0.76])
  stale = _stale(folder, (folder / "result_0.txt").read_text())
  rc = main(["validate", str(folder)])
  got = capsys.readouterr()
  assert rc == 1, got  # One run of the five a package needs; the leftover is not a sixth.
  assert "runs: 1 result_*.txt files" in got.out  # the report, on stdout
  assert got.err == f"note: ignoring 1 log(s) of killed runs in {folder} ({stale.name}); " \
      "`mlbench run` there moves them to runs/\n"  # the note, on stderr
  assert "result_0.txt" in got.out and stale.name not in got.out


def test_check_writable_refuses_a_missing_mount_and_a_file(tmp_path):
  with pytest.raises(UserError, match=r"its parent .*missing does not exist \(a missing mount\?\)"):
    writes.check_writable(tmp_path / "missing" / "ckpt", "--checkpoint-dir")
  assert not (tmp_path / "missing").exists()
  (tmp_path / "file").write_text("")
  with pytest.raises(UserError, match="cannot write to --results-dir"):
    writes.check_writable(tmp_path / "file" / "res", "--results-dir", parents=True)


def test_check_writable_refuses_a_full_filesystem(tmp_path):
  mnt = tmp_path / "mnt"
  mnt.mkdir()
  if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                    capture_output=True).returncode:
    pytest.skip("cannot mount a small tmpfs here (needs root)")
  try:
    with pytest.raises(UserError, match=r"has only 1\.0 MiB free"):
      writes.check_writable(mnt / "res", "--results-dir")
  finally:
    subprocess.run(["umount", str(mnt)], check=True)


def test_an_unwritable_results_dir_fails_before_training(mlbench, tmp_path, data_dir):
  (tmp_path / "file").write_text("")
  out = mlbench("run", "resnet50", "--results-dir", str(tmp_path / "file" / "res"),
                "--data-dir", str(data_dir), "--cpu-devices", "8", cwd=tmp_path, timeout=300)
  assert out.returncode == 2
  assert out.stderr.startswith("error: cannot write to --results-dir") and out.stderr.count(
      "\n") == 1, out.stderr


@pytest.mark.slow
def test_after_sigkill_the_next_run_files_the_leftover_away(mlbench, processes, tmp_path, data_dir):
  """A real run killed outright leaves a pending log; validate ignores it, run moves it.
  That next run, aborted (a budget too small for the target), still files its log, after a
  result_0.txt put there meanwhile, which it never clobbers."""
  folder = tmp_path / "results" / "results" / "cpu-test" / "resnet"
  args = ["run", "resnet50", "--set", "train_epochs=0.2", "--system", "cpu-test",
          "--data-dir", str(data_dir), "--cpu-devices", "8", "--seed", "3"]
  [proc] = processes.mlbench(*args, cwd=tmp_path)
  deadline = time.time() + 300
  while time.time() < deadline and not (folder.is_dir() and list(folder.glob("pending_*.log"))):
    time.sleep(0.2)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  [leftover] = list(folder.glob("pending_*.log"))
  out = mlbench("validate", str(tmp_path / "results"), cwd=tmp_path, timeout=300)
  assert out.returncode == 1 and "runs: no result_*.txt files" in out.stdout, out.stderr
  assert "note: ignoring 1 log(s) of killed runs in" in out.stderr
  (folder / "result_0.txt").write_text("an earlier run")
  out = mlbench(*args, cwd=tmp_path)
  assert out.returncode == 1, out.stderr  # Did not reach the target: exit 1, not 2.
  assert f"note: {leftover.name} was left by a run that no longer runs" in out.stderr
  line = json.loads(out.stdout.strip().splitlines()[-1])
  assert line["status"] == "aborted" and line["seed"] == 3 and line["compliant"] is False
  assert (folder / "result_0.txt").read_text() == "an earlier run"
  assert line["log"] == "results/results/cpu-test/resnet/result_1.txt"
  assert (tmp_path / "results" / "systems" / "cpu-test.json").is_file()
  assert sorted(p.name for p in folder.iterdir()) == ["result_0.txt", "result_1.txt"]
  kept = tmp_path / "results" / "runs" / "cpu-test" / "resnet" / leftover.stem.rsplit("_", 1)[1]
  assert (kept / "partial.log").is_file()


def test_validate_reports_a_resumed_run(capsys, tmp_path, write_log):
  """A log continued by `mlbench run --resume` carries mlbench_resumed; validate says so."""
  from mlbench.mllog import MLLog

  log = tmp_path / "result_0.txt"
  write_log(log, [0.5, 0.985])
  lines = log.read_text().splitlines(keepends=True)
  cut = next(i for i, ln in enumerate(lines) if '"block_start"' in ln)
  resumed = tmp_path / "resumed.txt"
  MLLog(resumed, prefix="".join(lines[:cut])).event(
      "mlbench_resumed", 11, {"checkpoint": "ck", "devices": 4, "lost_s": 12.5})
  with open(resumed, "a") as f:
    f.writelines(lines[cut:])
  rc = main(["validate", str(resumed)])
  out = capsys.readouterr().out
  assert rc == 0, out
  assert ("INFO resumed: the run was interrupted and resumed from its checkpoint of step 11 on 4 "
          "devices; 12.5 s were lost and are in its time") in out
