"""Preemption, for real: runs stopped by real signals, and resumed from orbax checkpoints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from mlbench import rules
from mlbench.storage import results
from telemetry_checks import check_scalars_and_trace  # tests/e2e/telemetry_checks.py

pytestmark = pytest.mark.slow

# One epoch of the ResNet-50 mini: 19 steps of 64, an evaluation at the end.
ARGS = ["run", "resnet50", "--set", "train_epochs=1", "--system", "cpu-test", "--seed", "3",
        "--checkpoint-every", "5"]
# To the mini's target: seed 3 reaches it at the evaluation of epoch 8 (step 152), the last
# of an 8-epoch budget (accuracy 0.994; 0.939 at epoch 8 of the 16-epoch default).
TO_TARGET = ["run", "resnet50", "--set", "train_epochs=8", "--system", "cpu-test", "--seed",
             "3", "--checkpoint-every", "5"]


def _start(processes, cwd: Path, *args: str):
  [proc] = processes.mlbench(*args, cwd=cwd)
  return proc


def _wait_for(predicate, timeout: float = 600) -> None:
  deadline = time.time() + timeout
  while not predicate():
    assert time.time() < deadline, "timed out"
    time.sleep(0.01)  # The save of a checkpoint is visible for ~0.1 s.


def _runs(cwd: Path) -> Path:
  return cwd / "results" / "runs" / "cpu-test" / "resnet"


def _bench(cwd: Path) -> Path:
  return results.benchmark_dir(cwd / "results", "cpu-test", "resnet")


def _stop(proc, signum: int) -> tuple[int, str, float]:
  t0 = time.time()
  proc.send_signal(signum)
  err = proc.wait(60).stderr
  return proc.returncode, err, time.time() - t0


def _final_state(ckpt_dir: Path) -> list[np.ndarray]:
  """Every array of the latest checkpoint's train state, as numpy."""
  import orbax.checkpoint as ocp

  step = max(int(p.name) for p in ckpt_dir.iterdir() if p.name.isdigit())
  tree = ocp.PyTreeCheckpointer().restore((ckpt_dir / str(step) / "state").resolve())
  return [np.asarray(x) for x in __import__("jax").tree.leaves(tree)]


def _interrupted_run(processes, cwd: Path, data_dir: Path, after_step: int) -> tuple[Path, str]:
  """A run stopped by SIGTERM once its checkpoint of `after_step` exists."""
  proc = _start(processes, cwd, *ARGS, "--data-dir", str(data_dir), "--cpu-devices", "8")
  _wait_for(lambda: any(_runs(cwd).glob(f"*/checkpoints/{after_step}/commit_success.txt"))
            or proc.poll() is not None)
  rc, err, took = _stop(proc, signal.SIGTERM)
  assert rc == 128 + signal.SIGTERM, err[-3000:]
  assert took < 10, took
  [folder] = list(_runs(cwd).iterdir())
  last = err.strip().splitlines()[-1]
  assert last.startswith(f"interrupted by SIGTERM: the partial log is kept at "
                         f"{folder.relative_to(cwd)}/partial.log, the checkpoint of step "), last
  assert f"resume with: mlbench run resnet50 --resume {folder.relative_to(cwd)}/checkpoints" in last
  assert results.result_files(_bench(cwd)) == [] and not list(_bench(cwd).glob("pending_*"))
  partial = (folder / "partial.log").read_text()
  assert '"key": "run_stop"' in partial and '"status": "aborted"' in partial
  return folder, last


