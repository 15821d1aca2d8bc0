"""One process of a distributed evaluation (run by test_multihost.py, not collected).

Evaluates ResNet-50 mini's initial state (seed 3) on the digits evaluation set
over every device of every process, and prints the merged count and metrics
from process 0 as JSON, with a fingerprint of every image the harness handed the
workload's host part, gathered across batches and processes by the harness. The
fingerprint helpers serve tests/unit/test_scaling.py's one-process evaluations too.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def fingerprints(images):
  """One uint64 per image, from its bytes: which examples were evaluated."""
  import hashlib

  import numpy as np

  return np.array([int.from_bytes(hashlib.blake2b(x.tobytes(), digest_size=8).digest(), "little")
                   for x in images], np.uint64)


def recording(workload):
  """The workload, its eval host part also returning the fingerprints of the real
  rows the harness hands it, as rows that the harness gathers."""
  import dataclasses

  import numpy as np

  real_host = workload.eval.host

  def host(cfg, outputs, batch):
    part = real_host(cfg, outputs, batch)
    part.rows["fingerprint"] = fingerprints(np.asarray(batch["image"]))
    return part

  return dataclasses.replace(workload, eval=dataclasses.replace(workload.eval, host=host))


def eval_set_fingerprints(data_dir):
  """The sorted fingerprints of the evaluation set, read straight from its files, without
  the harness's pipeline."""
  import numpy as np

  from mlbench.train import data
  from mlbench.workload import Split
  from workloads.common import imagenet
  from workloads.resnet50 import config, input_pipeline

  cfg = config.mini()
  t = data.tf()
  decode = input_pipeline.decode(cfg, Split.EVAL)
  ds = t.data.TFRecordDataset(sorted(imagenet.files(cfg, data_dir, Split.EVAL)))
  images = [ex["image"] for ex in ds.map(lambda r: decode(r, t.zeros([2], t.int64)))
            .as_numpy_iterator()]
  return np.sort(fingerprints(np.stack(images)))


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--data-dir", type=Path, required=True)
  p.add_argument("--devices", type=int, default=1)
  p.add_argument("--coordinator")
  p.add_argument("--num-processes", type=int)
  p.add_argument("--process-id", type=int)
  args = p.parse_args()

  from mlbench.train import runtime

  rt = runtime.setup(cpu_devices=args.devices, distributed=runtime.Distributed(
      args.coordinator, args.num_processes, args.process_id))

  from mlbench.train import data, evaluate, mesh as mesh_lib, steps
  from mlbench.workload import Split, StepContext
  from workloads.common import imagenet
  from workloads.resnet50 import WORKLOAD, config, input_pipeline

  cfg = config.mini()
  sched = WORKLOAD.schedule(cfg)
  mesh = mesh_lib.make_mesh(devices=rt.devices)
  programs = steps.compile_programs(WORKLOAD, cfg, sched, mesh, StepContext(mesh=mesh),
                                    WORKLOAD.optimizer(cfg, sched))
  state = programs.init_state(3)
  ds = data.eval_dataset(imagenet.files(cfg, args.data_dir, Split.EVAL),
                         input_pipeline.decode(cfg, Split.EVAL), num_examples=sched.eval_examples,
                         per_host_batch=sched.eval_batch_size // rt.process_count,
                         host=rt.process_index, hosts=rt.process_count)
  put = lambda b: mesh_lib.to_global(b, programs.batch_sharding, sched.eval_batch_size)
  metrics, part = evaluate.evaluate(recording(WORKLOAD), cfg, programs.eval, state,
                                    data.prefetch(data.numpy_batches(ds), put),
                                    sched.eval_examples)
  if rt.is_leader:
    print(json.dumps({"count": part.count, "devices": len(rt.devices),
                      "processes": rt.process_count, **metrics,
                      "fingerprints": sorted(int(f) for f in part.rows["fingerprint"])}))


if __name__ == "__main__":
  main()
