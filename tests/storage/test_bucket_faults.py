"""A bucket that refuses writes (HTTP 403) or answers 503 under load, injected on the wire
(faulty_gcs.py): transient errors are retried by the clients' own policies and said once;
what still fails is one line, and nothing is left half-written."""

from __future__ import annotations

import json

import jax.numpy as jnp
import pytest

from mlbench.storage import faults, paths, pending, results
from mlbench.errors import StorageFailed
from mlbench.train import steps
from mlbench.train.lifecycle import checkpoint
from mlbench.train.clock import Clock
from mlbench.train.result import RunResult


def test_a_result_upload_answered_503_is_retried_and_403_is_one_line(bucket, gcs_faults,
                                                                    tmp_path, capfd):
  faults._said.clear()  # The note is said once per process: this test's to say.
  folder = results.benchmark_dir(f"{bucket}/results", "sys", "resnet")
  run = pending.PendingRun(folder, results.new_run_id()).start()
  run.log_path.write_text(":::MLLOG the whole log\n")
  retried = gcs_faults.fail(r"result_0\.txt", 503, times=2)
  assert run.publish() == folder / "result_0.txt" and retried.hits == 2
  assert (folder / "result_0.txt").read_text() == ":::MLLOG the whole log\n"
  assert capfd.readouterr().err == (
      f"note: {folder}/result_0.txt answered HTTP 503; retrying with backoff "
      "(google-cloud-storage's DEFAULT_RETRY); further retries are not reported\n")

  gcs_faults.fail(r"result_1\.txt", 403)
  run = pending.PendingRun(folder, results.new_run_id()).start()
  run.log_path.write_text(":::MLLOG another log\n")
  with pytest.raises(StorageFailed) as e:
    with faults.needed(folder):
      run.publish()
  assert e.value.cause == f"permission denied (HTTP 403) at {folder}"
  assert e.value.fix == "give this account write access to it"
  assert capfd.readouterr().err == ""  # No retries of a permanent error, no traceback.
  assert sorted(p.name for p in folder.iterdir() if p.name.startswith("result_")) == [
      "result_0.txt"]
  assert run.log_path.read_text() == ":::MLLOG another log\n"  # kept, for the run to shelve
  run.shelve(results.run_folder(f"{bucket}/results", "sys", "resnet", "abcd1234"))


def test_a_checkpoint_save_refused_by_the_bucket_is_a_warning_and_leaves_nothing(
    bucket, gcs_faults, tmp_path, capfd):
  """orbax writes a step's objects straight into the bucket (no temporary name there);
  a save refused halfway leaves objects without commit_success.txt, which are removed."""
  ck_dir, said = paths.path(f"{bucket}/ck"), []
  state = steps.TrainState(step=jnp.zeros((), jnp.int32), params={"w": jnp.arange(4096.0)},
                           model_state={}, opt_state={}, rng=__import__("jax").random.key(0))
  log = tmp_path / "log.txt"
  log.write_text(":::MLLOG line\n")
  clock = Clock()
  clock.mark("init_start")
  ck = checkpoint.Checkpoints(ck_dir, 5, clock, RunResult(seed=0), log, say=said.append)
  sums = {"loss": jnp.float32(1)}
  ck.after_step(5, state, sums)
  ck.settle()
  refused = gcs_faults.fail(r"ck(/|%2F)10(/|%2F|\.)", 403)
  ck.after_step(10, state, sums)
  ck.settle()
  assert refused.hits >= 1
  assert said == [f"warning: the checkpoint of step 10 was not saved (permission denied (HTTP "
                  f"403) at {ck_dir}); training goes on, the checkpoint of step 5 stays the "
                  "one to resume from; 2 more failed save(s) in a row stop the run"]
  gcs_faults.clear()
  ck.after_step(15, state, sums)
  ck.close()
  assert sorted(p.name for p in ck_dir.iterdir()) == ["15", "5"]
  err = capfd.readouterr().err
  assert "Traceback" not in err and "Event loop is closed" not in err and "ERROR" not in err, err


def _resume_line(err: str) -> str:
  lines = err.strip().splitlines()
  assert "Traceback" not in err and "Event loop is closed" not in err, err[-3000:]
  return lines[-1]


