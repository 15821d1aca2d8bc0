"""When storage fails under a run: real full, read-only and refusing disks (small tmpfs mounts,
where the tests run as root), the errors of each client read into one line, the log cut
back to whole lines, failed checkpoint saves survived, and the start-up space check."""

from __future__ import annotations

import errno
import json
import logging
import subprocess
import threading
import time

import jax
import jax.numpy as jnp
import pytest

from mlbench.storage import faults
from mlbench.errors import StorageFailed, UserError
from mlbench.mllog import MLLog
from mlbench.train import steps
from mlbench.train.lifecycle import checkpoint, failed_saves, restore, space
from mlbench.train.clock import Clock
from mlbench.train.result import RunResult


def _lines(path) -> list[dict]:
  """Every line of a log, each a whole :::MLLOG record (a torn one fails here)."""
  return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in path.read_text().splitlines()]


def test_a_full_disk_stops_the_log_at_its_last_whole_line(small_disk):
  disk = small_disk(1)
  log = MLLog(disk / "run.log", prefix="")
  log.event("first", 1)
  before = (disk / "run.log").read_bytes()
  small_disk.fill(disk)
  with pytest.raises(StorageFailed) as e:
    for i in range(10):  # The first lines may still fit in the file's last page.
      log.event("long", "x" * 3000, {"i": i})
  assert e.value.cause == f"disk full at {disk / 'run.log'}: 0.0 MiB free"
  assert e.value.fix == "free space"
  text = (disk / "run.log").read_bytes()
  assert text.startswith(before) and [d["key"] for d in _lines(disk / "run.log")][0] == "first"
  log.run_stop(False)  # After the failure nothing more is written, and nothing raises.
  log.close()
  assert (disk / "run.log").read_bytes() == text


def test_a_log_that_cannot_be_created_leaves_nothing(small_disk):
  disk = small_disk(1)
  small_disk.fill(disk)
  with pytest.raises(StorageFailed, match=r"^disk full at .*: 0\.0 MiB free$"):
    with faults.needed(disk):
      MLLog(disk / "resumed.log", prefix=":::MLLOG {}\n" * 2000)  # a resumed run's log so far
  assert not (disk / "resumed.log").exists()


def test_each_clients_error_is_read_into_its_cause(small_disk):
  import tensorstore as ts

  disk = small_disk(1)
  small_disk.fill(disk)
  with pytest.raises(OSError) as full:
    (disk / "x").write_bytes(b"x" * 8192)
  spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": str(disk / "arr")}}
  with pytest.raises(ValueError) as ts_full:  # orbax's array writer, as it fails
    ts.open(spec, create=True, dtype=ts.float32, shape=[1024]).result().write(
        jnp.ones(1024)).result()
  subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
  with pytest.raises(OSError) as read_only:
    (disk / "y").write_text("y")
  for e in (full.value, ts_full.value):
    assert faults.diagnose(e, disk) == faults.Fault(f"disk full at {disk}: 0.0 MiB free",
                                                    "free space")
  assert faults.diagnose(read_only.value, disk).cause == f"read-only file system at {disk}"
  denied = PermissionError(errno.EACCES, "Permission denied", str(disk / "y"))
  assert faults.diagnose(denied, disk) == faults.Fault(f"permission denied at {disk}",
                                                       "make it writable")
  quota = OSError(errno.EDQUOT, "Disk quota exceeded")
  assert faults.diagnose(quota, disk).cause == f"disk quota exceeded at {disk}"
  # What is no storage fault is a bug, for the crash report.
  assert faults.diagnose(ValueError("shapes (3,) and (4,) differ"), disk) is None
  assert faults.diagnose(KeyError("params"), disk) is None


def _state(n: int = 150_000):
  return steps.TrainState(step=jnp.zeros((), jnp.int32), params={"w": jnp.arange(n * 1.0)},
                          model_state={}, opt_state={}, rng=jax.random.key(0))


def _orbax_errors(caplog) -> list[str]:
  """The ERROR records orbax logged (through absl) that reached the console's handlers."""
  return [r.getMessage() for r in caplog.records
          if r.levelno >= logging.ERROR and "/orbax/" in r.pathname]