def test_sigterm_then_resume_ends_exactly_like_the_uninterrupted_run(processes, data_dir, tmp_path,
                                                                     mlbench, official_check):
  whole, cut = tmp_path / "whole", tmp_path / "cut"
  whole.mkdir(), cut.mkdir()
  # The uninterrupted run also carries a profile (it changes no number): its TensorBoard
  # scalars and trace are checked here rather than in a run of their own.
  out = mlbench(*ARGS, "--data-dir", str(data_dir), "--cpu-devices", "8", "--profile", "5:3",
                cwd=whole)
  assert out.returncode == 1, out.stderr[-3000:]  # One epoch is too short for the target.
  expected = json.loads(out.stdout.splitlines()[-1])
  check_scalars_and_trace(whole, expected, out.stderr)

  folder, _ = _interrupted_run(processes, cut, data_dir, after_step=10)
  out = mlbench("run", "resnet50", "--resume", str(folder.relative_to(cut)), "--data-dir",
                str(data_dir), "--cpu-devices", "8", cwd=cut)
  assert out.returncode == 1, out.stderr[-3000:]
  got = json.loads(out.stdout.splitlines()[-1])
  # The same run: seed, result number, metrics and evaluations, to the bit.
  for key in ("seed", "run", "samples", "epoch", "eval_accuracy", "train_metrics"):
    assert got[key] == expected[key], key
  assert Path(got["log"]).name == "result_0.txt"
  for a, b in zip(_final_state(folder / "checkpoints"),
                  _final_state(next(_runs(whole).iterdir()) / "checkpoints"), strict=True):
    np.testing.assert_array_equal(a, b)
  log = Path(got["log"]).read_text()
  assert log.count('"key": "run_start"') == 1 and log.count('"key": "mlbench_resumed"') == 1
  # Time counts from the original run_start, the interruption included.
  assert got["time_to_train_s"] > expected["time_to_train_s"]
  assert got["goodput"]["restarts_s"] > 0 and 0 < got["goodput"]["goodput"] < 1
  out = mlbench("run", "resnet50", "--resume", str(folder.relative_to(cut)), cwd=cut)
  assert out.returncode == 2 and "that run already finished" in out.stderr


def test_a_second_ctrl_c_exits_at_once(processes, data_dir, tmp_path):
  proc = _start(processes, tmp_path, *ARGS, "--data-dir", str(data_dir), "--cpu-devices", "8")
  _wait_for(lambda: list(_bench(tmp_path).glob("pending_*")) if _bench(tmp_path).is_dir()
            else False)
  proc.send_signal(signal.SIGINT)
  time.sleep(0.3)
  rc, err, took = _stop(proc, signal.SIGINT)
  assert rc == 128 + signal.SIGINT and took < 3, (took, err[-2000:])
  assert "SIGINT again: exiting now" in err
  assert results.result_files(_bench(tmp_path)) == []


def _pending_text(cwd: Path, pid: int) -> str:
  """What the log of process `pid` holds so far, while it is pending ("" otherwise)."""
  folder = _bench(cwd)
  for p in folder.glob(f"pending_{pid}_*.log") if folder.is_dir() else []:
    try:
      return p.read_text()
    except OSError:  # Published or shelved just now.
      pass
  return ""


def _logged(key: str):
  return lambda cwd, pid: f'"key": "{key}"' in _pending_text(cwd, pid)


# Moments of a run, as seen from outside, at which a fault is injected.
MOMENTS = {
    # The log exists, init_start is not logged yet: process setup before the clock starts.
    "init": lambda cwd, pid: any(_bench(cwd).glob(f"pending_{pid}_*.log"))
                             and '"init_start"' not in _pending_text(cwd, pid),
    # The XLA compile of init, train and eval (~30 s of the mini's init).
    "compile": _logged("mlbench_ruleset"),
    # Training, just after the checkpoint of step 5.
    "training": lambda cwd, pid: any(_runs(cwd).glob("*/checkpoints/5/commit_success.txt")),
    # The asynchronous save of step 10, in flight in its orbax tmp folder.
    "checkpoint": lambda cwd, pid: any(_runs(cwd).glob("*/checkpoints/10.orbax-checkpoint-tmp*")),
    # The first evaluation.
    "eval": _logged("eval_start"),
    # Its end reached, the run has filed its log as result_0.txt at once; it still waits
    # for its checkpoint saves in flight and runs the checker.
    "publish": lambda cwd, pid: bool(results.result_files(_bench(cwd))),
}


