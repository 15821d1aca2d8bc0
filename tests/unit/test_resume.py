"""--resume continues exactly the run it claims to: a refusal for each recorded setting, one
line per difference, before JAX starts; what may differ (devices, the data axis, a copy of
the data, where the results folder is now); one live run per run folder (the lease)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlbench.storage import pending, writes
from mlbench.cli import main
from mlbench.config import RunConfig
from mlbench.train.lifecycle import lease as lease_lib, resume
from mlbench.train.lifecycle.runrecord import RUN_FILE, RunRecord, versions

RID = "abcd1234"


def _base(tmp_path: Path) -> dict:
  return dict(
      run_id=RID, workload="resnet50", config=None, overrides=("train_epochs=1",), seeds=(3,),
      index=0, system="cpu-test", submitter="mlbench", division="closed", ruleset="mini",
      results_dir=str(tmp_path / "results"), checkpoint_every=5, benchmark="resnet",
      config_sha256=None, precision=None, input_mode="deterministic", mesh=None,
      weight_update_sharding=False, bn_group_size=None, data_dir=str(tmp_path / "data"),
      process_count=1, versions=versions(), resolved_config={"train_epochs": "1.0"})


def _run(tmp_path: Path, *, checkpoint: bool = True, **changes) -> Path:
  """A run folder as an interrupted run leaves it: run.json and a checkpoint of step 5."""
  folder = tmp_path / "results" / "runs" / "cpu-test" / "resnet" / RID
  ckpt = folder / "checkpoints"
  ckpt.mkdir(parents=True)
  (tmp_path / "data").mkdir(exist_ok=True)
  if checkpoint:
    (ckpt / "5").mkdir()
  writes.write_new(ckpt / RUN_FILE, RunRecord(**{**_base(tmp_path), **changes}).to_json())
  return folder


def _refused(capsys, folder: Path, *args: str) -> list[str]:
  """The difference lines of a refused resume (after the line saying so)."""
  assert main(["run", "resnet50", "--resume", str(folder), *args]) == 2
  err = capsys.readouterr().err
  first, *lines = err.rstrip("\n").split("\n")
  assert first.startswith(f"error: --resume {folder}: this run would differ"), err
  return [line.strip() for line in lines]


OPTIONS = [
    (["--seed", "4"], "--seed 4: the run used 3; leave --seed out"),
    (["--set", "train_epochs=2"], "--set train_epochs=2: the run used train_epochs=1; leave --set out"),
    (["--system", "other"], "--system other: the run used cpu-test; leave --system out"),
    (["--submitter", "org"], "--submitter org: the run used mlbench; leave --submitter out"),
    (["--division", "open"], "--division open: the run used closed; leave --division out"),
    (["--ruleset", "4.0.0"], "--ruleset 4.0.0: the run used mini; leave --ruleset out"),
    (["--runs", "2"], "--runs 2: the run used 1; leave --runs out"),
    (["--precision", "bfloat16"],
     "--precision bfloat16: the run used the config's own; leave --precision out"),
    (["--input-mode", "fast"], "--input-mode fast: the run used deterministic; leave "
                               "--input-mode out"),
    (["--mesh", "data=4,model=2"],
     "--mesh data=4,model=2: the run used every device on data; leave --mesh out"),
    (["--weight-update-sharding"],
     "--weight-update-sharding on: the run used off; leave --weight-update-sharding out"),
    (["--bn-group-size", "2"],
     "--bn-group-size 2: the run used the whole batch; leave --bn-group-size out"),
    (["--config", "full"], "--config full: the run used the default; leave --config out"),
]


@pytest.mark.parametrize("args, line", OPTIONS, ids=[a[0] for a, _ in OPTIONS])
def test_each_recorded_option_given_otherwise_is_refused_in_one_line(capsys, tmp_path, args,
                                                                     line):
  assert _refused(capsys, _run(tmp_path), *args) == [line]


def test_the_data_the_checkpoint_folder_and_the_environment_are_recorded_too(capsys, tmp_path):
  cfg = tmp_path / "my_config.py"
  cfg.write_text("from workloads.resnet50.config import mini\n\ndef get_config():\n"
                 "  return mini()\n")
  old = {**versions(), "jax": "0.0.1", "libtpu": "none"}
  folder = _run(tmp_path, config=str(cfg), config_sha256="0" * 64, versions=old)
  (tmp_path / "elsewhere").mkdir()
  lines = _refused(capsys, folder, "--data-dir", str(tmp_path / "elsewhere"), "--checkpoint-dir",
                   str(tmp_path))
  assert lines[:2] == [f"--checkpoint-dir {tmp_path}: the run used {folder}/checkpoints; leave "
                       "--checkpoint-dir out",
                       f"--data-dir {tmp_path}/elsewhere: the run used {tmp_path}/data; leave "
                       "--data-dir out"]
  assert f"jax {versions()['jax']}: the run used 0.0.1; pip install jax==0.0.1" in lines
  if versions()["libtpu"] != "none":
    assert f"libtpu {versions()['libtpu']}: the run used none; pip uninstall libtpu" in lines
  assert lines[-1].startswith(f"--config {cfg}: changed since the run started (sha256 "
                              "000000000000... then, ")
  cfg.unlink()
  assert _refused(capsys, folder)[-1].startswith(f"--config {cfg}: no such file now; restore it")


def test_what_may_differ(tmp_path):
  """The device count and with it the data axis, the checkpoint cadence, a copy of a
  prepared set elsewhere (the same manifest); the rest comes from the record."""
  folder = _run(tmp_path, mesh=(("data", 4), ("model", 2)), precision="float32")
  (tmp_path / "data" / resume.DATA_MANIFEST).write_text('{"files": {}}')
  copy = tmp_path / "copy"
  copy.mkdir()
  (copy / resume.DATA_MANIFEST).write_text('{"files": {}}')
  rc = RunConfig(workload="resnet50", mesh=(("data", 2), ("model", 2)), data_dir=copy,
                 checkpoint_every=7, cpu_devices=4)
  got = resume.resumed_config(rc, folder, {"mesh", "data_dir", "checkpoint_every",
                                           "cpu_devices"})
  assert got.mesh == (("data", 2), ("model", 2)) and str(got.data_dir) == str(copy)
  assert got.checkpoint_every == 7 and got.cpu_devices == 4 and got.precision == "float32"
  assert (got.seed, got.overrides, got.ruleset) == (3, ("train_epochs=1",), "mini")
  assert str(got.resume) == str(folder / "checkpoints") and got.checkpoint_dir is None
  # Not given: the recorded mesh, its data axis following the devices there are.
  assert resume.resumed_config(RunConfig(workload="resnet50"), folder, set()).mesh == (
      ("data", 4), ("model", 2))
  assert resume.fit_mesh((("data", 4), ("model", 2)), 4) == (("data", 2), ("model", 2))
  assert resume.fit_mesh((("model", 2),), 8) == (("data", 4), ("model", 2))
  assert resume.fit_mesh((("data", 4), ("model", 2)), 3) == (("data", 4), ("model", 2))


def test_a_results_dir_given_is_honoured_where_the_run_is_and_refused_elsewhere(capsys,
                                                                               tmp_path):
  moved = tmp_path / "moved"
  folder = _run(moved)  # Recorded under moved/results, which holds it...
  rc = RunConfig(workload="resnet50", results_dir=moved / "results")
  got = resume.resumed_config(rc, folder, {"results_dir"})
  assert str(got.results_dir) == str(moved / "results")
  os.rename(moved / "results", tmp_path / "now")  # ...until the folder moves.
  now = tmp_path / "now" / "runs" / "cpu-test" / "resnet" / RID
  got = resume.resumed_config(dataclasses.replace(rc, results_dir=tmp_path / "now"), now,
                              {"results_dir"})
  assert str(got.results_dir) == str(tmp_path / "now")
  assert _refused(capsys, now) == [
      f"the run's folder (runs/cpu-test/resnet/{RID}) is in {tmp_path}/now now, not in its "
      f"results dir {moved}/results; give --results-dir {tmp_path}/now, where the results moved"]
  assert _refused(capsys, now, "--results-dir", str(tmp_path)) == [
      f"--results-dir {tmp_path}: the run's folder (runs/cpu-test/resnet/{RID}) is in "
      f"{tmp_path}/now; give --results-dir {tmp_path}/now, where the results moved, or leave "
      "it out"]


def test_a_run_checkpointed_elsewhere_files_where_it_is_told(tmp_path):
  """Checkpoints in a bucket every host reaches, results on the disk of the host that
  resumes: --results-dir is honoured, and without it the run files where it started."""
  ckpt = tmp_path / "bucket" / RID
  ckpt.mkdir(parents=True)
  (ckpt / "5").mkdir()
  writes.write_new(ckpt / RUN_FILE, RunRecord(**_base(tmp_path)).to_json())
  (tmp_path / "data").mkdir()
  rc = RunConfig(workload="resnet50", results_dir=tmp_path / "here")
  assert str(resume.resumed_config(rc, ckpt, {"results_dir"}).results_dir) == str(
      tmp_path / "here")
  assert str(resume.resumed_config(rc, ckpt, set()).results_dir) == str(tmp_path / "results")


def test_several_differences_are_one_line_each(capsys, tmp_path):
  lines = _refused(capsys, _run(tmp_path), "--seed", "4", "--input-mode", "fast")
  assert [line.split(":")[0] for line in lines] == ["--seed 4", "--input-mode fast"]


def test_the_process_count_and_the_resolved_config_are_checked_once_jax_runs(tmp_path):
  record = RunRecord(**_base(tmp_path))
  assert resume.plan_differences(record, {"train_epochs": 1.0}, 1) == []
  assert resume.plan_differences(record, {"train_epochs": 2.0, "model.dtype": "bfloat16"}, 2) == [
      "2 process(es): the run used 1; run it on 1 (the devices per process may differ)",
      'config model.dtype = "bfloat16": the run used absent; resume with what the run used',
      "config train_epochs = 2.0: the run used 1.0; resume with what the run used"]


def test_what_cannot_be_resumed_is_one_line(capsys, tmp_path):
  folder = _run(tmp_path, checkpoint=False)
  ckpt = folder / "checkpoints"
  assert main(["run", "resnet50", "--resume", str(folder)]) == 2
  assert "stopped before its first checkpoint" in capsys.readouterr().err
  (ckpt / "5").mkdir()
  assert main(["run", "bert", "--resume", str(folder)]) == 2
  assert "is a resnet50 run, not bert" in capsys.readouterr().err
  assert main(["run", "resnet50", "--resume", str(tmp_path)]) == 2
  assert "no run.json there" in capsys.readouterr().err
  (ckpt / "finished.json").write_text('{"log": "resu')  # Truncated: finished all the same.
  assert main(["run", "resnet50", "--resume", str(folder)]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "that run already finished (its finished.json says so but " \
                                  "is damaged)" in err, err
  (ckpt / "finished.json").unlink()
  record = json.loads((ckpt / RUN_FILE).read_text())
  del record["data_dir"], record["versions"]
  (ckpt / RUN_FILE).write_text(json.dumps(record))  # as an older mlbench wrote it
  assert main(["run", "resnet50", "--resume", str(folder)]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "cannot be used (it does not record data_dir, versions " \
                                  "(an older mlbench wrote it)); start a new run" in err, err


# -- one live run per run folder ------------------------------------------------------
def _lease_of(folder: Path, number: int, record: pending.Record) -> None:
  writes.write_new(folder / f"lease-{number}.json", record.to_json())


def _other_host(age_s: float) -> pending.Record:
  now = time.time()
  return pending.Record(RID, "tpu-host-7", "b00t", 4026531836, 4242, None, now - 7200, now - age_s)


def test_a_live_run_holds_its_folder_against_resumes_from_here_and_other_hosts(capsys, tmp_path):
  folder = _run(tmp_path)
  ckpt = folder / "checkpoints"
  with subprocess.Popen(["sleep", "60"]) as alive:
    here = dataclasses.replace(pending.Record.mine(RID), pid=alive.pid,
                               pid_start=pending._start_ticks(alive.pid))
    _lease_of(ckpt, 0, here)
    assert main(["run", "resnet50", "--resume", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"that run is in progress elsewhere (process {alive.pid} of " \
                                    f"this host still runs); wait for it to end, or stop it " \
                                    f"(kill -TERM {alive.pid})" in err, err
    alive.kill()
  (ckpt / "lease-0.json").unlink()
  _lease_of(ckpt, 3, _other_host(age_s=40))
  assert main(["run", "resnet50", "--resume", str(folder), "--stale-after", "600"]) == 2
  assert "(host tpu-host-7, process 4242: heartbeat 40 s ago)" in capsys.readouterr().err
  # Gone once its heartbeat is older than --stale-after: taken over, the next number.
  said = []
  taken = lease_lib.Lease.take(ckpt, RID, stale_after=30, what="--resume", say=said.append,
                               heartbeat_s=0.05)
  assert taken.path.name == "lease-4.json" and not (ckpt / "lease-3.json").exists()
  assert said == [f"note: took over {ckpt} from a run that is gone (host tpu-host-7, process "
                  "4242: its last heartbeat was 40 s ago (limit 30 s))"]
  first = pending.read_record(taken.path).heartbeat
  deadline = time.time() + 10
  while pending.read_record(taken.path).heartbeat == first:
    assert time.time() < deadline, "no heartbeat"
    time.sleep(0.02)
  assert taken.ours()
  _lease_of(ckpt, 5, _other_host(age_s=0))  # Another host took it over meanwhile.
  assert not taken.ours()
  taken.release()
  assert not taken.path.exists()


_TAKER = """
import sys, time
from pathlib import Path
from mlbench import errors
from mlbench.train.lifecycle.lease import Lease
go = Path(sys.argv[2])
Path(sys.argv[3]).touch()
while not go.exists():
  time.sleep(0.001)