@pytest.mark.slow
def test_refused_saves_then_a_refused_result_stop_resumably_and_a_flaky_bucket_files_it(
    bucket, gcs_faults, data_dir, tmp_path, processes, mlbench):
  """One run to the target, results in a bucket, checkpoints on a disk: its saves of steps
  10 and 15 are refused (EACCES), two warnings, and training goes on; its result, reached,
  is refused by the bucket (HTTP 403): the run stops in one line naming the --resume, its
  log kept in the bucket. That --resume, the bucket answering its upload with 503 once,
  retries (said once) and files the kept log as the one result, training nothing again."""
  import deny_writes  # tests/storage/deny_writes.py

  ckpt = tmp_path / "ckpt"
  gcs_faults.fail(r"/result_\d+\.txt", 403)
  env = {deny_writes.ENV: r"EACCES:/ckpt/[0-9a-f]{8}/(10|15)\.orbax-checkpoint-tmp"}
  [proc] = processes.start([*deny_writes.COMMAND, "run", "resnet50", "--set", "train_epochs=8",
                            "--system", "cpu-test", "--seed", "3", "--checkpoint-every", "5",
                            "--cpu-devices", "8", "--data-dir", data_dir, "--checkpoint-dir",
                            ckpt, "--results-dir", f"{bucket}/results"], cwd=tmp_path, env=env)
  out = proc.wait(900)
  [run] = list(ckpt.iterdir())
  bench = results.benchmark_dir(f"{bucket}/results", "cpu-test", "resnet")
  kept = results.run_folder(f"{bucket}/results", "cpu-test", "resnet", run.name) / "partial.log"
  assert out.returncode == StorageFailed.EXIT_CODE, out.stderr[-3000:]
  assert _resume_line(out.stderr) == (
      f"error: permission denied (HTTP 403) at {bench}: the partial log is kept at {kept}, the "
      f"checkpoint of step 150 in {run}; give this account write access to it and resume "
      f"with: mlbench run resnet50 --resume {run}")
  warned = [line for line in out.stderr.splitlines() if line.startswith("warning:")]
  assert warned == [f"warning: the checkpoint of step {s} was not saved (permission denied at "
                    f"{run}); training goes on, the checkpoint of step 5 stays the one to resume "
                    f"from; {n} more failed save(s) in a row stop the run" for s, n in
                    ((10, 2), (15, 1))]
  log = kept.read_text()
  assert '"status": "success"' in log  # the whole log, as evidence
  assert not bench.exists()  # no result, nothing pending left
  assert not [p.name for p in run.iterdir() if not (p.name.isdigit() or p.name == "run.json")]

  gcs_faults.clear()
  faults_hit = gcs_faults.fail(r"/result_\d+\.txt", 503, times=1)
  out = mlbench("run", "resnet50", "--resume", str(run), "--cpu-devices", "8", "--data-dir",
                str(data_dir), cwd=tmp_path)
  assert out.returncode == 0 and faults_hit.hits == 1, out.stderr[-3000:]
  assert out.stderr.count("retrying with backoff") == 1 and (
      f"note: {bench}/result_0.txt answered HTTP 503; retrying with backoff (google-cloud-"
      "storage's DEFAULT_RETRY); further retries are not reported") in out.stderr
  report = json.loads(out.stdout.splitlines()[-1])  # the official checker's verdict in it
  assert report["status"] == "success" and report["compliant"] is True and report["seed"] == 3
  assert report["log"] == f"{bench}/result_0.txt"
  assert [p.name for p in bench.iterdir()] == ["result_0.txt"]
  # Filed from the kept log, not trained again: the result is that log, byte for byte (no
  # mlbench_resumed, no second run_start), nothing was compiled, and the log left the run
  # folder, whose checkpoint folder now says the run is finished.
  assert (bench / "result_0.txt").read_text() == log and not kept.exists()
  assert report["compile_cache"]["hits"] + report["compile_cache"]["writes"] == 0
  assert f"its complete log, kept at {kept} when the result could not be filed, is filed " \
         f"now as {bench}/result_0.txt (nothing trained again)" in out.stderr
  assert json.loads((run / "finished.json").read_text()) == {"log": f"{bench}/result_0.txt"}
