"""End to end through the real CLI: time-to-quality, compliance, runs, the package checks.

Slow (minutes): they train for real on 8 simulated CPU devices. CI runs them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from mlperf_logging.benchmark_meta import get_result_file_counts
from mlperf_logging.package_checker.seed_checker import SeedChecker
from mlperf_logging.system_desc_checker import system_desc_checker

from mlbench import rules
from mlbench.storage import results

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
  # ... from the workload's analytic count of model FLOPs, never XLA's compiled count.
  from mlbench import registry

  w = registry.get("resnet50")
  assert report["flops_per_example"] == w.flops_per_example(w.configs["mini"]())
  assert report["flops_per_s"] == pytest.approx(
      report["samples_per_s"] * report["flops_per_example"], rel=1e-3)
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


def _package_checker_errors(folder, log):
  """The ERROR lines the official package checker logs for `folder` (its exit status
  is 0 whatever it finds, so its log is the verdict)."""
  proc = subprocess.run([sys.executable, "-m", "mlperf_logging.package_checker", str(folder),
                         "training", "4.0.0", "--log_output", str(log)],
                        capture_output=True, text=True, cwd=log.parent, timeout=300)
  text = log.read_text()
  assert "Traceback" not in proc.stderr and "Benchmark resnet" in text, proc.stderr[-2000:]
  return [line for line in text.splitlines() if line.startswith("ERROR")]


PACKAGE_FAILURES = ("Incorrect number of files", "Seed checker failed",
                    "System description file checker failed")


def test_two_invocations_make_five_distinct_seed_runs_the_package_checker_accepts_as_a_set(
    mlbench, tmp_path, data_dir, mllog_lines):
  """--runs 3, then --runs 2 more: five logs, nothing overwritten, distinct seeds; the
  official package checker finds the right number of files, unique seeds and a valid
  system description. These short runs stop before the target (exit 1, status
  aborted), so its per-file compliance and RCP checks fail, as they must."""
  args = ["run", "resnet50", "--set", "train_epochs=0.3", "--system", "cpu-pkg",
          "--data-dir", str(data_dir), "--cpu-devices", "8"]
  reports = []
  for runs in (3, 2):
    out = mlbench(*args, "--runs", str(runs), cwd=tmp_path)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    new = [json.loads(line) for line in out.stdout.strip().splitlines()]
    assert [r["status"] for r in new] == ["aborted"] * runs
    folder = results.benchmark_dir(tmp_path / "results", "cpu-pkg", "resnet")
    if runs == 3:
      before = {p.name: p.read_bytes() for p in results.result_files(folder)}
    reports += new
  files = results.result_files(folder)
  assert [p.name for p in files] == [f"result_{i}.txt" for i in range(5)]
  assert len(files) == get_result_file_counts("training")["resnet"]
  assert all(p.read_bytes() == before[p.name] for p in files[:3])
  seeds = [_by_key(mllog_lines(p), "seed")[0]["value"] for p in files]
  assert seeds == [r["seed"] for r in reports] and len(set(seeds)) == 5
  assert SeedChecker("4.0.0").check_seeds([str(p) for p in files])
  system = results.system_file(tmp_path / "results", "cpu-pkg")
  assert system_desc_checker.check_system_desc(str(system), "training", "4.0.0")[0]

  errors = _package_checker_errors(tmp_path / "results", tmp_path / "pc.log")
  assert errors and not [e for e in errors if any(f in e for f in PACKAGE_FAILURES)], errors
  assert any("files do not comply" in e for e in errors)  # the aborted runs, as expected

  # The same checker on a copy with each of those three broken says so: the checks
  # above can fail.
  broken = tmp_path / "broken"
  shutil.copytree(tmp_path / "results", broken)
  bfolder = results.benchmark_dir(broken, "cpu-pkg", "resnet")
  (bfolder / "result_4.txt").unlink()
  first = (bfolder / "result_0.txt").read_text()
  (bfolder / "result_1.txt").write_text(first)  # a second run with the first run's seed
  bsystem = results.system_file(broken, "cpu-pkg")
  desc = json.loads(bsystem.read_text())
  del desc["submitter"]
  bsystem.write_text(json.dumps(desc))
  errors = _package_checker_errors(broken, tmp_path / "broken.log")
  for failure in PACKAGE_FAILURES:
    assert any(failure in e for e in errors), (failure, errors)
