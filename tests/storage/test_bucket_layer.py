"""The path layer against a real GCS server: one-line errors, create-if-absent, pending records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from mlbench.storage import pending, results, writes
from mlbench.cli import main


def _line(capsys) -> str:
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "Traceback" not in err, err
  return err


def test_a_missing_bucket_object_or_slash_is_one_line(bucket, capsys):
  assert main(["validate", f"{bucket}-gone/results"]) == 2
  assert _line(capsys) == (f"error: validate {bucket}-gone/results: no such bucket "
                           f"({bucket}-gone)\n")
  assert main(["validate", f"{bucket}/results"]) == 2
  assert _line(capsys) == (f"error: validate {bucket}/results: no such folder or object in "
                           "the bucket\n")
  assert main(["check", "resnet50", "--from-log", f"{bucket}/result_0.txt"]) == 2
  assert _line(capsys).startswith(f"error: --from-log {bucket}/result_0.txt: no such folder")
  assert main(["data", "verify", "imagenet", "gs:/b/imagenet"]) == 2
  assert _line(capsys) == ("error: data verify gs:/b/imagenet: a bucket path needs two "
                           "slashes: gs://b/imagenet\n")
  assert main(["run", "resnet50", "--resume", f"{bucket}/runs/x"]) == 2
  assert "no such folder or object in the bucket" in _line(capsys)
  assert main(["run", "resnet50", "--results-dir", f"{bucket}-gone/r", "--system", "t"]) == 2
  assert _line(capsys) == (f"error: cannot write to --results-dir {bucket}-gone/r: no such "
                           f"bucket ({bucket}-gone)\n")


def test_write_new_creates_once_and_never_replaces(bucket):
  target = f"{bucket}/results/systems/a.json"
  assert writes.write_new(target, "first") is True
  assert writes.write_new(target, "second") is False
  assert writes.write_new(target, "first") is True  # A retried upload of ours: ours.
  assert results.paths.path(target).read_text() == "first"


def test_concurrent_runs_into_one_bucket_get_distinct_complete_results(bucket):
  folder = results.benchmark_dir(f"{bucket}/results", "sys", "resnet")
  (folder / "result_1.txt").write_text("an earlier run")
  logs = [f"run {i} " * 5000 for i in range(6)]  # 30-40 kB each, as a short run's log.
  runs = [pending.PendingRun(folder, results.new_run_id()).start() for _ in logs]
  for run, text in zip(runs, logs):
    run.log_path.write_text(text)
  out: list = []
  threads = [threading.Thread(target=lambda r=r: out.append(r.publish())) for r in runs]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  names = sorted(p.name for p in out)
  assert names == sorted(f"result_{i}.txt" for i in (0, 2, 3, 4, 5, 6))
  assert sorted(p.read_text() for p in out) == sorted(logs)
  assert (folder / "result_1.txt").read_text() == "an earlier run"
  assert sorted(p.name for p in folder.iterdir()) == sorted([*names, "result_1.txt"])


def _dead_pid() -> int:
  proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  return int(proc.stdout)


def _planted(folder, host: str, pid: int, beat_age_s: float, *, mine: bool = False) -> str:
  """A pending log and record as a run of `host` leaves them; returns its stem."""
  rid = results.new_run_id()
  me = pending.Host.this()
  now = time.time()
  record = pending.Record(rid, me.name if mine else host, me.boot_id if mine else "b00t",
                          me.pid_ns if mine else 4026531836, pid, None, now - 3600,
                          now - beat_age_s)
  stem = f"pending_{pid}_{rid}"
  (folder / f"{stem}.json").write_text(record.to_json())
  (folder / f"{stem}.log").write_text(f":::MLLOG log of {stem}\n")
  return stem


def test_pending_logs_of_a_shared_bucket_are_judged_by_whose_they_are(bucket):
  root = f"{bucket}/results"
  folder = results.benchmark_dir(root, "sys", "resnet")
  fresh = _planted(folder, "tpu-host-7", 4242, beat_age_s=20)
  stale = _planted(folder, "tpu-host-3", 4343, beat_age_s=3 * 3600)
  dead = _planted(folder, "", _dead_pid(), beat_age_s=1, mine=True)
  live = _planted(folder, "", os.getppid(), beat_age_s=7200, mine=True)
  said: list[str] = []
  pending.tidy(folder, lambda rid: results.run_folder(root, "sys", "resnet", rid),
               stale_after=1800, say=said.append)
  left = {p.name for p in folder.iterdir()}
  for stem in (fresh, live):  # Another host's run that beats, and a live process here.
    assert {f"{stem}.log", f"{stem}.json"} <= left
  for stem in (stale, dead):
    assert not {f"{stem}.log", f"{stem}.json"} & left
    kept = results.run_folder(root, "sys", "resnet", stem.rsplit("_", 1)[1]) / "partial.log"
    assert kept.read_text() == f":::MLLOG log of {stem}\n"
  notes = {line.split()[1].removesuffix(".log"): line for line in said}
  assert "belongs to a run in progress (host tpu-host-7, process 4242: heartbeat 20 s ago)" in (
      notes[fresh])
  assert "was left by a run that no longer runs (host tpu-host-3, process 4343: its last " \
         "heartbeat was 180 min ago (limit 30 min))" in notes[stale]
  assert "on this host is gone" in notes[dead] and "is not a result" in notes[dead]
  assert f"process {os.getppid()} of this host still runs" in notes[live]


def test_the_heartbeat_uploads_the_log_and_refreshes_the_record(bucket):
  folder = results.benchmark_dir(f"{bucket}/results", "sys", "resnet")
  run = pending.PendingRun(folder, results.new_run_id(), heartbeat_s=0.2).start()
  record = folder / f"{run.pending_log.stem}.json"
  first = pending.read_record(record)
  assert first.host == pending.Host.this().name and first.pid == os.getpid()
  run.log_path.write_text(":::MLLOG first line\n")
  deadline = time.time() + 30
  while not (run.pending_log.exists() and run.pending_log.read_text().endswith("first line\n")
             and pending.read_record(record).heartbeat > first.heartbeat):
    assert time.time() < deadline
    time.sleep(0.1)
  kept = run.shelve(results.run_folder(f"{bucket}/results", "sys", "resnet", first.run_id))
  assert kept.read_text() == ":::MLLOG first line\n" and kept.name == "partial.log"
  assert not folder.is_dir() and not run.log_path.exists()  # Nothing left there.


def test_a_run_folder_in_a_bucket_is_held_by_one_live_run(bucket):
  """The lease of mlbench.train.lifecycle.lease, in a bucket: refused while another host's run
  beats, taken over once its heartbeat is older than --stale-after, exactly once."""
  from mlbench.errors import UserError
  from mlbench.train.lifecycle.lease import Lease

  folder = results.run_folder(f"{bucket}/results", "sys", "resnet", "abcd1234") / "checkpoints"
  now = time.time()
  other = pending.Record("abcd1234", "tpu-host-7", "b00t", 1, 4242, None, now, now - 60)
  assert writes.write_new(folder / "lease-0.json", other.to_json())
  with pytest.raises(UserError, match=r"in progress elsewhere \(host tpu-host-7, process 4242: "
                                      r"heartbeat 60 s ago\)"):
    Lease.take(folder, "abcd1234", stale_after=600, what="--resume")
  lease = Lease.take(folder, "abcd1234", stale_after=30, what="--resume", heartbeat_s=0.1)
  assert [p.name for p in folder.iterdir()] == ["lease-1.json"] and lease.ours()
  # Another process of this host, while this one holds it and beats.
  out = subprocess.run([sys.executable, "-c", "import sys; from mlbench.train.lifecycle.lease "
                        "import Lease; Lease.take(sys.argv[1], 'abcd1234', stale_after=30, "
                        "what='--resume')", str(folder)], capture_output=True, text=True,
                       env={**os.environ}, timeout=120)
  assert out.returncode == 1 and (f"UserError: --resume: that run is in progress elsewhere "
                                  f"(process {os.getpid()} of this host still runs)") in out.stderr
  lease.release()
  assert not folder.exists() or not list(folder.iterdir())


@pytest.fixture
def restore_jax_cache():
  import jax
  from jax.experimental.compilation_cache import compilation_cache as cc

  before = jax.config.jax_compilation_cache_dir
  yield
  jax.config.update("jax_compilation_cache_dir", before)
  cc.reset_cache()


def test_a_cache_that_cannot_be_written_is_a_warning(bucket, capsys, restore_jax_cache):
  from mlbench.train import compile_cache

  compile_cache.configure(f"{bucket}-gone/cache")
  assert compile_cache.stats().folder is None
  assert capsys.readouterr().err == (f"warning: cannot write to --compile-cache "
                                     f"{bucket}-gone/cache: no such bucket ({bucket}-gone); "
                                     "compiling without a cache\n")
  assert "no such bucket" in compile_cache.stats().summary()
  compile_cache.configure("/dev/null/jax")
  assert compile_cache.stats().folder is None and "Not a directory" in capsys.readouterr().err
  compile_cache.configure(f"{bucket}/cache")
  assert str(compile_cache.stats().folder) == f"{bucket}/cache"


def test_where_there_are_no_hard_links_the_name_is_claimed_then_filled_in_one_rename(tmp_path):
  """A link across filesystems fails (EXDEV) as one on gcsfuse does: the fallback claims
  the name with O_EXCL and renames the complete copy over the empty claim."""
  other = "/dev/shm"
  if not os.path.isdir(other) or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
    pytest.skip("needs a second filesystem (/dev/shm)")
  src = os.path.join(other, f"mlbench-test-{os.getpid()}.log")
  with open(src, "w") as f:
    f.write(":::MLLOG a whole log\n")
  try:
    assert writes.write_new(tmp_path / "result_0.txt", src=src) is True
    assert writes.write_new(tmp_path / "result_0.txt", src=src) is False
  finally:
    os.unlink(src)
  assert (tmp_path / "result_0.txt").read_text() == ":::MLLOG a whole log\n"
  assert [p.name for p in tmp_path.iterdir()] == ["result_0.txt"]  # No temporary left.


def test_compare_scores_a_bucket_and_names_it_as_given(bucket, write_log, tmp_path, capsys):
  folder = results.benchmark_dir(f"{bucket}/package", "cpu-test", "resnet")
  for i, accuracies in enumerate(([0.5, 0.985], [0.6, 0.99])):
    writes.put(write_log(tmp_path / f"log{i}.txt", accuracies, seed=7 + i),
                folder / f"result_{i}.txt")
  assert main(["compare", f"{bucket}/package", "--json", str(tmp_path / "scores.json")]) == 0
  [entry] = json.loads((tmp_path / "scores.json").read_text())["entries"]
  assert entry["source"] == f"{bucket}/package" and len(entry["runs"]) == 2
  assert all(run["converged"] for run in entry["runs"])
  assert f"{bucket}/package" in capsys.readouterr().out  # The table names the bucket.


def test_a_result_log_in_a_bucket_reads_as_on_a_disk(bucket):
  """`check --from-log gs://...` reads a log through the path layer (`mlbench.resultlog`)."""
  from pathlib import Path

  from mlbench.resultlog import ResultLog

  local = (Path(__file__).parents[1] / "data" / "mlperf-v0.6" / "Google" / "results" /
           "tpu-v3-128" / "resnet" / "result_0.txt")
  remote = f"{bucket}/logs/result_0.txt"
  results.paths.path(remote).write_bytes(local.read_bytes())
  got, want = ResultLog.read(remote), ResultLog.read(local)
  assert got.events == want.events and got.size == want.size and got.old_format