def test_failed_saves_warn_training_goes_on_and_three_in_a_row_stop(small_disk, tmp_path,
                                                                    capfd, caplog):
  """A 600 kB state on a 3 MiB disk: the first save fits; with the disk full each save
  fails (one warning each, its half-written step removed), the checkpoint of step 5 stays;
  space back, the next save works and the count starts again; the third failure in a row
  stops the run. What orbax logs of the failed saves stays off the console, and what it
  logs of a damaged checkpoint read back afterwards shows."""
  disk, said = small_disk(3), []
  ck_dir, state, sums = disk / "ck", _state(), {"loss": jnp.float32(1)}
  log = tmp_path / "log.txt"
  log.write_text(":::MLLOG line\n")
  clock = Clock()
  clock.mark("init_start")
  ck = checkpoint.Checkpoints(ck_dir, 5, clock, RunResult(seed=0), log, say=said.append)

  def saves(*steps_):
    for s in steps_:
      ck.after_step(s, state, sums)
    ck.settle()

  saves(5)
  filler = small_disk.fill(disk)
  saves(10, 15)
  assert said == [
      f"warning: the checkpoint of step {s} was not saved (disk full at {ck_dir}: 0.0 MiB "
      f"free); training goes on, the checkpoint of step 5 stays the one to resume from; "
      f"{n} more failed save(s) in a row stop the run" for s, n in ((10, 2), (15, 1))]
  filler.unlink()
  saves(20)  # Saved: the count starts again.
  small_disk.fill(disk)
  saves(25, 30)
  assert len(said) == 4 and said[-1].endswith("stays the one to resume from; 1 more failed "
                                              "save(s) in a row stop the run")
  ck.after_step(35, state, sums)
  with pytest.raises(StorageFailed) as e:
    ck.settle()
  assert e.value.cause == (f"disk full at {ck_dir}: 0.0 MiB free ({failed_saves.LIMIT} "
                           "checkpoint saves in a row failed)")
  ck.close()
  assert sorted(p.name for p in ck_dir.iterdir()) == ["20", "5"]  # nothing half-written
  err = capfd.readouterr().err
  assert "Traceback" not in err and "Event loop is closed" not in err and "ERROR" not in err, err
  assert _orbax_errors(caplog) == []
  (ck_dir / "20" / "_CHECKPOINT_METADATA").write_text("{damaged")
  restore.read_meta(ck_dir, 20)  # orbax reads on without that file, and says so
  assert _orbax_errors(caplog) and all(m.startswith("Failed to json parse Metadata file: ")
                                       for m in _orbax_errors(caplog)), _orbax_errors(caplog)


def test_the_space_check_counts_what_the_run_writes_and_says_both_numbers(small_disk, tmp_path):
  """Two runs of the ResNet mini with checkpoints and a compile cache: the checkpoints are
  counted from the state's bytes (2 kept per run and 1 being written), the cache by its
  allowance; what shares a disk is summed, a disk with room for it passes."""
  from mlbench.config import RunConfig
  from mlbench.train.plan import make_plan
  from mlbench.train.runtime import Runtime

  devices = jax.devices()
  disk = small_disk(8)

  def needs(**where):
    rc = RunConfig(workload="resnet50", checkpoint_every=5, runs=2, **where)
    plan = make_plan(rc, Runtime(0, 1, devices, devices))
    return plan, space.needs(plan, state=state, cache=disk / "jax")

  state = space.state_bytes(make_plan(RunConfig(workload="resnet50"),
                                      Runtime(0, 1, devices, devices)))
  assert 3.5 * 2**20 < state < 4.5 * 2**20  # the mini's checkpoints hold 3.9 MiB on disk
  plan, need = needs(results_dir=disk / "results", checkpoint_dir=tmp_path / "ckpt")
  log = space.LOG_BYTES + space.POINT_BYTES * len(plan.points)
  assert [(n.option, n.where, n.bytes) for n in need] == [
      ("--results-dir", disk / "results", 2 * log),
      ("--checkpoint-dir", tmp_path / "ckpt", 5 * (state + log)),
      ("--compile-cache", disk / "jax", 3 * space.PROGRAM_BYTES["cpu"])]
  with pytest.raises(UserError) as e:
    space.check(need)
  assert str(e.value) == (
      f"--results-dir {disk / 'results'} and --compile-cache {disk / 'jax'} (one disk) have "
      f"only 8.0 MiB free; this run needs about {(2 * log + (12 << 20)) / 2**20:.1f} MiB there "
      f"(2 log(s) and TensorBoard "
      f"scalars: {2 * log / 1024:.0f} KiB; compile cache 3 x 4.0 MiB (an allowance per "
      "program): 12.0 MiB); free some space or choose another folder")
  space.check(need[:2])  # Without the cache: the logs fit, the checkpoints are elsewhere.
  _, need = needs(results_dir=disk / "results")
  with pytest.raises(UserError, match=r"^--results-dir \S+ has only 8\.0 MiB free; this run "
                                      r"needs about 19\.\d MiB there .*checkpoints 5 x 3\.9 MiB"):
    space.check(need[:2])


def test_a_mount_gone_read_only_fails_a_save_and_leaves_no_thread_waiting(small_disk, tmp_path):
  """An NFS server gone read-only, as a tmpfs remounted so: the save cannot create its
  folder; orbax's other threads of that save, waiting for it, end (they would otherwise
  wait out orbax's 300 s and keep the process from exiting)."""
  disk, said = small_disk(3), []
  log = tmp_path / "log.txt"
  log.write_text(":::MLLOG line\n")
  clock = Clock()
  clock.mark("init_start")
  ck = checkpoint.Checkpoints(disk / "ck", 5, clock, RunResult(seed=0), log, say=said.append)
  before = {t for t in threading.enumerate() if not t.daemon}
  ck.after_step(5, _state(1000), {"loss": jnp.float32(1)})
  ck.settle()
  subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
  ck.after_step(10, _state(1000), {"loss": jnp.float32(1)})
  ck.settle()
  assert said == [f"warning: the checkpoint of step 10 was not saved (read-only file system at "
                  f"{disk / 'ck'}); training goes on, the checkpoint of step 5 stays the one to "
                  "resume from; 2 more failed save(s) in a row stop the run"]
  ck.close()
  deadline = time.time() + 10
  while {t for t in threading.enumerate() if not t.daemon} - before:
    assert time.time() < deadline, [t.name for t in threading.enumerate()]
    time.sleep(0.1)


