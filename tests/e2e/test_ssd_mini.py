"""End to end through the real CLI: the SSD mini run to its target, checked officially;
and the detections of two processes gathered like those of one.

Slow (a few minutes): trains for real on 8 simulated CPU devices. CI runs it.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow


def test_the_ssd_mini_run_reaches_its_target_with_a_compliant_log(mini_run, ssd_data_dir,
                                                                  required_keys):
  run = mini_run("ssd", "ssd", data_dir=ssd_data_dir)
  logged = run.logged
  assert required_keys("0.7.0", "closed_ssd.yaml") <= set(logged)
  assert logged["submission_benchmark"] == "ssd" and logged["max_samples"] == 1
  assert logged["eval_samples"] == 500 and logged["train_samples"] == 6000
  # Whole epochs at the mini rules' cadence (every epoch), the last one at the target.
  assert [d["metadata"]["epoch_num"] for d in run.evals] == list(range(1, len(run.evals) + 1))
  assert run.reached_only_at_the_end()


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
    data_dir, devices, *job = sys.argv[1:]  # job: --coordinator C --num-processes N --process-id I
    coordinator, n, i = job[1::2] or (None, None, None)
    rt = runtime.setup(cpu_devices=int(devices), distributed=runtime.Distributed(
        coordinator, n and int(n), i and int(i)))
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


def _eval(processes, data_dir, n, devices, cwd):
  done = processes.run([sys.executable, "-c", _WORKER, data_dir, devices], n=n, cwd=cwd,
                       timeout=600)
  assert all(p.returncode == 0 for p in done), [p.stderr[-2000:] for p in done]
  assert all(p.stdout == "" for p in done[1:])  # Only process 0 reports.
  return json.loads(done[0].stdout)


@pytest.mark.multiprocess
def test_two_processes_gather_the_same_detections_as_one_device(processes, ssd_data_dir,
                                                                 tmp_path):
  single = _eval(processes, ssd_data_dir, 1, 1, tmp_path)
  both = _eval(processes, ssd_data_dir, 2, 4, tmp_path)
  assert (single["devices"], both["devices"], both["processes"]) == (1, 8, 2)
  for r in (single, both):
    assert r["count"] == r["unique"] == 500 and r["ids"] == [1, 2, 3, 498, 499, 500]
  assert both["detections"] == single["detections"] > 1000
  assert both["classes"] == single["classes"]
  assert both["mAP"] == pytest.approx(single["mAP"], abs=1e-9)
