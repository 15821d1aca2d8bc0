"""`mlbench run` under a real SLURM, as examples/slurm-gpu.sbatch starts it: a one-node
cluster on 127.0.0.1 (munged, slurmctld, slurmd: `slurm_cluster.py`; skipped where SLURM is
not installed, `.ci/run` installs it). The example's own `srun` line, on the mini config,
goes in through `sbatch`; `scancel` stops it after its first checkpoint (SIGTERM to every
task: each says the checkpoint and the `--resume` line, and exits 143); the `--resume`,
through `srun`, finds its processes from SLURM's environment and files one result."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

import pytest

from mlbench.storage import results

sys.path.insert(0, str(Path(__file__).parent))
import slurm_cluster  # noqa: E402  (tests/e2e/slurm_cluster.py)

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

ROOT = Path(__file__).parents[2]
MLBENCH = str(Path(sys.executable).with_name("mlbench"))
# The mini on 2 CPU devices per task, half an epoch (10 steps), a checkpoint every 2 steps:
# the run is stopped after its first, and its resume ends on its budget (below the target).
MINI = {"--config": "mini", "--system": "cpu-slurm", "--runs": "1", "--checkpoint-every": "2"}
MORE = ["--cpu-devices", "2", "--seed", "3", "--set", "train_epochs=0.5"]


@pytest.fixture(scope="module")
def slurm():
  why = slurm_cluster.missing()
  if why:
    pytest.skip(why)
  cluster = slurm_cluster.LocalSlurm()
  try:
    cluster.start()
  except RuntimeError as e:
    cluster.stop()
    pytest.skip(f"a local SLURM did not start here: {e}")
  yield cluster
  cluster.stop()


def _example(shared: Path, data_dir: Path) -> list[str]:
  """The example's `srun ... mlbench run ...` line, its values set for this node (the
  mini config, the session's data), with this environment's `mlbench`."""
  text = (ROOT / "examples" / "slurm-gpu.sbatch").read_text()
  [line] = [ln for ln in text.replace("\\\n", " ").splitlines() if ln.startswith("srun ")]
  argv = shlex.split(line.replace("$SHARED", str(shared)))
  for option, value in {**MINI, "--data-dir": str(data_dir)}.items():
    argv[argv.index(option) + 1] = value
  argv[argv.index("mlbench")] = MLBENCH
  return argv + MORE


def _env() -> dict[str, str]:
  return {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}


def _wait(ready, what: str, timeout_s: float = 600) -> None:
  deadline = time.monotonic() + timeout_s
  while not ready():
    assert time.monotonic() < deadline, what
    time.sleep(0.2)


def test_sbatch_scancel_and_srun_resume_file_one_result(slurm, data_dir, tmp_path,
                                                        official_check, budget_rule):
  shared = tmp_path / "shared"
  shared.mkdir()
  script = tmp_path / "job.sbatch"
  script.write_text("#!/bin/bash\n#SBATCH --job-name=mlbench-resnet50\n#SBATCH --ntasks=2\n"
                    f"#SBATCH --output={tmp_path}/%x-%j.out\nset -euo pipefail\n"
                    + shlex.join(_example(shared, data_dir)) + "\n")
  submitted = slurm.run("sbatch", "--parsable", str(script), cwd=tmp_path, env=_env())
  assert submitted.returncode == 0, submitted.stderr + slurm.logs()
  job = submitted.stdout.strip().split(";")[0]
  output = tmp_path / f"mlbench-resnet50-{job}.out"

  def running() -> bool:
    return slurm.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() != ""

  _wait(lambda: list(shared.glob("checkpoints/*/2/commit_success.txt")) or not running(),
        "no checkpoint within 600 s")
  assert running(), output.read_text()[-3000:]
  assert slurm.run("scancel", job).returncode == 0
  _wait(lambda: not running(), "the job did not end within 60 s of scancel", 60)
  [ckpt] = list((shared / "checkpoints").iterdir())
  said = output.read_text()
  resume = f"resume with: mlbench run resnet50 --resume {ckpt}"
  assert said.count(resume) == 2, said[-3000:]  # each task, on SIGTERM
  assert "interrupted by SIGTERM" in said and "Traceback" not in said, said[-3000:]
  bench = results.benchmark_dir(shared / "results", "cpu-slurm", "resnet")
  assert results.result_files(bench) == []

  # The --resume line, through srun: SLURM's environment gives jax.distributed its processes.
  # (Without --kill-on-bad-exit: the run ends on its budget, exit 1 on every task, and srun
  # would kill the task still exiting once the first has, ending the step with its own code.)
  done = slurm.run("srun", "-n", "2", MLBENCH, "run", "resnet50",
                   "--resume", str(ckpt), "--cpu-devices", "2", "--data-dir", str(data_dir),
                   "--compile-cache", str(shared / "jax-cache"), cwd=tmp_path, env=_env(),
                   timeout=900)
  assert done.returncode == 1, done.stderr[-3000:]  # every task: its budget, below the target
  report = json.loads(done.stdout.strip())  # one line: process 0's
  assert report["status"] == "aborted" and report["seed"] == 3 and report["samples"] == 10 * 64
  assert [p.name for p in results.result_files(bench)] == ["result_0.txt"]
  # The saves' deadline is said in the log, in a key the official checker ignores.
  assert '"key": "mlbench_save_deadline", "value": 300' in (bench / "result_0.txt").read_text()
  official_check(bench / "result_0.txt", budget_rule)