def test_a_bug_raised_while_a_write_error_is_handled_is_a_bug_not_a_storage_fault(
    small_disk, tmp_path):
  """A real ENOSPC in flight, and a bug in the code handling it: the bug reaches the CLI as
  itself (its crash report, exit 70), never as a storage fault (exit 75) or a failed save's
  warning; so does an error of the log's file handler that is no storage fault."""
  from mlbench.cli import crash
  from mlbench.train.lifecycle import agreement

  disk = small_disk(1)
  small_disk.fill(disk)
  with pytest.raises(AttributeError) as bug:
    with faults.needed(disk):
      try:
        (disk / "result_0.txt").write_bytes(b"x" * 8192)
      except OSError as e:
        raise StorageFailed(e.reason)  # a bug: OSError has no `reason`
  assert isinstance(bug.value.__context__, OSError)
  assert bug.value.__context__.errno == errno.ENOSPC  # what was in flight
  assert faults.diagnose(bug.value, disk) is None
  assert agreement.outcome(0, bug.value, disk).kind == agreement.BUG  # a save raises it
  assert crash.report(bug.value).startswith("error: unexpected AttributeError")
  # What storage raises itself stays a fault.
  assert faults.diagnose(OSError(errno.ENOSPC, "No space left on device"), disk).cause == (
      f"disk full at {disk}: 0.0 MiB free")

  log = MLLog(tmp_path / "run.log")
  log.event("first", 1)
  before = (tmp_path / "run.log").read_bytes()
  log._file.stream.close()  # closed behind the handler's back: a bug, no full disk
  with pytest.raises(ValueError, match="closed file"):
    log.event("second", 2)
  assert (tmp_path / "run.log").read_bytes() == before  # still whole lines


def test_a_log_write_that_fails_stops_the_run_with_its_log_kept_whole(small_disk):
  """The disk under the results fills up: the log line that does not fit stops the run; the
  log, cut back to whole lines, moves to the run folder (a hard link needs no space), the
  pending record goes, the run folder is let go, and the line says what to do."""
  import io

  from rich.console import Console

  from mlbench.storage import pending, results
  from mlbench.train.lifecycle import filing, lease as lease_lib

  root = small_disk(1) / "results"
  bench = results.benchmark_dir(root, "cpu-test", "resnet")
  folder = results.run_folder(root, "cpu-test", "resnet", "abcd1234")
  (folder / "checkpoints").mkdir(parents=True)
  run = pending.PendingRun(bench, "abcd1234").start()
  log = MLLog(run.log_path)
  log.run_start()
  lease = lease_lib.Lease.take(folder / "checkpoints", "abcd1234", stale_after=1800, what="t")
  end = filing.RunEnd("resnet50", log, run, folder, checkpoint.RunSaver(folder / "checkpoints",
                                                                        5), lease,
                      Console(file=io.StringIO()))
  small_disk.fill(root.parent)
  with pytest.raises(StorageFailed) as e:
    for i in range(10):
      log.event("eval_accuracy", 0.5, {"epoch_num": i, "padding": "x" * 3000})
  line = end.storage_failed(e.value)
  assert line == (f"disk full at {run.log_path}: 0.0 MiB free: the partial log is kept at "
                  f"{folder / 'partial.log'}; no checkpoint to resume from; free space and run "
                  "the same command again")
  assert _lines(folder / "partial.log")[0]["key"] == "run_start"
  assert not list(bench.iterdir()) and not list((folder / "checkpoints").glob("lease-*"))


def test_tensorboard_scalars_on_a_full_disk_turn_off_with_one_warning(small_disk, capfd):
  from mlbench.train.telemetry import Telemetry

  disk = small_disk(1)
  tele = Telemetry(disk / "tensorboard", scalars=True, profile=None)
  tele.evaluated(1, "eval_accuracy", 0.5)
  small_disk.fill(disk)
  for step in range(2, 40):  # TensorFlow buffers: the flush of some evaluation fails.
    tele.block(step, {"loss": 1.0, "padding" * 40: 2.0}, 64, 1.0, 0.1)
    tele.evaluated(step, "eval_accuracy", 0.5)
  tele.close()
  err = capfd.readouterr().err
  assert err.count("warning: TensorBoard scalars are off from here on (disk full at ") == 1, err
  assert not tele.writes
