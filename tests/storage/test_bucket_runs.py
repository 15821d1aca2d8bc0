"""Runs with their results, checkpoints and compile cache in a bucket (the data stays
local: tf.data's own GCS client cannot be pointed at the emulator).

One run is SIGTERMed and resumed from the bucket to the target; two hosts, started as
SLURM starts `srun` tasks, checkpoint into the bucket and resume from it.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from mlbench.storage import paths, pending, results
from mlbench.config import STALE_AFTER_S

pytestmark = pytest.mark.slow
def _checkpoint_of(step: int, ckpt: paths.Path, procs) -> paths.Path:
  """The run folder under `ckpt` once its checkpoint of `step` is committed."""
  deadline = time.time() + 600
  while True:
    assert time.time() < deadline and all(p.poll() is None for p in procs), [
        p.stderr[-3000:] for p in procs if p.poll() is not None]
    try:
      found = [d for d in ckpt.iterdir() if (d / str(step) / "commit_success.txt").exists()]
    except FileNotFoundError:  # Nothing there yet (or only the writability probe, just gone).
      found = []
    if found:
      return found[0]
    time.sleep(0.5)


def _sigterm(procs) -> list[str]:
  for p in procs:
    p.send_signal(signal.SIGTERM)
  errs = [p.wait(120).stderr for p in procs]
  assert [p.returncode for p in procs] == [128 + signal.SIGTERM] * len(procs), [
      e[-3000:] for e in errs]
  return errs


def _one_epoch() -> int:
  """The samples a run of `--set train_epochs=1` trains on: whole steps of the batch."""
  import dataclasses

  from workloads.resnet50 import WORKLOAD, config

  return WORKLOAD.schedule(dataclasses.replace(config.mini(), train_epochs=1.0)).max_train_samples


def _plant(folder, host: str, beat_age_s: float) -> str:
  """A pending log and record of a run on another host, as it leaves them in the bucket."""
  rid, now = results.new_run_id(), time.time()
  record = pending.Record(rid, host, "b00t", 4026531836, 4242, None, now - 7200,
                          now - beat_age_s)
  stem = f"pending_4242_{rid}"
  (folder / f"{stem}.json").write_text(record.to_json())
  (folder / f"{stem}.log").write_text(f":::MLLOG {stem}\n")
  return stem


def test_a_run_into_a_bucket_is_stopped_resumed_from_it_and_validated(bucket, data_dir, tmp_path,
                                                                      capsys, processes, mlbench):
  from mlbench.cli import main

  ckpt, cache = paths.path(f"{bucket}/ckpt"), f"{bucket}/cache"
  [proc] = processes.mlbench(
      "run", "resnet50", "--cpu-devices", "8", "--data-dir", data_dir, "--seed", "1",
      "--system", "cpu-test", "--checkpoint-every", "5", "--checkpoint-dir", ckpt,
      "--results-dir", f"{bucket}/results", "--compile-cache", cache, cwd=tmp_path)
  bench = results.benchmark_dir(f"{bucket}/results", "cpu-test", "resnet")
  run = _checkpoint_of(10, ckpt, [proc])
  [mine] = pending.scan(bench, stale_after=STALE_AFTER_S)  # The run's record, beating there.
  assert not mine.abandoned and mine.record.pid == proc.pid, mine
  [err] = _sigterm([proc])
  assert err.strip().splitlines()[-1].endswith(f"resume with: mlbench run resnet50 --resume "
                                               f"{run}"), err[-2000:]
  partial = results.run_folder(f"{bucket}/results", "cpu-test", "resnet", run.name)
  assert '"status": "aborted"' in (partial / "partial.log").read_text()
  assert not bench.is_dir()  # No result, and nothing pending left in the bucket.

  fresh, stale = _plant(bench, "tpu-host-7", 30), _plant(bench, "tpu-host-3", 5400)
  out = mlbench("run", "resnet50", "--resume", str(run), "--cpu-devices", "8", "--data-dir",
                str(data_dir), "--compile-cache", cache, "--stale-after", "3600", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  report = json.loads(out.stdout.splitlines()[-1])
  assert report["status"] == "success" and report["compliant"] is True
  assert report["log"] == f"{bench}/result_0.txt" and report["seed"] == 1
  # The programs compiled by the first run, loaded from the bucket.
  assert report["compile_cache"]["dir"] == cache and report["compile_cache"]["hits"] >= 2
  assert f"note: {fresh}.log belongs to a run in progress (host tpu-host-7" in out.stderr
  assert f"note: {stale}.log was left by a run that no longer runs (host tpu-host-3" in out.stderr
  assert {p.name for p in bench.iterdir()} == {"result_0.txt", f"{fresh}.log", f"{fresh}.json"}

  capsys.readouterr()
  assert main(["validate", report["log"]]) == 0, capsys.readouterr().err[-3000:]
  assert main(["validate", f"{bucket}/results"]) == 1  # One run of the five a result needs.
  err = capsys.readouterr().err
  assert "runs: 1 result_*.txt files" in err and "system cpu-test.json: " in err
  assert "note: ignoring 1 log(s) of runs still in progress" in err


def _srun(processes, cwd, *args: str) -> list:
  """Two tasks of one step on one node, as `srun --ntasks=2` starts them: the same command
  and environment but their task ids. jax.distributed takes its port from the job id
  (61440 + id % 4096); JAX_COORDINATOR_BIND_ADDRESS keeps the coordinator on 127.0.0.1
  (on a cluster it binds every interface)."""
  port = processes.free_port(61440, 65536)
  env = {"SLURM_JOB_ID": str(port - 61440), "SLURM_STEP_NODELIST": "127.0.0.1",
         "SLURM_NTASKS": "2", "JAX_COORDINATOR_BIND_ADDRESS": f"127.0.0.1:{port}"}
  return processes.mlbench("run", "resnet50", "--cpu-devices", "4", *args, n=2, cwd=cwd,
                           env=env, distributed=False,
                           env_for=lambda i: {"SLURM_PROCID": str(i), "SLURM_LOCALID": str(i)})


@pytest.mark.multiprocess
def test_two_hosts_save_their_shards_into_a_bucket_and_resume_from_it(bucket, data_dir, tmp_path,
                                                                      processes):
  """Both processes find each other from SLURM's task environment alone, write their
  shards into the bucket folder (with weight-update sharding each holds optimizer state
  of its own) and resume from it; one result, in the bucket."""
  ckpt = paths.path(f"{bucket}/ckpt")
  where = ["--data-dir", str(data_dir), "--results-dir", f"{bucket}/results",
           "--weight-update-sharding"]
  procs = _srun(processes, tmp_path, *where, "--set", "train_epochs=1", "--seed", "5", "--system",
                "cpu-2proc", "--checkpoint-every", "5", "--checkpoint-dir", str(ckpt))
  run = _checkpoint_of(10, ckpt, procs)
  errs = _sigterm(procs)
  assert errs[0].strip().splitlines()[-1].endswith(f"--resume {run}"), errs[0][-2000:]
  step = max(int(p.name) for p in run.iterdir() if p.name.isdigit())
  assert {p.name for p in (run / str(step) / "state").iterdir()} >= {
      "ocdbt.process_0", "ocdbt.process_1"}
  outs = [p.wait(900) for p in _srun(processes, tmp_path, "--resume", str(run), *where)]
  assert [o.returncode for o in outs] == [1, 1], [o.stderr[-3000:] for o in outs]
  report = json.loads(outs[0].stdout.splitlines()[-1])  # One epoch is below the target.
  assert report["samples"] == _one_epoch() and report["seed"] == 5 and outs[1].stdout == ""
  bench = results.benchmark_dir(f"{bucket}/results", "cpu-2proc", "resnet")
  assert [p.name for p in bench.iterdir()] == ["result_0.txt"]
