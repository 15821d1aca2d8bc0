"""Several hosts, simulated: jax.distributed processes on 127.0.0.1 with 4 CPU devices each."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mlbench import results

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

HERE = Path(__file__).parent


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(argv_for, n: int, cwd: Path, timeout: float = 600) -> list[subprocess.CompletedProcess]:
  """Starts n processes (argv_for(i, coordinator)) and waits for all of them."""
  coordinator = f"127.0.0.1:{_free_port()}"
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  procs = [subprocess.Popen(argv_for(i, coordinator), cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(n)]
  out = []
  for p in procs:
    try:
      stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      raise
    out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
  return out


def _eval(data_dir, n, devices, tmp_path):
  def argv(i, coordinator):
    extra = ["--coordinator", coordinator, "--num-processes", str(n), "--process-id", str(i)]
    return [sys.executable, str(HERE / "eval_worker.py"), "--data-dir", str(data_dir),
            "--devices", str(devices)] + (extra if n > 1 else [])

  done = _launch(argv, n, tmp_path)
  assert all(p.returncode == 0 for p in done), [p.stderr[-2000:] for p in done]
  assert all(p.stdout == "" for p in done[1:])  # Only process 0 reports.
  return json.loads(done[0].stdout)


def _eval_set_fingerprints(data_dir):
  """The evaluation set read straight from its files, without the harness's pipeline."""
  import numpy as np

  from mlbench.train import data
  from mlbench.workload import Split
  from workloads.resnet50 import config, input_pipeline

  sys.path.insert(0, str(HERE))
  from eval_worker import fingerprints

  cfg = config.mini()
  t = data.tf()
  decode = input_pipeline.decode(cfg, Split.EVAL)
  ds = t.data.TFRecordDataset(sorted(input_pipeline.files(cfg, data_dir, Split.EVAL)))
  images = [ex["image"] for ex in ds.map(lambda r: decode(r, t.zeros([2], t.int64)))
            .as_numpy_iterator()]
  return sorted(int(f) for f in fingerprints(np.stack(images)))


def test_two_processes_evaluate_exactly_like_one_device(data_dir, tmp_path):
  single = _eval(data_dir, 1, 1, tmp_path)
  both = _eval(data_dir, 2, 4, tmp_path)
  assert (single["devices"], both["devices"], both["processes"]) == (1, 8, 2)
  assert single["count"] == both["count"] == 540
  # Every example exactly once, on one device and over two processes (compared as
  # multisets: the digits hold a few duplicate images).
  expected = _eval_set_fingerprints(data_dir)
  assert len(expected) == 540 and len(set(expected)) > 500
  assert single["fingerprints"] == expected and both["fingerprints"] == expected
  assert both["accuracy"] == single["accuracy"]
  assert both["loss"] == pytest.approx(single["loss"], rel=1e-6)


def test_a_two_process_run_reaches_the_target_and_writes_one_log(data_dir, tmp_path):
  def argv(i, coordinator):
    return [sys.executable, "-c", "import sys; from mlbench.cli import main; sys.exit(main())",
            "run", "resnet50", "--cpu-devices", "4", "--coordinator", coordinator,
            "--num-processes", "2", "--process-id", str(i), "--data-dir", str(data_dir),
            "--seed", "21", "--system", "cpu-2proc"]

  leader, follower = _launch(argv, 2, tmp_path)
  assert leader.returncode == 0, leader.stderr[-3000:]
  assert follower.returncode == 0, follower.stderr[-3000:]
  report = json.loads(leader.stdout)
  assert report["status"] == "success" and report["compliant"] is True
  assert follower.stdout == ""  # Only process 0 writes results and reports.
  folder = results.benchmark_dir(tmp_path / "results", "cpu-2proc", "resnet")
  assert [p.name for p in results.result_files(folder)] == ["result_0.txt"]
  log = (folder / "result_0.txt").read_text()
  assert '"key": "submission_platform", "value": "cpu-2proc"' in log
  description = json.loads(results.system_file(tmp_path / "results", "cpu-2proc").read_text())
  assert description["number_of_nodes"] == "2"


def test_cache_clear_is_true_when_any_process_dropped_its_cache(tmp_path):
  # Each host drops its own page cache; the one log must say so if any did (the
  # rules' cache_clear stands for "flush the cache or restart the system").
  def argv(i, coordinator):
    return [sys.executable, str(HERE / "any_process_worker.py"), "--flag", str(int(i == 1)),
            "--coordinator", coordinator, "--num-processes", "2", "--process-id", str(i)]

  done = _launch(argv, 2, tmp_path, timeout=300)
  assert all(p.returncode == 0 for p in done), [p.stderr[-2000:] for p in done]
  assert [p.stdout.strip().splitlines()[-1] for p in done] == ["1", "1"]
