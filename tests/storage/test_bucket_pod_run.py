"""A pod's run with everything but the data in a bucket: two hosts started as SLURM starts
`srun` tasks, results, checkpoints and the compile cache in the bucket, SIGTERM, resumed
from the bucket, to the target; the result validates from the bucket."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import pytest

from mlbench import paths, pending, results

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def _srun(cwd, *args: str) -> list[subprocess.Popen]:
  """Two tasks of one step on one node, as `srun --ntasks=2` starts them: the same command
  and environment but their task ids. jax.distributed takes its port from the job id
  (61440 + id % 4096); JAX_COORDINATOR_BIND_ADDRESS keeps the coordinator on 127.0.0.1
  (on a cluster it binds every interface)."""
  rng = random.Random()
  for _ in range(200):
    port = rng.randrange(61440, 65536)
    with socket.socket() as s:
      try:
        s.bind(("127.0.0.1", port))
        break
      except OSError:
        continue
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update({"SLURM_JOB_ID": str(port - 61440), "SLURM_STEP_NODELIST": "127.0.0.1",
              "SLURM_NTASKS": "2", "JAX_COORDINATOR_BIND_ADDRESS": f"127.0.0.1:{port}"})
  return [subprocess.Popen(
      [sys.executable, "-c", "import sys; from mlbench.cli import main; sys.exit(main())",
       "run", "resnet50", "--cpu-devices", "4", "--weight-update-sharding", *args],
      cwd=cwd, env={**env, "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i)}, text=True,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(2)]


def _first_checkpoint_of_10(ckpt, procs) -> paths.Path:
  deadline = time.time() + 600
  while True:
    assert time.time() < deadline and all(p.poll() is None for p in procs), [
        p.communicate()[1][-3000:] for p in procs if p.poll() is not None]
    found = [d for d in ckpt.iterdir() if (d / "10" / "commit_success.txt").exists()] if (
        ckpt.is_dir()) else []
    if found:
      return found[0]
    time.sleep(0.5)


def _plant(folder, host: str, beat_age_s: float) -> str:
  """A pending log and record of a run on another host, as it leaves them in the bucket."""
  rid, now = results.new_run_id(), time.time()
  record = pending.Record(rid, host, "b00t", 4026531836, 4242, None, now - 7200,
                          now - beat_age_s)
  stem = f"pending_4242_{rid}"
  (folder / f"{stem}.json").write_text(record.to_json())
  (folder / f"{stem}.log").write_text(f":::MLLOG {stem}\n")
  return stem


def test_two_hosts_into_a_bucket_sigterm_resume_validate(bucket, data_dir, tmp_path, capsys):
  from mlbench.cli import main

  ckpt, cache = paths.path(f"{bucket}/ckpt"), f"{bucket}/cache"
  where = ["--results-dir", f"{bucket}/results", "--compile-cache", cache]
  procs = _srun(tmp_path, "--data-dir", str(data_dir), "--seed", "21", "--system", "cpu-2proc",
                "--checkpoint-every", "5", "--checkpoint-dir", str(ckpt), *where)
  bench = results.benchmark_dir(f"{bucket}/results", "cpu-2proc", "resnet")
  run_ckpt = _first_checkpoint_of_10(ckpt, procs)
  [mine] = pending.scan(bench)  # Process 0's record, beating in the bucket.
  assert not mine.abandoned and mine.record.pid == procs[0].pid, mine
  for p in procs:
    p.send_signal(signal.SIGTERM)
  errs = [p.communicate(timeout=120)[1] for p in procs]
  assert [p.returncode for p in procs] == [128 + signal.SIGTERM] * 2, [e[-3000:] for e in errs]
  assert errs[0].strip().splitlines()[-1].endswith(f"--resume {run_ckpt}"), errs[0][-2000:]
  step = max(int(p.name) for p in run_ckpt.iterdir() if p.name.isdigit())
  assert {p.name for p in (run_ckpt / str(step) / "state").iterdir()} >= {
      "ocdbt.process_0", "ocdbt.process_1"}  # Each host wrote its own shards there.
  partial = results.run_folder(f"{bucket}/results", "cpu-2proc", "resnet", run_ckpt.name)
  assert '"status": "aborted"' in (partial / "partial.log").read_text()
  assert not bench.is_dir() or not list(bench.iterdir())  # No result, nothing pending.

  bench.mkdir(parents=True, exist_ok=True)
  fresh, stale = _plant(bench, "tpu-host-7", 30), _plant(bench, "tpu-host-3", 5400)
  procs = _srun(tmp_path, "--resume", str(run_ckpt), "--data-dir", str(data_dir),
                "--compile-cache", cache, "--stale-after", "3600")
  outs = [p.communicate(timeout=900) for p in procs]
  assert [p.returncode for p in procs] == [0, 0], [e[-3000:] for _, e in outs]
  report = json.loads(outs[0][0].splitlines()[-1])
  assert report["status"] == "success" and report["compliant"] is True and outs[1][0] == ""
  assert report["log"] == f"{bench}/result_0.txt" and report["seed"] == 21
  assert report["compile_cache"]["dir"] == cache and report["compile_cache"]["hits"] >= 2
  assert f"note: {fresh}.log belongs to a run in progress (host tpu-host-7" in outs[0][1]
  assert f"note: {stale}.log was left by a run that no longer runs (host tpu-host-3" in outs[0][1]
  assert {p.name for p in bench.iterdir()} == {"result_0.txt", f"{fresh}.log", f"{fresh}.json"}

  capsys.readouterr()
  assert main(["validate", report["log"]]) == 0, capsys.readouterr().err[-3000:]
  assert main(["validate", f"{bucket}/results"]) == 1  # One run of the five a result needs.
  err = capsys.readouterr().err
  assert "runs: 1 result_*.txt files" in err and "system cpu-2proc.json: " in err
  assert "note: ignoring 1 log(s) of runs still in progress" in err
