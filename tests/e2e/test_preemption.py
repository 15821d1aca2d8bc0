"""Preemption, for real: runs stopped by real signals, and resumed from orbax checkpoints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mlbench import results

pytestmark = pytest.mark.slow

# One epoch of the ResNet-50 mini: 20 steps of 64, an evaluation at the end.
ARGS = ["run", "resnet50", "--set", "train_epochs=1", "--system", "cpu-test", "--seed", "3",
        "--checkpoint-every", "5"]


def _start(cwd: Path, *args: str) -> subprocess.Popen:
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  return subprocess.Popen([sys.executable, "-c", "import sys; from mlbench.cli import main; "
                           "sys.exit(main())", *args], cwd=cwd, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for(predicate, timeout: float = 600) -> None:
  deadline = time.time() + timeout
  while not predicate():
    assert time.time() < deadline, "timed out"
    time.sleep(0.1)


def _runs(cwd: Path) -> Path:
  return cwd / "results" / "runs" / "cpu-test" / "resnet"


def _bench(cwd: Path) -> Path:
  return results.benchmark_dir(cwd / "results", "cpu-test", "resnet")


def _stop(proc: subprocess.Popen, signum: int) -> tuple[int, str, float]:
  t0 = time.time()
  proc.send_signal(signum)
  _, err = proc.communicate(timeout=60)
  return proc.returncode, err, time.time() - t0


def _final_state(ckpt_dir: Path) -> list[np.ndarray]:
  """Every array of the latest checkpoint's train state, as numpy."""
  import orbax.checkpoint as ocp

  step = max(int(p.name) for p in ckpt_dir.iterdir() if p.name.isdigit())
  tree = ocp.PyTreeCheckpointer().restore((ckpt_dir / str(step) / "state").resolve())
  return [np.asarray(x) for x in __import__("jax").tree.leaves(tree)]


def _interrupted_run(cwd: Path, data_dir: Path, after_step: int) -> tuple[Path, str]:
  """A run stopped by SIGTERM once its checkpoint of `after_step` exists."""
  proc = _start(cwd, *ARGS, "--data-dir", str(data_dir), "--cpu-devices", "8")
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


def test_sigterm_then_resume_ends_exactly_like_the_uninterrupted_run(data_dir, tmp_path, mlbench,
                                                                     official_check):
  whole, cut = tmp_path / "whole", tmp_path / "cut"
  whole.mkdir(), cut.mkdir()
  out = mlbench(*ARGS, "--data-dir", str(data_dir), "--cpu-devices", "8", cwd=whole)
  assert out.returncode == 1, out.stderr[-3000:]  # One epoch is too short for the target.
  expected = json.loads(out.stdout.splitlines()[-1])

  folder, _ = _interrupted_run(cut, data_dir, after_step=10)
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


def test_a_checkpoint_of_8_devices_resumes_on_4(data_dir, tmp_path, mlbench):
  folder, _ = _interrupted_run(tmp_path, data_dir, after_step=5)
  out = mlbench("run", "resnet50", "--resume", str(folder), "--data-dir", str(data_dir),
                "--cpu-devices", "4", cwd=tmp_path)
  assert out.returncode == 1, out.stderr[-3000:]
  got = json.loads(out.stdout.splitlines()[-1])
  assert got["samples"] == 1280 and got["run"] == 0
  assert '"devices": 4' in Path(got["log"]).read_text()


def test_a_stop_during_compile_is_quick_and_leaves_no_result(data_dir, tmp_path):
  proc = _start(tmp_path, *ARGS, "--data-dir", str(data_dir), "--cpu-devices", "8")
  _wait_for(lambda: list(_bench(tmp_path).glob("pending_*")) if _bench(tmp_path).is_dir()
            else False)
  rc, err, took = _stop(proc, signal.SIGTERM)
  assert rc == 128 + signal.SIGTERM and took < 10, (took, err[-2000:])
  assert "interrupted by SIGTERM" in err.strip().splitlines()[-1]
  assert not list(_bench(tmp_path).iterdir())
  [partial] = list(_runs(tmp_path).glob("*/partial.log"))
  assert '"status": "aborted"' in partial.read_text()


def test_a_second_ctrl_c_exits_at_once(data_dir, tmp_path):
  proc = _start(tmp_path, *ARGS, "--data-dir", str(data_dir), "--cpu-devices", "8")
  _wait_for(lambda: list(_bench(tmp_path).glob("pending_*")) if _bench(tmp_path).is_dir()
            else False)
  proc.send_signal(signal.SIGINT)
  time.sleep(0.3)
  rc, err, took = _stop(proc, signal.SIGINT)
  assert rc == 128 + signal.SIGINT and took < 3, (took, err[-2000:])
  assert "SIGINT again: exiting now" in err
  assert results.result_files(_bench(tmp_path)) == []


def _pending_has(cwd: Path, key: str) -> bool:
  folder = _bench(cwd)
  return folder.is_dir() and any(f'"key": "{key}"' in p.read_text()
                                 for p in folder.glob("pending_*.log"))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
@pytest.mark.parametrize("when", ["init_start", "eval_start"])
def test_a_run_killed_anywhere_leaves_no_result_and_nothing_counted(data_dir, tmp_path, mlbench,
                                                                    signum, when):
  """Killed during init and compile, or during an evaluation (after 2 checkpoints)."""
  proc = _start(tmp_path, *ARGS, "--data-dir", str(data_dir), "--cpu-devices", "8")
  _wait_for(lambda: _pending_has(tmp_path, when) or proc.poll() is not None)
  proc.send_signal(signum)
  proc.communicate(timeout=60)
  assert proc.returncode == (128 + signum if signum == signal.SIGTERM else -signum)
  assert results.result_files(_bench(tmp_path)) == []
  out = mlbench("validate", str(tmp_path / "results"), cwd=tmp_path, timeout=300)
  assert "runs: no result_*.txt files" in out.stderr, out.stderr[-2000:]
  if when == "eval_start":  # The checkpoints of steps 5 .. 20 let the run finish.
    [folder] = list(_runs(tmp_path).iterdir())
    out = mlbench("run", "resnet50", "--resume", str(folder), "--data-dir", str(data_dir),
                  "--cpu-devices", "8", cwd=tmp_path)
    assert out.returncode == 1, out.stderr[-3000:]  # Finished: one epoch is below the target.
    assert json.loads(out.stdout.splitlines()[-1])["samples"] == 1280
    assert [p.name for p in results.result_files(_bench(tmp_path))] == ["result_0.txt"]
    assert not list(_bench(tmp_path).glob("pending_*"))
