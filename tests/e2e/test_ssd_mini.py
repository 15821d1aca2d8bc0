"""End to end through the real CLI: the SSD mini run to its target, checked officially;
and the detections of two processes gathered like those of one.

Slow (a few minutes): trains for real on 8 simulated CPU devices. CI runs it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import yaml

from mlbench import compliance, rules

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ssd_data_dir(_cache_dir):
  """The SSD mini dataset (digit scenes as COCO TFRecords), generated once."""
  from workloads.ssd import WORKLOAD, config

  path = _cache_dir / "data"
  WORKLOAD.input.prepare(config.mini(), path)
  return path


def _official_required_keys():
  folder = compliance.checker_package_dir() / "training_0.7.0"
  records = yaml.safe_load((folder / "closed_ssd.yaml").read_text())
  return {r["KEY"]["NAME"] for r in records if r["KEY"].get("REQ") == "EXACTLY_ONE"}


def test_the_ssd_mini_run_reaches_its_target_with_a_compliant_log(
    mlbench, tmp_path, ssd_data_dir, mllog_lines, official_check):
  out = mlbench("run", "ssd", "--cpu-devices", "8", "--data-dir", str(ssd_data_dir),
                "--seed", "0", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  report = json.loads(out.stdout.strip())
  rule = rules.load("ssd", "mini")
  assert report["status"] == "success" and report["compliant"] is True
  assert report["eval_accuracy"] >= rule.quality.target
  log = tmp_path / report["log"]

  # The official checker, run here by the test itself, on the derived mini rules.
  official_check(log, rule)

  lines = mllog_lines(log)
  logged = {d["key"]: d["value"] for d in lines}
  assert _official_required_keys() <= set(logged)
  assert logged["submission_benchmark"] == "ssd" and logged["max_samples"] == 1
  assert logged["eval_samples"] == 500 and logged["train_samples"] == 6000
  # Whole epochs at the mini rules' cadence (every epoch), the last one at the target.
  evals = [d for d in lines if d["key"] == "eval_accuracy"]
  assert [d["metadata"]["epoch_num"] for d in evals] == list(range(1, len(evals) + 1))
  assert evals[-1]["value"] >= rule.quality.target > max(d["value"] for d in evals[:-1])


def test_the_full_config_compiles_for_8_devices_from_shapes(mlbench, tmp_path):
  out = mlbench("check", "ssd", "--config", "full", "--mesh", "data=8", "--cpu-devices", "8",
                "--bn-group-size", "2", "--json", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  report = json.loads(out.stdout)
  assert report["params"] == 19_972_534 and report["mesh"] == {"data": 8}
  programs = {p["name"]: p for p in report["programs"]}
  train, evals = programs["train step"], programs["eval step"]
  assert train["collectives"]["all-reduce"] > 0 and evals["flops"] > 0


# One process of a distributed evaluation: the mini model's initial state on the digit
# scenes over all devices of all processes; process 0 prints the merged rows' digest.
_WORKER = textwrap.dedent("""
    import hashlib, json, sys
    from pathlib import Path
    from mlbench.train import runtime
    data_dir, devices, coordinator, n, i = sys.argv[1:]
    many = runtime.Distributed(coordinator, int(n), int(i))
    rt = runtime.setup(cpu_devices=int(devices),
                       distributed=many if int(n) > 1 else runtime.Distributed())
    import numpy as np
    from mlbench.train import data, evaluate, mesh as mesh_lib, steps
    from mlbench.workload import Split, StepContext
    from workloads.ssd import WORKLOAD, config, input_pipeline
    cfg = config.mini()
    sched = WORKLOAD.schedule(cfg)
    mesh = mesh_lib.make_mesh(devices=rt.devices)
    programs = steps.compile_programs(WORKLOAD, cfg, sched, mesh, StepContext(mesh=mesh),
                                      WORKLOAD.optimizer(cfg, sched))
    ds = data.eval_dataset(input_pipeline.files(cfg, Path(data_dir), Split.EVAL),
                           input_pipeline.decode(cfg, Split.EVAL),
                           num_examples=sched.eval_examples,
                           per_host_batch=sched.eval_batch_size // rt.process_count,
                           host=rt.process_index, hosts=rt.process_count)
    put = lambda b: mesh_lib.to_global(b, programs.batch_sharding, sched.eval_batch_size)
    metrics, part = evaluate.evaluate(WORKLOAD, cfg, programs.eval, programs.init_state(3),
                                      data.prefetch(data.numpy_batches(ds), put),
                                      sched.eval_examples)
    order = np.argsort(part.rows["image_id"])
    ids = part.rows["image_id"][order]
    classes = part.rows["det_classes"][order]
    if rt.is_leader:
      print(json.dumps({"count": part.count, "processes": rt.process_count,
                        "devices": len(rt.devices), "ids": ids.tolist()[:3] + ids.tolist()[-3:],
                        "unique": len(set(ids.tolist())),
                        "classes": hashlib.sha256(classes.tobytes()).hexdigest(),
                        "detections": int((part.rows["det_scores"] > 0).sum()), **metrics}))
""")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _eval(data_dir, processes, devices, cwd):
  coordinator = f"127.0.0.1:{_free_port()}"
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(data_dir), str(devices),
                             coordinator, str(processes), str(i)], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
           for i in range(processes)]
  done = [p.communicate(timeout=600) for p in procs]
  assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in done]
  assert all(out == "" for out, _ in done[1:])  # Only process 0 reports.
  return json.loads(done[0][0])


@pytest.mark.multiprocess
def test_two_processes_gather_the_same_detections_as_one_device(ssd_data_dir, tmp_path):
  single = _eval(ssd_data_dir, 1, 1, tmp_path)
  both = _eval(ssd_data_dir, 2, 4, tmp_path)
  assert (single["devices"], both["devices"], both["processes"]) == (1, 8, 2)
  for r in (single, both):
    assert r["count"] == r["unique"] == 500 and r["ids"] == [1, 2, 3, 498, 499, 500]
  assert both["detections"] == single["detections"] > 1000
  assert both["classes"] == single["classes"]
  assert both["mAP"] == pytest.approx(single["mAP"], abs=1e-9)