def _kill_at(cwd: Path, proc, when: str, signum: int) -> str:
  """Sends `signum` at the moment `when`; checks how the process ended; returns its stderr.
  A SIGTERM after the last evaluation of the last run cuts nothing short: the exit code
  is the run's own (0: its target reached, with a compliant log)."""
  _wait_for(lambda: MOMENTS[when](cwd, proc.pid) or proc.poll() is not None)
  assert proc.poll() is None, f"the run ended before the {when} moment"
  t0 = time.time()
  proc.send_signal(signum)
  err = proc.wait(60).stderr
  code = -signum if signum == signal.SIGKILL else 0 if when == "publish" else 128 + signum
  assert proc.returncode == code, err[-3000:]
  if signum == signal.SIGTERM:
    assert time.time() - t0 < 10, err[-2000:]
  return err


def _resumed_on(log: Path) -> int | None:
  """The devices the piece of a run that wrote `log` resumed on (None: not a resume)."""
  devices = [json.loads(line.split(":::MLLOG ", 1)[1])["metadata"]["devices"]
             for line in log.read_text().splitlines() if '"key": "mlbench_resumed"' in line]
  return devices[-1] if devices else None


def _only_complete_results(cwd: Path, mlbench, official_check, rule) -> list[str]:
  """The result files, each complete and passing the official checker; `validate` agrees
  when there is none (it counts no pending log, partial log or checkpoint)."""
  found = results.result_files(_bench(cwd))
  for log in found:
    official_check(log, rule)
  if not found:
    out = mlbench("validate", str(cwd / "results"), cwd=cwd, timeout=300)
    assert "runs: no result_*.txt files" in out.stdout, out.stderr[-2000:]
  return [p.name for p in found]


def _as_if_killed_inside_publish(cwd: Path, folder: Path) -> None:
  """Puts a published run back as a SIGKILL inside `publish` leaves it, microseconds after
  the hard link to result_0.txt and before the pending name is gone and finished.json is
  written: a window too short to hit from outside, so its state is made by hand."""
  (folder / "checkpoints" / "finished.json").unlink()
  gone = subprocess.Popen(["true"])
  gone.wait()
  [result] = results.result_files(_bench(cwd))
  os.link(result, _bench(cwd) / f"pending_{gone.pid}_{folder.name}.log")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
@pytest.mark.parametrize("when", ["init", "compile"])
def test_a_run_killed_before_its_first_step_leaves_nothing_to_count(processes, data_dir, tmp_path,
                                                                    mlbench, official_check,
                                                                    budget_rule, signum, when):
  """Killed while setting up or compiling: no result, nothing pending is left in the result
  folder, and nothing to resume. SIGTERM (a quick stop, checked in _kill_at) also says so
  and keeps the aborted log as partial.log."""
  # A real compile to land in: the tests' shared compilation cache would load the
  # programs in a fraction of a second and the signal would arrive after the first step.
  proc = _start(processes, tmp_path, *ARGS, "--data-dir", str(data_dir), "--cpu-devices", "8",
                "--compile-cache", "off")
  err = _kill_at(tmp_path, proc, when, signum)
  assert _only_complete_results(tmp_path, mlbench, official_check, budget_rule) == []
  [folder] = list(_runs(tmp_path).iterdir())
  if signum == signal.SIGTERM:
    assert "interrupted by SIGTERM" in err.strip().splitlines()[-1], err[-2000:]
    assert not list(_bench(tmp_path).iterdir())
    assert '"status": "aborted"' in (folder / "partial.log").read_text()
  out = mlbench("run", "resnet50", "--resume", str(folder), cwd=tmp_path)
  assert out.returncode == 2 and "before its first checkpoint" in out.stderr, out.stderr[-2000:]


def _damage_newest(ckpt: Path) -> int:
  """Truncates the metadata of the newest committed checkpoint; returns its step."""
  step = max(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()
             and (p / "commit_success.txt").exists())
  meta = ckpt / str(step) / "meta" / "metadata"
  meta.write_bytes(meta.read_bytes()[:10])
  return step


