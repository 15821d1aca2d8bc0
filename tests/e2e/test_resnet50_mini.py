"""End to end through the real CLI: time-to-quality, compliance, runs, the package checks.

Slow (minutes): they train for real on 8 simulated CPU devices. CI runs them.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from mlperf_logging.benchmark_meta import get_result_file_counts
from mlperf_logging.package_checker.seed_checker import SeedChecker
from mlperf_logging.system_desc_checker import system_desc_checker

from mlbench import results, rules

pytestmark = pytest.mark.slow


def _by_key(lines, key):
  return [d for d in lines if d["key"] == key]


def test_the_default_run_reaches_the_mini_target_with_a_compliant_log(
    mlbench, tmp_path, data_dir, mllog_lines, official_check):
  out = mlbench("run", "resnet50", "--cpu-devices", "8", "--data-dir", str(data_dir),
                cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  report = json.loads(out.stdout.strip())
  target = rules.load("resnet", "mini").quality.target
  assert report["status"] == "success" and report["compliant"] is True
  assert report["eval_accuracy"] >= target
  # MFU against this host's measured matmul rate, on the progress line and in the JSON.
  assert 0 < report["mfu"] < 2 and report["peak_source"].startswith("measured")
  assert report["flops_per_s"] > 0 and "MFU" in out.stderr
  # With libtpu installed (the tpu extra) a CPU run prints nothing about TPUs.
  assert "TPU_ACCELERATOR_TYPE" not in out.stderr and "libtpu" not in out.stderr
  log = tmp_path / report["log"]
  assert log == tmp_path / "results" / "results" / report["log"].split("/")[2] / "resnet" / "result_0.txt"

  # The official checker, run here by the test itself, on the derived mini rules.
  official_check(log, rules.load("resnet", "mini"))

  lines = mllog_lines(log)
  keys = [d["key"] for d in lines]
  assert keys.index("init_stop") < keys.index("run_start") < keys.index("block_start")
  assert keys[-1] == "run_stop" and lines[-1]["metadata"]["status"] == "success"
  times = [d["time_ms"] for d in lines]
  assert times == sorted(times)
  evals = _by_key(lines, "eval_accuracy")
  assert [d["metadata"]["epoch_num"] for d in evals] == [4 * (i + 1) for i in range(len(evals))]
  assert evals[-1]["value"] >= target > max(d["value"] for d in evals[:-1])
  assert _by_key(lines, "seed")[0]["metadata"]["file"] == "mlbench/train/loop.py"
  assert _by_key(lines, "submission_division")[0]["value"] == "closed"

  # mlbench's own validator finds nothing to say about mlbench's own log.
  checked = mlbench("validate", "--json", str(log), cwd=tmp_path)
  assert checked.returncode == 0, checked.stderr[-2000:]
  [verdict] = json.loads(checked.stdout)["files"]
  assert verdict["ruleset"] == "mini" and verdict["checker"] == "PASS"
  assert [f for f in verdict["findings"] if f["severity"] != "INFO"] == []


def test_runs_get_distinct_seeds_and_five_pass_the_package_checks(
    mlbench, tmp_path, data_dir, mllog_lines):
  """--runs 3, then --runs 2 more: five logs, nothing overwritten, package checks pass."""
  args = ["run", "resnet50", "--set", "train_epochs=0.3", "--system", "cpu-pkg",
          "--data-dir", str(data_dir), "--cpu-devices", "8"]
  first = mlbench(*args, "--runs", "3", cwd=tmp_path)
  reports = [json.loads(line) for line in first.stdout.strip().splitlines()]
  assert len(reports) == 3 and len({r["seed"] for r in reports}) == 3
  folder = results.benchmark_dir(tmp_path / "results", "cpu-pkg", "resnet")
  assert [p.name for p in results.result_files(folder)] == ["result_0.txt", "result_1.txt",
                                                            "result_2.txt"]
  before = {p.name: p.read_bytes() for p in results.result_files(folder)}
  for path, report in zip(results.result_files(folder), reports):
    assert _by_key(mllog_lines(path), "seed")[0]["value"] == report["seed"]

  mlbench(*args, "--runs", "2", cwd=tmp_path)
  files = results.result_files(folder)
  assert len(files) == get_result_file_counts("training")["resnet"] == 5
  assert all(p.read_bytes() == before[p.name] for p in files[:3])
  assert SeedChecker("4.0.0").check_seeds([str(p) for p in files])
  system = results.system_file(tmp_path / "results", "cpu-pkg")
  assert system_desc_checker.check_system_desc(str(system), "training", "4.0.0")[0]

  # The official package checker on the whole folder: its file-count, seed and
  # system-description checks pass (these short runs are aborted, so the
  # compliance target and RCP checks are expected to complain).
  proc = subprocess.run([sys.executable, "-m", "mlperf_logging.package_checker",
                         str(tmp_path / "results"), "training", "4.0.0", "--log_output",
                         str(tmp_path / "pc.log")], capture_output=True, text=True, cwd=tmp_path,
                        timeout=300)
  text = (tmp_path / "pc.log").read_text()
  assert "Running compliance checks in dir" in text and "Benchmark resnet" in text
  for failure in ("Incorrect number of files", "Seed checker failed",
                  "System description file checker failed"):
    assert failure not in text, text[-2000:]
  assert proc.returncode == 0
