"""`mlbench data prepare --out gs://...`, killed and run again, then `data verify gs://...`."""

from __future__ import annotations

import re
import signal
import time

import numpy as np
import pytest

from mlbench.storage import paths
from mlbench.cli import main

WNIDS = ("n01440764", "n01443537", "n01484850")


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
  """A tiny ILSVRC2012 tree: 4 training JPEGs per class, 6 validation JPEGs and labels."""
  import tensorflow as tf

  root = tmp_path_factory.mktemp("ilsvrc")
  rng = np.random.default_rng(0)

  def jpeg() -> bytes:
    return tf.io.encode_jpeg(rng.integers(0, 255, (24, 30, 3), dtype=np.uint8)).numpy()

  for wnid in WNIDS:
    (root / "train" / wnid).mkdir(parents=True)
    for i in range(4):
      (root / "train" / wnid / f"{wnid}_{i}.JPEG").write_bytes(jpeg())
  (root / "val").mkdir()
  rows = ["ImageId,PredictionString"]
  for i in range(6):
    name = f"ILSVRC2012_val_{i + 1:08d}"
    (root / "val" / f"{name}.JPEG").write_bytes(jpeg())
    rows.append(f"{name},{WNIDS[i % 3]} 1 2 3 4")
  (root / "LOC_val_solution.csv").write_text("\n".join(rows) + "\n")
  return root


def test_prepare_into_a_bucket_killed_and_run_again_then_verify(raw, bucket, capsys, processes):
  out = f"{bucket}/imagenet"
  args = ["data", "prepare", "imagenet", "--raw", str(raw), "--out", out, "--train-shards",
          "12", "--val-shards", "3", "--workers", "1"]
  [proc] = processes.mlbench(*args)
  receipts = paths.path(out) / ".mlbench"
  deadline = time.time() + 300
  while not (receipts.is_dir() and any(p.suffix == ".json" and p.stem != "lock"
                                       for p in receipts.iterdir())):
    assert time.time() < deadline and proc.poll() is None, proc.stderr[-2000:]
    time.sleep(0.02)
  proc.send_signal(signal.SIGKILL)  # Mid-job: no chance to tidy up, the lock object stays.
  proc.wait()
  assert (receipts / "lock.json").is_file() and not (paths.path(out) / "mlbench-data.json").exists()

  assert main(args) == 0
  summary = capsys.readouterr().err
  written, skipped = map(int, re.search(r"wrote (\d+) shard\(s\), skipped (\d+) finished",
                                        summary).groups())
  assert skipped >= 1 and written + skipped == 15, summary
  names = sorted(p.name for p in paths.path(out).iterdir())
  assert names == [".mlbench", "mlbench-data.json", *[f"train-{i:05d}-of-00012" for i in range(12)],
                   *[f"validation-{i:05d}-of-00003" for i in range(3)]]
  assert not (receipts / "lock.json").exists()

  assert main(["data", "verify", "imagenet", out]) == 0
  table = capsys.readouterr().out
  assert "WRONG" not in table and "train schema" in table and "as expected" in table
  # What the resnet50 workload lists for tf.data (which reads gs:// itself), and a set
  # that is not there: named as the user gave it, not as gs:/... .
  from mlbench.workload import Split
  from workloads.common import imagenet
  from workloads.resnet50 import config

  listed = imagenet.files(config.full(), paths.path(out), Split.TRAIN)
  assert listed == [f"{out}/train-{i:05d}-of-00012" for i in range(12)]
  assert main(["run", "resnet50", "--config", "full", "--data-dir", f"{bucket}/absent",
               "--results-dir", f"{bucket}/results"]) == 2
  assert f"no train-*-of-* TFRecord files in {bucket}/absent;" in capsys.readouterr().err