try:
  Lease.take(sys.argv[1], "abcd1234", stale_after=1800, what="--resume")
  print("took", flush=True)
  time.sleep(1)  # alive while the others judge its lease
except errors.UserError as e:
  print("refused", e, flush=True)
"""


def test_of_resumes_started_at_once_exactly_one_takes_the_folder(tmp_path):
  folder = _run(tmp_path) / "checkpoints"
  _lease_of(folder, 0, dataclasses.replace(pending.Record.mine(RID), pid=_dead_pid()))
  go = tmp_path / "go"
  procs = [subprocess.Popen([sys.executable, "-c", _TAKER, str(folder), str(go),
                             str(tmp_path / f"ready{i}")], stdout=subprocess.PIPE, text=True)
           for i in range(4)]
  deadline = time.time() + 60
  while len(list(tmp_path.glob("ready*"))) < 4:  # every taker imported and waiting
    assert time.time() < deadline
    time.sleep(0.01)
  go.touch()
  outs = [p.communicate(timeout=60)[0] for p in procs]
  assert sorted(o.split()[0] for o in outs) == ["refused"] * 3 + ["took"], outs
  assert [p.name for p in folder.glob("lease-*.json")] == ["lease-1.json"]


def _dead_pid() -> int:
  gone = subprocess.Popen(["true"])
  gone.wait()
  return gone.pid


def test_a_lease_left_by_a_process_of_this_host_that_is_gone_holds_nothing(tmp_path):
  folder = _run(tmp_path) / "checkpoints"
  _lease_of(folder, 2, dataclasses.replace(pending.Record.mine(RID), pid=_dead_pid()))
  lease_lib.check(folder, stale_after=1800, what="--resume")
  taken = lease_lib.Lease.take(folder, RID, stale_after=1800, what="--resume")
  assert [p.name for p in folder.glob("lease-*.json")] == ["lease-3.json"]
  taken.release()
