"""How a run ends: a stop gives the final checkpoint a grace that scales with the measured
save time (and says so); a run that reached its end is filed at once, so a signal after
its last evaluation keeps its result; a run stopped early is kept in its run folder."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time

import pytest
from rich.console import Console

from mlbench.storage import pending, results
from mlbench.mllog import MLLog
from mlbench.train.lifecycle import checkpoint, filing, lease as lease_lib

_STOP = """
import os, signal, sys, time
from mlbench.train.lifecycle import signals
with signals.StopOnSignals(grace_s=0.5):
  signals.allow_for_saves(2.0, "longest checkpoint save of this run")
  signals.on_timeout(lambda signum: os.write(2, b"the run's last words\\n"))
  os.kill(os.getpid(), signal.SIGTERM)
  t0 = time.time()
  while time.time() - t0 < float(sys.argv[1]):  # the final save, taking this long
    time.sleep(0.01)
print("saved")
"""


@pytest.mark.parametrize("save_s, code", [(1.0, 0), (60.0, 128 + signal.SIGTERM)],
                         ids=["within", "beyond"])
def test_a_stop_waits_for_the_final_save_as_long_as_saves_take(save_s, code):
  t0 = time.time()
  out = subprocess.run([sys.executable, "-c", _STOP, str(save_s)], capture_output=True,
                       text=True, timeout=120)
  took = time.time() - t0
  assert out.returncode == code, out.stderr
  assert ("SIGTERM: stopping the run at the next step, within 4 s (0.5 s + 2 x 2.0 s, the "
          "longest checkpoint save of this run) (again to exit at once)") in out.stderr
  if code == 0:  # The save of 1 s finished: no watchdog.
    assert out.stdout == "saved\n" and "last words" not in out.stderr
  else:  # Cut short after 0.5 + 2 x 2 s, not at once and not after the minute.
    assert "the run's last words" in out.stderr and 4.5 <= took < 30, took


def _ending(tmp_path, *, run_id="abcd1234"):
  """The end of a real run's filing: its pending log and record in the results folder,
  a checkpoint folder it holds the lease of."""
  root = tmp_path / "results"
  bench = results.benchmark_dir(root, "cpu-test", "resnet")
  folder = results.run_folder(root, "cpu-test", "resnet", run_id)
  ckpt = folder / "checkpoints"
  ckpt.mkdir(parents=True)
  run = pending.PendingRun(bench, run_id).start()
  log = MLLog(run.log_path)
  log.run_start()
  lease = lease_lib.Lease.take(ckpt, run_id, stale_after=1800, what="test")
  saver = checkpoint.RunSaver(ckpt, 5)
  end = filing.RunEnd("resnet50", log, run, folder, saver, lease,
                      Console(file=io.StringIO()))
  return end, bench, folder, ckpt


def test_a_run_that_ended_is_filed_before_anything_waits(tmp_path, capfd):
  end, bench, folder, ckpt = _ending(tmp_path)
  end.log.run_stop(True)
  [result] = [end.finished()]
  assert result == bench / "result_0.txt" and '"status": "success"' in result.read_text()
  assert (ckpt / "finished.json").read_text() == f'{{"log": "{result}"}}\n'
  # A signal now, and the watchdog ending the process: the result stays as filed.
  end.cut_short(signal.SIGTERM)
  err = capfd.readouterr().err
  # (The grace it names depends on the saves this process measured before.)
  assert err.startswith("interrupted by SIGTERM (no safe point reached in "), err
  assert f"): the run had finished and its log is filed ({result})" in err, err
  assert [p.name for p in bench.iterdir()] == ["result_0.txt"]
  assert not list(folder.glob("partial*.log")) and not list(ckpt.glob("lease-*"))


def test_a_run_cut_short_before_its_end_is_kept_not_filed(tmp_path, capfd):
  end, bench, folder, ckpt = _ending(tmp_path)
  end.cut_short(signal.SIGTERM)
  assert f"the partial log is kept at {folder / 'partial.log'}" in capfd.readouterr().err
  assert '"status": "aborted"' in (folder / "partial.log").read_text()
  assert not bench.exists() or not list(bench.iterdir())
  assert end.finished() is None and not list(ckpt.glob("lease-*"))


def test_a_run_taken_over_meanwhile_is_not_filed(tmp_path):
  end, bench, folder, ckpt = _ending(tmp_path)
  other = pending.Record("abcd1234", "tpu-host-7", "b00t", 1, 4242, None, time.time(),
                         time.time())
  (ckpt / "lease-1.json").write_text(other.to_json())
  end.log.run_stop(True)
  assert end.finished() is None
  assert not list(bench.glob("result_*")) and (folder / "partial.log").is_file()
  os.remove(ckpt / "lease-1.json")
  end.release()


def test_only_this_runs_kept_complete_successful_log_is_filed_on_resume(tmp_path, write_log):
  """A run stopped after its target because its result could not be written keeps its
  whole log; --resume files that log (`refile`) when it continues the log of the run's
  checkpoint, is whole, and ends in a successful run_stop; never another run's, a torn one,
  or one that stopped short of its target (that run resumes from its checkpoint)."""
  from mlbench.resultlog import ResultLog
  from mlbench.train.lifecycle import refile

  full = write_log(tmp_path / "full.log", [0.5, 0.99]).read_text()
  at_checkpoint = "".join(full.splitlines(keepends=True)[:-6])  # before the last evaluation
  folder = tmp_path / "run"
  folder.mkdir()
  candidates = {
      "another run": write_log(tmp_path / "other.log", [0.5, 0.99], seed=8).read_text(),
      "torn": full[:-20],
      "not successful": full.replace('"status": "success"', '"status": "aborted"')}
  for what, text in candidates.items():
    assert text != full
    (folder / "partial.log").write_text(text)
    assert refile.kept_success(folder, at_checkpoint) is None, what
  (folder / "partial_1.log").write_text(full)
  assert refile.kept_success(folder, at_checkpoint) == folder / "partial_1.log"
  log = ResultLog.read(folder / "partial_1.log")
  result = refile._result(log, "eval_accuracy", seed=7)
  assert result.success and result.evals == [(4.0, 0.5), (8.0, 0.99)] and result.epoch == 8.0
  assert result.time_to_train_s == log.time_to_train_ms / 1000 > 0