def _second_resume_is_refused(cwd: Path, folder: Path, proc, mlbench) -> None:
  """While a resumed run holds its run folder, another --resume of it stops before JAX."""
  _wait_for(lambda: any(f'"pid": {proc.pid},' in p.read_text()
                        for p in (folder / "checkpoints").glob("lease-*.json"))
            or proc.poll() is not None, timeout=300)
  out = mlbench("run", "resnet50", "--resume", str(folder), cwd=cwd, timeout=120)
  assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr[-2000:]
  assert (f"that run is in progress elsewhere (process {proc.pid} of this host still runs)"
          in out.stderr), out.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
def test_a_run_killed_anywhere_resumes_to_its_target_filed_once(processes, data_dir, tmp_path,
                                                                mlbench, official_check,
                                                                budget_rule, signum):
  """One run, killed in training, in a checkpoint save (its async commit in flight), in an
  evaluation and once it has filed its result (saves in flight, the checker running),
  resumed after each kill before the last (SIGTERM saves the last step; SIGKILL loses the
  steps since the last save, and leaves the save in flight half-written): after every kill
  only complete, compliant results are counted, and the run is filed once, as result_0.txt.
  With SIGTERM the run goes to the mini's target, a success: a SIGTERM after it reached
  its target changes nothing. With SIGKILL it is the one-epoch run, ended by its budget
  (what a resume restores does not depend on the target, and the suite's time does): a
  second --resume while one runs is refused, and the newest checkpoint, damaged, is set
  aside and the one before it restored. The run resumed after the kill in training
  continues on 4 devices from the checkpoint of 8, the next on 8 from that of 4."""
  resume = ["run", "resnet50", "--data-dir", str(data_dir), "--resume"]
  killed = signum == signal.SIGKILL
  proc = _start(processes, tmp_path, *(ARGS if killed else TO_TARGET), "--data-dir",
                str(data_dir), "--cpu-devices", "8")
  for when in ("training", "checkpoint", "eval", "publish"):
    err = _kill_at(tmp_path, proc, when, signum)
    published = _only_complete_results(tmp_path, mlbench, official_check, budget_rule)
    [folder] = list(_runs(tmp_path).iterdir())
    if when == "publish":
      break
    assert published == []
    damaged = _damage_newest(folder / "checkpoints") if killed and when == "eval" else None
    proc = _start(processes, tmp_path, *resume, str(folder), "--cpu-devices",
                  "4" if when == "training" else "8")
    if killed and when == "checkpoint":
      _second_resume_is_refused(tmp_path, folder, proc, mlbench)
  if killed:
    assert (f"warning: the checkpoint of step {damaged} in {folder}/checkpoints is damaged "
            "(JSONDecodeError: ") in err, err[-3000:]
  else:
    assert "note: SIGTERM arrived after the last evaluation of the run, which is filed as it " \
           "ended" in err, err[-3000:]
  assert published == ["result_0.txt"]
  result = _bench(tmp_path) / "result_0.txt"
  if not killed:
    official_check(result, rules.load("resnet", "mini"))  # the real target this time
  assert f'"status": "{"aborted" if killed else "success"}"' in result.read_text()
  # Filed: resuming would count the run twice. One partial log per kill before the last.
  partials = sorted(folder.glob("partial*.log"))
  assert len(partials) == 3
  for hand_made in (False, True):
    if hand_made:
      _as_if_killed_inside_publish(tmp_path, folder)
    out = mlbench(*resume, str(folder), "--cpu-devices", "8", cwd=tmp_path)
    assert out.returncode == 2 and "that run already finished" in out.stderr, out.stderr[-2000:]
  # The second name of the result is removed, not kept as a partial log.
  assert "removed pending_" in out.stderr, out.stderr[-2000:]
  assert sorted(folder.glob("partial*.log")) == partials
  assert _only_complete_results(tmp_path, mlbench, official_check, budget_rule) == ["result_0.txt"]
  assert not list(_bench(tmp_path).glob("pending_*"))
  assert not list((folder / "checkpoints").glob("lease-*"))  # let go when the run ended
  # The logs of the first three pieces of the run, killed in training, in a save and in an
  # evaluation: the second continued on 4 devices, the third on 8 again.
  assert [_resumed_on(log) for log in partials] == [None, 4, 8]
